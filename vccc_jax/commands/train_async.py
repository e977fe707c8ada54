"""``vccc train --async``: the real actor-learner pipeline (issue 48; ``runs.train_async``).

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    vccc train --async --env CartPole-v1 --actor-threads 2 --param-mode latest \\
        --actor-devices 0 --learner-devices 1 --out results/async_demo

Across hosts: the same command on every host with ``--coordinator HOST:PORT --num-processes
P --process-id I`` (or VCCC_* variables, a SLURM / MPI launch); each host runs its actor
threads, the learner's mesh spans every host's ``--learner-devices``.

On CPU the devices are forced host devices: without ``XLA_FLAGS`` naming a count, ``--async``
sets ``--xla_force_host_platform_device_count`` to the largest index asked for + 1 (before
JAX starts). Ctrl-C checkpoints after the update in flight and exits 130; ``--out DIR
--resume`` continues. An actor thread that raises stops the run: one line naming the thread
and its error, exit 1, the rows and the last update's checkpoint kept.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["add_async_flags", "check", "force_host_devices", "single", "spec_of"]


def _indices(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"device list must be integers separated by commas, got {text!r}") \
            from None
    if not out or min(out) < 0:
        raise ValueError(f"device list must hold indices >= 0, got {text!r}")
    return out


def add_async_flags(p) -> None:
    """The ``--async`` flag block (pure Python)."""
    g = p.add_argument_group("asynchronous pipeline (issue 48): actor threads + a learner on "
                             "JAX devices")
    g.add_argument("--async", dest="async_run", action="store_true",
                   help="train with real actor threads and a learner (one seed; the --lag law "
                   "is not used: the lag is what the pipeline produces, in metrics.csv and "
                   "lags.trace)")
    g.add_argument("--actor-threads", type=int, default=1, help="actor threads (default 1)")
    g.add_argument("--queue-size", type=int, default=1,
                   help="rollouts each actor may queue ahead of the learner (default 1)")
    g.add_argument("--param-mode", default="lag1", metavar="MODE",
                   help="lag1 (exactly one version stale) | latest (newest, no wait) | "
                   "bounded:N (the learner drops rollouts older than N; counted) (default lag1)")
    g.add_argument("--actor-devices", default="0", metavar="I,J",
                   help="device indices of the actor threads (default 0)")
    g.add_argument("--learner-devices", default="0", metavar="I,J",
                   help="device indices of the learner (default 0); several: the learner's "
                   "state and batch on a mesh over them (the sharded trainer's layout)")
    g.add_argument("--actor-sync-every", type=int, default=0, metavar="M",
                   help="actors take new parameters every M steps inside a rollout (M divides "
                   "--num-steps; every step keeps its own version; lag1: the chunks after the "
                   "first wait for the newest version) (default 0: once per rollout)")
    g.add_argument("--queue-timeout", type=float, default=300.0, metavar="S",
                   help="longest wait on any queue or parameter version, seconds (default 300)")


def check(args, exp) -> None:
    """Refuse what --async does not run (pure Python)."""
    if not args.async_run:
        return
    if exp is not None and exp.grid.axes:
        raise ValueError("--async runs one configuration; a --config grid is not supported")
    if getattr(args, "critic_free", None):
        raise ValueError("--async trains an actor-critic; --critic-free is not supported")
    if getattr(args, "devices", None) is not None or getattr(args, "mesh", None):
        raise ValueError("--devices / --mesh shape the synchronous trainer's mesh; with --async "
                         "the devices are --actor-devices and --learner-devices I,J (a mesh "
                         "over the learner's devices)")
    spec_of(args, check_only=True)


def spec_of(args, check_only: bool = False):
    """The ``AsyncSpec`` of the flags (``check_only``: validate in pure Python only)."""
    fields = dict(actors=args.actor_threads, queue=args.queue_size, mode=args.param_mode,
                  actor_devices=_indices(args.actor_devices),
                  learner_devices=_indices(args.learner_devices), timeout=args.queue_timeout,
                  sync_every=args.actor_sync_every)
    if check_only:
        return fields
    from vccc_jax.train.async_pipeline import AsyncSpec

    return AsyncSpec(**fields)


def force_host_devices(args) -> None:
    """Before JAX starts: force enough CPU host devices for the indices asked for, unless
    XLA_FLAGS already names a count (or JAX is already running)."""
    if not args.async_run or "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    need = max(_indices(args.actor_devices) + _indices(args.learner_devices)) + 1
    if need > 1:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={need}".strip()


def single(cfg, out: Path, args, resume: bool, command: list) -> int:
    """One --async run; the exit status (0, 1: an actor thread failed, 130: Ctrl-C)."""
    from vccc_jax.commands.interrupt import EXIT_INTERRUPTED, SigintStops
    from vccc_jax.runs.run_dir import checkpoint_steps
    from vccc_jax.runs.train import Interrupted
    from vccc_jax.runs.train_async import ProcessStopped, run_async
    from vccc_jax.train.async_pipeline import ActorFailed

    every, _ = args.checkpoint_every
    spec = spec_of(args)

    def kept() -> str:
        steps = checkpoint_steps(out)
        return (f"rows and the checkpoint at update {steps[-1]} kept in {out}" if steps
                else f"no update finished; {out} holds no checkpoint")

    try:
        with SigintStops(lambda: f"interrupted; {kept()}") as stop:
            summary, rows = run_async(cfg, spec, out, checkpoint_every=every, resume=resume,
                                      keep=args.keep, stop=stop, command=command,
                                      track=args.track)
    except Interrupted as e:
        print(f"vccc train: interrupted after update {e.update} of {e.total}; checkpoint "
              f"saved: `--out {out} --resume` continues it", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ActorFailed, TimeoutError, ProcessStopped) as e:
        print(f"vccc train: {e}; {kept()}", file=sys.stderr)
        return 1
    from vccc_jax.runs.distributed import is_main

    if not is_main():  # several processes: process 0 writes and prints
        return 0
    if not args.no_figure:
        from vccc_jax import plotting

        plotting.plot_learning_curves(
            rows, out / "curves.png",
            f"{cfg.env}  async {spec.mode} x{spec.actors}  critic {cfg.critic}  "
            f"actor {cfg.actor}")
    print("\n".join(summary_lines(summary, rows)))
    print(f"results: {out}")
    return 0


def summary_lines(summary: dict, rows: list[dict]) -> list[str]:
    """The console summary of an async run: each number with its interval text
    (``analysis.train.format_interval``) and the window it averages over (issue 45 row 8)."""
    from vccc_jax.analysis.train import format_interval

    lines = [f"{k:>18}: {format_interval(summary[k])}; {summary[k]['window']}"
             for k in ("final_return", "lag_mean") if k in summary]
    last = rows[-1] if rows else {}
    mean = sum(r["version_diff_avg"] for r in rows) / max(len(rows), 1)
    lines.append(f"{'version_diff_avg':>18}: {mean:.3f}; mean over all {len(rows)} updates (the "
                 f"last: min {last.get('version_diff_min')}, max {last.get('version_diff_max')})")
    return lines
