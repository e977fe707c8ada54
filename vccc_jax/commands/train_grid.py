"""``vccc train --config <grid>``: a ``kind = "train"`` grid (:func:`grid`: cells one after
the other into the resumable store, Ctrl-C between and inside cells, tables, figures) and a
``kind = "critic_free"`` grid (:func:`critic_free`); ``commands.train`` checks the input and
calls them."""

from __future__ import annotations

import sys
from pathlib import Path

from vccc_jax.commands.interrupt import EXIT_INTERRUPTED, SigintStops
from vccc_jax.commands.interrupt import exit_interrupted as _exit_interrupted


def grid(name: str, cells: list, out: Path, args) -> int:
    from vccc_jax.analysis.seeds import MIN_INTERVAL_SEEDS
    from vccc_jax.analysis.train import GRID_TABLE_NOTE, format_grid_table, format_whole_run_table
    from vccc_jax.runs.distributed import is_main
    from vccc_jax.runs.train import run_grid, whole_run_results

    def on_cell(i, n, cfg):
        if not args.quiet and is_main():
            print(f"[{i + 1}/{n}] {cfg.env} lag={cfg.lag} critic={cfg.critic} "
                  f"actor={cfg.actor} seeds={cfg.num_seeds}", file=sys.stderr, flush=True)

    from vccc_jax.runs.train import GridStopped, Interrupted

    resume_line = "finished cells are in the store: rerun the same command to resume"
    try:
        with SigintStops(lambda: f"interrupted; {resume_line}") as stop:
            results = run_grid(name, cells, out, quiet=args.quiet or not is_main(),
                               on_cell=on_cell, mesh=args.mesh_obj, fsdp=args.fsdp,
                               checkpoint_every=args.checkpoint_every[0],
                               checkpoint_seconds=args.checkpoint_every[1], stop=stop,
                               track=args.track)
    except KeyboardInterrupt as e:
        msg = (f"interrupted after update {e.update} of {e.total} of a cell (checkpointed)"
               if isinstance(e, Interrupted) else f"interrupted after {e.done} of {e.total} "
               "cells, before the next one started" if isinstance(e, GridStopped)
               else "interrupted")
        msg += "; " + resume_line
        if not isinstance(e, (Interrupted, GridStopped)):
            _exit_interrupted(msg)
        if is_main():
            print(f"vccc train: {msg}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not is_main():
        return 0
    print(format_grid_table(results))
    print(GRID_TABLE_NOTE)
    print("\nWhole run (AUC = mean over every ground-truth update; @25/@50/@100 = value at "
          f"that share of the run; mean ± 95% t half-width over seeds, or with fewer than "
          f"{MIN_INTERVAL_SEEDS} seeds mean [smallest, largest seed]):")
    print(format_whole_run_table(whole_run_results(name, cells, out)))
    if not args.no_figure:
        from vccc_jax import plotting

        path = plotting.plot_lag_sweep(results, out / f"{name}.png", name)
        print(f"figure: {path}")
        path = error_curves(name, out)
        if path:
            print(f"figure: {path}")
    return 0


def critic_free(exp, out: Path, args, mesh=None) -> int:
    """A ``critic_free`` grid (``runs.critic_free``): progress on stderr, the sweep's table."""
    import time

    from vccc_jax.runs import critic_free as runs_cf

    t0, last = time.perf_counter(), [0.0]

    def on_cell(i, n, cell):
        last[0] = time.perf_counter()
        if not args.quiet:
            print(f"[{i + 1}/{n}] {cell['env']} law={cell['law']} lag={cell['lag']} "
                  f"seed={cell['seed']}", file=sys.stderr, flush=True)

    def on_update(u, n, row):  # at evaluated updates, at most every 2 s, and the last one
        now = time.perf_counter()
        if args.quiet or not (u == n or (row["exact_return"] == row["exact_return"]
                                         and now - last[0] >= 2.0)):
            return
        last[0] = now
        print(f"  update {u}/{n}: return {row['return']:.3f}  J {row['exact_return']:.3f}  "
              f"kept {row['kept_fraction']:.2f}", file=sys.stderr, flush=True)

    path, rows = runs_cf.run_grid(exp, out, progress=not args.quiet, on_cell=on_cell,
                                  on_update=on_update, mesh=mesh)
    print(runs_cf.format_table(runs_cf.summarize(rows)))
    print("\n" + runs_cf.footer(exp, rows, path, time.perf_counter() - t0))
    if not args.no_figure and rows:
        from vccc_jax.plotting.comparators2 import fig_ps_ppo
        from vccc_jax.plotting.style import save

        print("figures: " + ", ".join(map(str, save(fig_ps_ppo(rows), out / exp.name))))
    return 0


def error_curves(name: str, out: Path):
    """``<out>/<name>_error_curves.png``: critic error vs update over the whole run, one
    panel per lag (and sampler / env), one band per critic (plotting.train.error_curves)."""
    from vccc_jax.plotting.train import error_curves
    from vccc_jax.runs.train import error_curve_rows

    by, key = error_curve_rows(out / f"{name}.jsonl")
    if not by:
        return None
    fig = error_curves(by, key, title=f"{name}: {key} over the whole run")
    path = out / f"{name}_error_curves.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
