"""exact_truth: closed-form values, replay mixtures and actor-gradient bias for a network's
logits on a tabular env (issue 11 §1). Exact identities in float64 to ~1e-10."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.tabular_env import make_params, params_mdp
from vccc_jax.tabular import exact, history
from vccc_jax.tabular.mdp import random_mdp

S, A, K = 5, 3, 4
TOL = 1e-10


def linear(theta, obs):
    return obs @ theta


@pytest.fixture(scope="module")
def case():
    """A tabular (one-hot, linear) actor whose versions are an exact NPG history, in a ring."""
    with jax.enable_x64(True):
        mdp = random_mdp(jax.random.PRNGKey(0), 1, S, A, gamma=0.9, dtype=jnp.float64)[0]
        params = make_params(mdp, "onehot")
        theta0 = jax.random.normal(jax.random.PRNGKey(1), (S, A), jnp.float64)
        hist = history.policy_history(mdp, theta0, history.HistoryConfig("npg", 0.7, K))
        buffer = lag_lib.init_buffer(hist.logits[0], K)
        for i in range(1, K):
            buffer = lag_lib.push(buffer, hist.logits[i])
        weights = jnp.asarray(lag_lib.LagLaw.parse("uniform:3").pmf(K))  # over lags 0..K-1
        obs = params.obs_table.astype(jnp.float64)
        out = _run(params_mdp(params), obs, hist.logits[-1], buffer, weights)
        return mdp, hist, buffer, weights, obs, out


def _run(mdp, obs, theta, buffer, weights):
    log_pi = et.policy_log_probs(linear, theta, obs)
    log_mus = et.ring_log_probs(linear, buffer, obs)
    return et.version_truth(mdp, log_pi, log_mus, weights)


def test_version_truth_matches_tabular_oracles(case):
    mdp, hist, _, weights, _, truth = case
    with jax.enable_x64(True):
        np.testing.assert_allclose(truth.v_pi, hist.values[-1], atol=TOL)
        # lag l is version K-1-l
        np.testing.assert_allclose(truth.v_mus, hist.values[::-1], atol=TOL)
        w_versions = weights[::-1]
        np.testing.assert_allclose(
            truth.d_mix, history.replay_state_distribution(w_versions, hist.visitation), atol=TOL)
        np.testing.assert_allclose(
            truth.posterior, history.version_posterior(w_versions, hist.visitation)[::-1], atol=TOL)
        # V^{mix} is the fixed point of the uncorrected expected update under the replay
        backups = jax.vmap(lambda m: exact.bellman_operator(mdp, m, truth.v_mix))(hist.probs[::-1])
        np.testing.assert_allclose(jnp.sum(truth.posterior * backups, 0), truth.v_mix, atol=TOL)
        assert float(jnp.max(jnp.abs(truth.v_mix - truth.v_pi))) > 0.05


def test_version_truth_is_jittable(case):
    mdp, hist, buffer, weights, obs, truth = case
    with jax.enable_x64(True):
        jitted = jax.jit(_run)(params_mdp(make_params(mdp, "onehot")), obs, hist.logits[-1],
                                buffer, weights)
        np.testing.assert_allclose(jitted.v_mix, truth.v_mix, atol=TOL)


def test_critic_errors(case):
    _, _, _, _, _, truth = case
    with jax.enable_x64(True):
        e = et.critic_errors(truth.v_pi, truth)
        assert float(e.rmse_pi) == 0.0 and float(e.max_pi) == 0.0
        np.testing.assert_allclose(e.rmse_mix, e.gap, atol=TOL)
        e2 = et.critic_errors(truth.v_pi + 0.5, truth, jnp.full((S,), 1.0 / S))
        np.testing.assert_allclose([e2.rmse_pi, e2.max_pi], [0.5, 0.5], atol=TOL)
        w = et.empirical_state_weights(jnp.array([0, 0, 2, 4]), S)
        np.testing.assert_allclose(w, [0.5, 0, 0.25, 0, 0.25])


def test_linear_fixed_point(case):
    mdp, hist, _, _, obs, truth = case
    with jax.enable_x64(True):
        # one-hot features: the fixed points are V^{mubar} (uncorrected) and V^{pi} (VCCC)
        np.testing.assert_allclose(
            et.linear_fixed_point(mdp, obs, truth.d_mix, truth.mix_policy), truth.v_mix, atol=1e-9)
        pi = jnp.exp(truth.log_pi)
        np.testing.assert_allclose(et.linear_fixed_point(mdp, obs, truth.d_mix, pi), truth.v_pi, atol=1e-9)
        # aliased features: the projected Bellman equation holds, the value is not V^pi
        phi = jax.random.normal(jax.random.PRNGKey(3), (S, 2), jnp.float64)
        v = et.linear_fixed_point(mdp, phi, truth.d_mix, pi)
        resid = phi.T @ (truth.d_mix * (exact.bellman_operator(mdp, pi, v) - v))
        np.testing.assert_allclose(resid, 0.0, atol=1e-10)
        assert float(jnp.max(jnp.abs(v - truth.v_pi))) > 1e-3


def test_actor_update_equals_eq12_with_exact_ratios_and_target_critic(case):
    mdp, hist, _, _, obs, truth = case
    with jax.enable_x64(True):
        theta = hist.logits[-1]
        g = et.actor_update_truth(linear, theta, obs, mdp, truth, truth.v_pi)
        np.testing.assert_allclose(g.expected, g.eq12, atol=TOL)
        # tabular logits: Eq 12 is d_mix(s) E_pi[Q^pi u | s] per state
        pi = jnp.exp(truth.log_pi)
        ref = truth.d_mix[:, None] * exact.exact_actor_update(mdp, pi, exact.softmax_score(pi))
        np.testing.assert_allclose(g.eq12, ref, atol=TOL)
        b = et.gradient_bias(g.expected, g.eq12)
        assert float(b.bias_norm) < TOL and float(b.cosine) == pytest.approx(1.0, abs=1e-12)
        # score centring does not change the expectation with exact ratios (m_rho = E_pi u = 0)
        gc = et.actor_update_truth(linear, theta, obs, mdp, truth, truth.v_pi, centred=True)
        np.testing.assert_allclose(gc.expected, g.eq12, atol=TOL)


def test_actor_bias_of_a_stale_critic_and_of_clipping(case):
    mdp, hist, _, _, obs, truth = case
    with jax.enable_x64(True):
        theta = hist.logits[-1]
        g = et.actor_update_truth(linear, theta, obs, mdp, truth, truth.v_mix)
        assert float(et.gradient_bias(g.expected, g.eq12).relative) > 1e-2
        # closed form per state: sum_i q_i E_{mu_i}[rho A u] (exact.importance_weighted_actor_update)
        pi, mus = jnp.exp(truth.log_pi), jnp.exp(truth.log_mus)
        u = exact.softmax_score(pi)
        per = jax.vmap(lambda m: exact.importance_weighted_actor_update(mdp, pi, m, truth.v_mix, u))(mus)
        ref = truth.d_mix[:, None] * jnp.einsum("ks,ksa->sa", truth.posterior, per)
        np.testing.assert_allclose(g.expected, ref, atol=TOL)
        # clipped + centred (Eq 13) against exact.centred_actor_update
        gc = et.actor_update_truth(linear, theta, obs, mdp, truth, truth.v_mix,
                                   kind="truncate", clip=1.2, centred=True)
        adv = exact.q_values(mdp, v=truth.v_mix) - truth.v_mix[:, None]
        per = jax.vmap(lambda m: exact.centred_actor_update(
            mdp, m, u, exact.clip_weights(pi, m, 1.2), adv))(mus)
        ref = truth.d_mix[:, None] * jnp.einsum("ks,ksa->sa", truth.posterior, per)
        np.testing.assert_allclose(gc.expected, ref, atol=TOL)
