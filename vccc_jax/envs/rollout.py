"""Vectorised gymnax rollouts that log what an off-policy learner needs (DESIGN.md §6).

One rollout is a ``lax.scan`` over ``num_steps`` steps of ``num_envs`` auto-resetting gymnax
environments. Each step records, time-major ``[T, B, ...]``:

* ``obs``, ``action``, ``reward``;
* ``terminated`` and ``truncated`` SEPARATELY. ``terminated[t]``: s_{t+1} is a terminal
  state (no bootstrap, discount 0). ``truncated[t]``: the episode was cut by the time limit
  after step t without terminating — the learner must bootstrap from the value of
  ``final_obs[t]`` (the observation reached before the auto-reset) with the discount kept;
* ``final_obs``: the observation the step produced before any auto-reset (equal to
  ``obs[t+1]`` unless the episode ended at t);
* ``log_mu`` = log mu(a_t|s_t) of the *actual* sampling distribution (logits / temperature,
  top-k truncation included) and ``log_mu_all`` [T, B, A], the whole sampling distribution
  (actions are discrete), which score centering (Eq 13) and Z(s) (§4.2) need;
* ``log_pi_all`` [T, B, A]: log-probs of the newest actor version (the learner's pi_k at
  temperature 1) at s_t. The learner does not move during a rollout, so pi_k is known here;
  logging it avoids a second forward pass and makes lag-0 log-ratios exactly zero (an env
  at lag 0 reads its behaviour logits from the newest version's row, or under the per-env
  and sorted paths the newest's plain forward: the same bits);
* ``lag`` / ``version``: how many updates old the acting parameters were and their id;
* ``episode_return`` / ``episode_length`` of episodes that ended at t (0 elsewhere);
* optionally ``env_state`` (the full gymnax state at s_t) for Monte-Carlo ground truth.

The lagged actor runs one of four ways (``lag.acting_actor`` / ``lag.choose_path``): once
per version on the whole batch (:func:`versioned_logits` over a ``lag.VersionTable``: V x B
forwards per step, memory O(V x params)), once per (chunk, version) pair of the lag-sorted
envs (:func:`sorted_logits` over ``lag.SortedVersions``: at most B + (K - 1) x chunk rows in
chunk-row matmuls, plus the newest's plain forward) or once per env with its own version
(:func:`per_env_logits` over ``lag.EnvVersions``: B per-env forwards plus the newest's plain
forward, memory O(B x params)). Synchronous rollouts (plain params) run one plain forward.

Time-limit detection: gymnax >= 1.0 returns ``terminated`` and ``truncated`` from
``env.step``; older gymnax merges them in ``done``. For the old API we detect the cut from the
env's step counter (``state.time >= max_steps_in_episode``) — see :func:`env_step`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import samplers

Array = chex.Array
ApplyFn = Callable[[Any, Array], Array]  # (params, obs) -> logits [..., A]


# --------------------------------------------------------------------------------------
# Sampling distribution
# --------------------------------------------------------------------------------------


def sampling_log_probs(logits: Array, temperature: float = 1.0, top_k: int = 0) -> Array:
    """log mu(.|s) of the distribution actions are actually drawn from.

    mu ∝ exp(logits / temperature) restricted to the ``top_k`` largest logits (``top_k=0``
    or >= A: no restriction; ties at the k-th logit: the lower action ids, the default
    position cut of ``samplers.SamplerSpec``, whose ``sampler_log_probs`` this is). Actions
    outside the support get log-prob -inf. ``temperature`` and ``top_k`` are static.
    """
    spec = samplers.SamplerSpec(temperature=temperature, top_k=top_k)  # validates both
    return samplers.sampler_log_probs(logits, spec)


# --------------------------------------------------------------------------------------
# Environment stepping
# --------------------------------------------------------------------------------------


def _select(pred: Array, on_true: Any, on_false: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: jax.lax.select(pred, a, b), on_true, on_false)


def env_step(env, key: Array, state: Any, action: Array, params: Any):
    """:func:`env_step_info` without the info dict: ``(obs, state, reward, terminated,
    truncated, final_obs)``."""
    return env_step_info(env, key, state, action, params)[:6]


def env_step_info(env, key: Array, state: Any, action: Array, params: Any):
    """One auto-resetting step of a single gymnax env with termination and truncation apart.

    Returns ``(obs, state, reward, terminated, truncated, final_obs, info)``: ``obs``/``state``
    are post-reset when the episode ended; ``final_obs`` is the observation reached before
    the reset; ``truncated`` is True only for a time-limit cut that did not terminate;
    ``info`` the env's info dict (empty for the legacy API).
    """
    out = env.step(key, state, action, params)
    if len(out) == 6:  # gymnax >= 1.0: terminated / truncated apart, final_observation kept
        obs, new_state, reward, terminated, truncated, info = out
        final_obs = info.get("final_observation", obs)
        terminated = jnp.asarray(terminated, bool)
        truncated = jnp.logical_and(jnp.asarray(truncated, bool), ~terminated)
        return (obs, new_state, jnp.asarray(reward, jnp.float32), terminated, truncated,
                final_obs, info)
    # Legacy gymnax: `done` merges both; redo the step without the reset and read the
    # step counter to tell a time-limit cut from a terminal state.
    key_step, key_reset = jax.random.split(key)
    obs_st, state_st, reward, done, _ = env.step_env(key_step, state, action, params)
    obs_re, state_re = env.reset_env(key_reset, params)
    # (a terminal state reached exactly at the time limit is indistinguishable from a cut
    # in the legacy API and counts as truncated)
    time_up = jnp.asarray(state_st.time >= params.max_steps_in_episode, bool)
    done = jnp.logical_or(jnp.asarray(done, bool), time_up)
    truncated = time_up
    terminated = jnp.logical_and(done, ~time_up)
    new_state = _select(done, state_re, state_st)
    obs = _select(done, obs_re, obs_st)
    return obs, new_state, jnp.asarray(reward, jnp.float32), terminated, truncated, obs_st, {}


@struct.dataclass
class EnvCarry:
    """Per-env state carried across rollouts (leading axis: envs)."""

    env_state: Any
    obs: Array
    episode_return: Array  # running undiscounted return of the current episode
    episode_length: Array  # int32 steps so far in the current episode


def reset(env, env_params: Any, key: Array, num_envs: int) -> EnvCarry:
    """Reset ``num_envs`` environments."""
    keys = jax.random.split(key, num_envs)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)
    return EnvCarry(
        env_state=state,
        obs=obs,
        episode_return=jnp.zeros((num_envs,), jnp.float32),
        episode_length=jnp.zeros((num_envs,), jnp.int32),
    )


@struct.dataclass
class Trajectory:
    """A time-major rollout; every field is [T, B, ...] (see the module docstring)."""

    obs: Array
    action: Array
    reward: Array
    terminated: Array
    truncated: Array
    final_obs: Array
    log_mu: Array
    log_mu_all: Array
    log_pi_all: Array
    lag: Array
    version: Array
    episode_return: Array
    episode_length: Array
    episode_done: Array
    env_state: Any = None
    discount: Any = None  # [T, B] the env's own per-step discount (info["discount"]) or None
    is_action: Any = None  # [T, B] bool: a policy action (False: env tool step) or None
    log_b_all: Any = None  # [T, B, A] training-side log-probs of the behaviour version or None

    def discounts(self, gamma: float) -> Array:
        """gamma * (1 - terminated): 0 only when s_{t+1} is terminal (truncation keeps it).
        When the rollout recorded the env's own discounts (``env_discounts=True``, e.g. the
        token env: ``tool_discount`` after a tool step) those are returned instead."""
        if self.discount is not None:
            return self.discount.astype(self.reward.dtype)
        return gamma * (1.0 - self.terminated.astype(self.reward.dtype))


# --------------------------------------------------------------------------------------
# Rollout
# --------------------------------------------------------------------------------------


def versioned_logits(apply_fn: ApplyFn, table: lag_lib.VersionTable, rows: Array,
                     obs: Array) -> tuple[Array, Array]:
    """Behaviour and newest-version logits [B, A] of per-env table ``rows`` [B] at ``obs``.

    The actor runs once per table row on the whole batch (one batched matmul over [V, B]
    rows: memory O(V x params), no per-env copy of the params); each env then picks its
    row. Everything stays on the env axis with its env, so a batch sharded over envs moves
    no rows between devices. Row 0 is the newest version, so an env at lag 0 takes the very
    bits of the target logits and its log-ratios are exactly 0.
    """
    logits = jax.vmap(apply_fn, in_axes=(0, None))(table.params, obs)  # [V, B, A]
    behaviour = jnp.take_along_axis(logits, rows[None, :, None], axis=0)[0]
    return behaviour, logits[0]


def lag_zero_exact(lags: Array, target: Array, own: Array) -> Array:
    """The behaviour logits [B, A]: ``own`` (each env's version by a per-env or chunk
    kernel), except envs at lag 0, which take the newest's plain-forward logits ``target``:
    those kernels may round differently, and lag 0 must give the very bits of the target
    logits, so that its log-ratios are exactly 0."""
    return jnp.where((lags == 0)[:, None], target, own)


def per_env_logits(apply_fn: ApplyFn, newest: Any, env_params: Any, lags: Array,
                   obs: Array) -> tuple[Array, Array]:
    """Behaviour and newest-version logits [B, A]: env b's own version (``env_params``,
    leaves [B, ...]) by one forward per env (``vmap`` over (params, obs): a batched matvec,
    memory O(B x params)), the newest by one plain forward over the batch; envs at lag 0
    act with the latter (:func:`lag_zero_exact`)."""
    target = apply_fn(newest, obs)
    own = jax.vmap(apply_fn)(env_params, obs)
    return lag_zero_exact(lags, target, own), target


def sorted_logits(apply_fn: ApplyFn, actor: lag_lib.SortedVersions, obs: Array
                  ) -> tuple[Array, Array]:
    """Behaviour and newest-version logits [B, A] from lag-sorted (chunk, version) pairs
    (``lag.sorted_versions``): one ``chunk``-row forward per pair, then each env picks its own
    version's row; the newest by one plain forward over the batch; envs at lag 0 act with
    the latter (:func:`lag_zero_exact`)."""
    target = apply_fn(actor.newest, obs)
    out = jax.vmap(apply_fn)(actor.params, obs[actor.rows])  # [P, chunk, A]
    own = out.reshape((-1,) + out.shape[2:])[actor.pick]
    return lag_zero_exact(actor.lag, target, own), target


def rollout(
    env,
    env_params: Any,
    apply_fn: ApplyFn,
    actor: Any,
    carry: EnvCarry,
    key: Array,
    *,
    num_steps: int,
    lags: Optional[Array] = None,
    num_lags: Optional[int] = None,
    switch_every: int = 0,
    switch_stride: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    record_states: bool = False,
    sampler: Optional[samplers.SamplerSpec] = None,
    env_discounts: bool = False,
    record_behaviour_log_probs: bool = False,
) -> tuple[EnvCarry, Trajectory]:
    """Run ``num_steps`` steps of every env in ``carry``; returns (new carry, Trajectory).

    Args:
      env, env_params: a gymnax environment (discrete actions) and its params.
      apply_fn: (params, obs) -> logits for one observation or a batch.
      actor: plain actor params (synchronous: every env acts with them, lag 0), a
        :class:`~vccc_jax.envs.lag.VersionBuffer` (env b acts with the version ``lags[b]``
        updates old, capped by the versions pushed so far; the actor runs once per version
        in ``lag.lag_table(actor, num_lags)``) or a :class:`~vccc_jax.envs.lag.VersionTable`
        (the versions to run, e.g. ``lag.common_table`` when every env has the same lag),
        or a :class:`~vccc_jax.envs.lag.EnvVersions` (each env's own version, one forward
        per env: :func:`per_env_logits`), or a :class:`~vccc_jax.envs.lag.SortedVersions`
        (one forward per (chunk, version) pair of the lag-sorted envs: :func:`sorted_logits`;
        no mid-rollout switch). ``lag.acting_actor`` picks one of the last four.
      carry: :class:`EnvCarry` with B envs.
      key: jax.random key.
      num_steps: static T.
      lags: int [B], required with a VersionBuffer or VersionTable (ignored with
        EnvVersions and SortedVersions, which carry the lags they were built for).
      num_lags: static rows of the lag table built from a VersionBuffer (default: all K
        slots); every lag must be < num_lags.
      switch_every, switch_stride: mid-rollout switches (see :func:`lag.switch_lags`).
      temperature, top_k: the sampling distribution (static; see :func:`sampling_log_probs`).
      record_states: also return the env state at every s_t (for ground truth).
      sampler: a :class:`~vccc_jax.envs.samplers.SamplerSpec` (static); replaces
        ``temperature`` / ``top_k``: actions come from ``samplers.sample`` and log mu is the
        log-prob of the distribution actually sampled from (mismatch, top-p, greedy included).
      env_discounts: record ``info["discount"]`` (the env's own per-step discount under its
        task convention) as ``Trajectory.discount``; the env must provide it.
      record_behaviour_log_probs: also record ``Trajectory.log_b_all`` = log_softmax of the
        behaviour version's logits (the training-side log-probs of that version, before the
        sampler's temperature / top-k / mismatch), for the decoupled ``pi_old_route="exact"``.

    Envs whose info has ``"is_action"`` (the token env) get ``Trajectory.is_action``; on a
    non-action (tool) step the behaviour row is replaced by pi_k's (log mu := log pi_k), so
    the log-ratio is exactly 0 and every correction reduces to its uncorrected form there.
    """
    num_envs = carry.obs.shape[0]
    per_env = isinstance(actor, lag_lib.EnvVersions)
    grouped = isinstance(actor, lag_lib.SortedVersions)
    if grouped:
        if switch_every > 0:
            raise ValueError("lag.SortedVersions fixes each env's lag for the rollout: no "
                             "mid-rollout switches (use lag.env_versions or lag.lag_table)")
        lags = actor.lag
    versioned = isinstance(actor, (lag_lib.VersionBuffer, lag_lib.VersionTable))
    if per_env:
        lags = actor.lag
    elif versioned:
        if lags is None:
            raise ValueError("lags [num_envs] is required when actor is a VersionBuffer "
                             "or a VersionTable")
        chex.assert_shape(lags, (num_envs,))
        lags = jnp.asarray(lags, jnp.int32)
        if isinstance(actor, lag_lib.VersionBuffer):
            lags = lag_lib.cap_lags(lags, lag_lib.available(actor))
            actor = lag_lib.lag_table(actor, num_lags)
        if switch_every > 0 and not actor.complete:
            raise ValueError("mid-rollout switches need a complete lag table (lag.lag_table)")
        if switch_every <= 0:  # the same rows for the whole rollout
            fixed_rows = actor.rows(lags)
    step_env = jax.vmap(env_step_info, in_axes=(None, 0, 0, 0, None))

    def one_step(state: EnvCarry, xs):
        t, step_key = xs
        k_act, k_env = jax.random.split(step_key)
        if per_env:
            lag_t = lag_lib.switch_lags(lags, t, every=switch_every, stride=switch_stride)
            params_t = (actor.params if switch_every <= 0  # else re-gathered at every step
                        else lag_lib.gather(actor.buffer, lag_t))
            logits_mu, logits_pi = per_env_logits(apply_fn, actor.newest, params_t, lag_t,
                                                  state.obs)
            version = lag_lib.version_ids(actor.buffer, lag_t)
        elif grouped:
            lag_t = lags
            logits_mu, logits_pi = sorted_logits(apply_fn, actor, state.obs)
            version = actor.version
        elif versioned:
            rows = (fixed_rows if switch_every <= 0 else actor.rows(
                lag_lib.switch_lags(lags, t, every=switch_every, stride=switch_stride)))
            logits_mu, logits_pi = versioned_logits(apply_fn, actor, rows, state.obs)
            lag_t, version = actor.row_lag[rows], actor.version[rows]
        else:
            logits_pi = apply_fn(actor, state.obs)
            logits_mu = logits_pi
            lag_t = jnp.zeros((num_envs,), jnp.int32)
            version = lag_t
        log_pi_all = jax.nn.log_softmax(logits_pi, axis=-1)
        log_b_all = (jax.nn.log_softmax(logits_mu, axis=-1) if record_behaviour_log_probs
                     else None)
        if sampler is None:
            log_mu_all = sampling_log_probs(logits_mu, temperature, top_k)
            action = jax.random.categorical(k_act, log_mu_all, axis=-1).astype(jnp.int32)
            log_mu = jnp.take_along_axis(log_mu_all, action[:, None], axis=-1)[:, 0]
        else:
            drawn = samplers.sample(k_act, logits_mu, sampler)
            action, log_mu, log_mu_all = drawn.token, drawn.log_prob, drawn.log_probs
        obs, env_state, reward, terminated, truncated, final_obs, info = step_env(
            env, jax.random.split(k_env, num_envs), state.env_state, action, env_params
        )
        is_action = info.get("is_action")
        if is_action is not None:  # tool steps: no behaviour ratio (log rho := 0)
            is_action = jnp.asarray(is_action, bool)
            log_mu_all = jnp.where(is_action[:, None], log_mu_all, log_pi_all)
            log_mu = jnp.take_along_axis(log_mu_all, action[:, None], axis=-1)[:, 0]
        discount = None
        if env_discounts:
            if "discount" not in info:
                raise ValueError("env_discounts=True but the env's info has no 'discount'")
            discount = jnp.asarray(info["discount"], jnp.float32)
        done = terminated | truncated
        ep_return = state.episode_return + reward
        ep_length = state.episode_length + 1
        record = Trajectory(
            obs=state.obs,
            action=action,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            log_mu=log_mu,
            log_mu_all=log_mu_all,
            log_pi_all=log_pi_all,
            lag=lag_t,
            version=version,
            episode_return=jnp.where(done, ep_return, 0.0),
            episode_length=jnp.where(done, ep_length, 0),
            episode_done=done,
            env_state=state.env_state if record_states else None,
            discount=discount,
            is_action=is_action,
            log_b_all=log_b_all,
        )
        new_state = EnvCarry(
            env_state=env_state,
            obs=obs,
            episode_return=jnp.where(done, 0.0, ep_return),
            episode_length=jnp.where(done, 0, ep_length),
        )
        return new_state, record

    steps = jnp.arange(num_steps, dtype=jnp.int32)
    keys = jax.random.split(key, num_steps)
    return jax.lax.scan(one_step, carry, (steps, keys))
