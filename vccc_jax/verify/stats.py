"""Statistical tests of the sampled half (scipy.stats), all at level ``ALPHA`` = 0.1%.

- :func:`ks_test`: one-sample Kolmogorov-Smirnov of z-scores against N(0, 1);
- :func:`binomial_upper`: the 99.9% upper bound on how many |z| > 3.29 a correct target shows;
- :func:`chi2_sf` / :func:`chi2_isf`: the per-MDP chi-square test of a false claim and its
  critical value (for the certified-power argument of :func:`vccc_jax.verify.targets.sampled_rows`).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from vccc_jax.verify.problems import ALPHA


def normal_cdf(x) -> np.ndarray:
    return stats.norm.cdf(np.asarray(x, float))


def two_sided_tail(z: float) -> float:
    """P(|N(0, 1)| > z)."""
    return float(2.0 * stats.norm.sf(z))


def ks_test(z) -> tuple[float, float]:
    """Kolmogorov-Smirnov test of z against N(0, 1): (D, p) from ``scipy.stats.kstest``
    (exact distribution for small samples, asymptotic otherwise)."""
    z = np.asarray(z, float)
    if z.size == 0:
        return 0.0, 1.0
    res = stats.kstest(z, "norm")
    return float(res.statistic), float(res.pvalue)


def binomial_upper(n: int, p: float, alpha: float = ALPHA) -> int:
    """Smallest m with P(Binomial(n, p) > m) <= alpha."""
    if n == 0:
        return 0
    return int(stats.binom.ppf(1.0 - alpha, n, p))


def chi2_sf(x, df) -> np.ndarray:
    """Upper tail of chi-square(df) at x."""
    return stats.chi2.sf(np.asarray(x, float), np.asarray(df, float))


def chi2_isf(alpha: float, df) -> np.ndarray:
    """Upper alpha quantile of chi-square(df)."""
    return stats.chi2.isf(alpha, np.asarray(df, float))
