"""Exact decoupled-correction routes on tabular MDPs (vccc_jax.tabular.decoupled)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related import decoupled as dc
from vccc_jax.tabular import decoupled as td
from vccc_jax.tabular import exact
from vccc_jax.tabular.history import HistoryConfig, policy_history
from vccc_jax.tabular.mdp import random_mdp


@pytest.fixture(scope="module")
def setup():
    with jax.enable_x64(True):
        mdp = random_mdp(jax.random.PRNGKey(3), 1, 3, 3, gamma=0.8, dtype=jnp.float64)[0]
        theta0 = jax.random.normal(jax.random.PRNGKey(4), (3, 3), jnp.float64)
        hist = policy_history(mdp, theta0, HistoryConfig(step_size=0.4, num_versions=5))
        vbar = jnp.asarray([0.2, -0.1, 0.4])
        return mdp, hist.logits, vbar


def _mu(logits, lag, noise):
    return td.inference_policy(logits[-1 - lag], noise_scale=noise, key=jax.random.PRNGKey(9))


def test_no_mismatch_no_lag_all_routes_agree(setup):
    mdp, logits, vbar = setup
    with jax.enable_x64(True):
        res = td.route_comparison(mdp, logits, 0, _mu(logits, 0, 0.0), vbar, decay=0.0)
        for r in td.ROUTES:
            assert res[r]["actor_bias_vs_exact"] < 1e-12 and res[r]["actor_bias_vs_ideal"] < 1e-12
            assert res[r]["critic_bias_vs_ideal"] < 1e-12


def test_exact_route_unclipped_is_unbiased_and_naive_is_not(setup):
    mdp, logits, vbar = setup
    with jax.enable_x64(True):
        mu = _mu(logits, 2, 0.5)
        res = td.route_comparison(mdp, logits, 2, mu, vbar, decay=0.5, kind="ratio", clip=None,
                                  ppo_epsilon=None)
        assert res["exact"]["actor_bias_vs_ideal"] < 1e-10
        assert res["exact"]["critic_bias_vs_ideal"] < 1e-10
        # Unclipped, pi_old cancels: every route is exactly unbiased (only thresholds differ).
        assert res["behaviour"]["actor_bias_vs_exact"] < 1e-10
        clipped = td.route_comparison(mdp, logits, 2, mu, vbar, decay=0.5, kind="truncate", clip=1.5,
                                      ppo_epsilon=0.2)
        assert clipped["behaviour"]["actor_bias_vs_exact"] > 1e-3
        assert clipped["ewma"]["actor_bias_vs_exact"] > 0.0


def test_actor_variance_by_enumeration(setup):
    mdp, logits, _ = setup
    with jax.enable_x64(True):
        mu = _mu(logits, 1, 0.3)
        pols = td.route_policies(logits, 1, mu, decay=0.5)
        mean, var = td.actor_update_moments(mdp, pols["pi"], pols["ewma"], mu, kind="mask", clip=2.0,
                                            ppo_epsilon=0.2)
        pi, old, mu = (np.array(x) for x in (pols["pi"], pols["ewma"], mu))
        adv = np.array(exact.q_values(mdp, pols["pi"]))
        adv -= (pi * adv).sum(-1, keepdims=True)
        for s in range(3):
            samples, probs = [], []
            for a in range(3):
                d, r = old[s, a] / mu[s, a], pi[s, a] / old[s, a]
                w = d if 0.5 <= d <= 2.0 else 0.0
                on = not ((adv[s, a] > 0 and r > 1.2) or (adv[s, a] < 0 and r < 0.8))
                u = np.eye(3)[a] - pi[s]
                samples.append(w * r * adv[s, a] * u * on)
                probs.append(float(mu[s, a]))
            samples, probs = np.asarray(samples), np.asarray(probs)
            m = probs @ samples
            np.testing.assert_allclose(mean[s], m, atol=1e-12)
            np.testing.assert_allclose(var[s], probs @ np.sum((samples - m) ** 2, -1), atol=1e-12)


def test_threshold_interaction(setup):
    mdp, logits, _ = setup
    with jax.enable_x64(True):
        out = td.threshold_interaction(mdp, logits, 0, _mu(logits, 0, 0.6), decay=0.0, kind="mask",
                                       clips=(1.5, 3.0), epsilons=(0.1, 0.3))
        assert np.all(out["behaviour"]["discrepancy"] == 0.0)
        assert np.all(out["exact"]["ppo"] == 0.0)  # lag 0: pi_old = pi exactly
        assert np.all(out["behaviour"]["ppo"] > 0.0)  # inference noise trips the PPO clip
        assert out["behaviour"]["ppo"][0, 0] > out["behaviour"]["ppo"][0, 1]  # wider clip fires less
        assert out["exact"]["discrepancy"][0, 0] >= out["exact"]["discrepancy"][1, 0]


def test_ewma_logits_match_estimator_update(setup):
    _, logits, _ = setup
    with jax.enable_x64(True):
        state = dc.ewma_init(logits[0])
        for k in range(logits.shape[0]):
            state = dc.ewma_update(state, logits[k], 0.6)
        np.testing.assert_allclose(td.ewma_logits(logits, 0.6), dc.ewma_params(state, 0.6), atol=1e-12)


def test_critic_moments_routes_and_inference_policy_by_hand(setup):
    """Every function of tabular/decoupled.py against numpy written from its docstring: the
    critic target Vbar + w(pi_old / mu) clip(pi / pi_old) delta (mean and variance over a ~ mu,
    s' ~ P), the route policies, the EWMA of the logits and the inference-side sampler."""
    mdp, logits, vbar = setup
    with jax.enable_x64(True):
        mu = _mu(logits, 1, 0.3)
        pols = td.route_policies(logits, 1, mu, decay=0.5)
        sm = lambda z: np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)  # noqa: E731
        L = np.asarray(logits)
        w = 0.5 ** np.arange(3, -1, -1)  # versions 0..3 (K - lag = 3), the newest weighted most
        ewma = np.einsum("v,vsa->sa", w / w.sum(), L[:4])
        for name, want in (("pi", sm(L[4])), ("exact", sm(L[3])), ("ewma", sm(ewma)), ("behaviour", np.asarray(mu))):
            np.testing.assert_allclose(pols[name], want, atol=1e-12)
        np.testing.assert_allclose(td.ewma_logits(logits[:4], 0.5), ewma, atol=1e-12)
        pi, old, mu_ = (np.asarray(pols[k]) for k in ("pi", "ewma", "mu"))
        P, R, v = np.asarray(mdp.P), np.asarray(mdp.R), np.asarray(vbar)
        gam = float(mdp.gamma) * (1 - np.asarray(mdp.terminal))
        mean, var = td.critic_target_moments(mdp, pols["pi"], pols["ewma"], pols["mu"], vbar, kind="truncate",
                                             clip=1.2, ppo_epsilon=0.1)
        for s in range(3):
            ys, ps = [], []
            for a in range(3):
                wgt = min(old[s, a] / mu_[s, a], 1.2) * np.clip(pi[s, a] / old[s, a], 0.9, 1.1)
                for s2 in range(3):
                    ys.append(v[s] + wgt * (R[s, a, s2] + gam[s2] * v[s2] - v[s]))
                    ps.append(mu_[s, a] * P[s, a, s2])
            ys, ps = np.asarray(ys), np.asarray(ps)
            m = ps @ ys
            np.testing.assert_allclose(mean[s], m, atol=1e-12)
            np.testing.assert_allclose(var[s], ps @ (ys - m) ** 2, atol=1e-12)
        # inference policy: softmax(quantum * round((logits + noise) / quantum) / temperature)
        noise = np.asarray(jax.random.normal(jax.random.PRNGKey(9), L[2].shape, jnp.float64))
        got = td.inference_policy(logits[2], noise_scale=0.3, key=jax.random.PRNGKey(9), quantum=0.25, temperature=0.7)
        np.testing.assert_allclose(got, sm(0.25 * np.round((L[2] + 0.3 * noise) / 0.25) / 0.7), atol=1e-12)
        # fire probabilities: P_mu[mask fires], P_mu[PPO ratio outside 1 +- eps]
        d = old / mu_
        fd, fr = td.fire_probabilities(pols["pi"], pols["ewma"], pols["mu"], kind="mask", clip=1.2, ppo_epsilon=0.05)
        np.testing.assert_allclose(fd, np.sum(mu_ * ((d < 1 / 1.2) | (d > 1.2)), -1), atol=1e-12)
        r = pi / old
        np.testing.assert_allclose(fr, np.sum(mu_ * ((r < 0.95) | (r > 1.05)), -1), atol=1e-12)
        assert np.max(var) > 1e-3 and np.max(fd) > 0 and np.max(fr) > 0
