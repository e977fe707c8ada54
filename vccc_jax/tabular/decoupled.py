"""Exact bias / variance of decoupled correction per pi_old route on tabular MDPs (issue 13).

The estimator is :mod:`vccc_jax.estimators.related.decoupled` (routes, EWMA, the split
ratio). Here everything is exact (enumeration over a ~ mu(.|s), s' ~ P), per state:

* Inference mismatch (:func:`inference_policy`): the behaviour mu is the sampler's view of
  the *same* version's logits: Gaussian-perturbed, quantised to a grid, and/or tempered.
* Routes (:func:`route_policies`): pi = pi_K (the learner), behaviour version pi_{K-l};
  pi_old is pi_{K-l} (exact), the softmax of the debiased EMA of the logits
  theta_0..theta_{K-l} at decay beta (ewma; PPO-EWMA on tabular logits; the EMA runs over
  the versions the learner has produced up to the behaviour's), or mu itself (behaviour).
* Actor update (:func:`actor_update_moments`): the single-sample gradient of the decoupled
  PPO surrogate at the current parameters, G = w(pi_old/mu) r 1[PPO clip inactive] A u,
  with r = pi / pi_old, A = Q^pi - V^pi (an oracle critic) and u the softmax score; its
  mean E_mu[G | s] [S, A] and total variance E||G||^2 - ||E G||^2 [S].
* Critic target (:func:`critic_target_moments`): Vbar + w(pi_old/mu) clip(r) delta, mean and
  variance via :func:`vccc_jax.tabular.exact.target_moments`.
* :func:`route_comparison`: bias of each route vs the exact route (and vs the ideal
  E_pi[A u] / T_pi Vbar), and the variances, weighted by the behaviour's visitation.
* :func:`threshold_interaction`: probability (under mu) that the discrepancy mask /
  truncation fires and that the PPO clip fires, per route, over a grid of thresholds: with
  pi_old = mu the discrepancy threshold never fires and the PPO clip absorbs the inference
  noise (it fires even at lag 0), the entanglement the abstract describes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.importance import importance_weights
from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import TabularMDP
from vccc_jax.tabular.policies import log_ratio_table, softmax_policy

Array = chex.Array

ROUTES = ("exact", "ewma", "behaviour")


def inference_policy(logits: Array, *, noise_scale: float = 0.0, key: Optional[Array] = None,
                     quantum: Optional[float] = None, temperature: float = 1.0) -> Array:
    """mu = softmax(q(logits + noise) / temperature): q rounds to multiples of ``quantum``
    (None = no rounding), noise ~ N(0, noise_scale^2) (needs ``key``). [S, A] probs."""
    z = logits
    if noise_scale:
        if key is None:
            raise ValueError("noise_scale > 0 needs a key")
        z = z + noise_scale * jax.random.normal(key, z.shape, z.dtype)
    if quantum is not None:
        if not quantum > 0:
            raise ValueError(f"quantum must be > 0, got {quantum}")
        z = quantum * jnp.round(z / quantum)
    return softmax_policy(z, temperature)


def ewma_logits(logits: Array, decay: float) -> Array:
    """Debiased EMA of logits [V, S, A] over versions 0..V-1 (the last one weighted most):
    sum_j (1 - b) b^(V-1-j) theta_j / (1 - b^V). [S, A]"""
    V = logits.shape[0]
    w = (1.0 - decay) * decay ** jnp.arange(V - 1, -1, -1, dtype=logits.dtype)
    return jnp.einsum("v,vsa->sa", w / jnp.sum(w), logits)


def route_policies(logits: Array, lag: int, mu: Array, *, decay: float) -> dict:
    """pi, mu and pi_old of every route for behaviour version K - lag of logits [K+1, S, A]."""
    K = logits.shape[0] - 1
    if not 0 <= lag <= K:
        raise ValueError(f"lag must lie in [0, {K}], got {lag}")
    old = K - lag
    return dict(pi=softmax_policy(logits[K]), mu=mu,
                exact=softmax_policy(logits[old]),
                ewma=softmax_policy(ewma_logits(logits[: old + 1], decay)),
                behaviour=mu)


def _weights(pi, pi_old, mu, kind, clip, ppo_epsilon):
    """w(pi_old/mu) [S, A], r = pi/pi_old [S, A], and r clipped."""
    d = jnp.where(mu > 0, importance_weights(log_ratio_table(pi_old, mu), kind,
                                             clip if kind != "ratio" else None), 0.0)
    r = exact.ratio_table(pi, pi_old)
    r_c = r if ppo_epsilon is None else jnp.clip(r, 1.0 - ppo_epsilon, 1.0 + ppo_epsilon)
    return d, r, r_c


def actor_update_moments(mdp: TabularMDP, pi: Array, pi_old: Array, mu: Array, *,
                         kind: str = "truncate", clip: Optional[float] = 2.0,
                         ppo_epsilon: Optional[float] = 0.2) -> tuple[Array, Array]:
    """(E_mu[G | s] [S, A], tr Var_mu[G | s] [S]) of the per-sample decoupled PPO gradient
    wrt the tabular logits theta[s] at the current parameters (module docstring)."""
    adv = exact.q_values(mdp, pi)
    adv = adv - jnp.sum(pi * adv, axis=-1, keepdims=True)
    d, r, _ = _weights(pi, pi_old, mu, kind, clip, ppo_epsilon)
    if ppo_epsilon is None:
        active = jnp.ones_like(r, dtype=bool)
    else:
        active = ~(((adv > 0) & (r > 1.0 + ppo_epsilon)) | ((adv < 0) & (r < 1.0 - ppo_epsilon)))
    coeff = jnp.where(active, d * r * adv, 0.0)            # G = coeff(s, a) u(s, a, :)
    u = exact.softmax_score(pi)
    mean = jnp.einsum("sa,sab->sb", mu * coeff, u)
    second = jnp.sum(mu * coeff**2 * jnp.sum(u**2, axis=-1), axis=-1)
    return mean, jnp.maximum(second - jnp.sum(mean**2, axis=-1), 0.0)


def critic_target_moments(mdp: TabularMDP, pi: Array, pi_old: Array, mu: Array, vbar: Array, *,
                          kind: str = "truncate", clip: Optional[float] = 2.0,
                          ppo_epsilon: Optional[float] = 0.2) -> tuple[Array, Array]:
    """(mean [S], var [S]) of the one-step target Vbar + w(pi_old/mu) clip(pi/pi_old) delta."""
    d, _, r_c = _weights(pi, pi_old, mu, kind, clip, ppo_epsilon)
    delta = exact.bellman_targets(mdp, vbar) - vbar[:, None, None]
    y = vbar[:, None, None] + (d * r_c)[:, :, None] * delta
    return exact.target_moments(mdp, mu, y)


def route_comparison(mdp: TabularMDP, logits: Array, lag: int, mu: Array, vbar: Array, *,
                     decay: float, kind: str = "truncate", clip: Optional[float] = 2.0,
                     ppo_epsilon: Optional[float] = 0.2) -> dict:
    """Per route: visitation-weighted (under mu) numbers, as floats:

    actor_bias_vs_exact: sum_s d(s) ||E G_route - E G_exact||; actor_bias_vs_ideal: the
    same against E_pi[A u] (the on-policy update, Eq 12); actor_variance: sum_s d tr Var;
    critic_bias_vs_exact: sum_s d |E y_route - E y_exact|; critic_bias_vs_ideal: against
    T_pi Vbar; critic_variance: sum_s d Var y.
    """
    pols = route_policies(logits, lag, mu, decay=decay)
    pi = pols["pi"]
    dvis = exact.visitation(mdp, mu)
    adv = exact.q_values(mdp, pi)
    adv = adv - jnp.sum(pi * adv, axis=-1, keepdims=True)
    ideal_actor = jnp.einsum("sa,sab->sb", pi * adv, exact.softmax_score(pi))
    ideal_critic = exact.bellman_operator(mdp, pi, vbar)
    kw = dict(kind=kind, clip=clip, ppo_epsilon=ppo_epsilon)
    moments = {r: (actor_update_moments(mdp, pi, pols[r], mu, **kw),
                   critic_target_moments(mdp, pi, pols[r], mu, vbar, **kw)) for r in ROUTES}
    (a_ex, _), (c_ex, _) = moments["exact"]
    norm = lambda x: jnp.sqrt(jnp.sum(x**2, axis=-1))  # noqa: E731
    out = {}
    for r, ((am, av), (cm, cv)) in moments.items():
        out[r] = dict(
            actor_bias_vs_exact=float(dvis @ norm(am - a_ex)),
            actor_bias_vs_ideal=float(dvis @ norm(am - ideal_actor)),
            actor_variance=float(dvis @ av),
            critic_bias_vs_exact=float(dvis @ jnp.abs(cm - c_ex)),
            critic_bias_vs_ideal=float(dvis @ jnp.abs(cm - ideal_critic)),
            critic_variance=float(dvis @ cv),
        )
    return out


def fire_probabilities(pi: Array, pi_old: Array, mu: Array, *, kind: str, clip: float,
                       ppo_epsilon: float) -> tuple[Array, Array]:
    """(P_mu[discrepancy truncation/mask fires | s], P_mu[PPO clip range exceeded | s]) [S]."""
    raw = jnp.where(mu > 0, exact.ratio_table(pi_old, mu), 0.0)
    d, r, r_c = _weights(pi, pi_old, mu, kind, clip, ppo_epsilon)
    fired_d = (d != raw) & (mu > 0)
    fired_r = (r_c != r) & (mu > 0)
    return jnp.sum(mu * fired_d, axis=-1), jnp.sum(mu * fired_r, axis=-1)


def threshold_interaction(mdp: TabularMDP, logits: Array, lag: int, mu: Array, *, decay: float,
                          kind: str = "mask", clips: Sequence[float] = (1.5, 2.0, 4.0),
                          epsilons: Sequence[float] = (0.1, 0.2, 0.3)) -> dict:
    """Visitation-weighted fire probabilities per route over (clip, epsilon):
    ``{route: {"discrepancy": [C, E], "ppo": [C, E]}}`` (numpy). For ``behaviour`` the
    discrepancy never fires and the PPO clip fires on pure inference mismatch (lag 0)."""
    pols = route_policies(logits, lag, mu, decay=decay)
    dvis = exact.visitation(mdp, mu)
    out = {}
    for r in ROUTES:
        grid_d, grid_r = np.zeros((len(clips), len(epsilons))), np.zeros((len(clips), len(epsilons)))
        for i, c in enumerate(clips):
            for j, e in enumerate(epsilons):
                fd, fr = fire_probabilities(pols["pi"], pols[r], mu, kind=kind, clip=c, ppo_epsilon=e)
                grid_d[i, j], grid_r[i, j] = float(dvis @ fd), float(dvis @ fr)
        out[r] = {"discrepancy": grid_d, "ppo": grid_r}
    return out


__all__ = [
    "ROUTES", "inference_policy", "ewma_logits", "route_policies", "actor_update_moments",
    "critic_target_moments", "route_comparison", "fire_probabilities", "threshold_interaction",
]
