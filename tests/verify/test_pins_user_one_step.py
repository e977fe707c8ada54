"""Pin of the user-target fixed-point rows (``verify.user_one_step``): a target that is exact
on half of the MDPs and biased on the other half must fail its fixed-point rows (the row
holds only if EVERY MDP's fixed point matches), while the exact target passes them.

The half is chosen by the data: the episodic group of ``vccc verify --quick`` (4 states,
2 actions, 16 MDPs) is undiscounted in every other MDP, where discounts are 0 or 1; the
biased target adds 0.3 to Eq 8's target on transitions with 0 < discount < 1, i.e. only in
the discounted MDPs (its fixed point there moves by 0.3 / (1 - gamma) >= 0.3, checked below
against the row's error)."""
import jax
import jax.numpy as jnp
import pytest

from vccc_jax import verify as V
from vccc_jax.verify import user as U

GROUP = V.GroupSpec("episodic", 4, 2, 16)
sg = jax.lax.stop_gradient


def iw_td(rewards, discounts, values, next_values, log_rhos):
    """Eq 8: Vbar + rho delta (exact)."""
    return sg(values + jnp.exp(log_rhos) * (rewards + discounts * next_values - values))


def iw_td_biased_when_discounted(rewards, discounts, values, next_values, log_rhos):
    """Eq 8 plus 0.3 where 0 < discount < 1: exact in the undiscounted MDPs only."""
    bias = 0.3 * ((discounts > 0) & (discounts < 1)).astype(values.dtype)
    return iw_td(rewards, discounts, values, next_values, log_rhos) + sg(bias)


@pytest.fixture(scope="module")
def reports():
    return V.check_all([U.Target(iw_td), U.Target(iw_td_biased_when_discounted)],
                       key=jax.random.PRNGKey(0), groups=(GROUP,), num_samples=256)


def _fixed_rows(report):
    rows = [r for r in report.rows if "fixed point" in r.name]
    assert len(rows) == 2, report.format()  # stalest version, replay mixture
    return rows


def test_exact_target_passes_its_fixed_point_rows(reports):
    assert all(r.passed for r in _fixed_rows(reports[0])), reports[0].format()


def test_a_target_wrong_on_some_mdps_fails_its_fixed_point_rows(reports):
    for r in _fixed_rows(reports[1]):
        assert not r.passed, reports[1].format()
        assert r.error >= 0.3 - 1e-9, r  # 0.3 / (1 - gamma) in a discounted MDP
        assert r.mdps == GROUP.num_mdps
