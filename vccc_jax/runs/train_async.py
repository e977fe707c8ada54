"""``vccc train --async``: one run of the real asynchronous pipeline (``train.async_pipeline``).

:func:`run_async` writes the run directory of any ``vccc train`` run (``runs.train``):
``config.json`` (plus an ``"async"`` block: the :class:`AsyncSpec`), ``metrics.csv`` (the
trainer's columns and the measured lag of ``train.async_lag``: version_diff_min / avg / max,
lag_hist<j>, traj_staleness_*, traj_lag_hist<j>, traj_multi_version_frac, lag_len_corr,
lag_value_corr; ``dropped`` rollouts under ``bounded:N``; ``learner_wait_s``), ``summary.json``,
``checkpoint/`` and ``lags.trace`` (the measured per-(update, env) lags, and the lags of the
rollouts ``bounded:N`` dropped, that the simulator's ``trace`` law replays: ``--lag
trace:@<run>/lags.trace``).

Several processes (``jax.distributed``, e.g. ``--coordinator``): every process runs its own
actor threads on its own devices (``--actor-devices`` / ``--learner-devices`` index each
process's local devices); the learner is one program over a mesh of every process's learner
devices, each update's batch assembled from every process's rollouts (process p's actors
hold envs p x B / P onwards); the processes agree each update that every one has its batch
and whether to stop (process 0's Ctrl-C), so a failure or interrupt stops all at the same
update; process 0 writes the rows, ``lags.trace`` and the summary (``dropped`` and
``learner_wait_s`` are its own), every process its shards of the checkpoints.

One seed per run (one pipeline). Checkpoints hold the learner's state, the actors' key
chains and the env carries after the last rollout consumed; rollouts in the queues when a
run stops are discarded, so ``resume`` continues from a consistent state (the first
rollouts after a resume act with the resumed version: lag 0). An actor thread that raises
stops the run with ``train.async_pipeline.ActorFailed``; the rows and a checkpoint of the
last finished update are written first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.provenance import provenance
from vccc_jax.runs.tracking import log_rows, open_tracker, parse_spec
from vccc_jax.runs.train import Interrupted, checkpoint_meta, metrics_to_rows, write_csv
from vccc_jax.train.config import TrainConfig

__all__ = ["ProcessStopped", "run_async"]


class ProcessStopped(RuntimeError):
    """Several processes: another process stopped (its actor failed, it timed out); this one
    stops at the same update (rows and checkpoint kept)."""


def run_async(cfg: TrainConfig, spec, out: Path, *, checkpoint_every: int = 0,
              resume: bool = False, keep: int = 3, stop: Optional[Callable[[], bool]] = None,
              command: Optional[list[str]] = None, track: str = "none",
              on_update: Optional[Callable[[int, dict], None]] = None
              ) -> tuple[dict, list[dict]]:
    """Train ``cfg`` (one seed) with the asynchronous pipeline ``spec`` into ``out``.

    ``stop()`` is asked after every update: True checkpoints there and raises
    ``runs.train.Interrupted``. ``on_update(update, row)`` (progress) after each update.
    Returns (summary, rows)."""
    from vccc_jax.train import checkpoint as ck

    if cfg.num_seeds != 1:
        raise ValueError(f"--async runs one seed per pipeline; got num_seeds {cfg.num_seeds}")
    from vccc_jax.runs.distributed import is_main

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mngr = ck.manager(out / "checkpoint", keep=keep)
    track = track if is_main() else "none"  # several processes: process 0 writes
    tracker = open_tracker(track, logdir=out / parse_spec(track)[0], config=cfg.to_dict())
    try:
        return _loop(cfg, spec, out, mngr, checkpoint_every=checkpoint_every, resume=resume,
                     stop=stop, command=command, tracker=tracker, on_update=on_update)
    finally:
        ck.wait(mngr)
        mngr.close()
        tracker.close()


def _all_processes(flag: bool):
    """Several processes: [P] ``flag`` of every process, else [flag] (a collective)."""
    import jax

    if jax.process_count() == 1:
        return np.asarray([flag])
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(flag, np.int32))).reshape(-1)


def _next_batch(pipe, update: int):
    """``pipe.next_batch``; with several processes they first agree that every one has its
    batch (else all stop: a process waiting in the learner's collectives would hang)."""
    try:
        batch, err = pipe.next_batch(update), None
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - re-raised below
        batch, err = None, e
    failed = _all_processes(err is not None)
    if err is not None:
        raise err
    if failed.any():
        raise ProcessStopped(f"process {int(np.argmax(failed))} stopped before update {update} "
                             "(its error is in its own output)")
    return batch


def _keys(keys):
    """The actors' key chains of every process, [P x N, 2] (one process: as they are)."""
    import jax

    if jax.process_count() == 1:
        return keys
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(keys))).reshape(-1, 2)


def _write_config(cfg, spec, out: Path, start: int, trainer, command) -> None:
    record = {"config": cfg.to_dict(), "async": spec.to_dict(),
              "num_updates": trainer.num_updates, "provenance": provenance(command)}
    path = out / "config.json"
    if start and path.exists():
        old = json.loads(path.read_text())
        record["resumed"] = old.get("resumed", []) + [dict(record["provenance"], update=start)]
        record["provenance"] = old.get("provenance", record["provenance"])
    path.write_text(json.dumps(record, indent=1))


def _loop(cfg, spec, out, mngr, *, checkpoint_every, resume, stop, command, tracker,
          on_update):
    import jax

    from vccc_jax.analysis.train import summarize
    from vccc_jax.runs.distributed import agree, is_main
    from vccc_jax.runs.train import _strong
    from vccc_jax.train import async_lag as al
    from vccc_jax.train import async_pipeline as ap
    from vccc_jax.train import checkpoint as ck
    from vccc_jax.train.sharding import gather_to_host
    from vccc_jax.train.trainer import Trainer

    main = is_main()
    trainer = Trainer(cfg)
    total = trainer.num_updates
    state = jax.tree_util.tree_map(lambda x: x[0], _strong(trainer.init()))
    tree = {"state": state, "actor_keys": ap.initial_actor_keys(
        state.key, spec.actors * jax.process_count())}
    rows, trace, trajs = [], al.LagTrace(), al.TrajectoryLags(cfg.num_envs)
    start = ck.latest_step(mngr)
    if start is not None and not resume:
        raise ValueError(f"{out / 'checkpoint'} already holds checkpoints (latest: update "
                         f"{start}): resume the run or use a new directory")
    if start is None:
        start = 0
    else:
        tree, meta = ck.restore(mngr, tree, step=start)
        if meta.get("config") != cfg.to_dict() or meta.get("async") != spec.to_dict():
            raise ValueError(f"--resume: {out / 'checkpoint'} was written by a different "
                             "config or --async setting")
        rows, trace = list(meta["rows"]), al.LagTrace(meta["trace"], meta.get("trace_drops"))
        trajs.load(meta["traj_lags"])
    if main:
        _write_config(cfg, spec, out, start, trainer, command)

    def save(update: int, tree_) -> None:
        meta = checkpoint_meta(cfg, update, rows, 1) | {
            "async": spec.to_dict(), "trace": trace.rows, "trace_drops": trace.drops, "traj_lags": trajs.state()}
        if ck.latest_step(mngr) != update:
            ck.save(mngr, update, tree_, meta, force=True)
        if main:
            write_csv(rows, out / "metrics.csv")
            trace.write(out)

    pipe = ap.Pipeline(trainer, spec, tree["state"], tree["actor_keys"], start)
    t0, update = time.time(), start
    try:
        pipe.start_threads()
        state = pipe.place_state(tree["state"])
        while update < total:
            batch = _next_batch(pipe, update)
            state, metrics = pipe.learn(state, batch, update)
            pipe.publish(update + 1, state.actor_params, state.critic_params)
            version, done, metrics = gather_to_host(
                (batch.traj.version, batch.traj.episode_done, metrics))
            lag = update - np.asarray(version)
            row = metrics_to_rows({k: np.asarray(v)[None, None] for k, v in metrics.items()},
                                  cfg, update)[0]
            row.update(al.transition_metrics(lag))
            row.update(trajs.update(np.asarray(version), lag, np.asarray(done)))
            row.update(dropped=batch.dropped, learner_wait_s=batch.wait_s)
            # several processes: each sees only its own actors' drops, so none are traced
            drops = batch.drop_versions if pipe.procs == 1 else ()
            trace.add(lag[0], al.drop_lags(update, drops, cfg.num_envs))
            rows.append(row)
            log_rows(tracker, [row])
            update += 1
            tree = {"state": state, "actor_keys": _keys(batch.actor_keys)}
            if on_update is not None:
                on_update(update, row)
            stopping = stop is not None and update < total and bool(stop())
            if jax.process_count() > 1:  # process 0's Ctrl-C stops every process
                stopping = agree([stopping])[0]
            if update == total or stopping or (checkpoint_every > 0
                                               and update % checkpoint_every == 0):
                save(update, tree)
            if stopping:
                ck.wait(mngr)
                raise Interrupted(update, total)
    except (ap.ActorFailed, TimeoutError, RuntimeError):
        if update > start:  # every row so far, and the state after the last update
            save(update, tree)
        raise
    finally:
        pipe.close()
    ck.wait(mngr)
    summary = summarize(rows)
    summary["wall_seconds"] = {"mean": time.time() - t0, "ci95": 0.0, "per_seed": []}
    if main:
        write_csv(rows, out / "metrics.csv")
        trace.write(out)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, rows
