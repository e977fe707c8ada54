"""BRACE in the tabular sweep (issue 13 registration): the method adapter's exact moments
equal ``tabular.brace.target_moments`` and the sampled path equals the estimator."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related.brace import brace
from vccc_jax.tabular import brace as tb
from vccc_jax.tabular.mdp import random_mdp, with_horizon
from vccc_jax.tabular.methods import METHODS
from vccc_jax.tabular.vtrace_moments import Trajectory, vtrace_moments


@pytest.fixture(scope="module")
def setup():
    with jax.enable_x64(True):
        k = jax.random.split(jax.random.PRNGKey(7), 4)
        mdp = random_mdp(k[0], 1, 3, 2, gamma=0.9, dtype=jnp.float64)[0]
        pi = jax.nn.softmax(jax.random.normal(k[1], (3, 2), jnp.float64))
        mu = jax.nn.softmax(jax.random.normal(k[2], (3, 2), jnp.float64))
        vbar = jax.random.normal(k[3], (3,), jnp.float64)
        return mdp, pi, mu, vbar


@pytest.mark.parametrize("anchor,clip,n", [("prefix", 1.0, 2), ("constant", np.inf, 4)])
def test_adapter_moments_equal_target_moments(setup, anchor, clip, n):
    """On the time-folded horizon-H MDP, a segment of H steps is the whole episode, so the
    sweep adapter's moments at time-0 states are tabular.brace.target_moments' row 0 (float64)."""
    mdp, pi, mu, vbar = setup
    H = 4
    with jax.enable_x64(True):
        fin = with_horizon(mdp, H)
        kw = dict(clip_rho_threshold=None if np.isinf(clip) else clip,
                  clip_c_threshold=None if np.isinf(clip) else clip, tail_anchor=anchor)
        mean_ref, var_ref = tb.target_moments(fin, pi, mu, vbar, n=n, **kw)
        fm, pf, mf, vf = tb.fold(fin, pi, mu, vbar)
        opts = METHODS["brace"].options(dict(n=n, n_steps=H, tail_anchor=anchor))
        mean, var = METHODS["brace"].moments(fm, pf, mf, vf, jnp.asarray(clip), opts)
        np.testing.assert_allclose(mean[:3], mean_ref[0], atol=1e-12)
        np.testing.assert_allclose(var[:3], var_ref[0], atol=1e-12)
        assert float(jnp.min(var_ref[0])) > 1e-3  # a non-trivial variance was compared


def test_prefix_covering_segment_is_vtrace_and_variants(setup):
    mdp, pi, mu, vbar = setup
    with jax.enable_x64(True):
        m, v = tb.segment_moments(mdp, pi, mu, vbar, n=5, n_steps=3, clip=1.2)
        m2, v2 = vtrace_moments(mdp, pi, mu, vbar, n_steps=3, lambda_=1.0,
                                clip_rho_threshold=1.2, clip_c_threshold=1.2)
        np.testing.assert_allclose(m, m2, atol=1e-12)
        np.testing.assert_allclose(v, v2, atol=1e-12)
    assert [METHODS[f"brace_n{k}"].options()["n"] for k in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert METHODS["brace"].uses_clip and METHODS["brace"].multi_step
    with pytest.raises(ValueError, match="no option"):
        METHODS["brace"].options({"lambda_": 1.0})


def test_sampled_trajectory_target_equals_estimator():
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    T, B = 6, 5
    traj = Trajectory(log_rhos=0.7 * jax.random.normal(k[0], (T, B)),
                      discounts=jnp.full((T, B), 0.9), rewards=jax.random.normal(k[1], (T, B)),
                      values=jax.random.normal(k[2], (T, B)), bootstrap_value=jax.random.normal(k[3], (B,)))
    opts = METHODS["brace_n2"].options(dict(n_steps=T, tail_anchor="constant"))
    y = METHODS["brace_n2"].trajectory_target(traj, jnp.asarray(1.5), opts)
    ref = brace(traj.log_rhos, traj.discounts, traj.rewards, traj.values, traj.bootstrap_value,
                n=2, clip_rho_threshold=1.5, clip_c_threshold=1.5, tail_anchor="constant").vs[0]
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_sweep_mean_equals_monte_carlo_of_sampled_targets(setup):
    """Exact segment mean vs 6000 sampled segments through the estimator (fixed key; the
    tolerance is 5 standard errors of the sample mean, so a false failure has p < 1e-6; the
    variance within 15%, ~5 standard errors of a sample variance at this N)."""
    mdp, pi, mu, vbar = setup
    T, N, s0 = 4, 6000, 0
    with jax.enable_x64(True):
        mean, var = (np.asarray(x) for x in tb.segment_moments(mdp, pi, mu, vbar, n=1, n_steps=T, clip=1.0))
    P, R = (jnp.asarray(np.asarray(x), jnp.float32) for x in (mdp.P, mdp.R))
    pi, mu, vbar = (jnp.asarray(np.asarray(x), jnp.float32) for x in (pi, mu, vbar))

    def sample(key):
        def step(s, key):
            ka, ks = jax.random.split(key)
            a = jax.random.categorical(ka, jnp.log(mu[s]))
            s2 = jax.random.categorical(ks, jnp.log(P[s, a]))
            return s2, (jnp.log(pi[s, a] / mu[s, a]), R[s, a, s2], vbar[s], s2)
        s_end, (lr, r, v, _) = jax.lax.scan(step, s0, jax.random.split(key, T))
        return lr, r, v, vbar[s_end]

    lr, r, v, boot = jax.vmap(sample)(jax.random.split(jax.random.PRNGKey(11), N))
    y = brace(lr.T.astype(jnp.float32), jnp.full((T, N), 0.9, jnp.float32), r.T, v.T.astype(jnp.float32),
              boot.astype(jnp.float32), n=1).vs[0]
    se = np.sqrt(float(var[s0]) / N)
    assert abs(float(jnp.mean(y)) - float(mean[s0])) < 5 * se + 1e-4
    assert abs(float(jnp.var(y)) / float(var[s0]) - 1) < 0.15
