"""actor.py: exact expected gradients on softmax tables vs NumPy, Eq 2 / Eq 13 invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators import actor

S, A = 4, 5


def setup(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(S, A))
    mu = rng.dirichlet(np.ones(A), size=S)
    adv = rng.normal(size=(S, A))
    return logits, mu, adv


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_weight(rho, kind, c):
    if kind == "ratio":
        return rho
    if kind == "truncate":
        return np.minimum(rho, c)
    return np.where((rho >= 1 / c) & (rho <= c), rho, 0.0)


def np_expected_grad(logits, mu, adv, kind, c, centered):
    """(1/S) sum_s E_{a~mu}[A (w u - m_w)] with u = e_a - pi(s) (grad wrt the logits)."""
    pi = softmax(logits)
    g = np.zeros_like(logits)
    for s in range(S):
        w = np_weight(pi[s] / mu[s], kind, c)
        u = np.eye(A) - pi[s][None, :]  # row a: score of action a
        m_w = (mu[s] * w) @ u
        for a in range(A):
            g[s] += mu[s, a] * adv[s, a] * (w[a] * u[a] - (m_w if centered else 0.0))
    return g / S


def expected_loss(logits, mu, adv, kind, c, centered):
    """Token-weighted loss whose gradient is minus the exact expectation over (s ~ uniform, a ~ mu)."""
    log_pi_all = jax.nn.log_softmax(logits)
    log_mu_all = jnp.log(mu)
    weight = S * A * (mu / S)  # mean over S*A tokens -> sum_s (1/S) sum_a mu(a|s)
    centering = None
    if centered:
        centering = jnp.broadcast_to(actor.centering_term(log_pi_all, log_mu_all, kind=kind, clip=c)[:, None], (S, A))
    return actor.policy_loss(log_pi_all, log_mu_all, weight * adv, kind=kind, clip=c, centering=centering)


_grad = jax.jit(jax.grad(expected_loss), static_argnames=("kind", "c", "centered"))


@pytest.mark.parametrize("kind,c", [("ratio", None), ("truncate", 1.5), ("mask", 2.0)])
@pytest.mark.parametrize("centered", [False, True])
def test_expected_gradient_matches_numpy(kind, c, centered):
    with jax.enable_x64(True):
        logits, mu, adv = setup(0)
        got = -np.asarray(_grad(jnp.asarray(logits), jnp.asarray(mu), jnp.asarray(adv), kind=kind, c=c, centered=centered))
        np.testing.assert_allclose(got, np_expected_grad(logits, mu, adv, kind, c, centered), atol=1e-12)


@pytest.mark.parametrize("kind,c", [("ratio", None), ("truncate", 1.5), ("mask", 2.0)])
def test_score_centering_removes_baseline_dependence_eq2(kind, c):
    with jax.enable_x64(True):
        logits, mu, adv = map(jnp.asarray, setup(1))
        b = jnp.asarray(np.random.default_rng(9).normal(size=(S, 1))) * 3.0
        g = lambda a, cen: _grad(logits, mu, a, kind=kind, c=c, centered=cen)
        np.testing.assert_allclose(g(adv + b, True), g(adv, True), atol=1e-12)
        drift = np.max(np.abs(np.asarray(g(adv + b, False) - g(adv, False))))
        if kind == "ratio":
            # Exact ratios: m_w = E_mu[rho u] = E_pi[u] = 0, so no drift even uncentred.
            assert drift < 1e-12
        else:
            # Clipped/masked weights: m_w != 0 off-policy and the baseline drifts the update (Eq 1).
            assert drift > 1e-3


def test_standard_ppo_special_case():
    with jax.enable_x64(True):
        rng = np.random.default_rng(2)
        log_mu = np.log(rng.uniform(0.05, 1, size=32))
        log_pi = log_mu + rng.normal(0, 0.3, size=32)
        log_pi = np.minimum(log_pi, 0.0)
        adv = rng.normal(size=32)
        eps = 0.2
        got = actor.policy_loss(jnp.asarray(log_pi), jnp.asarray(log_mu), jnp.asarray(adv), ppo_epsilon=eps, log_pi_old=jnp.asarray(log_mu))
        ratio = np.exp(log_pi - log_mu)
        want = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_topk_centering_exact_when_k_covers_or_tail_matches_model():
    with jax.enable_x64(True):
        logits, mu, _ = setup(3)
        log_pi_all = jax.nn.log_softmax(jnp.asarray(logits))
        full = lambda lp: actor.centering_term(lp, jnp.log(jnp.asarray(mu)), kind="truncate", clip=1.5)
        ids = jnp.argsort(-jnp.asarray(mu), axis=-1)
        topk = lambda lp, k, m: actor.centering_term_topk(lp, jnp.take_along_axis(jnp.log(m), ids[:, :k], -1), ids[:, :k], kind="truncate", clip=1.5)
        # k = A: identical values and gradients.
        np.testing.assert_allclose(topk(log_pi_all, A, jnp.asarray(mu)), full(log_pi_all), atol=1e-12)
        g_full = jax.jacrev(lambda x: full(jax.nn.log_softmax(x)))(jnp.asarray(logits))
        g_top = jax.jacrev(lambda x: topk(jax.nn.log_softmax(x), A, jnp.asarray(mu)))(jnp.asarray(logits))
        np.testing.assert_allclose(g_top, g_full, atol=1e-12)
        # k = 2 with a behaviour tail that really is pi-proportional: still exact.
        pi = np.exp(np.asarray(log_pi_all))
        mu2 = mu.copy()
        idn = np.asarray(ids)
        for s in range(S):
            tail = idn[s, 2:]
            mu2[s, tail] = mu[s, tail].sum() * pi[s, tail] / pi[s, tail].sum()
        np.testing.assert_allclose(
            topk(log_pi_all, 2, jnp.asarray(mu2)),
            actor.centering_term(log_pi_all, jnp.log(jnp.asarray(mu2)), kind="truncate", clip=1.5), atol=1e-12)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="log_mu"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.full(3, 0.5), jnp.ones(3))
    with pytest.raises(ValueError, match="advantages"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.zeros(3) - 1, jnp.ones(2))
    with pytest.raises(ValueError, match="ppo_epsilon"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.zeros(3) - 1, jnp.ones(3), ppo_epsilon=1.5)


def test_centering_weight_uses_the_proximal_policy_when_given():
    with jax.enable_x64(True):
        logits, mu, _ = setup(5)
        log_pi_all = jax.nn.log_softmax(jnp.asarray(logits))
        log_mu_all = jnp.log(jnp.asarray(mu))
        old = jax.nn.log_softmax(jnp.asarray(logits) + 0.5 * jnp.asarray(np.random.default_rng(6).normal(size=(S, A))))
        same = actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5, log_pi_old_all=log_pi_all)
        np.testing.assert_allclose(same, actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5), atol=1e-14)
        got = actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5, log_pi_old_all=old)
        w_old = np.minimum(np.exp(np.asarray(old)) / mu, 1.5)
        np.testing.assert_allclose(got, np.sum(mu * w_old * np.asarray(log_pi_all), -1), atol=1e-12)
        assert np.max(np.abs(np.asarray(got - same))) > 1e-3
