"""Staleness laws and policy version histories (float64, exact)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import exact
from vccc_jax.tabular import history as H
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular.policies import softmax_policy


@pytest.mark.parametrize("law, mean", [(law, m) for law in H.STALENESS_LAWS
                                       for m in (0, 1, 2.5, 4) if law != "fixed" or m == int(m)])
def test_lag_weights_are_distributions_with_the_stated_mean(law, mean):
    w = H.lag_weights(law, mean, 12)
    assert w.shape == (13,) and np.all(w >= 0)
    assert w.sum() == pytest.approx(1.0, abs=1e-14)
    assert H.lag_mean(w) == pytest.approx(mean, abs=1e-10)


def test_law_shapes():
    assert np.array_equal(H.lag_weights("fixed", 3, 5), [0, 0, 0, 1, 0, 0])
    np.testing.assert_allclose(H.lag_weights("uniform", 1.5, 5), [0.25] * 4 + [0, 0])
    g = H.lag_weights("geometric", 2, 40)
    ratios = g[1:10] / g[:9]
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)  # constant ratio q
    assert ratios[0] == pytest.approx(2 / 3, abs=1e-3)  # ~ untruncated q = m / (1 + m)
    z = H.lag_weights("zipf", 2, 40)
    lags = np.arange(41)
    s = -np.polyfit(np.log1p(lags), np.log(z), 1)[0]
    np.testing.assert_allclose(np.log(z), np.log(z[0]) - s * np.log1p(lags), atol=1e-10)
    # Heavy tail: at the same mean, zipf puts more mass beyond 5x the mean than geometric.
    assert z[10:].sum() > 3 * g[10:].sum()


def test_version_weights_reverse_lags():
    w = H.version_weights("fixed", 1, 4)
    assert np.array_equal(w, [0, 0, 1, 0])  # lag 1 -> version K - 1 = 2


@pytest.mark.parametrize("law, mean, L, match", [
    ("fixed", 1.5, 5, "integer"), ("fixed", 6, 5, "integer"), ("uniform", 3, 5, "2\\*mean_lag"),
    ("geometric", 5, 5, "< max_lag"), ("poisson", 1, 5, "law must be"), ("zipf", -1, 5, "mean_lag"),
])
def test_bad_law_arguments(law, mean, L, match):
    with pytest.raises(ValueError, match=match):
        H.lag_weights(law, mean, L)


@pytest.fixture(scope="module")
def mdps():
    with jax.enable_x64(True):
        return jax.jit(lambda k: M.garnet_mdp(k, 3, 5, 3, 2, gamma=0.9))(jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def _history_fn(cfg):
    return jax.jit(jax.vmap(functools.partial(H.policy_history, config=cfg)))


def _histories(mdps, cfg):
    th = H.initial_logits(jax.random.PRNGKey(1), 3, 5, 3, cfg.init_scale)
    return _history_fn(cfg)(mdps, th), th


@pytest.mark.parametrize("algorithm, eta", [("npg", 0.3), ("pg", 1.0)])
def test_history_improves_the_policy_and_reports_kl(mdps, algorithm, eta):
    with jax.enable_x64(True):
        cfg = H.HistoryConfig(algorithm=algorithm, step_size=eta, num_versions=6)
        h, th = _histories(mdps, cfg)
        assert h.logits.shape == (3, 6, 5, 3) and h.kl.shape == (3, 5)
        np.testing.assert_array_equal(h.logits[:, 0], th)
        # Exact (N)PG with a small step: the objective init . V^pi never decreases.
        J = jnp.einsum("ns,nvs->nv", mdps.init, h.values)
        assert np.all(np.diff(np.asarray(J), axis=1) > -1e-12)
        assert np.all(J[:, -1] > J[:, 0] + 1e-3)
        # Values and visitations are those of the versions' policies.
        m0 = mdps[0]
        ref = jax.jit(lambda th: (exact.policy_value(m0, softmax_policy(th)),
                                  exact.visitation(m0, softmax_policy(th))))
        for v in (0, 5):
            val, vis = ref(h.logits[0, v])
            np.testing.assert_allclose(h.values[0, v], val, atol=1e-12)
            np.testing.assert_allclose(h.visitation[0, v], vis, atol=1e-12)
        np.testing.assert_allclose(h.probs.sum(-1), 1.0, atol=1e-12)
        # KL(pi_i || pi_{i-1}) under d^{pi_i}, computed directly.
        p1, p0 = h.probs[0, 3], h.probs[0, 2]
        kl_direct = np.sum(np.asarray(h.visitation[0, 3]) *
                           np.sum(np.asarray(p1) * np.log(np.asarray(p1) / np.asarray(p0)), -1))
        assert float(h.kl[0, 2]) == pytest.approx(kl_direct, rel=1e-10)
        assert np.all(h.kl > 0) and np.all(h.kl_max >= h.kl - 1e-15)


def test_npg_step_is_theta_plus_eta_advantage(mdps):
    with jax.enable_x64(True):
        m = mdps[1]
        th = jax.random.normal(jax.random.PRNGKey(2), (5, 3), jnp.float64)
        pi = softmax_policy(th)
        q = exact.q_values(m, pi)
        adv = q - np.sum(np.asarray(pi) * np.asarray(q), -1, keepdims=True)
        np.testing.assert_allclose(H.npg_step(m, th, 0.7), th + 0.7 * adv, atol=1e-12)
        # PG step: finite-difference check of the exact gradient of init . V^pi.
        J = lambda t: float(m.init @ exact.policy_value(m, softmax_policy(t)))  # noqa: E731
        g = (H.pg_step(m, th, 1.0) - th)
        e = np.zeros((5, 3))
        e[2, 1] = 1e-6
        fd = (J(th + e) - J(th - e)) / 2e-6
        assert float(g[2, 1]) == pytest.approx(fd, rel=1e-6)


def test_replay_state_distribution_and_posterior():
    with jax.enable_x64(True):
        w = jnp.asarray([0.2, 0.3, 0.5])
        d = jnp.asarray([[0.5, 0.5, 0.0], [0.1, 0.9, 0.0], [1.0, 0.0, 0.0]])
        dmix = H.replay_state_distribution(w, d)
        np.testing.assert_allclose(dmix, [0.63, 0.37, 0.0], atol=1e-15)
        q = H.version_posterior(w, d)
        np.testing.assert_allclose(q[:, 0], np.array([0.1, 0.03, 0.5]) / 0.63, atol=1e-15)
        np.testing.assert_allclose(q[:, 2], w, atol=1e-15)  # unvisited state: the prior
        np.testing.assert_allclose(q.sum(0), 1.0, atol=1e-15)


def test_history_config_errors():
    with pytest.raises(ValueError, match="step_size"):
        H.HistoryConfig(step_size=0)
    with pytest.raises(ValueError, match="num_versions"):
        H.HistoryConfig(num_versions=0)
    with pytest.raises(ValueError, match="initial_logits"):
        m = M.make_mdp(np.full((4, 2, 4), 0.25), np.zeros((4, 2)), 0.9)
        H.policy_history(m, jnp.zeros((3, 2)), H.HistoryConfig())
