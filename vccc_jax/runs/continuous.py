"""Continuous-action runs (issue 31): ``train.continuous.train`` with its rows written to
``<out>/continuous.jsonl`` and a summary (no printing here; ``commands.train`` prints)."""

from __future__ import annotations

import json
from pathlib import Path

from vccc_jax.train.config import TrainConfig
from vccc_jax.train.continuous import check_config, train, wants_continuous


def check_continuous(cfg: TrainConfig, resume: bool = False) -> None:
    """For a continuous-action env: ValueError (one line) for what its trainer does not
    support, before any file is written; nothing for other envs."""
    if wants_continuous(cfg.env):
        check_config(cfg)
        if resume:
            raise ValueError("--resume is not supported with continuous actions")


def progress_line(row: dict, num_updates: int) -> str:
    """One progress line for an update's row."""
    extra = f"  critic_error {row['critic_error']:.4g}" if "critic_error" in row else ""
    return (f"seed {row['seed']} update {row['update']}/{num_updates}: return "
            f"{row['episode_return']:.4g}  mean lag {row['mean_lag']:.2f}  rho max "
            f"{row['rho_max']:.3g}{extra}")


def run_continuous(cfg: TrainConfig, out: Path, progress=None) -> dict:
    """Train, write one JSON row per (seed, update) to ``out / "continuous.jsonl"``, and return
    {metric: mean over the last 10% of updates and the seeds} for ``episode_return`` (updates
    where an episode ended) and ``critic_error`` (lqr: envs). ``progress(line)`` gets a
    :func:`progress_line` every tenth of the run."""
    def on_update(row):
        if progress is not None and (row["update"] % max(1, cfg.num_updates // 10) == 0
                                     or row["update"] == cfg.num_updates):
            progress(progress_line(row, cfg.num_updates))

    rows = train(cfg, on_update)
    with open(Path(out) / "continuous.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tail = [r for r in rows if r["update"] > cfg.num_updates - max(1, cfg.num_updates // 10)]
    summary = {}
    for key in ("episode_return", "critic_error"):
        vals = [r[key] for r in tail if key in r and r[key] == r[key]]
        if vals:
            summary[key] = sum(vals) / len(vals)
    return summary
