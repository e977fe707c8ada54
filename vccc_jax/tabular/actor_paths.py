"""Exact expected actor updates of EVERY actor-correction row by path enumeration (issue 21).

Sequence-level rows (``estimators.actor_registry``: sequence TIS / MIS, GSPO, TOPR) weight
a token by a function of its whole sequence, so their expected update needs the law of
whole sequences, not per-state tables. On a short horizon that law is finite: this module
lists every path (s_0, a_0, s_1, ..., s_H) with its probability under pi and under each
behaviour version, evaluates the registry row ITSELF on the time-major [H, paths] arrays
(one column = one sequence) and sums

    g = sum_l v_l sum_paths P_{mu_l}(path) sum_t w_t A_t u(s_t, a_t)      (docs/method.md A0)

into per-(state, action) coefficients (update = sum coeff(s, a) u(s, a)). Every row is
exact here: token rows (cross-checked against ``tabular.exact_actor.correction_coefficients``
with D = the enumerated occupancy), sequence rows, and M2PO in its population limit (atoms
(l, t, path) of probability v_l P_{mu_l}(path)). Cost: one entry per path and step,
S (A S)^H paths for a tabular MDP (``tabular_paths``), P V^H for the token task
(``envs.token_actor_truth.token_paths``), so only short horizons (and small vocabularies).

References on the same paths: :func:`pi_update` (E_pi[sum_t A^pi_t u_t], the finite-horizon
policy gradient without gamma^t, when the critic is V^pi) and :func:`occupancy` (the state
weights D under the behaviour mixture, for the per-state Eq 12 reference and for the
token-level closed forms).

Advantages (:func:`path_advantages`): GAE(lambda) of a critic table along each path,
A_t = delta_t + lambda d_t A_{t+1}, delta_t = r_t + d_t V(s_{t+1}) - V(s_t) (lambda = 0: the
one-step TD actor of Sec 5.1; lambda = 1: the Monte-Carlo return minus V).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import actor_registry
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array

__all__ = ["Paths", "path_digits", "tabular_paths", "path_advantages", "path_weights", "expected_update",
           "pi_update", "occupancy", "scatter_coefficients", "tabular_time_values"]


class Paths(NamedTuple):
    """Every path of a finite-horizon problem, time-major [H, N] (N paths).

    policy_id: the state whose score u is read at step t (tabular: s_t; token: (t, p, q)
      flattened); action: a_t; alive: the episode is running at t; is_action: alive and a
      policy step (tool / terminal steps: no ratio, no actor gradient); log_pi / log_mus
      [L, H, N]: log-probabilities of a_t (0 where not is_action); reward, discount: r_t and
      d_t (0 after termination); value_id / next_value_id: index of s_t / s_{t+1} in the
      flattened critic table; prob_pi [N], prob_mus [L, N]: path probabilities.
    """

    policy_id: Array
    action: Array
    alive: Array
    is_action: Array
    log_pi: Array
    log_mus: Array
    reward: Array
    discount: Array
    value_id: Array
    next_value_id: Array
    prob_pi: Array
    prob_mus: Array


def path_digits(num_paths: int, base: int, horizon: int) -> tuple[Array, Array]:
    """(head [N], digits [H, N]) of every path index n = head base^H + sum_t digit_t
    base^(H - 1 - t): paths in prefix-major order, one digit (the step's outcome) per step."""
    n = jnp.arange(num_paths)
    powers = base ** jnp.arange(horizon - 1, -1, -1)
    return n // base ** horizon, (n[None, :] // powers[:, None]) % base


def tabular_paths(mdp: TabularMDP, pi: Array, mus: Array) -> Paths:
    """All S (A S)^H paths of a finite-horizon tabular MDP under a stationary pi and
    behaviour versions ``mus`` [L, S, A]. s_0 ~ init; a terminal s_t ends the episode
    (absorbing, no action). Critic index of s_t: t S + s (a table [H + 1, S], row H = the
    end of the episode: :func:`tabular_time_values`). One ``lax.scan`` over the H steps."""
    H = mdp.horizon
    if H is None:
        raise ValueError("tabular_paths needs a finite-horizon MDP (mdp.horizon)")
    S, A = mdp.num_states, mdp.num_actions
    chex.assert_shape(pi, (S, A))
    chex.assert_shape(mus, (None, S, A))
    L = mus.shape[0]
    s0, digits = path_digits(S * (A * S) ** H, A * S, H)
    log_pi_t, log_mus_t = jnp.log(pi), jnp.log(mus)

    def step(carry, xs):
        s, alive, p_pi, p_mu = carry
        t, dig = xs
        a, s2 = dig // S, dig % S
        trans = mdp.P[s, a, s2]
        rec = dict(pid=s, a=a, alive=alive, lp=jnp.where(alive, log_pi_t[s, a], 0.0),
                   lm=jnp.where(alive[None], log_mus_t[:, s, a], 0.0),
                   r=jnp.where(alive, mdp.R[s, a, s2], 0.0),
                   d=jnp.where(alive, mdp.gamma * (1.0 - mdp.terminal[s2]), 0.0),
                   vid=t * S + s, nvid=(t + 1) * S + s2)
        carry = (s2, alive & (mdp.terminal[s2] == 0), p_pi * pi[s, a] * trans,
                 p_mu * mus[:, s, a] * trans[None])
        return carry, rec

    dtype = pi.dtype
    init = (s0, mdp.terminal[s0] == 0, mdp.init[s0].astype(dtype),
            jnp.broadcast_to(mdp.init[s0].astype(dtype), (L,) + s0.shape))
    (_, _, p_pi, p_mu), o = jax.lax.scan(step, init, (jnp.arange(H), digits))
    return Paths(policy_id=o["pid"].astype(jnp.int32), action=o["a"].astype(jnp.int32),
                 alive=o["alive"], is_action=o["alive"], log_pi=o["lp"],
                 log_mus=jnp.moveaxis(o["lm"], 0, 1), reward=o["r"], discount=o["d"],
                 value_id=o["vid"].astype(jnp.int32), next_value_id=o["nvid"].astype(jnp.int32),
                 prob_pi=p_pi, prob_mus=p_mu)


def tabular_time_values(values: Array, horizon: int) -> Array:
    """A critic for :func:`tabular_paths`: [S] (stationary) or [H + 1, S] (by time) ->
    flattened [(H + 1) S] with row H = 0 (the episode ends at the horizon: no bootstrap)."""
    if values.ndim == 1:
        values = jnp.broadcast_to(values, (horizon + 1,) + values.shape)
    chex.assert_shape(values, (horizon + 1, None))
    return values.at[horizon].set(0.0).reshape(-1)


def path_advantages(paths: Paths, critic: Array, lam: float = 0.0) -> Array:
    """GAE(lambda) along every path of a flattened critic table [H, N] (module docstring);
    0 where the episode has ended."""
    v = critic[paths.value_id]
    nv = critic[paths.next_value_id]
    delta = jnp.where(paths.alive, paths.reward + paths.discount * nv - v, 0.0)

    def back(nxt, xs):
        dt, disc = xs
        a = dt + lam * disc * nxt
        return a, a

    _, adv = jax.lax.scan(back, jnp.zeros_like(delta[0]), (delta, paths.discount), reverse=True)
    return adv


def path_weights(paths: Paths, advantages: Array, version_weights: Array, *, correction: str,
                 params: Optional[dict] = None) -> Array:
    """The row's w [L, H, N] on every path under every version: the registry row evaluated
    on time-major [H, L, N] arrays (one column = one sequence; mask = is_action; AReaL's
    lags = l; M2PO's population mask over atoms of probability v_l P_{mu_l}(path))."""
    row = actor_registry.get_actor_correction(correction)
    L, H, N = paths.log_mus.shape
    lr = jnp.moveaxis(paths.log_pi[None] - paths.log_mus, 0, 1)  # [H, L, N]
    adv = jnp.broadcast_to(advantages[:, None], lr.shape)
    mask = jnp.broadcast_to(paths.is_action[:, None], lr.shape)
    data = {}
    if "lags" in row.data:
        data["lags"] = jnp.broadcast_to(jnp.arange(L)[None, :, None], lr.shape)
    if "log_mu" in row.data:
        data["log_mu"] = jnp.moveaxis(paths.log_mus, 0, 1)
    if row.level == "batch":
        data["probs"] = jnp.broadcast_to((version_weights[:, None] * paths.prob_mus)[None], lr.shape)
    w = row(lr, adv, mask=mask, **(params or {}), **data)
    return jnp.moveaxis(w, 1, 0)


def scatter_coefficients(paths: Paths, coeff: Array, num_ids: int, num_actions: int) -> Array:
    """Sum coeff [H, N] into [num_ids, num_actions] at (policy_id, action), action steps only."""
    idx = paths.policy_id * num_actions + paths.action
    vals = jnp.where(paths.is_action, coeff, 0.0)
    return jax.ops.segment_sum(vals.reshape(-1), idx.reshape(-1),
                               num_segments=num_ids * num_actions).reshape(num_ids, num_actions)


def expected_update(paths: Paths, advantages: Array, version_weights: Array, *, correction: str,
                    params: Optional[dict] = None, num_ids: int, num_actions: int) -> Array:
    """Coefficients [num_ids, A] of g = sum_l v_l E_{mu_l}[sum_t w_t A_t u(s_t, a_t)] (update
    = sum coeff(s, a) u(s, a)) for the registry row ``correction``; ``advantages`` [H, N]
    (:func:`path_advantages`), ``version_weights`` [L] (each sequence comes from one version)."""
    chex.assert_shape(version_weights, (paths.prob_mus.shape[0],))
    w = path_weights(paths, advantages, version_weights, correction=correction, params=params)
    prob = version_weights[:, None] * paths.prob_mus  # [L, N]
    coeff = jnp.sum(prob[:, None, :] * w, axis=0) * advantages
    return scatter_coefficients(paths, coeff, num_ids, num_actions)


def pi_update(paths: Paths, advantages: Array, *, num_ids: int, num_actions: int) -> Array:
    """Coefficients of E_pi[sum_t A_t u(s_t, a_t)] (pi's own path law, w = 1): with the
    critic V^pi and lambda = 0 this is E_pi[sum_t (Q^pi_t - V^pi_t) u_t], the policy
    gradient of the finite-horizon return (without gamma^t)."""
    coeff = paths.prob_pi[None, :] * advantages
    return scatter_coefficients(paths, coeff, num_ids, num_actions)


def occupancy(paths: Paths, version_weights: Array, num_ids: int) -> Array:
    """D(id) = sum_l v_l E_{mu_l}[number of action steps at policy state id] [num_ids]."""
    prob = jnp.sum(version_weights[:, None] * paths.prob_mus, axis=0)
    vals = jnp.where(paths.is_action, prob[None, :], 0.0)
    return jax.ops.segment_sum(vals.reshape(-1), paths.policy_id.reshape(-1), num_segments=num_ids)
