"""Lag and wall-clock statistics of a simulated pipeline, and its exports (issue 14).

* :func:`lag_stats` mean / quantiles / max / histogram of lags (per token or per episode).
* :func:`wallclock_stats` seconds per update and throughput.
* :func:`lag_pmf` the lag histogram as probabilities over lags 0..L, the same layout as
  ``vccc_jax.tabular.history.lag_weights`` (float64, sums to 1), so a tabular sweep can use
  the measured law in place of a parametric staleness law.
* :func:`format_lag_trace` / :func:`write_lag_trace` integers separated by whitespace, the
  format ``LagLaw.parse("trace:@path")`` (vccc_jax/envs/lag.py) reads.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from vccc_jax.pipeline.simulate import PipelineTrace

QUANTILES = (0.5, 0.9, 0.99)
WEIGHTS = ("token", "episode")


def lags_of(trace: PipelineTrace, weight: str = "token") -> np.ndarray:
    """Per-transition lags (``token``) or per-episode lags of the first token (``episode``)."""
    if weight not in WEIGHTS:
        raise ValueError(f"weight must be one of {WEIGHTS}, got {weight!r}")
    return trace.transition_lags() if weight == "token" else trace.episode_lags()


def lag_stats(trace: PipelineTrace, weight: str = "token") -> dict:
    """{'mean', 'q50', 'q90', 'q99', 'max', 'hist'} of the lags; hist[l] = count of lag l."""
    lags = lags_of(trace, weight)
    qs = np.quantile(lags, QUANTILES, method="inverted_cdf")
    out = {"mean": float(lags.mean())}
    out.update({f"q{int(round(q * 100))}": int(v) for q, v in zip(QUANTILES, qs)})
    out["max"] = int(lags.max())
    out["hist"] = np.bincount(lags)
    return out


def wallclock_stats(trace: PipelineTrace) -> dict:
    """{'total', 'per_update_mean', 'per_update_q50', 'per_update_q90', 'tokens_per_second'}."""
    per = trace.wallclock_per_update()
    total = float(trace.update_end[-1])
    return {
        "total": total,
        "per_update_mean": float(per.mean()),
        "per_update_q50": float(np.quantile(per, 0.5)),
        "per_update_q90": float(np.quantile(per, 0.9)),
        "tokens_per_second": float(trace.ep_tokens.sum() / total) if total > 0 else float("inf"),
    }


def reward_delay_stats(trace: PipelineTrace) -> dict:
    """Per channel: mean latency (s) and mean / max delay in optimiser steps after consumption."""
    out = {}
    for c, name in enumerate(trace.channel_names):
        d = trace.reward_delay_steps(c)
        lat = trace.ep_reward_time[:, c] - trace.ep_done_time
        out[name] = {
            "latency_mean": float(lat.mean()),
            "delay_steps_mean": float(d.mean()) if d.size else float("nan"),
            "delay_steps_max": int(d.max()) if d.size else -1,
            "censored": int((trace.ep_reward_update[:, c] < 0).sum()),
        }
    return out


def lag_pmf(trace: PipelineTrace, max_lag: Optional[int] = None, weight: str = "token") -> np.ndarray:
    """Probabilities of lags 0..max_lag (float64, sums to 1); lags above max_lag are folded
    into max_lag (the oldest version a history of max_lag + 1 versions keeps)."""
    lags = lags_of(trace, weight)
    top = int(lags.max()) if max_lag is None else int(max_lag)
    if top < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    counts = np.bincount(np.minimum(lags, top), minlength=top + 1).astype(np.float64)
    return counts / counts.sum()


def format_lag_trace(lags: np.ndarray, per_line: int = 32) -> str:
    """Whitespace-separated integers, ``per_line`` to a line (trailing newline)."""
    lags = np.asarray(lags)
    if lags.ndim != 1 or lags.size == 0 or not np.issubdtype(lags.dtype, np.integer):
        raise ValueError("lags must be a non-empty 1-D integer array")
    if lags.min() < 0:
        raise ValueError(f"lags must be >= 0, got {lags.min()}")
    rows = [" ".join(map(str, lags[i:i + per_line].tolist()))
            for i in range(0, lags.size, per_line)]
    return "\n".join(rows) + "\n"


def write_lag_trace(path: str, trace: PipelineTrace, weight: str = "episode") -> int:
    """Write the lags (default one per episode in consumption order: the trainer's trace law
    gives one lag per environment per update) to ``path``; returns how many were written."""
    lags = lags_of(trace, weight)
    with open(path, "w") as f:
        f.write(format_lag_trace(lags))
    return int(lags.size)
