"""Exact actor-side quantities on a single finite MDP (Eq 1, 2 / 13, 12; ``tabular.exact``).

Scores of a tabular softmax policy, the mean score m_w(s) of Sec 2.2 / 5.2, the drift
decomposition of Eq 1, the centred update of Eq 13, and both sides of Eq 12. Re-exported
by ``tabular.exact``; import it from there.

The rows of the actor-correction table (``estimators.actor_registry``, issue 21):
:func:`correction_coefficients` (the per-state coefficients of any token-level row, also
used by the tabular-env and token-env truths), :func:`correction_update` (its exact
expected update on an infinite-horizon MDP under a version replay) and
:func:`population_threshold` (M2PO's infinite-batch mask). Sequence-level rows need the
distribution of whole sequences: ``tabular.actor_paths`` enumerates it on short horizons.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax.numpy as jnp

from vccc_jax.estimators import actor_registry
from vccc_jax.tabular.evaluation import (
    _masked,
    bellman_targets,
    q_values,
    ratio_table,
    visitation,
)
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


# ------------------------------------------------------- actor-correction rows (issue 21)


def population_threshold(correction: str, params: Optional[dict], log_rhos: Array,
                         probs: Array):
    """For a ``batch`` row of ``estimators.actor_registry`` (M2PO): its population
    (infinite-batch) mask threshold over token atoms ``log_rhos`` with probabilities
    ``probs`` (same shape), the ``threshold`` data input of the row; None for other rows."""
    row = actor_registry.get_actor_correction(correction)
    if row.level != "batch":
        return None
    p = row.resolve(params)
    return actor_registry.second_moment_threshold(log_rhos, probs, p["tau"])


def correction_coefficients(
    log_pi: Array,
    log_mu: Array,
    adv: Array,
    *,
    correction: str,
    params: Optional[dict] = None,
    centred: bool = False,
    next_prob: Optional[Array] = None,
    lags: Optional[Array] = None,
    threshold=None,
) -> Array:
    """Per-action coefficients of a one-step actor's expected update at a state under one
    behaviour mu, for any token-level row of ``estimators.actor_registry`` (and the batch
    row M2PO given its population ``threshold``): update = sum_a coeff(a) u(a) with

        coeff(a) = mu(a) E[w A | s, a] - c E_mu[A | s] mu(a) E[w | s, a]     (Eq 13 if c = 1)

    w = row(log pi - log mu, A) (0 off mu's support), c = 1 when ``centred`` (m_w(s) =
    E_mu[w u | s]; for a row whose w depends only on rho this is the library's centring).

    Args:
      log_pi, log_mu: [..., A] (broadcasting) log-probabilities at the state(s).
      adv: [..., A] E[A | s, a] when the advantage is a function of (s, a) (the token env:
        deterministic transitions at policy states), or [..., A, S'] per next state with
        ``next_prob`` [..., A, S'] = P(s'|s, a) (then sign-dependent rows are exact too).
      lags: the version lag of each entry (broadcast to [..., A]) for rows with a ``lags``
        input (AReaL's staleness cap).
      threshold: M2PO's population (kappa, frac) (:func:`population_threshold`).
    """
    row = actor_registry.get_actor_correction(correction)
    if row.level == "sequence":
        raise ValueError(f"actor correction {row.name!r} is sequence-level: its expected update "
                         "needs the sequence distribution (tabular.actor_paths enumerates it)")
    if row.level == "batch" and threshold is None:
        raise ValueError(f"actor correction {row.name!r} is batch-level: pass its population "
                         "threshold (tabular.exact_actor.population_threshold)")
    mus = jnp.exp(log_mu)
    log_rhos = log_pi - log_mu
    shape = jnp.broadcast_shapes(log_rhos.shape, adv.shape if next_prob is None else adv.shape[:-1])
    log_rhos = jnp.broadcast_to(log_rhos, shape)
    mus = jnp.broadcast_to(mus, shape)
    data = {}
    if "lags" in row.data and lags is not None:
        data["lags"] = jnp.broadcast_to(lags, shape)
    if "log_mu" in row.data:  # DPPO's probability band reads mu(a) itself
        data["log_mu"] = jnp.broadcast_to(log_mu, shape)
    if threshold is not None:
        data["threshold"] = threshold
    if next_prob is None:
        adv = jnp.broadcast_to(adv, shape)
        w = row(log_rhos, adv, **(params or {}), **data)
        e_wa, e_w, e_a = w * adv, w, adv
    else:
        grid = shape + adv.shape[-1:]
        adv = jnp.broadcast_to(adv, grid)
        next_prob = jnp.broadcast_to(next_prob, grid)
        data = {k: (jnp.broadcast_to(v[..., None], grid) if k in ("lags", "log_mu") else v)
                for k, v in data.items()}
        w = row(jnp.broadcast_to(log_rhos[..., None], grid), adv, **(params or {}), **data)
        e_wa = jnp.sum(next_prob * w * adv, axis=-1)
        e_w = jnp.sum(next_prob * w, axis=-1)
        e_a = jnp.sum(next_prob * adv, axis=-1)
    on = mus > 0
    e_wa, e_w = jnp.where(on, e_wa, 0.0), jnp.where(on, e_w, 0.0)
    coeff = mus * e_wa
    if centred:
        coeff = coeff - jnp.sum(mus * jnp.where(on, e_a, 0.0), axis=-1, keepdims=True) * mus * e_w
    return coeff


class CorrectionUpdate(NamedTuple):
    """Exact expected actor updates in tabular logit space [S, A] (the gradient wrt
    theta[s, :]): ``expected`` of the row, ``eq12`` = sum_s D(s) E_pi[Q^pi u | s] (same D)."""

    expected: Array
    eq12: Array


def correction_update(
    mdp: TabularMDP,
    pi: Array,
    mus: Array,
    state_weights: Array,
    posterior: Array,
    values: Array,
    *,
    correction: str,
    params: Optional[dict] = None,
    centred: bool = False,
) -> CorrectionUpdate:
    """Exact expected one-step TD actor update (Sec 5.1) of a token- or batch-level row on
    an infinite-horizon tabular MDP, under a replay of behaviour versions, vs Eq 12.

    The update is sum_s D(s) sum_l q_l(s) E_{mu_l}[A (w u - c m_w)], A = r + gamma(s')
    V(s') - V(s) per transition (sign-dependent rows exact: per-s' advantages), u the
    softmax score of pi. Version l has lag l (AReaL's staleness cap reads it); M2PO's mask is
    its population limit over atoms (s, l, a) of probability D(s) q_l(s) mu_l(a|s).

    Args:
      pi: [S, A]; mus: [L, S, A] behaviour versions (lag l = index l);
      state_weights: [S] D; posterior: [L, S] q_l(s); values: [S] the actor's critic.
    """
    if mdp.horizon is not None:
        raise ValueError("correction_update is for infinite-horizon MDPs (tabular.actor_paths "
                         "enumerates finite-horizon ones)")
    u = softmax_score(pi)
    L = mus.shape[0]
    log_pi = jnp.log(pi)
    log_mus = jnp.log(mus)
    adv = bellman_targets(mdp, values) - values[:, None, None]  # [S, A, S']
    lags = jnp.broadcast_to(jnp.arange(L)[:, None, None], mus.shape)
    probs = state_weights[None, :, None] * posterior[:, :, None] * mus
    threshold = population_threshold(correction, params, log_pi[None] - log_mus, probs)
    coeff = correction_coefficients(log_pi[None], log_mus, adv[None], correction=correction,
                                    params=params, centred=centred, next_prob=mdp.P[None],
                                    lags=lags, threshold=threshold)  # [L, S, A]
    coeff = jnp.einsum("s,ls,lsa->sa", state_weights, posterior, coeff)
    eq12 = state_weights[:, None] * exact_actor_update(mdp, pi, u)
    return CorrectionUpdate(expected=jnp.einsum("sa,sab->sb", coeff, u), eq12=eq12)
