"""Pins of ``verify.stats`` against closed forms written here (exact binomial sums with
``math.comb``, the normal tail by ``math.erfc``): the count bound of the sampled rows and the
two-sided tail they are built from."""
import math

import pytest

from vccc_jax.verify import stats


def _binom_sf(m, n, p):
    """P(Binomial(n, p) > m), exact."""
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(m + 1, n + 1))


@pytest.mark.parametrize("n, p, alpha", [(480, 0.001, 1e-3), (96, 0.01, 1e-3), (50, 0.2, 0.05)])
def test_binomial_upper_is_the_smallest_bound_at_level_alpha(n, p, alpha):
    m = stats.binomial_upper(n, p, alpha)
    assert _binom_sf(m, n, p) <= alpha
    assert m == 0 or _binom_sf(m - 1, n, p) > alpha
    assert m >= n * p  # an upper bound: at least the mean count


@pytest.mark.parametrize("z", [1.0, 1.96, 3.29])
def test_two_sided_tail(z):
    assert stats.two_sided_tail(z) == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)
