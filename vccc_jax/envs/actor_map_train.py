"""Whole training runs driven by EXACT expected updates (issue 21, parts 2-3): the return a
(actor row, critic correction, lag, sampler) pair reaches, with no sampling noise.

Update n (:func:`train_run`): the learner is pi_n = softmax(theta_n); the behaviour is the
sampler (temperature, top-p) of theta_{max(n - lag, 0)} (a fixed lag; the first ``lag``
updates act with theta_0, as a version ring padded with the initial policy); the critic is
the fixed point of the critic correction's expected target under that behaviour
(``envs.actor_map.critic_policies``: an idealised critic that has converged for the current
replay); the actor takes the row's exact expected update (``envs.actor_map.row_update``) in
logit space: theta_{n+1} = theta_n + lr g_n. The return J(pi_n) is exact. A run is
deterministic: seeds differ in the problem instance and the initial logits only.

The behaviour versions live in a ring of ``ring_size`` logit tables (slot n % R holds
theta_n): any lag < R, and any lag >= the number of updates (every update then acts with
theta_0), is exact; :func:`ring_size` picks R = min(max lag, updates) + 1.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import actor_map as am

Array = chex.Array

__all__ = ["ring_size", "TrainCurve", "train_run", "normalised_auc"]


def ring_size(max_lag: int, num_updates: int) -> int:
    """Ring slots that make every lag in [0, max_lag] exact over ``num_updates`` updates."""
    return min(int(max_lag), int(num_updates)) + 1


class TrainCurve(NamedTuple):
    """returns [N + 1]: J(pi_0) .. J(pi_N); cos_eq12 / cos_pg [N]: the cosine of each applied
    update with Eq 12 (behaviour state weights) and with the true policy gradient; norms [N, 6]
    (with ``decompose``; else zeros): |eq12|, |pg| and the norms of the drift / critic /
    weight / state parts of the update (``envs.actor_map`` module docstring)."""

    returns: Array
    cos_eq12: Array
    cos_pg: Array
    norms: Array


def train_run(kind: str, env, row: str, params: dict, logits0: Array, critic, temperature,
              top_p, lag, *, num_updates: int, ring: int, lr: float, clip: float,
              rhobar: float, centred: bool = False, decompose: bool = False) -> TrainCurve:
    """One run (module docstring). ``critic``: index into ``actor_map.CRITICS`` (traced);
    ``temperature`` / ``top_p`` / ``lag`` traced; ``kind``, ``row``, ``params``, sizes, lr,
    clip, rhobar, ``centred``, ``decompose`` (also the bias parts of every update: about 2x
    the cost) static."""
    per_state = am.row_is_per_state(kind, env, row)
    ring0 = jnp.broadcast_to(logits0[None], (ring,) + logits0.shape)

    def step(carry, n):
        theta, slots = carry
        log_pi = jax.nn.log_softmax(theta, axis=-1)
        log_mu = am.behaviour_log_probs(slots[jnp.maximum(n - lag, 0) % ring], temperature, top_p)
        v_pi = am.policy_values(kind, env, log_pi)
        crit = am.policy_values(kind, env, am.critic_policies(log_pi, log_mu, clip, rhobar)[critic])
        d_mu = am.occupancy(kind, env, log_mu)
        def upd(v, c):
            return am.row_update(kind, env, row, params, log_pi, log_mu, v, d_mu, centred=c,
                                 lag=lag, v_pi=v_pi)

        g = upd(crit, centred)
        d_pi = am.occupancy(kind, env, log_pi)
        eq12 = am.reference(kind, env, log_pi, v_pi, d_mu)
        pg = am.reference(kind, env, log_pi, v_pi, d_pi)
        norm = lambda x: jnp.linalg.norm(x.reshape(-1))  # noqa: E731
        if decompose:
            g1 = upd(crit, True) if (per_state and not centred) else g
            g_pi = upd(v_pi, per_state)
            norms = jnp.stack([norm(eq12), norm(pg), norm(g - g1), norm(g1 - g_pi),
                               norm(g_pi - eq12), norm(eq12 - pg)])
        else:
            norms = jnp.zeros((6,), g.dtype)
        theta = theta + lr * g
        slots = slots.at[(n + 1) % ring].set(theta)
        out = (am.start_value(kind, env, v_pi), am.cosine(g, eq12), am.cosine(g, pg), norms)
        return (theta, slots), out

    (theta, _), (j, c12, cpg, norms) = jax.lax.scan(step, (logits0, ring0),
                                                     jnp.arange(num_updates, dtype=jnp.int32))
    j_last = am.start_value(kind, env, am.policy_values(kind, env, jax.nn.log_softmax(theta, -1)))
    return TrainCurve(returns=jnp.concatenate([j, j_last[None]]), cos_eq12=c12, cos_pg=cpg,
                      norms=norms)


def normalised_auc(returns: Array, j_star: Array) -> Array:
    """Mean over updates 1..N of (J(pi_n) - J(pi_0)) / (J* - J(pi_0)): the share of the
    initial policy's gap to the optimum closed, averaged over the run. returns [..., N + 1]."""
    gap = (j_star - returns[..., 0])
    return jnp.mean(returns[..., 1:] - returns[..., :1], axis=-1) / gap
