"""Exact expected actor update on the token env vs Eq 12, in the actor's parameter space
(issue 12; the token twin of :func:`vccc_jax.envs.exact_truth.actor_update_truth`).

The one-step TD actor (Sec 5.1) on a ``tabular.token.TokenTask`` uses, at a policy state
s = (t, p, q, k = 0), the advantage A_phi(s, a, s') = r + d V_phi(s') - V_phi(s), the weight
w_l(s, a) = ``importance_weights(log pi - log mu_l, kind, clip)`` (0 where mu_l = 0) and the
score u = grad_theta log pi_theta(a|s) (temperature 1). Tool-observation states (k > 0) are
not actions: no ratio, no actor gradient, so they contribute nothing here (the critic values
of tool states still enter through the backup of the policy token that triggers the tool).

With state weights D(s) at policy states and a version posterior q_l(s), its expected update
is (c = 1 when ``centred``, Eq 13; else 0)

    expected = sum_s D(s) sum_l q_l(s) E_{mu_l}[A_phi(s, a) (w_l(s, a) u(s, a) - c m_{w_l}(s))],
    eq12     = sum_s D(s) E_pi[(Q^pi(s, a) - V^pi(s)) u(s, a)]          (Eq 12, same D),

where E[A_phi | s, a] = ``class_backup(task, V_phi[t + 1], t)`` - V_phi(s) depends on the
token only through its class and m_w(s) = E_mu[w u | s]. With ``kind="ratio"`` and
V_phi = V^pi the two are equal for any D, any posterior and any behaviour versions that
cover pi's support (the Sec 5.1 identity), with or without centring (m_w = E_pi[u] = 0).

Both are written as coefficient tables coeff [H, P, Q, V] with update = sum coeff(s, a)
u(s, a) (:func:`update_coefficients`, one position at a time under ``lax.map``: O(P Q V) per
position, never V x V) and turned into parameter-space vectors by ONE surrogate gradient
``exact_truth._surrogate_grad`` on the policy-state observation grid (:func:`policy_obs_grid`).
Compare them with ``exact_truth.gradient_bias``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import token_env as token_env_lib
from vccc_jax.estimators.importance import WeightKind
from vccc_jax.tabular import token as token_task
from vccc_jax.tabular.token import TokenTask

Array = chex.Array
ApplyFn = Callable[[Any, Array], Array]
LogMusFn = Callable[[Array], Array]  # position t -> behaviour log-probs [L, P, Q, V]

__all__ = ["Coefficients", "TokenActorTruth", "policy_obs_grid", "update_coefficients",
           "actor_update_truth"]


class Coefficients(NamedTuple):
    """Per-token coefficients [H, P, Q, V] of the two updates (update = sum coeff u)."""

    expected: Array
    eq12: Array


class TokenActorTruth(NamedTuple):
    """Exact actor updates in parameter space (pytrees shaped like the actor params):
    ``expected`` (the one-step TD actor under the stated D, posterior and versions) and
    ``eq12`` (its Eq 12 reference under the same D)."""

    expected: Any
    eq12: Any


def policy_obs_grid(env: token_env_lib.TokenEnv) -> Array:
    """Observations of every policy state (t < H, p, q, k = 0): [H, P, Q, F]
    (``token_env.policy_observations`` stacked over positions)."""
    return jax.vmap(lambda t: token_env_lib.policy_observations(env, t))(
        jnp.arange(env.task.horizon, dtype=jnp.int32))


def _critic_table(task: TokenTask, values: Array, dtype) -> Array:
    """Critic values [H, P, Q, K] or [H+1, P, Q, K] -> [H+1, P, Q, K] (V(H, .) = 0: the
    step at position H - 1 terminates, so row H only ever meets discount 0)."""
    H, P, Q, K = task.horizon, task.num_prompts, task.num_states, task.num_counters
    if values.shape == (H, P, Q, K):
        values = jnp.concatenate([values, jnp.zeros((1, P, Q, K), values.dtype)], axis=0)
    elif values.shape != (H + 1, P, Q, K):
        raise ValueError(f"critic_values must have shape [H, P, Q, K] = {(H, P, Q, K)} "
                         f"(or [H+1, P, Q, K]), got {values.shape}")
    return values.astype(dtype)


def _check_tables(task: TokenTask, posterior: Array, state_weights: Array) -> None:
    H, P, Q = task.horizon, task.num_prompts, task.num_states
    if posterior.ndim != 4 or posterior.shape[1:] != (H, P, Q):
        raise ValueError(f"posterior must have shape [L, H, P, Q] = [L, {H}, {P}, {Q}], "
                         f"got {posterior.shape}")
    if state_weights.shape != (H, P, Q):
        raise ValueError(f"state_weights must have shape [H, P, Q] = {(H, P, Q)} (policy "
                         f"states), got {state_weights.shape}")


def update_coefficients(
    task: TokenTask,
    log_pi_fn: token_task.LogProbFn,
    log_mus_fn: LogMusFn,
    posterior: Array,
    state_weights: Array,
    critic_values: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    centred: bool = False,
    pi_values: Optional[token_task.Values] = None,
) -> Coefficients:
    """Coefficient tables of the expected one-step TD actor update and of Eq 12 (module
    docstring), [H, P, Q, V] each.

    Args:
      task: the token task.
      log_pi_fn: t -> log pi(.|t, p, q) [P, Q, V] (the learner's softmax).
      log_mus_fn: t -> behaviour log-probs of every version [L, P, Q, V] (-inf off support).
      posterior: [L, H, P, Q] version posterior q_l(s) at the policy states.
      state_weights: [H, P, Q] D(s) at the policy states.
      critic_values: V_phi [H, P, Q, K] (or [H+1, P, Q, K]; row H is never used).
      kind / clip / centred: the actor's weight (Eq 10 kinds) and Eq 13 centring (static).
      pi_values: ``token.policy_values(task, log_pi_fn)`` if already computed.
    """
    _check_tables(task, posterior, state_weights)
    dtype = task.gamma.dtype
    vbar = _critic_table(task, critic_values, dtype)
    vals = token_task.policy_values(task, log_pi_fn) if pi_values is None else pi_values
    posterior, state_weights = posterior.astype(dtype), state_weights.astype(dtype)

    def one(t):
        lp = log_pi_fn(t)  # [P, Q, V]
        lms = log_mus_fn(t)  # [L, P, Q, V]
        chex.assert_rank(lms, 4)
        chex.assert_equal_shape([lp, lms[0]])
        adv = token_task.token_view(task, token_task.class_backup(task, vbar[t + 1], t)
                                    - vbar[t, :, :, 0, None])  # E[A_phi | s, a]  [P, Q, V]
        coeff = et.td_actor_coefficients(lp[None], lms, adv[None], kind=kind, clip=clip,
                                         centred=centred)  # [L, P, Q, V]
        d = state_weights[t][..., None]  # [P, Q, 1]
        expected = d * jnp.sum(posterior[:, t][..., None] * coeff, axis=0)
        q_minus_v = token_task.token_view(task, vals.q_class[t] - vals.v[t, :, :, 0, None])
        return expected, d * jnp.exp(lp) * q_minus_v  # pi (Q^pi - V^pi): sum_a pi u = 0

    expected, eq12 = jax.lax.map(one, jnp.arange(task.horizon, dtype=jnp.int32))
    return Coefficients(expected=expected, eq12=eq12)


def actor_update_truth(
    apply_fn: ApplyFn,
    params: Any,
    obs_grid: Array,
    task: TokenTask,
    log_mus_fn: LogMusFn,
    posterior: Array,
    state_weights: Array,
    critic_values: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    centred: bool = False,
    pi_values: Optional[token_task.Values] = None,
) -> TokenActorTruth:
    """Exact expected actor update vs Eq 12 (Sec 5.1, 5.2) for actor ``params`` on the token
    task (module docstring). pi = softmax(apply_fn(params, obs_grid[t])) with ``obs_grid``
    [H, P, Q, F] the policy-state observations (:func:`policy_obs_grid`); the other
    arguments as in :func:`update_coefficients`. ``apply_fn`` / ``kind`` / ``clip`` /
    ``centred`` static."""
    H, P, Q = task.horizon, task.num_prompts, task.num_states
    if obs_grid.shape[:3] != (H, P, Q):
        raise ValueError(f"obs_grid must have shape [H, P, Q, ...] = [{H}, {P}, {Q}, ...], "
                         f"got {obs_grid.shape}")

    def log_pi_fn(t):
        return jax.nn.log_softmax(apply_fn(params, obs_grid[t]), axis=-1)

    coeff = update_coefficients(task, log_pi_fn, log_mus_fn, posterior, state_weights,
                                critic_values, kind=kind, clip=clip, centred=centred,
                                pi_values=pi_values)
    return TokenActorTruth(
        expected=et._surrogate_grad(apply_fn, params, obs_grid, coeff.expected),
        eq12=et._surrogate_grad(apply_fn, params, obs_grid, coeff.eq12),
    )
