"""Scale-out flags shared by ``vccc sweep`` and ``vccc train --config`` (issue 22):

    vccc sweep --config X --shards 4                      # 4 local jobs (submitit), then the tables
    vccc sweep --config X --shards 64 --launcher slurm --launcher-opt slurm_partition=gpu
    vccc sweep --config X --shard 2/4                     # one shard, any scheduler

Each shard computes the units of work it owns (``runs.store.shard_of``) into its own store
file; readers take the union. Rerunning a launch relaunches every shard (the finished ones
find nothing to do); ``--shard i/N`` reruns one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

LAUNCH_FLAGS = ("--shards", "--launcher", "--launcher-opt", "--launch-dir", "--shard")


def add_shard_flags(p) -> None:
    g = p.add_argument_group("scale-out: one store file per shard (README \"Scale-out\")")
    g.add_argument("--shard", default=None, metavar="i/N",
                   help="compute only shard i of N (its own store file; for any scheduler)")
    g.add_argument("--shards", type=int, default=None, metavar="N",
                   help="launch N shard jobs with submitit, wait, then print the tables")
    g.add_argument("--launcher", default="local", choices=("local", "slurm"),
                   help="with --shards: local subprocesses (default) or a SLURM job array")
    g.add_argument("--launcher-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="submitit parameter (timeout_min, gpus_per_node, slurm_partition, ...)")
    g.add_argument("--launch-dir", default=None,
                   help="submitit's job files and logs (default: <results>/launch/<command>)")


def _strip(argv: list[str]) -> list[str]:
    """``argv`` without the launch flags (and their values)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in LAUNCH_FLAGS:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def scaled(command: str, main: Callable, argv: Optional[list[str]], args,
           body: Callable[[], int], results: Path) -> Callable[[], int]:
    """The thunk a command returns for ``body`` (validated here, before anything runs):

    * no shard flags: ``body``;
    * ``--shard i/N``: ``body`` with every store opened in that shard (``runs.store.sharded``);
    * ``--shards N``: submit N jobs of this command (``main``, argv + ``--shard i/N``), wait,
      then run ``body`` once: every cell is done, so it only reads the union and prints.
    """
    from vccc_jax.runs.launch import check, parse_options
    from vccc_jax.runs.store import Shard, parse_shard, sharded

    if args.shard is not None and args.shards is not None:
        raise ValueError("--shard and --shards exclude each other")
    if args.shard is not None:
        shard = parse_shard(args.shard)

        def one() -> int:
            with sharded(shard):
                return body()

        return one
    if args.shards is None:
        return body
    if args.shards < 1:
        raise ValueError(f"--shards must be >= 1, got {args.shards}")
    options = parse_options(args.launcher_opt)
    check(args.launcher)
    base = _strip(list(sys.argv[2:] if argv is None else argv))
    folder = Path(args.launch_dir) if args.launch_dir else Path(results) / "launch" / command

    def launch() -> int:
        from vccc_jax.runs.launch import submit, wait

        shards = [Shard(i, args.shards) for i in range(args.shards)]
        jobs = submit(main, [base + ["--shard", str(s)] for s in shards], shards,
                      launcher=args.launcher, folder=folder, options=options,
                      name=f"vccc-{command}")
        print(f"vccc {command}: {len(jobs)} shard jobs ({args.launcher}), logs in {folder}",
              file=sys.stderr, flush=True)
        results_ = wait(jobs, shards)
        failed = [r for r in results_ if not r.ok]
        for r in failed:
            print(f"vccc {command}: shard {r.shard} failed ({r.error}); log {r.log}; resume "
                  f"it alone with --shard {r.shard}, or rerun this command", file=sys.stderr)
        if failed:
            return 1
        return body()

    return launch
