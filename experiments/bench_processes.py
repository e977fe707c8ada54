"""One cell of ``vccc bench train``, run in N fresh processes: the spread of a ratio between
processes, not only between placements in one (issue 28: a program's time moves by up to
~10-30% from one compile or input copy to the next on the 2-core CPU, as much as the
targets' margins, so one grid run cannot tell 0.95x from 1.0x).

    .venv/bin/python experiments/bench_processes.py --processes 6 --seeds 1 --envs 4 \\
        --rows reference,sync-gae --placements 3 --out results/bench_processes.jsonl

Each process appends its record to ``--out`` (``vccc bench train --out``, one line per
process); the summary prints, for every row against ``--base`` (default the reference), the
per-process wall and CPU ratios (env steps/s of the row over the base's), their mean with a
95% t interval and the geometric mean. ``--summarize`` only reads ``--out``. Not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np


def summarize(path: str, base: str, seeds: int, envs: int) -> None:
    from vccc_jax.analysis.stats import ci_dict
    from vccc_jax.benchmarks import train_grid as g

    recs = [r for r in g.read_record(path) if r["seeds"] == seeds and r["envs"] == envs]
    if not recs:
        raise SystemExit(f"no record of {seeds} seeds x {envs} envs in {path}")
    by_proc = [{t.name: t for t in g.timings(r)} for r in recs]
    base_name = next(n for n in by_proc[0] if n.startswith(base))
    loads = " ".join(f"{r['load_start']:.1f}-{r['load_end']:.1f}" for r in recs)
    print(f"# {len(recs)} processes, {seeds} seeds x {envs} envs; ratio = env steps/s of the "
          f"row over {base_name}'s; 1-minute loads {loads}")
    for name in by_proc[0]:
        if name == base_name:
            continue
        for cpu in (False, True):
            x = np.array([g.ratio(p[name], p[base_name], cpu=cpu) for p in by_proc])
            s = ci_dict(x)
            print(f"{name:14s} {'cpu ' if cpu else 'wall'}  mean {s['mean']:.3f} "
                  f"[{s['mean'] - s['ci']:.3f}, {s['mean'] + s['ci']:.3f}]  "
                  f"geo {np.exp(np.log(x).mean()):.3f}"
                  f"  per process {' '.join(f'{v:.2f}' for v in x)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=6)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--rows", default="reference,sync-gae")
    p.add_argument("--base", default="reference", help="the row the ratios are taken against")
    p.add_argument("--placements", type=int, default=3)
    p.add_argument("--out", default="results/bench_processes.jsonl")
    p.add_argument("--summarize", action="store_true", help="only read --out")
    args = p.parse_args(argv)
    if not args.summarize:
        for i in range(args.processes):
            print(f"process {i + 1}/{args.processes}", flush=True)
            subprocess.run([sys.executable, "-m", "vccc_jax.cli", "bench", "train", "--grid",
                            "--seeds", str(args.seeds), "--envs", str(args.envs),
                            "--rows", args.rows, "--placements", str(args.placements),
                            "--out", args.out], check=True)
    summarize(args.out, args.base, args.seeds, args.envs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
