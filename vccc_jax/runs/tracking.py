"""Optional experiment tracking: TensorBoard event files or Weights & Biases (offline by
default). Off by default, no account needed.

    tracker = open_tracker("tensorboard", logdir="results/tensorboard/my_run", config=cfg)
    tracker.log(step, {"return": 12.5, "gt_mse": 0.03})     # scalars at a step
    tracker.log_cell("3f2a...", {"law": "fixed", "mean_lag": 4}, {"fp_err_max": 0.1})
    tracker.close()

Specs (``--track``): ``none`` (default: a tracker that does nothing); ``tensorboard`` or
``tensorboard:DIR`` (event files written by ``tensorboardX``: no TensorFlow, no account;
view with ``tensorboard --logdir DIR``); ``wandb`` or ``wandb:PROJECT`` (a Weights & Biases
run in ``<logdir>/wandb``, project ``vccc_jax`` by default, **offline** unless the
environment sets ``WANDB_MODE``: it runs without network or account; upload later with
``wandb sync <logdir>/wandb/offline-run-*``). Both packages: ``pip install
'vccc_jax[tracking]'``.

``log`` takes any mapping: non-numeric and non-finite values are skipped, nested mappings
become ``a/b`` tags. ``log_cell`` records one finished grid cell of a sweep (TensorBoard's
HParams table, one row per cell; W&B: one table ``cells``, logged at ``close``). The trainer's
hook is three lines (``runs.train.run_one``; ``new_rows``: the chunk's ``metrics_to_rows``, one
per update and seed; :func:`log_rows` logs the mean over seeds at each update, with the env
steps so far as the step, as CleanRL and PureJaxRL log ``global_step``)::

    tracker = open_tracker(track, logdir=out / backend, config=cfg.to_dict())
    log_rows(tracker, new_rows)                                # after each chunk
    tracker.close()                                            # after the loop
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

BACKENDS = ("none", "tensorboard", "wandb")
PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb"}  # backend -> the module it needs


def parse_spec(spec: Optional[str]) -> tuple[str, Optional[str]]:
    """``"tensorboard:DIR"`` -> ("tensorboard", "DIR"), ``"wandb:PROJECT"`` -> ("wandb",
    "PROJECT"); checks the backend name and that its package is installed (ValueError naming
    ``--track`` and the extra otherwise). No heavy import."""
    import importlib.util

    backend, _, arg = (spec or "none").partition(":")
    if backend not in BACKENDS or (backend == "none" and arg):
        raise ValueError("--track must be none, tensorboard[:DIR] or wandb[:PROJECT], got "
                         f"{spec!r}")
    package = PACKAGES.get(backend)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ValueError(f"--track {backend}: the {package} package is not installed "
                         "(pip install 'vccc_jax[tracking]')")
    return backend, arg or None


def scalars(metrics: Mapping, prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``metrics`` (bools and numpy scalars included; nested
    mappings as ``prefix/key``), as floats."""
    out = {}
    for k, v in metrics.items():
        tag = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(scalars(v, tag + "/"))
            continue
        if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            v = v.item()
        if isinstance(v, (bool, int, float)) and math.isfinite(float(v)):
            out[tag] = float(v)
    return out


class Tracker:
    """The do-nothing tracker (``--track none``) and the interface of the others."""

    def log(self, step: int, metrics: Mapping) -> None:
        """Record the scalars of ``metrics`` at ``step``."""

    def log_cell(self, name: str, params: Mapping, metrics: Mapping) -> None:
        """Record one finished grid cell: its parameters and its metrics."""

    def close(self) -> None:
        """Flush and close (idempotent)."""

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _hparam(v: Any):
    """An HParams value: bool / number / string (others as their text)."""
    return v if isinstance(v, (bool, int, float, str)) else str(v)


class TensorBoardTracker(Tracker):
    """Event files under ``logdir`` (``tensorboardX.SummaryWriter``)."""

    def __init__(self, logdir: str | os.PathLike, config: Optional[Mapping] = None):
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self._writer = SummaryWriter(logdir=str(self.logdir), flush_secs=30)
        if config:
            import json

            self._writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str)
                                  + "\n```", 0)

    def log(self, step: int, metrics: Mapping) -> None:
        for tag, value in scalars(metrics).items():
            self._writer.add_scalar(tag, value, int(step))

    def log_cell(self, name: str, params: Mapping, metrics: Mapping) -> None:
        self._writer.add_hparams({k: _hparam(v) for k, v in params.items()},
                                 scalars(metrics), name=name, global_step=0)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbTracker(Tracker):
    """A Weights & Biases run writing under ``logdir`` (``wandb.init(dir=logdir)``), offline
    unless ``WANDB_MODE`` says otherwise; grid cells become one table ``cells`` at close."""

    def __init__(self, logdir: str | os.PathLike, config: Optional[Mapping] = None,
                 project: Optional[str] = None, quiet: bool = False):
        import wandb

        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._cells: list[dict] = []
        # quiet: none of W&B's ~15 lines per run (banner, history, sync hint) on the console
        quiet_settings = {"settings": wandb.Settings(silent=True, console="off")} if quiet else {}
        self._run = wandb.init(project=project or "vccc_jax", dir=str(self.logdir),
                               config=dict(config or {}),
                               mode=os.environ.get("WANDB_MODE", "offline"), **quiet_settings)

    def log(self, step: int, metrics: Mapping) -> None:
        values = scalars(metrics)
        if values:
            self._run.log(values, step=int(step))

    def log_cell(self, name: str, params: Mapping, metrics: Mapping) -> None:
        self._cells.append({"id": name, **{k: _hparam(v) for k, v in params.items()},
                            **scalars(metrics)})

    def close(self) -> None:
        if self._run is None:
            return
        if self._cells:
            columns = list(dict.fromkeys(k for c in self._cells for k in c))
            data = [[c.get(k) for k in columns] for c in self._cells]
            self._run.log({"cells": self._wandb.Table(columns=columns, data=data)})
        self._run.finish()
        self._run = None


def log_rows(tracker: Tracker, rows: Sequence[Mapping], step: str = "env_steps",
             skip: Sequence[str] = ("seed", "update")) -> None:
    """Log table rows (e.g. ``metrics.csv`` rows, one per update and seed): at each value of
    ``rows[i][step]`` (default: the env steps so far, the x axis CleanRL and PureJaxRL users
    read), the mean over its rows of every numeric column (NaN ignored) except ``step`` and
    ``skip``."""
    by_step: dict[int, list[Mapping]] = {}
    for row in rows:
        by_step.setdefault(int(row[step]), []).append(row)
    for k in sorted(by_step):
        columns: dict[str, list[float]] = {}
        for row in by_step[k]:
            for tag, v in scalars({c: x for c, x in row.items()
                                   if c != step and c not in skip}).items():
                columns.setdefault(tag, []).append(v)
        tracker.log(k, {tag: sum(vs) / len(vs) for tag, vs in columns.items()})


def open_tracker(spec: Optional[str], *, logdir: str | os.PathLike,
                 config: Optional[Mapping] = None, quiet: bool = False) -> Tracker:
    """The tracker of a ``--track`` spec: TensorBoard event files in ``DIR`` (default
    ``logdir``), a W&B run under ``logdir`` (project ``PROJECT``; ``quiet``: silent), or the
    do-nothing :class:`Tracker`."""
    backend, arg = parse_spec(spec)
    if backend == "tensorboard":
        return TensorBoardTracker(arg or logdir, config)
    if backend == "wandb":
        return WandbTracker(logdir, config, project=arg, quiet=quiet)
    return Tracker()


def read_events(path: str | os.PathLike) -> list[tuple[int, str, float, str]]:
    """``[(step, tag, value, plugin)]`` of one event file (TFRecord framing read directly,
    tensorboardX's Event protobuf): for tests and notebooks, no TensorFlow needed."""
    import struct

    from tensorboardX.proto import event_pb2

    data, i, out = Path(path).read_bytes(), 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        for v in event.summary.value:
            out.append((event.step, v.tag, v.simple_value, v.metadata.plugin_data.plugin_name))
    return out
