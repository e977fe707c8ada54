"""``vccc train`` runs: one lagged actor-critic configuration, or a grid of them.

:func:`run_one` trains one ``TrainConfig`` (all its seeds vmapped) and writes ``<out>/``:

    metrics.csv   tidy table, one row per (update, seed): env_steps, return, lag_mean, ESS,
                  clip rates (overall and clip_frac_lag<j>), log-ratio quantiles, KL(pi||mu),
                  losses, and at ground-truth updates the critic error vs MC V^{pi_k}
    summary.json  per-seed summaries, each with its window and interval across seeds
                  (``analysis.train.summarize``: 95% with >= 5 seeds, else the seeds' range)
    config.json   the frozen TrainConfig + provenance (command line, git revision, package
                  versions, host, devices; a resumed run adds one per resume in "resumed")
    checkpoint/   orbax CheckpointManager: ``<update>/state`` (the sharded TrainState) and
                  ``<update>/meta`` (config, update, metric rows); saved every
                  ``checkpoint_every`` updates or ``checkpoint_seconds``, at the end and
                  when ``stop()`` asks, the last ``keep`` kept; ``resume`` continues from
                  the latest bit for bit (``train.checkpoint``)

:func:`run_grid` runs the cells of a ``kind = "train"`` experiment (:func:`cells`: the
product of its ``[grid]`` over its ``[base]``) one after the other into
``<out>/<name>/<cell id>/`` with one summary row per cell in the resumable result store
``<out>/<name>.jsonl`` (a rerun skips finished cells).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.envs.spec import env_gamma
from vccc_jax.runs.distributed import agree, is_main, open_store
from vccc_jax.runs.grid import product
from vccc_jax.runs.provenance import provenance
from vccc_jax.runs.schema import Experiment
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import cell_id
from vccc_jax.runs.tracking import log_rows, open_tracker, parse_spec
from vccc_jax.train.config import TrainConfig

# Above: pure Python (numpy at most). JAX, scipy (analysis) and rich (progress) are
# imported where used, so ``vccc train`` can check its input (:func:`resolve_fields`,
# ``runs.run_dir``) before loading them.

QUANTILE_NAMES = ("q01", "q10", "q50", "q90", "q99")


class Interrupted(KeyboardInterrupt):
    """:func:`run_one` stopped early because ``stop()`` asked it to (Ctrl-C in ``vccc
    train``): the state after ``update`` of ``total`` updates is checkpointed and committed."""

    def __init__(self, update: int, total: int):
        super().__init__(f"stopped after update {update} of {total}")
        self.update, self.total = update, total


class GridStopped(KeyboardInterrupt):
    """:func:`run_grid` stopped before its next cell because ``stop()`` asked (Ctrl-C during
    the cell before, even in its last update): ``done`` of ``total`` cells are stored."""

    def __init__(self, done: int, total: int):
        super().__init__(f"stopped after {done} of {total} cells")
        self.done, self.total = done, total


def cell_fields(exp: Experiment, overrides: dict | None = None) -> list[dict]:
    """The resolved fields (:func:`resolve_fields`) of every cell of a ``train`` experiment:
    ``base`` updated by ``overrides`` (flags), then every point of ``grid``
    (:func:`runs.grid.product`, in file order). Pure Python."""
    if exp.kind != "train":
        raise ConfigError(f"{exp.path}: kind {exp.kind!r} is not a train experiment")
    base = dict(exp.base)
    base.update(overrides or {})
    return [resolve_fields(dict(base, **point), exp.path) for point in product(exp.grid.axes)]


def cells(exp: Experiment, overrides: dict | None = None) -> list[TrainConfig]:
    """The TrainConfigs of a ``train`` experiment (:func:`cell_fields`, each built by
    :func:`config_from`)."""
    return [config_from(f, exp.path) for f in cell_fields(exp, overrides)]


def resolve_fields(fields: dict, where: str = "train config") -> dict:
    """Every TrainConfig field of a run given ``fields`` (a config's ``[base]`` and flags):
    defaults filled, ``gamma`` taken from a ``tabular:`` / ``token:`` env spec unless given
    (then it must agree). Equals ``config_from(fields).to_dict()``, but is pure Python:
    ConfigError naming ``where`` for an unknown field, a malformed env spec or a conflicting
    gamma -- before JAX is imported (value types: ``runs.schema`` for config files,
    argparse for flags)."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown TrainConfig fields: {unknown}")
    out = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    out.update(fields)
    check_numbers(out, where)
    try:
        gamma = env_gamma(out["env"])
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if gamma is not None:
        if "gamma" not in fields:
            out["gamma"] = gamma
        elif abs(float(fields["gamma"]) - gamma) > 1e-12:
            raise ConfigError(f"{where}: gamma={fields['gamma']} conflicts with gamma={gamma:g} "
                              f"of env {out['env']!r}; set it once, in the env spec")
    return out


# The least value of each count field (TrainConfig checks the rest once JAX is imported):
# checked in pure Python before any compute (``--hidden 0`` trained, then crashed in orbax;
# ``--total-timesteps -512`` was answered "use -512 or 0").
LEAST = {"num_envs": 1, "num_steps": 1, "total_timesteps": 1, "update_epochs": 1,
         "num_minibatches": 1, "hidden": 1, "num_layers": 0, "num_seeds": 1, "gt_every": 0,
         "gt_states": 1, "gt_rollouts": 2, "eval_envs": 0, "switch_every": 0,
         "switch_stride": 1, "top_k": 0, "critic_steps": 1, "replay_updates": 0,
         "centering_topk": 0, "brace_n": 0}


def check_numbers(fields: dict, where: str = "train config") -> None:
    """ConfigError naming ``where`` for a count below its least value (:data:`LEAST`) or a
    number that is not finite (``inf``, ``nan``). Pure Python."""
    for name, least in LEAST.items():
        value = fields.get(name)
        if isinstance(value, (int, float)) and value < least:
            raise ConfigError(f"{where}: {name} must be >= {least}, got {value}")
    for name, value in fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {name} must be a finite number, got {value}")


GT_POINTS = 10  # ground-truth evaluations over a run from flags (default_gt_every)


def default_gt_every(fields: dict) -> int:
    """``gt_every`` of a run from flags that does not give it: about ``GT_POINTS`` ground-truth
    evaluations over the run (every update for runs of fewer than GT_POINTS updates)."""
    updates = int(fields["total_timesteps"]) // (int(fields["num_envs"]) * int(fields["num_steps"]))
    return max(1, updates // GT_POINTS)


def with_ground_truth(fields: dict, flags: dict) -> dict:
    """The resolved fields of a run from flags with ground truth on (:func:`default_gt_every`)
    unless the flags give ``gt_every`` (or a pi_old_route whose actor may not allow it)."""
    if "gt_every" in flags or fields["pi_old_route"]:
        return fields
    return dict(fields, gt_every=default_gt_every(fields))


def check_whole_updates(fields: dict, where: str = "train config") -> None:
    """A run does whole updates of ``num_envs * num_steps`` env steps: ConfigError when
    those cover less than 99% of ``total_timesteps`` (``1e3`` with 512-step updates would run
    one update, 512 steps), naming the nearest totals that are whole. The default 500000 with
    512-step updates (976 updates, 99.94%) passes, as in PureJaxRL. Pure Python."""
    batch = int(fields["num_envs"]) * int(fields["num_steps"])
    total = int(fields["total_timesteps"])
    updates = total // batch
    if batch > 0 and updates * batch < 0.99 * total:
        lower = f"{updates * batch} or " if updates else ""
        raise ConfigError(
            f"{where}: total_timesteps {total} is {total / batch:.3g} updates of {batch} env "
            f"steps (num_envs {fields['num_envs']} x num_steps {fields['num_steps']}); a run "
            f"does whole updates only, so it would run {updates * batch}: use "
            f"{lower}{(updates + 1) * batch}")


def config_from(fields: dict, where: str = "train config") -> TrainConfig:
    """``TrainConfig.from_dict`` of :func:`resolve_fields`, with errors (unknown field, bad
    value, unknown critic, env that cannot be built) naming the input."""
    try:
        cfg = TrainConfig.from_dict(resolve_fields(fields, where))
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: {e}") from None
    from vccc_jax.envs.make import make_env
    from vccc_jax.train.targets import CRITIC_TARGETS

    if cfg.critic not in CRITIC_TARGETS:
        raise ConfigError(f"{where}: unknown critic {cfg.critic!r} (known: "
                          f"{', '.join(sorted(CRITIC_TARGETS))})")

    try:  # gymnax names, DeepSea-bsuite:N, tabular:..., token:... (envs.make)
        make_env(cfg.env)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e} (e.g. CartPole-v1, tabular:family=garnet,S=8, "
                          "token:V=64,H=16)") from None
    return cfg


def metrics_to_rows(metrics: dict, config: TrainConfig, start_update: int = 0) -> list[dict]:
    """Metrics [U, S, ...] -> one dict per (update, seed); vector metrics get one column each."""
    m = {k: np.asarray(v) for k, v in metrics.items()}
    num_updates, num_seeds = next(iter(m.values())).shape[:2]
    rows = []
    for u in range(num_updates):
        update = start_update + u
        for s in range(num_seeds):
            row = {"update": update, "seed": s,
                   "env_steps": (update + 1) * config.batch_size}
            for k, v in m.items():
                x = v[u, s]
                if x.ndim == 0:
                    row[k] = x.item()
                elif k == "log_rho_q":
                    row.update({f"log_rho_{q}": float(xi) for q, xi in zip(QUANTILE_NAMES, x)})
                elif k == "clip_frac_by_lag":
                    row.update({f"clip_frac_lag{j}": float(xi) for j, xi in enumerate(x)})
                elif k == "count_by_lag":
                    row.update({f"count_lag{j}": int(xi) for j, xi in enumerate(x)})
                else:
                    row.update({f"{k}{j}": float(xi) for j, xi in enumerate(x)})
            rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    fields = list(rows[0])
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        conv = {}
        for k, v in r.items():
            try:
                conv[k] = int(v) if k in ("update", "seed", "env_steps") else float(v)
            except ValueError:
                conv[k] = v
        out.append(conv)
    return out


def _chunk_size(num_updates: int, requested: int, checkpoint_every: int) -> int:
    """Updates per jitted call; a divisor of num_updates when possible (one compile), and a
    divisor of ``checkpoint_every`` so every scheduled checkpoint falls on a call boundary."""
    if requested > 0:
        size = requested
    else:
        target = max(1, num_updates // 20)
        divisors = [d for d in range(1, target + 1) if num_updates % d == 0]
        size = divisors[-1] if divisors and divisors[-1] * 4 >= target else target
    if checkpoint_every > 0:
        size = max(d for d in range(1, min(size, checkpoint_every) + 1)
                   if checkpoint_every % d == 0)
    return max(1, min(size, num_updates))


def checkpoint_meta(cfg: TrainConfig, update: int, rows: list[dict], chunk: int) -> dict:
    """What a checkpoint's meta holds: the config (resume refuses another one), the number
    of updates done, the metric rows so far (so a resumed table is exact) and the updates
    per jitted call (a resumed run keeps them: the same compiled programs, bit for bit)."""
    return {"config": cfg.to_dict(), "update": int(update), "rows": rows, "chunk": int(chunk)}


def run_one(cfg: TrainConfig, out: Path, *, chunk: int = 0, checkpoint_every: int = 0,
            checkpoint_seconds: float = 0.0, resume: bool = False, quiet: bool = False,
            mesh=None, fsdp: bool = False, keep: int = 3,
            stop: Optional[Callable[[], bool]] = None,
            command: Optional[list[str]] = None, track: str = "none",
            programs=None) -> tuple[dict, list[dict]]:
    """Train one configuration (all its seeds) over ``mesh`` and write the run directory.

    ``mesh``: a ``train.sharding`` mesh (None: all devices, ``(n, 1)``); every process of a
    multi-host run calls this with the same arguments, process 0 writes the files.
    Checkpoints (orbax ``<out>/checkpoint/<update>/``, the last ``keep`` kept) are written
    at the end of the chunk (jitted call, :func:`_chunk_size`) that completes a multiple of
    ``checkpoint_every`` updates, or the first chunk ending ``checkpoint_seconds`` after the
    last save, and at the end. ``resume`` continues from the latest checkpoint bit for bit
    (state, metric rows and chunk size travel in the checkpoint meta); without it the checkpoint
    directory must hold no step. ``stop()`` is asked after every chunk: True checkpoints the
    state there and raises :class:`Interrupted`. Every exit (the end, an exception, Ctrl-C)
    first waits for pending saves, so a returned or raised run leaves no save half done.
    ``command``: the command line recorded in the provenance (default ``sys.argv``).
    ``track``: a ``runs.tracking`` spec (``tensorboard``: event files in ``<out>/tensorboard``;
    ``wandb``: an offline W&B run in ``<out>/wandb``; the mean over seeds of every metric at
    each update, stepped by env steps).
    ``programs``: a ``train.programs.ProgramCache`` shared with other runs (a grid's cells
    that differ only in grid values then share one compiled program); None: its own.
    Returns (summary, tidy rows); the caller draws figures (``plotting.train``)."""

    from vccc_jax.train import checkpoint as ck
    from vccc_jax.train import sharding as sh
    from vccc_jax.train.trainer import Trainer

    out = Path(out)
    main = is_main()
    if main:
        out.mkdir(parents=True, exist_ok=True)
    st = sh.ShardedTrainer(Trainer(cfg), mesh if mesh is not None else sh.make_mesh(),
                           fsdp=fsdp, cache=programs)
    trainer = st.trainer
    total = trainer.num_updates
    mngr = ck.manager(out / "checkpoint", keep=keep)
    tracker = open_tracker(track if main else "none", logdir=out / parse_spec(track)[0],
                           config=cfg.to_dict(), quiet=quiet)
    try:
        return _train_loop(cfg, out, st, mngr, total=total, chunk=chunk,
                           checkpoint_every=checkpoint_every,
                           checkpoint_seconds=checkpoint_seconds, resume=resume,
                           quiet=quiet, fsdp=fsdp, stop=stop, command=command, tracker=tracker)
    finally:  # normal end, exception, Ctrl-C: no save is left half done
        ck.wait(mngr)
        mngr.close()
        tracker.close()


def _strong(tree):
    """``tree`` with weak-typed leaves (gymnax's ``EnvState.time = 0``) made strong: a
    restored state has no weak types, so without this a resumed run would compile (and run)
    another program than the uninterrupted one."""
    import jax

    return jax.tree_util.tree_map(
        lambda x: jax.lax.convert_element_type(x, x.dtype) if x.weak_type else x, tree)


def _train_loop(cfg, out, st, mngr, *, total, chunk, checkpoint_every, checkpoint_seconds,
                resume, quiet, fsdp, stop, command, tracker):
    import jax

    from vccc_jax.analysis.train import summarize
    from vccc_jax.train import checkpoint as ck

    main = is_main()
    trainer = st.trainer
    rows: list[dict] = []
    start = ck.latest_step(mngr)
    if start is not None and not resume:
        raise ValueError(f"{out / 'checkpoint'} already holds checkpoints (latest: update "
                         f"{start}): resume the run or use a new directory")
    size = _chunk_size(total, chunk, checkpoint_every)
    if start is None:
        start, state = 0, _strong(st.init())
    else:
        state, meta = ck.restore(mngr, st.abstract_state, st.shardings, step=start)
        if meta.get("config") != cfg.to_dict():
            raise ValueError(f"--resume: {out / 'checkpoint'} was written by a different config")
        rows = list(meta["rows"])
        size = int(meta.get("chunk", size))
    if main:
        record = {"config": cfg.to_dict(), "num_updates": total,
                  "num_versions": trainer.setup.num_versions,
                  "mean_lag_law": cfg.lag_law.mean(trainer.setup.num_versions),
                  "gt_horizon": trainer.setup.gt_horizon, "devices": st.mesh.devices.size,
                  "mesh": dict(st.mesh.shape), "fsdp": fsdp, "processes": jax.process_count(),
                  "provenance": provenance(command)}
        if start:  # a resumed run keeps what started it; each resume adds its provenance
            path = out / "config.json"
            old = json.loads(path.read_text()) if path.exists() else {}
            record["resumed"] = old.get("resumed", []) + [
                dict(record["provenance"], update=start)]
            record["provenance"] = old.get("provenance", record["provenance"])
        (out / "config.json").write_text(json.dumps(record, indent=1))
    progress = None
    if not quiet and main:
        from vccc_jax.runs.progress import Progress

        progress = Progress(total, done=start, label="updates", min_interval=10.0)
    t0 = last_save = time.time()
    t_first, steps_after_first = None, 0  # throughput excludes the first call (compile)
    update = start
    while update < total:
        n = min(size, total - update)
        state, metrics = st.train(state, n, start=update)  # donates state
        metrics = jax.device_get(metrics)
        new_rows = metrics_to_rows(metrics, cfg, update)
        rows.extend(new_rows)
        log_rows(tracker, new_rows)
        update += n
        if t_first is None:
            t_first = time.time()
        else:
            steps_after_first += n * cfg.batch_size * cfg.num_seeds
        # process 0 decides (clocks and Ctrl-C are per process); all take part in the save
        timed = checkpoint_seconds > 0 and time.time() - last_save >= checkpoint_seconds
        stopping = stop is not None and update < total and bool(stop())
        timed, stopping = agree([timed, stopping])
        if (update == total or timed or stopping
                or (checkpoint_every > 0 and update % checkpoint_every == 0)):
            ck.save(mngr, update, state, checkpoint_meta(cfg, update, rows, size), force=True)
            last_save = time.time()
            if main:
                write_csv(rows, out / "metrics.csv")
        if progress is not None:
            ret = np.nanmean(np.asarray(metrics["return"])[-1])
            note = f"return {ret:7.1f}"
            if steps_after_first:
                rate = steps_after_first / max(time.time() - t_first, 1e-9)
                note += f"  {rate / 1e3:6.1f}k steps/s"
            else:
                note += f"  (compiled + first {n} updates in {t_first - t0:.1f}s)"
            progress.advance(n, note=note)
        if stopping:
            if progress is not None:
                progress.close()
            ck.wait(mngr)
            raise Interrupted(update, total)
    if progress is not None:
        progress.close()
    ck.wait(mngr)
    summary = summarize(rows)
    summary["wall_seconds"] = {"mean": time.time() - t0, "ci95": 0.0, "per_seed": []}
    if main:
        write_csv(rows, out / "metrics.csv")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, rows


def run_grid(name: str, cells: list[TrainConfig], out: Path, *, quiet: bool = False,
             on_cell=None, mesh=None, fsdp: bool = False, checkpoint_every: int = 0,
             checkpoint_seconds: float = 0.0,
             stop: Optional[Callable[[], bool]] = None, track: str = "none") -> list[dict]:
    """Run every cell (see :func:`cells`) into the resumable store ``<out>/<name>.jsonl``
    (written by process 0; :mod:`runs.distributed`); ``on_cell(i, n, cfg)`` is called
    before a cell is computed. A cell checkpoints as :func:`run_one` does into its own
    directory ``<out>/<name>/<cell id>/`` and a rerun resumes a cell left half done.
    The cells share one ``train.programs.ProgramCache``: cells that differ only in grid
    values (learning rates, clips, the lag law's parameter, seed) compile once.
    ``track``: each computed cell is one tracked run (:func:`cell_track`).
    ``stop()`` is asked before each cell too: True raises :class:`GridStopped` (a Ctrl-C
    during a cell's last update ends the grid there, not after the next cell's compile).
    Returns ``[{"config", "summary"}]`` in cell order."""
    from vccc_jax.train.programs import ProgramCache

    store_path = out / f"{name}.jsonl"
    results, programs = [], ProgramCache()
    with open_store(store_path) as store:
        ids = [cell_id(cfg.to_dict()) for cfg in cells]
        todo = agree([store.owns(cid) and not store.has(cid) for cid in ids])
        for i, (cfg, cid, run) in enumerate(zip(cells, ids, todo)):
            cell = cfg.to_dict()
            if not run:  # done (by any shard), or another shard's cell
                if store.has(cid):
                    results.append({"config": cell, "summary": store.row(cid)["metrics"]})
                continue
            if stop is not None and agree([bool(stop())])[0]:  # no new cell after Ctrl-C
                raise GridStopped(len(results), len(cells))
            if on_cell is not None:
                on_cell(i, len(cells), cfg)
            t0 = time.time()
            # a cell directory holds only this cell (its id is the config's hash): resume
            # a cell a killed run left half done
            summary, _ = run_one(cfg, out / name / cid, quiet=quiet, mesh=mesh, fsdp=fsdp,
                                 resume=True, checkpoint_every=checkpoint_every,
                                 checkpoint_seconds=checkpoint_seconds, stop=stop,
                                 programs=programs, track=cell_track(track, name, cid))
            store.append({"id": cid, "cell": cell, "metrics": summary,
                          "meta": {"seconds": time.time() - t0, **provenance()}})
            results.append({"config": cell, "summary": summary})
    return results


def cell_track(track: str, name: str, cid: str) -> str:
    """The ``--track`` spec of one grid cell: its own run, in its cell directory
    (``<out>/<name>/<cid>/tensorboard`` or ``.../wandb``), or under ``DIR/<name>/<cid>`` for
    ``tensorboard:DIR`` (so ``tensorboard --logdir`` shows one run per cell)."""
    backend, arg = parse_spec(track)
    if backend == "tensorboard" and arg:
        return f"tensorboard:{Path(arg) / name / cid}"
    return track


def whole_run_results(name: str, cells: list[TrainConfig], out: Path) -> list[dict]:
    """``[{"config", "summary": whole_run_summary}]`` of the grid's finished cells, read from
    their ``<out>/<name>/<cell id>/metrics.csv`` (critic error over the WHOLE run: AUC and
    fixed checkpoints, issue 11 section 3)."""
    from vccc_jax.analysis.train import whole_run_summary

    results = []
    for cfg in cells:
        path = out / name / cell_id(cfg.to_dict()) / "metrics.csv"
        if path.exists():
            results.append({"config": cfg.to_dict(),
                            "summary": whole_run_summary(read_csv(path))})
    return results


def error_curve_rows(store: Path) -> tuple[dict, str]:
    """Per-update rows of every finished cell of a train grid's store ``<out>/<name>.jsonl``,
    keyed ``(panel, label)`` as :func:`vccc_jax.plotting.train.error_curves` wants them
    (panel: lag [+ sampler] [+ env for gymnax]; label: the cell's critic), and the error key
    to draw: ``exact_err_pi`` on envs with exact values, else the Monte-Carlo ``gt_mae``."""
    from vccc_jax.analysis.train import cell_label
    from vccc_jax.runs.store import read_rows

    store = Path(store)
    by = {}
    for r in read_rows(store):
        cell = r.get("cell") or {}
        path = store.parent / store.stem / str(r.get("id")) / "metrics.csv"
        if "lag" not in cell or not path.exists():
            continue
        env = str(cell.get("env", ""))
        panel = " ".join(x for x in (cell["lag"], cell.get("sampler", ""),
                                     "" if env.startswith(("tabular", "token")) else env) if x)
        rows = read_csv(path)
        if rows:
            by[(panel, cell_label(cell))] = rows
    first = next(iter(by.values()))[0] if by else {}
    return by, ("exact_err_pi" if "exact_err_pi" in first else "gt_mae")


def rows_with_whole_run(store: Path) -> list[dict]:
    """The store's rows (``runs.store.read_rows``) with each finished cell's whole-run
    summary (``analysis.train.whole_run_summary`` of its ``metrics.csv``: ``exact_err_pi_auc``,
    ``gt_rel_err_auc``, ...) merged into ``row["metrics"]``, for lag-curve figures."""
    from vccc_jax.analysis.train import whole_run_summary
    from vccc_jax.runs.store import read_rows

    store = Path(store)
    out = []
    for r in read_rows(store):
        path = store.parent / store.stem / str(r.get("id")) / "metrics.csv"
        rows = read_csv(path) if path.exists() else []
        extra = whole_run_summary(rows) if rows else {}
        out.append(dict(r, metrics={**extra, **(r.get("metrics") or {})}))
    return out
