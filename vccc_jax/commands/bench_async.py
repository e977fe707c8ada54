"""``vccc bench async``: env steps/s of ``vccc train --async`` vs the synchronous trainer (issue 48).

    vccc bench async [--envs 16] [--steps 64] [--updates 40] [--actors 1] [--mode latest]
                     [--queue 2] [--single-thread-ops]

Runs with two forced host devices on CPU (actor thread on device 0, learner on device 1)
unless XLA_FLAGS names a count. ``--single-thread-ops`` adds
``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` (each computation on
one core, so actor and learner threads can overlap); both are set before JAX starts.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from vccc_jax.commands.common import Parser

SINGLE = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def async_parser() -> Parser:
    p = Parser(prog="vccc bench async", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--actors", type=int, default=1)
    p.add_argument("--mode", default="latest")
    p.add_argument("--queue", type=int, default=2)
    p.add_argument("--single-thread-ops", action="store_true",
                   help=f"XLA:CPU intra-op threads off ({SINGLE})")
    return p


def bench_async(argv: list[str]) -> Callable[[], int]:
    args = async_parser().parse_args(argv)
    if min(args.envs, args.steps, args.updates, args.actors, args.queue) < 1:
        raise ValueError("--envs, --steps, --updates, --actors and --queue must be >= 1")
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            flags += " --xla_force_host_platform_device_count=2"
        if args.single_thread_ops and "multi_thread_eigen" not in flags:
            flags += " " + SINGLE
        os.environ["XLA_FLAGS"] = flags.strip()

    def run() -> int:
        from vccc_jax.benchmarks.train_async import bench_async as measure
        from vccc_jax.benchmarks.train_async import format_rows

        print(format_rows(measure(args.env, args.envs, args.steps, args.updates, args.warmup,
                                  args.actors, args.mode, args.queue)), flush=True)
        return 0

    return run
