"""The ``critic_free`` kind of ``vccc sweep``: the GRPO vs PS-PPO grid (issue 14).

    vccc sweep --config experiments/ps_ppo.toml [--results results] [--figures figures]

Runs every missing cell into ``<results>/<name>.jsonl`` (``runs.critic_free``; interrupt and
rerun to resume), prints the README table and writes ``<figures>/<name>.png`` (+ .pdf).
"""

from __future__ import annotations

import time
from pathlib import Path


def run(exp, args, t0: float) -> int:
    """Body of ``vccc sweep`` for a ``critic_free`` experiment (``args``: sweep's flags)."""
    from vccc_jax.runs import critic_free
    from vccc_jax.runs.progress import format_seconds

    path, rows = critic_free.run_grid(exp, args.results, progress=not args.no_progress)
    print(critic_free.format_table(critic_free.summarize(rows)))
    n = len(critic_free.cells(exp))
    print(f"\n{len(rows)}/{n} runs in {path} ({format_seconds(time.perf_counter() - t0)} "
          "wall this run)")
    if not args.no_figures and rows:
        from vccc_jax.plotting.comparators2 import fig_ps_ppo
        from vccc_jax.plotting.style import save

        paths = save(fig_ps_ppo(rows), Path(args.figures) / exp.name)
        print("figures: " + ", ".join(map(str, paths)))
    return 0
