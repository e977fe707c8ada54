"""``vccc bench async``: env steps/s of ``vccc train --async`` against the synchronous trainer on
the same devices, side by side in one process (issue 48).

The synchronous reference is ``train.trainer.Trainer`` (one jitted scan over the updates, on
the default device); the asynchronous run is ``train.async_pipeline.Pipeline`` with its actor
threads and learner on the devices asked for. Both run the same config; each is timed after
a warm-up of ``warmup`` updates that holds its compiles (the sync trainer: a first full call).
What bounds it on CPU: the XLA:CPU intra-op thread pool (each computation may already use
every core, so threads overlap only when ``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``) and, per update, the learner's host round trip (metrics,
the parameter publish). The XLA flags are the process's: compare two processes.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import jax
import numpy as np

__all__ = ["AsyncBench", "bench_async", "format_rows"]


class AsyncBench(NamedTuple):
    name: str
    steps_per_s: float
    seconds: float
    lag_mean: float


def _config(env: str, num_envs: int, num_steps: int, updates: int):
    from vccc_jax.train.config import TrainConfig

    return TrainConfig(env=env, num_envs=num_envs, num_steps=num_steps,
                       total_timesteps=num_envs * num_steps * updates, update_epochs=1,
                       num_minibatches=1, hidden=64, gt_every=0, eval_envs=0)


def sync_rate(cfg, updates: int) -> AsyncBench:
    from vccc_jax.train.trainer import Trainer

    trainer = Trainer(cfg)
    jax.block_until_ready(trainer.train(trainer.init(), updates))  # compile + warm
    state = trainer.init()
    t0 = time.perf_counter()
    jax.block_until_ready(trainer.train(state, updates))
    dt = time.perf_counter() - t0
    return AsyncBench("sync trainer (1 device)", updates * cfg.batch_size / dt, dt, 0.0)


def async_rate(cfg, spec, updates: int, warmup: int) -> AsyncBench:
    from vccc_jax.train import async_pipeline as ap
    from vccc_jax.train.trainer import Trainer

    trainer = Trainer(cfg)  # cfg holds warmup + updates updates
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    pipe = ap.Pipeline(trainer, spec, state, ap.initial_actor_keys(state.key, spec.actors), 0)
    lags, t0 = [], None
    try:
        pipe.start_threads()
        state = jax.device_put(state, pipe.learner_device)
        for k in range(warmup + updates):
            if k == warmup:
                jax.block_until_ready(state)
                t0 = time.perf_counter()
            batch = pipe.next_batch(k)
            state, _ = pipe.learn(state, batch, k)
            pipe.publish(k + 1, state.actor_params)
            if k >= warmup:
                lags.append(k - int(np.asarray(batch.traj.version).mean()))
        jax.block_until_ready(state)
        dt = time.perf_counter() - t0
    finally:
        pipe.close()
    name = (f"async {spec.mode} x{spec.actors} actors dev {','.join(map(str, spec.actor_devices))}"
            f" / learner dev {spec.learner_devices[0]}, queue {spec.queue}")
    return AsyncBench(name, updates * cfg.batch_size / dt, dt, float(np.mean(lags)))


def bench_async(env: str = "CartPole-v1", num_envs: int = 16, num_steps: int = 64,
                updates: int = 40, warmup: int = 4, actors: int = 1, mode: str = "latest",
                queue: int = 2) -> dict:
    """The rows (sync first) and the conditions: devices, XLA flags, load before / after."""
    import dataclasses

    from vccc_jax.train.async_pipeline import AsyncSpec

    cfg = _config(env, num_envs, num_steps, updates)
    n = len(jax.devices())
    spec = AsyncSpec(actors=actors, queue=queue, mode=mode, actor_devices=(0,),
                     learner_devices=(1 if n > 1 else 0,), timeout=600.0)
    load0 = os.getloadavg()
    rows = [sync_rate(cfg, updates)]
    warm_cfg = dataclasses.replace(cfg, total_timesteps=cfg.batch_size * (updates + warmup))
    rows.append(async_rate(warm_cfg, spec, updates, warmup))
    return {"rows": rows, "devices": n, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "load": (load0, os.getloadavg()), "cpus": os.cpu_count(),
            "shape": f"{env} B={num_envs} T={num_steps} x {updates} updates"}


def format_rows(result: dict) -> str:
    rows = result["rows"]
    base = rows[0].steps_per_s
    lines = [f"{'run':<62} {'steps/s':>10} {'x sync':>7} {'s':>6} {'lag':>5}"]
    for r in rows:
        lines.append(f"{r.name:<62} {r.steps_per_s:>10.0f} {r.steps_per_s / base:>7.2f} "
                     f"{r.seconds:>6.2f} {r.lag_mean:>5.2f}")
    (a, b) = result["load"]
    lines.append(f"{result['shape']}; {result['devices']} devices, {result['cpus']} CPUs; load "
                 f"{a[0]:.2f} before, {b[0]:.2f} after; XLA_FLAGS={result['xla_flags']!r}")
    return "\n".join(lines)
