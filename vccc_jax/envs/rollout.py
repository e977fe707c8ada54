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
  top-k truncation included; a Gaussian's noise scale) and ``log_mu_all`` [T, B, P], the
  whole sampling distribution as the head's rows (``envs.policy_heads``: log-probs of every
  discrete action, or a Gaussian's [mean, log_std]), which Z(s) (§4.2) and score centering
  (Eq 13) need;
* ``log_pi_all`` [T, B, A]: log-probs of the newest actor version (the learner's pi_k at
  temperature 1) at s_t. The learner does not move during a rollout, so pi_k is known here,
  and lag-0 log-ratios are exactly zero: under the tables an env at lag 0 reads its
  behaviour logits from the newest version's row (the same bits); under the per-env and
  sorted paths pi_k comes from forwards over the T x B observations after the step loop, and
  lag-0 entries keep the behaviour's own log-softmax (``acting.newest_log_probs``);
* ``lag`` / ``version``: how many updates old the acting parameters were and their id;
* ``episode_return`` / ``episode_length`` of episodes that ended at t (0 elsewhere);
* optionally ``env_state`` (the full gymnax state at s_t) for Monte-Carlo ground truth.

The lagged actor runs one of four ways, chosen per compiled program
(:mod:`vccc_jax.envs.acting`: ``acting_actor`` / ``choose_path``); each step asks
``acting.step_logits`` for the behaviour and newest logits (under the per-env and sorted
paths the newest come after the loop). Synchronous rollouts (plain params) run one plain
forward.

Time-limit detection: gymnax >= 1.0 returns ``terminated`` and ``truncated`` from
``env.step``; older gymnax merges them in ``done``. For the old API we detect the cut from the
env's step counter (``state.time >= max_steps_in_episode``) — see :func:`env_step`.
"""

from __future__ import annotations

from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from vccc_jax.envs import acting, samplers
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.policy_heads import CategoricalHead

Array = chex.Array
ApplyFn = acting.ApplyFn  # (params, obs) -> logits [..., A]


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
    # [T, B, 2] the behaviour version's critic copy V_{k-L} at (obs, final_obs), or None: logged
    # only for a critic that reads it (train.targets.NEEDS_ACTOR_CRITIC)
    behaviour_values: Any = None

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


def step_draws(key: Array, num_steps: int, num_envs: int,
               logits: Optional[jax.ShapeDtypeStruct], head=None) -> tuple:
    """The scan inputs of a rollout: (step index [T], action key [T, 2], env keys [T, B, 2],
    action noise [T, ...] or None), every random draw of the loop made before it, one
    batched call each. They are the very bits the loop body would draw step by step (step t
    splits ``split(key, T)[t]`` into an action and an env key; threefry is counter-based, so
    ``vmap`` over the keys changes nothing), without a threefry call per draw inside the
    loop: XLA:CPU runs each as a 5-trip while loop of small kernels. The noise is there when
    ``logits`` (the shape and dtype of one step's behaviour output [B, P]) is given:
    ``head.noise`` of each step's action key (the categorical head's Gumbel noise:
    ``jax.random.categorical`` is the argmax of the log-probs plus it; the Gaussian head's
    standard normal draws); a sampler draws its own."""
    head = CategoricalHead() if head is None else head
    both = jax.vmap(jax.random.split)(jax.random.split(key, num_steps))  # [T, 2, 2]
    k_act, k_env = both[:, 0], both[:, 1]
    env_keys = jax.vmap(lambda k: jax.random.split(k, num_envs))(k_env)
    noise = None if logits is None else jax.vmap(lambda k: head.noise(k, logits))(k_act)
    return jnp.arange(num_steps, dtype=jnp.int32), k_act, env_keys, noise


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
    head: Any = None,
    steps: Optional[int] = None,
    first_step: Any = 0,
) -> tuple[EnvCarry, Trajectory]:
    """Run ``num_steps`` steps of every env in ``carry``; returns (new carry, Trajectory).

    Args:
      env, env_params: a gymnax environment and its params.
      apply_fn: (params, obs) -> the actor's output (logits, or a Gaussian's [mean, log_std])
        for one observation or a batch.
      actor: plain actor params (synchronous: every env acts with them, lag 0), a
        :class:`~vccc_jax.envs.lag.VersionBuffer` (env b acts with the version ``lags[b]``
        updates old, capped by the versions pushed so far; the actor runs once per version
        in ``acting.lag_table(actor, num_lags)``) or a
        :class:`~vccc_jax.envs.acting.VersionTable`
        (the versions to run, e.g. ``acting.common_table`` when every env has the same lag),
        or a :class:`~vccc_jax.envs.acting.EnvVersions` (each env's own version, one forward
        per env: ``acting.per_env_logits``), or a :class:`~vccc_jax.envs.acting.SortedVersions`
        (one forward per (chunk, version) pair of the lag-sorted envs:
        ``acting.sorted_logits``; no mid-rollout switch). ``acting.acting_actor`` picks one
        of the last four.
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
      head: the actor's distribution (``envs.policy_heads``): what the log-prob "rows"
        ``log_mu_all`` / ``log_pi_all`` / ``log_b_all`` hold, how actions are drawn and what
        the env receives. Default: ``CategoricalHead(temperature, top_k)``; a Gaussian head
        logs [mean, log_std] rows and continuous actions (the pre-squash u).
      steps, first_step: run only steps ``first_step .. first_step + steps - 1`` (``steps``
        static, ``first_step`` may be traced) of the ``num_steps``-step rollout, with that
        rollout's very draws: chunks run one after the other, passing the carry on, equal the
        whole rollout bit for bit (a real actor's mid-rollout weight updates, issue 48).

    Envs whose info has ``"is_action"`` (the token env) get ``Trajectory.is_action``; on a
    non-action (tool) step the behaviour row is replaced by pi_k's (log mu := log pi_k), so
    the log-ratio is exactly 0 and every correction reduces to its uncorrected form there.
    """
    num_envs = carry.obs.shape[0]
    if head is None:
        head = CategoricalHead(temperature=temperature, top_k=top_k)
    if isinstance(actor, acting.SortedVersions) and switch_every > 0:
        raise ValueError("acting.SortedVersions fixes each env's lag for the rollout: no "
                         "mid-rollout switches (use acting.env_versions or acting.lag_table)")
    if isinstance(actor, (lag_lib.VersionBuffer, acting.VersionTable)):
        if lags is None:
            raise ValueError("lags [num_envs] is required when actor is a VersionBuffer "
                             "or a VersionTable")
        chex.assert_shape(lags, (num_envs,))
        lags = jnp.asarray(lags, jnp.int32)
        if isinstance(actor, lag_lib.VersionBuffer):
            lags = lag_lib.cap_lags(lags, lag_lib.available(actor))
            actor = acting.lag_table(actor, num_lags)
        if switch_every > 0 and not actor.complete:
            raise ValueError("mid-rollout switches need a complete lag table (acting.lag_table)")
    step_env = jax.vmap(env_step_info, in_axes=(None, 0, 0, 0, None))

    def one_step(state: EnvCarry, xs):
        t, k_act, env_keys, noise = xs
        logits_mu, logits_pi, lag_t, version = acting.step_logits(
            apply_fn, actor, lags, state.obs, t, switch_every=switch_every,
            switch_stride=switch_stride)
        log_b_all = head.normalize(logits_mu)  # (unused ones are not computed)
        # pi_k's log-probs; under the per-env and sorted paths the behaviour's stand in
        # until the forward after the loop
        log_pi_all = log_b_all if logits_pi is None else head.normalize(logits_pi)
        if sampler is None:
            log_mu_all = head.behaviour(logits_mu)
            # categorical: = jax.random.categorical(k_act, log_mu_all) (argmax + Gumbel)
            action = head.sample(log_mu_all, noise)
            log_mu = head.log_prob(log_mu_all, action)
        else:
            drawn = samplers.sample(k_act, logits_mu, sampler)
            action, log_mu, log_mu_all = drawn.token, drawn.log_prob, drawn.log_probs
        obs, env_state, reward, terminated, truncated, final_obs, info = step_env(
            env, env_keys, state.env_state, head.env_action(action), env_params
        )
        is_action = info.get("is_action")
        if is_action is not None:
            is_action = jnp.asarray(is_action, bool)
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
            log_b_all=log_b_all if record_behaviour_log_probs else None,
        )
        new_state = EnvCarry(
            env_state=env_state,
            obs=obs,
            episode_return=jnp.where(done, 0.0, ep_return),
            episode_length=jnp.where(done, 0, ep_length),
        )
        return new_state, record

    draws = step_draws(key, num_steps, num_envs, None if sampler is not None else jax.eval_shape(
        lambda o: acting.step_logits(apply_fn, actor, lags, o, jnp.int32(0))[0], carry.obs), head)
    if steps is not None:  # one chunk of the rollout: its slice of the same draws
        draws = jax.tree_util.tree_map(
            lambda x: jax.lax.dynamic_slice_in_dim(x, first_step, steps, 0), draws)
    carry, traj = jax.lax.scan(one_step, carry, draws)
    newest = acting.newest_after(actor)
    if newest is not None:
        traj = traj.replace(log_pi_all=acting.newest_log_probs(
            apply_fn, newest, traj.obs, traj.lag, traj.log_pi_all, head.normalize))
    if traj.is_action is not None:  # tool steps: no behaviour ratio (log rho := 0)
        log_mu_all = jnp.where(traj.is_action[..., None], traj.log_mu_all, traj.log_pi_all)
        traj = traj.replace(log_mu_all=log_mu_all, log_mu=head.log_prob(log_mu_all, traj.action))
    return carry, traj
