"""The lag `vccc train --async` produces per parameter mode (issue 48): one short CartPole-v1
run per mode, the run-wide lag histograms and trajectory metrics as a markdown table.

    XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false \
intra_op_parallelism_threads=1" PYTHONPATH=$PWD python experiments/async_lag_modes.py OUT

Each run: actor threads on device 0, the learner on device 1, B=8 envs x T=32 steps, 100
updates, seed 0 (flags below). Timing-dependent: the histograms are what this machine under
its load produced, not a property of the mode alone.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

MODES = [("lag1", 1, 1), ("lag1", 2, 1), ("latest", 1, 1), ("latest", 2, 2),
         ("bounded:1", 2, 2)]
BASE = ["--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "32", "--total-timesteps",
        str(8 * 32 * 100), "--gt-every", "0", "--eval-envs", "0", "--quiet", "--no-figure",
        "--actor-devices", "0", "--learner-devices", "1", "--checkpoint-every", "0"]


def main(out: Path) -> None:
    lines = ["| mode | actors | queue | lag 0 | 1 | 2 | 3 | 4 | 5+ | version_diff_avg | "
             "traj_staleness_avg | multi-version traj. | lag-len corr | lag-V corr | dropped | "
             "final return |", "|" + "---|" * 16]
    for mode, actors, queue in MODES:
        run = out / f"{mode.replace(':', '')}_x{actors}_q{queue}"
        cmd = [sys.executable, "-m", "vccc_jax.cli", "train", "--async", *BASE, "--param-mode",
               mode, "--actor-threads", str(actors), "--queue-size", str(queue), "--out",
               str(run), "--overwrite"]
        subprocess.run(cmd, check=True, timeout=1200, env=os.environ)
        with open(run / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))

        def col(name):
            return np.array([float(r[name]) for r in rows])
        hist = np.mean([[float(r[f"lag_hist{j}"]) for j in range(8)] for r in rows], axis=0)
        cells = [f"{h:.3f}" for h in hist[:5]] + [f"{hist[5:].sum():.3f}"]
        lines.append(
            f"| {mode} | {actors} | {queue} | " + " | ".join(cells)
            + f" | {col('version_diff_avg').mean():.2f} | {np.nanmean(col('traj_staleness_avg')):.2f}"
            f" | {np.nanmean(col('traj_multi_version_frac')):.2f}"
            f" | {np.nanmean(col('lag_len_corr')):.2f} | {np.nanmean(col('lag_value_corr')):.2f}"
            f" | {int(col('dropped').sum())} | {col('return')[-10:].mean():.1f} |")
    text = "\n".join(lines)
    (out / "lag_modes.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/async_lag_modes"))
