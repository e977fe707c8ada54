"""``vccc sweep``: a tabular staleness sweep, an async actor-critic grid, a comparator
study (kinds critic_free, decoupled, rac, rac_wallclock) or the actor x critic correction map
(kind actor_map), resumable.

    vccc sweep                                     # experiments/tabular_default.toml
    vccc sweep --config experiments/async_ac.toml  # kind = "async_ac"
    vccc sweep --config experiments/rac_two_channel.toml   # kind = "rac"
    vccc sweep --set base.num_mdps=4 --set grid.mean_lags=0,1,2   # override the file
    vccc sweep --dry-run                           # grid size and ETA, nothing computed
    vccc sweep --export csv > tabular_default.csv  # the store as one flat table
    vccc sweep --track tensorboard                 # + <results>/tensorboard/<name>/

Interrupt it at any point (Ctrl-C, SIGKILL) and run the same command again: finished cells
are kept and only the missing ones are computed (``runs.store``).

Tabular sweeps scale out (issue 10): ``--devices 8`` / ``--mesh data=8`` splits every
group's batch of cells over the mesh's "data" axis (the same rows as one device);
``--coordinator HOST:PORT --num-processes N --process-id I`` (or VCCC_*; ``auto`` or a
SLURM / Open MPI / TPU pod launch: detected) runs it on several hosts, process 0 writing.

Every kind scales out over machines (issue 22): ``--shards N [--launcher local|slurm]``
launches N shard jobs, ``--shard i/N`` runs one (``commands.shards``); ``--dry-run``,
``--export`` and ``--track`` read the union of the shard files.

Bad input (flags, a config key or value, ``--set``, an output directory that cannot be made)
is one line ``vccc sweep: <what is wrong>`` and exit status 2, found before JAX is imported
where the check does not need it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

from vccc_jax.commands.common import Parser, check_output_dir, dry_run, fail, guarded, output_dir
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
                   help="experiment .toml (kind tabular_sweep, async_ac, critic_free, decoupled, rac, "
                   "rac_wallclock or actor_map; default: "
                   "experiments/tabular_default.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override the config: base.FIELD=V, base.TABLE.FIELD=V, "
                   "base.families[0].FIELD=V, grid.AXIS=a,b,c, name=N (repeatable; typed and "
                   "checked as the file is)")
    p.add_argument("--results", default="results", help="result store directory (default: results)")
    p.add_argument("--figures", default="figures", help="figure directory (default: figures)")
    p.add_argument("--no-figures", action="store_true", help="skip writing figures")
    p.add_argument("--no-progress", action="store_true", help="no progress output at all")
    p.add_argument("--track", default="none", metavar="SPEC",
                   help="experiment tracking: none (default), tensorboard (event files in "
                   "<results>/tensorboard/<name>), tensorboard:DIR, or wandb[:PROJECT] (a "
                   "W&B run in <results>/wandb/<name>, offline unless WANDB_MODE is set); "
                   "pip install 'vccc_jax[tracking]'")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--dry-run", action="store_true",
                      help="print the grid size, the cells already stored and an ETA; compute "
                      "nothing")
    what.add_argument("--export", choices=("csv",), default=None,
                      help="write the result store as CSV on stdout (cell and metric columns; "
                      "lists as JSON); compute nothing")
    add_mesh_flags(p)
    add_distributed_flags(p)
    add_shard_flags(p)
    return p


@guarded("sweep")
def main(argv: Optional[list[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    started = start_distributed(argv)  # before any jax array exists (JAX only if asked)
    args = build_parser().parse_args(argv)
    exp = schema.load(args.config or schema.default_path(), args.overrides)
    store = Path(args.results) / f"{exp.name}.jsonl"
    if args.export:
        return lambda: _export(store, args)
    from vccc_jax.runs.tracking import parse_spec

    parse_spec(args.track)
    if exp.kind not in SWEEP_KINDS:
        raise ValueError(f"{exp.path}: kind {exp.kind!r} runs with "
                         f"`vccc {'simulate' if exp.kind == 'pipeline' else 'train'}`, "
                         "not `vccc sweep`")
    if not args.dry_run:  # before JAX; made (output_dir) once everything else is checked
        check_output_dir(args.results, "--results")
        if not args.no_figures:
            check_output_dir(args.figures, "--figures")
    args.mesh_obj = None
    if args.devices is not None or args.mesh is not None or (
            started and exp.kind == "tabular_sweep"):  # several hosts: all their devices
        if exp.kind != "tabular_sweep":
            raise ValueError(f"--devices/--mesh split tabular sweeps; {exp.path} is {exp.kind!r}")
        args.mesh_obj = mesh_of(args)
    from vccc_jax.runs.store import cell_id

    cfg, body, cells = plan(exp)
    ids = [cell_id(c) for c in cells]
    if args.dry_run:
        return lambda: dry_run(exp, ids, store)
    run = scaled("sweep", main, argv, args,
                 lambda: _interruptible(body, cfg, args, exp, ids, store), Path(args.results))
    output_dir(args.results, "--results")  # last check (it creates them), before any compute
    if not args.no_figures:
        output_dir(args.figures, "--figures")
    return run


SWEEP_KINDS = ("tabular_sweep", "async_ac", "critic_free", "decoupled", "rac", "rac_wallclock",
               "actor_map")


def plan(exp):
    """(config, body, cells) of a sweep experiment: its semantic validation (unknown
    methods, laws, ...: ValueError), the function that runs it and its cells as the store
    keys them (``store.cell_id(cell)``), in grid order."""
    if exp.kind == "tabular_sweep":
        from vccc_jax.runs import tabular_config

        cfg = tabular_config.config_of(exp)
        return cfg, _tabular, [c for g in tabular_config.expand(cfg) for _, c in g.cells]
    if exp.kind == "async_ac":
        from vccc_jax.runs import async_ac

        cfg = async_ac.config_of(exp)
        return cfg, _async_ac, [dict(c, grid=cfg) for c in async_ac.grid_cells(cfg)]
    if exp.kind == "critic_free":  # GRPO vs PS-PPO grid (commands/critic_free.py)
        from vccc_jax.commands import critic_free
        from vccc_jax.runs.critic_free import validate

        cells, body = validate(exp), critic_free.run
    elif exp.kind == "decoupled":  # exact pi_old-route study (runs/decoupled.py)
        from vccc_jax.runs.decoupled import validate

        cells, body = validate(exp), _decoupled
    elif exp.kind == "actor_map":  # actor x critic corrections, exact (runs/actor_map.py)
        from vccc_jax.runs.actor_map import validate

        cells, body = validate(exp), _actor_map
    elif exp.kind == "rac":  # exact RAC bias cut (runs/rac.py)
        from vccc_jax.runs.rac import validate_bias_cut

        cells, body = validate_bias_cut(exp), _rac
    else:  # rac_wallclock: RAC vs wait-for-slow in wall-clock (runs/rac_wallclock.py)
        from vccc_jax.runs.rac_wallclock import validate_wallclock

        cells, body = validate_wallclock(exp), _rac
    return exp, body, cells


def _export(store: Path, args) -> int:
    from vccc_jax.runs.export import write_csv
    from vccc_jax.runs.store import is_store, read_rows

    if not is_store(store):
        return fail("sweep", f"--export: no result store at {store} (run the sweep first, "
                    "or pass --results DIR)")
    n = write_csv(read_rows(store), sys.stdout)
    print(f"vccc sweep: exported {n} rows of {store}", file=sys.stderr)
    return 0


def _track(args, exp, ids: list, store: Path) -> None:
    """Every stored cell of this grid into the tracker (TensorBoard HParams: one row each)."""
    from vccc_jax.runs.export import flatten
    from vccc_jax.runs.store import rows_by_id
    from vccc_jax.runs.tracking import open_tracker, parse_spec

    by_id = rows_by_id(store)
    rows = [by_id[i] for i in ids if i in by_id]
    logdir = Path(args.results) / parse_spec(args.track)[0] / exp.name
    with open_tracker(args.track, logdir=logdir, config={"name": exp.name, "kind": exp.kind,
                                                          "config": exp.path}) as tracker:
        for i, row in enumerate(rows):
            cell = flatten({k: v for k, v in (row.get("cell") or {}).items() if k != "grid"})
            tracker.log_cell(row["id"], cell, row.get("metrics") or {})
            tracker.log(i, {"cells/" + k: v for k, v in (row.get("metrics") or {}).items()})
    if not args.no_progress:
        print(f"tracking: {len(rows)} cells in {args.track.partition(':')[2] or logdir}",
              file=sys.stderr)


RESUME_LINE = "interrupted; finished cells are saved -- rerun the same command to resume."


def _interruptible(body, cfg, args, exp, ids: list, store: Path) -> int:
    from vccc_jax.commands.interrupt import SigintStops, exit_interrupted

    t0 = time.perf_counter()
    # the first Ctrl-C is acknowledged at once, even mid-compile (it raises KeyboardInterrupt
    # when the main thread runs Python again); a second one quits at once
    acknowledged = SigintStops(lambda: RESUME_LINE, command="sweep", raise_first=True,
                               ack="interrupting: finished cells are saved; stopping when the "
                               "computation in flight returns (Ctrl-C again to quit now)")
    try:
        with acknowledged:
            rc = body(cfg, args, t0)
        if args.track != "none":
            _track(args, exp, ids, store)
        return rc
    except KeyboardInterrupt:
        # The store is closed (every finished row is fsynced). Exit at once: interpreter
        # teardown after an XLA compile was interrupted can crash (seen: SIGSEGV at exit).
        exit_interrupted(RESUME_LINE, "sweep")


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
                                    on_chunk=None if args.no_progress else on_chunk)
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


def _actor_map(exp, args, t0: float) -> int:
    from vccc_jax.analysis import actor_map as stats
    from vccc_jax.runs import actor_map
    from vccc_jax.runs.progress import format_seconds

    path, rows = actor_map.run_study(exp, args.results, progress=not args.no_progress)
    exact = [r for r in rows if r["cell"]["study"] == "exact"]
    for task in exp.grid.tasks:
        if exact:
            print(f"\n{task}: largest lag with cos >= 0.9 / 0.5 to Eq 12")
            print(stats.tolerance_markdown(rows, task, "eq12"))
    if any(r["cell"]["study"] == "train" for r in rows):
        print("\nreturn AUC, paired per seed against the uncorrected critic")
        print(stats.paired_markdown(rows))
    print(f"\n{len(rows)} cells in {path} ({format_seconds(time.perf_counter() - t0)} wall this run)")
    if not args.no_figures and exact:
        from vccc_jax.plotting import save
        from vccc_jax.plotting.actor_map import fig_actor_map

        out = Path(args.figures) / exp.name
        paths = save(fig_actor_map(rows, "eq12"), out / "actor_map_eq12")
        print(f"figures: {', '.join(map(str, paths))}")
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
