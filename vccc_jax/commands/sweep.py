"""``vccc sweep``: a tabular staleness sweep, an async actor-critic grid or a comparator
study (kinds critic_free, decoupled, rac, rac_wallclock), resumable.

    vccc sweep                                     # experiments/tabular_default.toml
    vccc sweep --config experiments/async_ac.toml  # kind = "async_ac"
    vccc sweep --config experiments/rac_two_channel.toml   # kind = "rac"

Interrupt it at any point (Ctrl-C, SIGKILL) and run the same command again: finished cells
are kept and only the missing ones are computed (``runs.store``).

Tabular sweeps scale out (issue 10): ``--devices 8`` / ``--mesh data=8`` splits every
group's batch of cells over the mesh's "data" axis (the same rows as one device);
``--coordinator HOST:PORT --num-processes N --process-id I`` (or VCCC_*; ``auto`` or a
SLURM / Open MPI / TPU pod launch: detected) runs it on several hosts, process 0 writing.

Every kind scales out over machines (issue 22): ``--shards N [--launcher local|slurm]``
launches N shard jobs, ``--shard i/N`` runs one (``commands.shards``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from vccc_jax.commands.common import Parser, fail, guarded
from vccc_jax.commands.shards import add_shard_flags, scaled
from vccc_jax.commands.train import (
    add_distributed_flags,
    add_mesh_flags,
    mesh_of,
    start_distributed,
)
from vccc_jax.runs import schema


def build_parser() -> Parser:
    p = Parser(prog="vccc sweep",
               description="Staleness x clipping sweep on tabular MDPs, or an async actor-critic "
               "grid (resumable: rerun the same command after an interruption).")
    p.add_argument("--config", default=None,
                   help="experiment .toml (kind tabular_sweep, async_ac, critic_free, decoupled, rac or "
                   "rac_wallclock; default: "
                   "experiments/tabular_default.toml)")
    p.add_argument("--results", default="results", help="result store directory (default: results)")
    p.add_argument("--figures", default="figures", help="figure directory (default: figures)")
    p.add_argument("--no-figures", action="store_true", help="skip writing figures")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_mesh_flags(p)
    add_distributed_flags(p)
    add_shard_flags(p)
    return p


@guarded("sweep")
def main(argv: Optional[list[str]] = None):
    started = start_distributed(argv)  # before any jax array exists
    args = build_parser().parse_args(argv)
    exp = schema.load(args.config or schema.default_path())
    args.mesh_obj = None
    if args.devices is not None or args.mesh is not None or (
            started and exp.kind == "tabular_sweep"):  # several hosts: all their devices
        if exp.kind != "tabular_sweep":
            raise ValueError(f"--devices/--mesh split tabular sweeps; {exp.path} is {exp.kind!r}")
        args.mesh_obj = mesh_of(args)
    if exp.kind == "tabular_sweep":
        from vccc_jax.runs import tabular_config

        cfg, body = tabular_config.config_of(exp), _tabular
    elif exp.kind == "async_ac":
        from vccc_jax.runs import async_ac

        cfg, body = async_ac.config_of(exp), _async_ac
    elif exp.kind == "critic_free":  # GRPO vs PS-PPO grid (commands/critic_free.py)
        from vccc_jax.commands import critic_free
        from vccc_jax.runs.critic_free import validate

        validate(exp)
        cfg, body = exp, critic_free.run
    elif exp.kind == "decoupled":  # exact pi_old-route study (runs/decoupled.py)
        from vccc_jax.runs.decoupled import validate

        validate(exp)
        cfg, body = exp, _decoupled
    elif exp.kind == "rac":  # exact RAC bias cut (runs/rac.py)
        from vccc_jax.runs.rac import validate_bias_cut

        validate_bias_cut(exp)
        cfg, body = exp, _rac
    elif exp.kind == "rac_wallclock":  # RAC vs wait-for-slow in wall-clock (runs/rac_wallclock.py)
        from vccc_jax.runs.rac_wallclock import validate_wallclock

        validate_wallclock(exp)
        cfg, body = exp, _rac
    else:
        raise ValueError(f"{exp.path}: kind {exp.kind!r} runs with `vccc train`, not `vccc sweep`")
    return scaled("sweep", main, argv, args, lambda: _interruptible(body, cfg, args),
                  Path(args.results))


def _interruptible(body, cfg: dict, args) -> int:
    from vccc_jax.runs.store import StoreLockedError

    t0 = time.perf_counter()
    try:
        return body(cfg, args, t0)
    except KeyboardInterrupt:
        # The store is closed (every finished row is fsynced). Exit at once: interpreter
        # teardown after an XLA compile was interrupted can crash (seen: SIGSEGV at exit).
        print("\nvccc sweep: interrupted; finished cells are saved -- rerun the same command "
              "to resume.", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    except StoreLockedError as e:
        fail("sweep", e)
        return 3


def _tabular(cfg: dict, args, t0: float) -> int:
    from vccc_jax.analysis.tabular import summary_table
    from vccc_jax.runs.distributed import is_main
    from vccc_jax.runs.progress import format_seconds
    from vccc_jax.runs.tabular_config import expand, num_cells
    from vccc_jax.runs.tabular_sweep import run_sweep

    path, rows = run_sweep(cfg, args.results, progress=not args.no_progress,
                           mesh=args.mesh_obj)
    if not is_main():
        return 0
    wall = time.perf_counter() - t0
    print(summary_table(rows, cfg))
    total = num_cells(expand(cfg))
    print(f"\n{len(rows)}/{total} cells in {path} ({format_seconds(wall)} wall this run)")
    if not args.no_figures and len(rows):
        from vccc_jax import plotting

        out = Path(args.figures) / cfg["name"]
        paths = plotting.make_figures(rows, out)
        print(f"figures: {len(paths)} files in {out}")
    return 0


def _async_ac(cfg: dict, args, t0: float) -> int:
    from vccc_jax.analysis import async_ac as stats
    from vccc_jax.runs import async_ac
    from vccc_jax.runs.progress import format_seconds

    def on_chunk(mode, done, lanes, seconds):
        print(f"async_ac {mode}: {done}/{lanes} runs ({seconds:.1f}s)", file=sys.stderr,
              flush=True)

    path, rows = async_ac.run_sweep(cfg, args.results, progress=not args.no_progress,
                                    on_chunk=on_chunk)
    print(stats.summary_table(rows))
    print()
    print(stats.ratio_table(rows))
    wall = time.perf_counter() - t0
    print(f"\n{len(rows)}/{len(async_ac.grid_cells(cfg))} cells in {path} "
          f"({format_seconds(wall)} wall this run)")
    if not args.no_figures and rows:
        from vccc_jax import plotting

        out = Path(args.figures) / cfg["name"]
        paths = []
        for mode in cfg["modes"]:
            for kind in cfg["actor_kinds"]:
                fig = plotting.fig_async_ac(rows, mode, kind)
                paths += plotting.save(fig, out / f"{mode}_{kind}")
        print(f"figures: {len(paths)} files in {out}")
    return 0


def _decoupled(exp, args, t0: float) -> int:
    from vccc_jax.runs import decoupled
    from vccc_jax.runs.progress import format_seconds

    path, result = decoupled.run_study(exp, args.results, progress=not args.no_progress)
    print(decoupled.summary_table(result))
    print(f"\n{len(result['rows'])} route rows in {path} "
          f"({format_seconds(time.perf_counter() - t0)} wall this run)")
    if not args.no_figures:  # the same figure as notebooks/comparators.py (vccc figures)
        from vccc_jax.plotting import comparators, save

        fig = comparators.fig_decoupled_routes(result, noise=result["threshold_axes"]["noise"])
        print(f"figures: {', '.join(map(str, save(fig, Path(args.figures) / exp.name)))}")
    return 0


def _rac(exp, args, t0: float) -> int:
    from vccc_jax.runs import rac, rac_wallclock
    from vccc_jax.runs.progress import format_seconds

    bias_cut = exp.kind == "rac"
    run = rac.run_bias_cut if bias_cut else rac_wallclock.run_wallclock
    path, rows = run(exp, args.results, progress=not args.no_progress)
    print(rac.bias_cut_table(rows) if bias_cut else rac_wallclock.wallclock_table(rows))
    print(f"\n{len(rows)} rows in {path} ({format_seconds(time.perf_counter() - t0)} wall this run)")
    if not args.no_figures and rows:  # the same figures as notebooks/comparators.py
        from vccc_jax.plotting import comparators, save

        fig = comparators.fig_rac_bias_cut(rows) if bias_cut else comparators.fig_rac_wallclock(rows)
        print(f"figures: {', '.join(map(str, save(fig, Path(args.figures) / exp.name)))}")
    return 0
