"""Exact RAC claims on a tabular MDP with two slow channels (float64, ~1e-12). Every claim is
evaluated inside ONE jitted computation shared by the module (one XLA compile)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import history as H
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular import rac

DELAYS = (0, 2, 4)
KERNELS = ((1.0,), (0.6, 0.3, 0.1), (0.5, 0.5))
MASSES = (0.0, 0.5)


def _claims(m, ch, probs):
    out = {"full": rac.claim_unbiased_full_mass(m, ch, DELAYS, KERNELS, probs),
           "drop": rac.bias_norm(m, ch, DELAYS, KERNELS, probs, "drop", clip=None),
           "identity": rac.claim_identity_is_vtrace(m, ch, probs, clip=1.0, behaviour_lag=2),
           "cut": rac.bias_cut_ratio(m, ch, DELAYS, KERNELS, probs, clip=1.0)}
    for mass in MASSES:
        out[f"linear{mass}"] = rac.claim_linear_in_unreinjected(m, ch, DELAYS, (0.6, 0.3, 0.1), mass,
                                                                 probs, behaviour_lag=1)
    return out


@pytest.fixture(scope="module")
def problem():
    with jax.enable_x64(True):
        m = M.random_mdp(jax.random.PRNGKey(0), 1, 4, 3, gamma=0.9)[0]
        cfg = H.HistoryConfig(step_size=0.4, num_versions=9)
        probs = H.policy_history(m, H.initial_logits(jax.random.PRNGKey(1), 1, 4, 3, 1.0)[0], cfg).probs
        ch = rac.split_rewards(jax.random.PRNGKey(2), m.R, 3)
        return m, ch, probs


@pytest.fixture(scope="module")
def claims(problem):
    with jax.enable_x64(True):
        return jax.device_get(jax.jit(_claims)(*problem))


def test_unbiased_at_full_mass(claims):
    got, want = claims["full"]
    assert abs(float(got - want)) < 1e-12
    assert float(claims["drop"]) > 1e-2  # dropping the slow channels is biased


@pytest.mark.parametrize("mass", MASSES)
def test_bias_linear_in_unreinjected_fraction(claims, mass):
    got, want = claims[f"linear{mass}"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert float(np.max(np.abs(want))) > 1e-3


def test_identity_kernel_is_vtrace(claims):
    got, want = claims["identity"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert float(jnp.max(jnp.abs(want))) > 1e-3


def test_clipped_bias_cut(claims):
    r = claims["cut"]
    assert float(r["rac"]) < float(r["drop"]) and float(r["ratio"]) > 1.0


def test_history_too_short(problem):
    with pytest.raises(ValueError, match="history"):
        rac.expected_update(*problem[:2], (0, 8, 8), KERNELS, problem[2], "rac")
