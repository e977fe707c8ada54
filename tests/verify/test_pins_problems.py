"""Pins of the verifier's own yardsticks (``verify.problems``) against NumPy written here:
the error of every exact check is max |x| (an error that is negative everywhere must count),
and the independent closed forms of the clipped policies of Eq 10 (Z and pitilde for the
truncation min(c mu, pi) and the double-sided mask), by a loop over states and actions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.verify import problems as P

C = 2.0


def _policies(seed, s=5, a=4):
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.ones(a), size=s)
    mu = rng.dirichlet(np.ones(a), size=s)
    return pi, mu


def test_maxabs_counts_negative_errors():
    x = -np.linspace(0.5, 3.0, 6).reshape(2, 3)
    assert float(P.maxabs(jnp.asarray(x))) == 3.0
    assert float(P.maxabs(jnp.asarray(-x))) == 3.0
    assert float(P.maxabs(jnp.asarray([-1e-3, 2e-4]))) == pytest.approx(1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truncated_policy_brute_force(seed):
    pi, mu = _policies(seed)
    with jax.enable_x64(True):
        z, pit = P.truncated_policy(jnp.asarray(pi), jnp.asarray(mu), C)
        z, pit = np.asarray(z), np.asarray(pit)
    for s in range(pi.shape[0]):
        m = [min(C * mu[s, a], pi[s, a]) for a in range(pi.shape[1])]
        assert z[s] == pytest.approx(sum(m), rel=1e-12)
        np.testing.assert_allclose(pit[s], np.array(m) / sum(m), rtol=1e-12)
    assert np.any(z < 1.0 - 1e-6)  # some state is clipped: the threshold matters


@pytest.mark.parametrize("seed", [0, 1])
def test_masked_policy_brute_force(seed):
    pi, mu = _policies(seed)
    with jax.enable_x64(True):
        z, pit = P.masked_policy(jnp.asarray(pi), jnp.asarray(mu), C)
        z, pit = np.asarray(z), np.asarray(pit)
    for s in range(pi.shape[0]):
        m = [pi[s, a] if mu[s, a] / C <= pi[s, a] <= C * mu[s, a] else 0.0
             for a in range(pi.shape[1])]
        assert z[s] == pytest.approx(sum(m), rel=1e-12, abs=1e-15)
        if sum(m) > 0:
            np.testing.assert_allclose(pit[s], np.array(m) / sum(m), rtol=1e-12)
