"""Statistics over seeds (never over episodes), after Agarwal et al. 2021 ("rliable").

A *score matrix* is ``[num_runs, num_tasks]``: one number per independent run (seed, or
random MDP) and task (environment / lag / cell), e.g. a run's final return. Episodes inside
a run are averaged into that one number first; they are not independent samples.

- :func:`iqm` interquartile mean (25% trimmed mean of all runs x tasks);
- :func:`stratified_bootstrap_ci` percentile CI of any aggregate, resampling runs with
  replacement *within each task* (stratified), via ``scipy.stats.bootstrap`` with one sample
  per task;
- :func:`aggregate` point + CI per method;
- :func:`performance_profile` fraction of runs above tau (score distribution) with CIs;
- :func:`paired_difference` "does the correction help": per-run differences on the same
  seeds / MDPs, mean with a bootstrap CI, the fraction of runs that improve and the
  Wilcoxon signed-rank p-value.

Why not rliable itself: ``rliable==1.2.0`` resolves with our pinned numpy/scipy but needs
``arch>=5.3.1``; the resolvable ``arch==7.2.0`` fails at import with the pinned
``pandas==3.1.1`` (``deprecate_kwarg() missing ... 'new_arg_name'``). The statistics are
the same few lines on top of ``scipy.stats`` (trim_mean, bootstrap, wilcoxon).
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import numpy as np
from scipy import stats

CI_LEVEL = 0.95
NUM_BOOT = 2000


def iqm(x, axis=None) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``),
    over all entries (``axis=None``) or along ``axis``. NaNs are dropped (``axis=None``)."""
    x = np.asarray(x, np.float64)
    if axis is None:
        x = x[np.isfinite(x)].ravel()
        return np.float64(stats.trim_mean(x, 0.25)) if x.size else np.float64(np.nan)
    return stats.trim_mean(x, 0.25, axis=axis)


def _as_matrix(scores) -> np.ndarray:
    s = np.asarray(scores, np.float64)
    if s.ndim == 1:
        s = s[:, None]
    if s.ndim != 2 or s.shape[0] < 1:
        raise ValueError(f"scores must be [runs] or [runs, tasks], got shape {s.shape}")
    return s


def stratified_bootstrap_ci(scores, statistic: Callable = iqm, level: float = CI_LEVEL,
                            num_boot: int = NUM_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(point, lo, hi): ``statistic`` of all runs x tasks and its percentile bootstrap CI,
    runs resampled with replacement within each task (rliable's stratified bootstrap).

    ``statistic(x, axis)`` takes the pooled [.., runs*tasks] sample along ``axis``.
    One run per task: the CI is the point (nothing to resample)."""
    s = _as_matrix(scores)
    point = float(statistic(s.ravel(), axis=-1))
    if s.shape[0] < 2:
        return point, point, point
    samples = tuple(s[:, j] for j in range(s.shape[1]))

    def pooled(*xs, axis=-1):
        return statistic(np.concatenate(xs, axis=axis), axis=axis)

    with np.errstate(invalid="ignore"):
        res = stats.bootstrap(samples, pooled, n_resamples=num_boot, confidence_level=level,
                              method="percentile", vectorized=True, paired=False,
                              rng=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    if not np.isfinite(lo):  # degenerate: every resample identical
        lo = hi = point
    return point, float(lo), float(hi)


def bootstrap_band(y, axis: int = -1, level: float = CI_LEVEL, num_boot: int = NUM_BOOT,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lo, hi) over runs along ``axis`` at every other index, e.g. a learning curve
    ``[updates, seeds]`` -> three ``[updates]`` arrays: the mean over seeds and its percentile
    bootstrap CI (seeds resampled with replacement, the same resamples at every update).

    A resampled mean lies between the smallest and largest run, so the band never leaves
    the metric's range (a t band over 2 seeds can put an ESS fraction above 1 or a
    non-negative return below 0). NaN runs are left out of each mean; with one run the
    band is the mean."""
    y = np.moveaxis(np.asarray(y, np.float64), axis, -1)
    avg = np.nanmean if np.isnan(y).any() else np.mean
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN
        mean = avg(y, axis=-1)
        n = y.shape[-1]
        if n < 2:
            return mean, mean.copy(), mean.copy()
        idx = np.random.default_rng(seed).integers(0, n, size=(num_boot, n))
        boots = avg(y[..., idx], axis=-1)  # [..., num_boot]
        alpha = (1.0 - level) / 2
        quantile = np.nanquantile if np.isnan(boots).any() else np.quantile
        lo, hi = quantile(boots, [alpha, 1.0 - alpha], axis=-1)
    return mean, lo, hi


# Fewer seeds than this get their range (smallest and largest seed), not a 95% interval:
# the percentile bootstrap of 2 seeds is their min and max, not 95% of anything.
MIN_INTERVAL_SEEDS = 5


def interval_method(n: int) -> str:
    """How the interval over ``n`` seeds is computed, as every output states it (console,
    ``summary.json``, ``curves.png``): the one rule of :func:`seed_interval`."""
    if n < 2:
        return f"n = {n}: no interval"
    if n < MIN_INTERVAL_SEEDS:
        return f"range of the n = {n} seeds (fewer than {MIN_INTERVAL_SEEDS}: no 95% interval)"
    return f"95% percentile bootstrap of the mean over n = {n} seeds"


def seed_band(y, axis: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lo, hi) over seeds along ``axis`` by the rule of :func:`interval_method`: the
    95% :func:`bootstrap_band` with at least ``MIN_INTERVAL_SEEDS`` seeds, else the seeds'
    smallest and largest value (one seed: the value)."""
    y = np.moveaxis(np.asarray(y, np.float64), axis, -1)
    if y.shape[-1] >= MIN_INTERVAL_SEEDS:
        return bootstrap_band(y, axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN
        return np.nanmean(y, axis=-1), np.nanmin(y, axis=-1), np.nanmax(y, axis=-1)


def seed_interval(x, level: float = CI_LEVEL) -> dict:
    """The interval of a per-seed sample used by every output of a run: ``mean``, ``lo``,
    ``hi``, ``n`` (finite seeds) and ``interval`` (:func:`interval_method`).

    n >= MIN_INTERVAL_SEEDS: the percentile bootstrap of :func:`bootstrap_band` (the band
    ``curves.png`` draws: same resamples), which stays inside the seeds' range and so inside
    the metric's (a 2-seed t interval of a CartPole return is wider than [0, 500]); 2 to 4
    seeds: their smallest and largest value (no 95% claim); n = 1: lo = hi = NaN,
    no interval; n = 0: everything NaN."""
    x = np.asarray(x, np.float64).ravel()
    f = x[np.isfinite(x)]
    n = int(f.size)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0, "interval": interval_method(0)}
    if n == 1:
        return {"mean": float(f[0]), "lo": float("nan"), "hi": float("nan"), "n": 1, "interval": interval_method(1)}
    mean, lo, hi = (bootstrap_band(f, level=level) if n >= MIN_INTERVAL_SEEDS
                    else (f.mean(), f.min(), f.max()))
    return {"mean": float(mean), "lo": float(lo), "hi": float(hi), "n": n, "interval": interval_method(n)}


def mean_stat(x, axis=-1):
    return np.mean(x, axis=axis)


def aggregate(score_dict: dict, statistic: Callable = iqm, level: float = CI_LEVEL,
              num_boot: int = NUM_BOOT, seed: int = 0) -> dict:
    """{method: {"point", "lo", "hi", "n"}} of ``statistic`` over each [runs, tasks] matrix."""
    out = {}
    for name, scores in score_dict.items():
        s = _as_matrix(scores)
        p, lo, hi = stratified_bootstrap_ci(s, statistic, level, num_boot, seed)
        out[name] = {"point": p, "lo": lo, "hi": hi, "n": int(s.shape[0]), "tasks": int(s.shape[1])}
    return out


def performance_profile(scores, taus: Sequence[float], level: float = CI_LEVEL,
                        num_boot: int = NUM_BOOT, seed: int = 0) -> dict:
    """Score distribution: fraction of runs with score > tau (averaged over tasks) for each
    tau, with stratified bootstrap CIs. Returns {"tau", "point", "lo", "hi"} arrays."""
    s = _as_matrix(scores)
    taus = np.asarray(taus, np.float64)

    def frac_above(tau):
        return lambda x, axis=-1: np.mean(x > tau, axis=axis)

    res = [stratified_bootstrap_ci(s, frac_above(t), level, num_boot, seed) for t in taus]
    p, lo, hi = (np.array(v) for v in zip(*res))
    return {"tau": taus, "point": p, "lo": lo, "hi": hi, "n": int(s.shape[0])}


def paired_difference(treated, control, level: float = CI_LEVEL, num_boot: int = NUM_BOOT,
                      seed: int = 0, statistic: Callable = mean_stat) -> dict:
    """Per-run differences ``treated - control`` on the same seeds / MDPs (index-aligned).

    Returns {"n", "point" (statistic of the differences), "lo", "hi" (percentile bootstrap),
    "frac_better" (share of runs with difference > 0), "p_value" (two-sided Wilcoxon
    signed-rank; 1.0 when every difference is 0)}. NaN pairs are dropped."""
    a = np.asarray(treated, np.float64).ravel()
    b = np.asarray(control, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.shape} vs {b.shape}")
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    if d.size == 0:
        raise ValueError("no finite pairs")
    p, lo, hi = stratified_bootstrap_ci(d, statistic, level, num_boot, seed)
    pv = 1.0 if np.all(d == 0) or d.size < 2 else float(stats.wilcoxon(d).pvalue)
    return {"n": int(d.size), "point": p, "lo": lo, "hi": hi,
            "frac_better": float(np.mean(d > 0)), "p_value": pv}
