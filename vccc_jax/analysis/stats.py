"""Interval estimates across seeds / MDPs (scipy.stats), the one ``mean_ci`` of the package."""

from __future__ import annotations

import numpy as np
from scipy import stats

CI_LEVEL = 0.95


def t_quantile(level: float, dof) -> np.ndarray:
    """Two-sided Student-t critical value: ``P(|T_dof| <= q) = level``."""
    return stats.t.ppf(0.5 + level / 2, dof)


def mean_ci(x, axis: int = -1, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """(mean, half-width of a Student-t ``level`` interval) across ``axis``; NaN-aware.

    The half-width is NaN where fewer than two finite values remain.
    """
    x = np.asarray(x, np.float64)
    n = np.sum(np.isfinite(x), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(x, axis=axis) if np.any(n) else np.full(np.shape(n), np.nan)
        sd = np.nanstd(x, axis=axis, ddof=1) if np.all(n > 1) else np.full(np.shape(n), np.nan)
        half = t_quantile(level, np.maximum(n - 1, 1)) * sd / np.sqrt(n)
    return mean, half


def ci_dict(x, level: float = CI_LEVEL) -> dict:
    """``{"mean", "ci"}`` of a 1-D sample (``ci``: t half-width; 0.0 for one value)."""
    x = np.asarray(x, np.float64)
    mean, half = mean_ci(x, axis=0, level=level)
    return {"mean": float(mean), "ci": float(half) if x.shape[0] > 1 else 0.0}
