"""Run directories hold exactly one run (issue 23, DESIGN section 8).

A ``vccc train`` run directory (``runs.train.run_one``) holds ``RUN_FILES``: config.json
(written first), metrics.csv, summary.json, curves.png, checkpoint/ (orbax steps) and
tensorboard/ or wandb/ (``--track``). Before any compute, :func:`prepare` decides what a command may
do with ``--out``:

* a new or empty directory: start;
* a directory holding another config, or files that are not a run: refuse;
* the same config: refuse unless ``resume`` (continue from its latest checkpoint; from
  update 0 when it stopped before its first save: the same run, from its start);
* ``overwrite``: a run directory (of any config) is emptied and started over; nothing but
  the run's own files is ever deleted.

:func:`prepare` only looks; :func:`make` (called once every other check has passed) creates
the directory, locks it for the run (:func:`lock`: a second ``vccc train`` on the same
directory is refused, exit 3, as ``vccc sweep`` refuses a second writer of its store), checks
it again under the lock and empties it for ``overwrite``.

:func:`run_name` is the default directory name: readable fields, the config hash and the
start time (as CleanRL's run names), so two runs never share a default directory.
Pure Python (no JAX): commands check ``--out`` before they import it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Optional

from vccc_jax.runs.store import cell_id, lock_exclusive

RUN_FILES = ("config.json", "metrics.csv", "summary.json", "curves.png", "checkpoint", "tensorboard",
             "wandb", "lags.trace")  # lags.trace: the measured lags of vccc train --async
START, RESUME, OVERWRITE = "start", "resume", "overwrite"


def run_name(config: dict, now: Optional[_dt.datetime] = None) -> str:
    """``<env>_<lag>_<critic>_<actor>_s<seeds>_<hash8>_<YYYYmmdd-HHMMSS>`` (UTC), with
    characters that are awkward in paths replaced by ``-``."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    head = "_".join(str(config.get(k, "")) for k in ("env", "lag", "critic", "actor"))
    name = f"{head}_s{config.get('num_seeds', 1)}_{cell_id(config)[:8]}_{now:%Y%m%d-%H%M%S}"
    for ch in ':/,= ':
        name = name.replace(ch, "-")
    return name


def new_dir(parent: Path, name: str) -> Path:
    """Create and return ``parent/name`` (``name-2``, ``-3``, ... if it exists): a default
    run directory is never shared, even by two runs started in the same second."""
    for i in range(1, 1000):
        path = Path(parent) / (name if i == 1 else f"{name}-{i}")
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise ValueError(f"--out {path} cannot be created: {e.strerror or e}") from None
    raise ValueError(f"--out: no free run directory named {name} in {parent}")


def saved_config(out: Path) -> Optional[dict]:
    """The config recorded in ``<out>/config.json`` (None: no run recorded there)."""
    try:
        return json.loads((Path(out) / "config.json").read_text())["config"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--out {out}: config.json is not a vccc train run record") from None


def checkpoint_steps(out: Path) -> list[int]:
    """Finished checkpoint steps in ``<out>/checkpoint`` (orbax renames a step's directory
    into place only when its save has committed, so a digit name is a finished step)."""
    ckpt = Path(out) / "checkpoint"
    if not ckpt.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit() and p.is_dir())


def _differences(saved: dict, config: dict, limit: int = 3) -> str:
    keys = [k for k in sorted(set(saved) | set(config)) if saved.get(k) != config.get(k)]
    text = ", ".join(f"{k} {saved.get(k)!r} -> {config.get(k)!r}" for k in keys[:limit])
    return text + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _creatable(out: Path) -> None:
    """ValueError if ``out`` (which does not exist) cannot be created: its nearest existing
    ancestor must be a writable directory."""
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--out {out} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} cannot be created: {parent} is not writable")


def prepare(out: Path, config: dict, *, resume: bool = False, overwrite: bool = False) -> str:
    """What a run of ``config`` (a TrainConfig dict) may do with the directory ``out``:
    START, RESUME or OVERWRITE; ValueError (one line) for every refusal above and for a
    directory that cannot be created. Changes nothing on disk (see :func:`make`)."""
    out = Path(out)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory")
    if not out.exists():
        _creatable(out)
    elif not os.access(out, os.W_OK | os.X_OK):  # empty or not: before any compute
        raise ValueError(f"--out {out} is not writable")
    if not out.exists() or not any(out.iterdir()):
        if resume:
            raise ValueError(f"--resume: {out} holds no run to resume (no checkpoint)")
        return START
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name not in RUN_FILES and not p.name.endswith(".tmp"))
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise ValueError(f"--out {out} is not empty and is not a vccc train run ({shown}): "
                         "choose a new or empty directory")
    if overwrite:
        return OVERWRITE
    saved = saved_config(out)
    if saved is None:
        raise ValueError(f"--out {out} holds run files but no config.json: --overwrite "
                         "starts over there")
    if saved != config and resume:
        raise ValueError(f"--resume: --out {out} holds a run of another config "
                         f"({_differences(saved, config)}): `--out {out} --resume` alone "
                         "continues that run; give a new --out for this config")
    if saved != config:
        raise ValueError(f"--out {out} holds a run of another config "
                         f"({_differences(saved, config)}): choose another --out, or "
                         "--overwrite to replace that run")
    steps = checkpoint_steps(out)
    if resume:  # no checkpoint yet (stopped before its first save): from update 0
        return RESUME
    where = f"checkpoint at update {steps[-1]}" if steps else "no checkpoint"
    raise ValueError(f"--out {out} already holds this run ({where}): --resume continues it, "
                     "--overwrite starts it over")


def lock(out: Path) -> int:
    """Hold the run directory ``out`` for this process (an exclusive ``flock`` on the
    directory itself, as ``vccc sweep`` locks its store file: ``runs.store.lock_exclusive``);
    returns the descriptor to close when the run ends (the process's end releases it too).
    StoreLockedError if another process holds it."""
    return lock_exclusive(os.open(out, os.O_RDONLY | os.O_DIRECTORY),
                          f"--out {out}: another vccc train is running in this directory; "
                          "wait for it to end, or choose another --out")


def make(out: Path, mode: str, config: dict) -> int:
    """Create ``out`` and lock it (:func:`lock`), check it again under the lock (another run
    may have started there since :func:`prepare` looked: ValueError as :func:`prepare`), then
    keep it (START, RESUME) or empty it of the run's files (OVERWRITE: nothing else is
    there). Returns the lock's descriptor. ValueError if it cannot be made."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out} cannot be created: {e.strerror or e}") from None
    fd = lock(out)
    try:
        again = prepare(out, config, resume=mode == RESUME, overwrite=mode == OVERWRITE)
    except ValueError:
        os.close(fd)
        raise
    if again != mode and not (mode == OVERWRITE and again == START):
        os.close(fd)
        raise ValueError(f"--out {out} changed while this run was being checked (now: "
                         f"{again}); run the command again")
    if mode == OVERWRITE:
        for path in out.iterdir():
            if path.name in RUN_FILES or path.name.endswith(".tmp"):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
    return fd
