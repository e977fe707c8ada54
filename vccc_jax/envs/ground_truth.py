"""Monte-Carlo ground truth V^{pi_k}(s) from saved env states (DESIGN.md §6).

A stale critic learns V^{mu} (or a replay mixture of them); the quantity we want it to
track is the *current* policy's value. For a batch of saved gymnax states s_i we run
``num_rollouts`` independent rollouts of the current policy pi_k from each s_i and return

    V_hat(s_i) = mean_j G_ij,   G_ij = sum_{t < H} gamma^t r_t   (stopped at termination)

with its standard error sd_j(G_ij) / sqrt(n). Rollouts for all states and repeats run in one
vmapped ``lax.scan`` over the horizon H.

Bias: the horizon cut drops at most ``gamma^H * max|r| / (1 - gamma)`` (``tail_discount`` =
gamma^H is returned so callers can state it). By default the env's time limit is lifted
(``ignore_time_limit=True``): a critic that bootstraps through time-limit truncations (as
ours do, DESIGN.md §3) estimates the value of the untruncated discounted task, so that is
the ground truth it is compared with.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs.rollout import env_step

Array = chex.Array

NO_TIME_LIMIT = 2**30


class GroundTruth(NamedTuple):
    """Monte-Carlo estimate of V^pi at each saved state."""

    value: Array  # [S] mean discounted return
    stderr: Array  # [S] standard error of the mean
    tail_discount: float  # gamma ** horizon: the horizon cut's relative bias bound


def horizon_for(gamma: float, tolerance: float = 0.01, max_horizon: int = 2000) -> int:
    """Smallest H with gamma^H <= tolerance (capped at max_horizon)."""
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if gamma == 1.0:
        return max_horizon
    if gamma == 0.0:
        return 1
    return int(min(max_horizon, math.ceil(math.log(tolerance) / math.log(gamma))))


def mc_values(
    env,
    env_params: Any,
    logits_fn: Callable[[Any, Array], Array],
    params: Any,
    states: Any,
    obs: Array,
    key: Array,
    *,
    num_rollouts: int,
    horizon: int,
    gamma: float,
    ignore_time_limit: bool = True,
) -> GroundTruth:
    """Monte-Carlo V^pi(s) with standard errors for a batch of saved env states, for a
    categorical policy given by ``logits_fn: (params, obs [N, ...]) -> logits [N, A]`` (pi_k,
    sampled exactly: temperature 1, no top-k). Arguments as :func:`mc_values_policy`."""

    def act(p, ob, k):
        return jax.random.categorical(k, logits_fn(p, ob), axis=-1).astype(jnp.int32)

    return mc_values_policy(env, env_params, act, params, states, obs, key,
                            num_rollouts=num_rollouts, horizon=horizon, gamma=gamma,
                            ignore_time_limit=ignore_time_limit)


def mc_values_policy(
    env,
    env_params: Any,
    act_fn: Callable[[Any, Array, Array], Array],
    params: Any,
    states: Any,
    obs: Array,
    key: Array,
    *,
    num_rollouts: int,
    horizon: int,
    gamma: float,
    ignore_time_limit: bool = True,
) -> GroundTruth:
    """Monte-Carlo V^pi(s) with standard errors for a batch of saved env states, any action
    space (continuous actions: issue 31).

    Args:
      env, env_params: the gymnax environment.
      act_fn: (params, obs [N, ...], key) -> the actions [N, ...] the env receives, sampled
        from the policy to evaluate.
      params: the policy's parameters.
      states: pytree of env states with leading axis S.
      obs: [S, ...] the observations at those states (some envs draw observations
        stochastically, so they are passed rather than recomputed).
      key: jax.random key.
      num_rollouts: n >= 2 rollouts per state (static).
      horizon: H steps per rollout (static).
      gamma: discount.
      ignore_time_limit: lift the env's time limit during the rollouts (see module doc).
    """
    if num_rollouts < 2:
        raise ValueError(f"num_rollouts must be >= 2 for a standard error, got {num_rollouts}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    num_states = obs.shape[0]
    n = num_states * num_rollouts
    if ignore_time_limit and hasattr(env_params, "max_steps_in_episode"):
        env_params = env_params.replace(max_steps_in_episode=NO_TIME_LIMIT)

    def rep(x):
        return jnp.repeat(x, num_rollouts, axis=0)

    start_states = jax.tree_util.tree_map(rep, states)
    start_obs = rep(obs)
    step_env = jax.vmap(env_step, in_axes=(None, 0, 0, 0, None))

    def one_step(carry, step_key):
        state, ob, alive, disc, ret = carry
        k_act, k_env = jax.random.split(step_key)
        action = act_fn(params, ob, k_act)
        ob, state, reward, terminated, truncated, _ = step_env(
            env, jax.random.split(k_env, n), state, action, env_params
        )
        ret = ret + jnp.where(alive, disc * reward, 0.0)
        alive = alive & ~terminated & ~truncated
        return (state, ob, alive, disc * gamma, ret), None

    init = (
        start_states,
        start_obs,
        jnp.ones((n,), bool),
        jnp.ones((n,), jnp.float32),
        jnp.zeros((n,), jnp.float32),
    )
    (_, _, _, _, returns), _ = jax.lax.scan(one_step, init, jax.random.split(key, horizon))
    returns = returns.reshape(num_states, num_rollouts)
    value = jnp.mean(returns, axis=1)
    stderr = jnp.std(returns, axis=1, ddof=1) / jnp.sqrt(float(num_rollouts))
    return GroundTruth(value=value, stderr=stderr, tail_discount=float(gamma) ** horizon)
