"""Exact actor-side quantities on a single finite MDP (Eq 1, 2 / 13, 12; ``tabular.exact``).

Scores of a tabular softmax policy, the mean score m_w(s) of Sec 2.2 / 5.2, the drift
decomposition of Eq 1, the centred update of Eq 13, and both sides of Eq 12. Re-exported
by ``tabular.exact``; import it from there.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax.numpy as jnp

from vccc_jax.tabular.evaluation import _masked, q_values, ratio_table, visitation
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array


def softmax_score(pi: Array, temperature: float = 1.0) -> Array:
    """u(s, a) = grad_theta log pi(a|s) for pi = softmax(theta / temperature) with tabular theta.

    Only the row theta[s, :] matters for state s, so u is stored as [S, A, A]:
    u[s, a, a'] = (1[a = a'] - pi(a'|s)) / temperature.
    """
    A = pi.shape[-1]
    return (jnp.eye(A, dtype=pi.dtype)[None, :, :] - pi[:, None, :]) / temperature


def mean_score(mu: Array, u: Array, w: Optional[Array] = None) -> Array:
    """m_w(s) = E_mu[w(s, a) u(s, a) | s] (Sec 2.2 / 5.2); w = None gives m_mu(s). [S, A]"""
    weight = mu if w is None else mu * jnp.where(mu > 0, w, 0.0)
    return jnp.einsum("sa,sab->sb", weight, u)


def actor_drift_decomposition(
    mdp: TabularMDP, pi: Array, mu: Array, baseline: Array, temperature: float = 1.0
) -> tuple[Array, Array, Array]:
    """Eq 1 for a softmax pi, with G the behaviour Monte-Carlo return (E[G | s, a] = Q^mu):

        g_b(s) = E_mu[(G - b(s)) u | s] = Cov_mu(G, u | s) + (V^mu(s) - b(s)) m_mu(s).

    Returns (g_b, cov, drift), each [S, A] (the gradient wrt theta[s, :]).
    """
    u = softmax_score(pi, temperature)
    q_mu = q_values(mdp, mu)
    v_mu = jnp.sum(mu * q_mu, axis=-1)
    g_b = jnp.einsum("sa,sab->sb", mu * (q_mu - baseline[:, None]), u)
    cov = jnp.einsum("sa,sab->sb", mu * (q_mu - v_mu[:, None]), u)
    drift = (v_mu - baseline)[:, None] * mean_score(mu, u)
    return g_b, cov, drift


def centred_actor_update(mdp: TabularMDP, mu: Array, u: Array, w: Array, advantages: Array) -> Array:
    """Eq 13: g^SC(s) = E_mu[A (w u - m_w(s)) | s] for per-transition advantages A [S, A, S']
    (or [S, A]). [S, A]"""
    if advantages.ndim == 3:
        advantages = jnp.sum(mdp.P * _masked(mu[:, :, None] * mdp.P, advantages), axis=-1)
    m_w = mean_score(mu, u, w)
    centred = jnp.where(mu > 0, w, 0.0)[:, :, None] * u - m_w[:, None, :]
    return jnp.einsum("sa,sab->sb", mu * advantages, centred)


def score_covariance(mdp: TabularMDP, mu: Array, u: Array, w: Array, returns_q: Array) -> Array:
    """Cov_mu(G, Z_w | s) with Z_w = w u and E[G | s, a] = returns_q(s, a) (Eq 2 RHS). [S, A]"""
    mean_g = jnp.sum(mu * returns_q, axis=-1)
    zw = jnp.where(mu > 0, w, 0.0)[:, :, None] * u
    return jnp.einsum("sa,sab->sb", mu * (returns_q - mean_g[:, None]), zw)


def importance_weighted_actor_update(mdp: TabularMDP, pi: Array, mu: Array, v: Array, u: Array) -> Array:
    """E_mu[rho (r + gamma(s') v(s') - v(s)) u | s] (Sec 5.1, the LHS of Eq 12). [S, A]"""
    rho = jnp.where(mu > 0, ratio_table(pi, mu), 0.0)
    adv = q_values(mdp, v=v) - v[:, None]
    return jnp.einsum("sa,sab->sb", mu * rho * adv, u)


def exact_actor_update(mdp: TabularMDP, pi: Array, u: Array) -> Array:
    """E_pi[Q^pi(s, a) u(s, a) | s] (the RHS of Eq 12). [S, A]"""
    return jnp.einsum("sa,sab->sb", pi * q_values(mdp, pi), u)


def policy_gradient(mdp: TabularMDP, pi: Array, u: Array) -> Array:
    """grad_theta of init . V^pi for tabular logits: d(s) E_pi[Q^pi u | s] with the
    unnormalised discounted visitation d (the policy-gradient theorem). [S, A]

    Infinite-horizon MDPs only (a finite horizon makes Q time-dependent).
    """
    if mdp.horizon is not None:
        raise ValueError("policy_gradient is defined for infinite-horizon MDPs (horizon=None)")
    d = visitation(mdp, pi, normalize=False)
    return d[:, None] * exact_actor_update(mdp, pi, u)
