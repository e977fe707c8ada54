"""A fully jitted asynchronous actor-critic trainer with simulated policy lag.

PureJaxRL manner: one training run is ONE jitted function (a ``lax.scan`` over updates;
seeds ``vmap``-ed); all state lives in :class:`TrainState`, every leaf with a leading seed
axis. Asynchrony is simulated with a ring of the last K actor versions (``envs.lag``): at
update k each env draws a lag L from the lag law and acts with pi_{k-L}; the learner trains
pi_k and the critic on those stale transitions with the logged behaviour log-probabilities.

Layout (read top to bottom): :func:`update` is the whole update of one seed, five named
steps —

1. :func:`rollout_step`: B envs x T steps with behaviour versions mu_i = pi_{k - L_b}
   (temperature / top-k sampling logged exactly; log pi_k of every action logged too), and
   :func:`with_replay` (the replayed rollouts of Eq 6: the learner's batch ``ltraj``);
2. prepare (``train.learner``): Vbar (the critic at the start of the update, or its Polyak
   average) on s_t and on the next observation (truncation bootstraps, termination does
   not), log-ratios, critic targets (``train.targets``: the names of
   ``estimators.registry`` plus ``gae``), actor advantages, the actor's pi_old (pi_k or a
   decoupled route of issue 13) and the learner batch;
3. :func:`learn_step`: epochs x minibatches of the actor loss
   (``train.losses.actor_loss``) and the critic loss 0.5 (V(s) - sg[y])^2 (Eq 7), jointly
   or critic first (``train.learner``);
4. :func:`push_version`: the new state — Polyak target, the new actor pushed into the ring,
   replay, EWMA;
5. :func:`update_metrics`: episode return, lags, importance diagnostics
   (``train.batch_metrics``), losses, and at the start-of-update parameters
   :func:`ground_truth` (``train.truth``, every ``gt_every`` updates) and the pi_old
   route's diagnostics (``train.route_metrics``).

Every step is a plain function of the static pieces (``train.setup.Setup``, built once from
the config), the grid values (``train.programs.GridValues``: learning rates, clips, the lag
law's parameter, the PPO-EWMA rate; an explicit argument of the compiled program, so grid
cells share one compile) and arrays. :func:`train_scan` scans :func:`update` over updates
(seeds vmapped); :class:`Trainer` compiles it (:func:`compile_programs`, shared through a
``train.programs.ProgramCache`` when one is given) and runs it on host.

Lag 0 is exactly on-policy: log-ratios are exactly 0, every weight exactly 1 and every
corrected target its uncorrected form (tests/train check this bit for bit).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from vccc_jax.envs import acting
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.train import learner, truth
from vccc_jax.train import replay as replay_lib
from vccc_jax.train import route_metrics as rm
from vccc_jax.train import setup as setup_lib
from vccc_jax.train.batch_metrics import data_metrics, pi_old_kl
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.programs import (
    GridValues,
    ProgramCache,
    abstract_values,
    grid_values,
    program_values,
)
from vccc_jax.train.setup import Setup, make_setup
from vccc_jax.train.targets import NEEDS_ACTOR_CRITIC

Array = chex.Array

__all__ = ["TrainConfig", "TrainState", "Trainer", "compile_programs", "init_state",
           "replay_drops", "rollout_step", "train", "train_scan", "update"]


@struct.dataclass
class TrainState:
    """Everything that changes during training (one seed; a leading seed axis when batched)."""

    actor_params: Any
    critic_params: Any
    target_critic_params: Any  # None without a Polyak target
    actor_opt_state: Any
    critic_opt_state: Any
    versions: Any  # lag.VersionBuffer of actor params, or None when synchronous (K = 1)
    env: rollout_lib.EnvCarry
    key: Array
    last_return: Array  # carried mean return of the latest finished behaviour episodes
    update: Array  # int32 number of updates done
    baseline_params: Any = None  # learned b_psi head (baseline="learned"), else None
    baseline_opt_state: Any = None
    replay: Any = None  # train.replay.ReplayBuffer (replay_updates > 0), else None
    ewma: Any = None  # decoupled.EwmaState of the actor (pi_old_route="ewma"), else None
    # lag.VersionBuffer of critic params beside ``versions`` (the actor's critic copy, read by
    # a critic of targets.NEEDS_ACTOR_CRITIC), else None
    critic_versions: Any = None


# --------------------------------------------------------------------------------------
# One update of one seed
# --------------------------------------------------------------------------------------


def update(setup: Setup, values: GridValues, state: TrainState, idx: Array
           ) -> tuple[TrainState, dict]:
    """One rollout + learning phase for one seed. ``idx`` is the (unbatched) update index."""
    key, k_lag, k_roll, k_perm, k_gt = jax.random.split(state.key, 5)
    env = state.env
    if setup.law.drops:  # static: a trace of a real run that dropped rollouts
        env, k_roll = replay_drops(setup, values, state, idx)
    # 1. rollout with stale versions (+ replayed rollouts: the learner's batch ltraj)
    env_carry, traj = rollout_step(setup, values, state.actor_params, state.versions,
                                   env, k_roll, idx, k_lag)
    traj = with_behaviour_values(setup, state.critic_versions, state.critic_params, traj)
    traj = setup.constrain("traj", traj)
    ltraj, valid = with_replay(setup, state, traj)
    # 2. prepare: Vbar, ratios, critic targets, advantages, pi_old, the learner batch
    prep = learner.prepare(setup, values, ltraj, vbar_params(setup, state),
                           state.baseline_params)
    log_pi_old, log_pi_old_all = learner.pi_old(setup, values, state.ewma, ltraj, prep)
    batch = learner.learner_batch(setup, values, ltraj, prep, valid, log_pi_old,
                                  log_pi_old_all)
    # 3. learn: epochs x minibatches over the [T, B] batch (env-local shuffles)
    learned, loss_stats = learn_step(setup, values, state, batch, ltraj, k_perm)
    # 4. push the new version (and the Polyak target, replay, EWMA)
    new_state = push_version(setup, values, state, learned, traj, env_carry, key)
    # 5. metrics (ground truth and route diagnostics at the start-of-update params)
    metrics = update_metrics(setup, values, state, new_state, traj, ltraj, valid, prep,
                             batch, log_pi_old_all, loss_stats, k_gt, idx)
    return new_state, metrics


def rollout_step(setup: Setup, values: GridValues, actor_params, versions, env_carry, key,
                 idx, k_lag=None, lags=None, steps=None, first_step=0):
    """One rollout; ``acting.acting_actor`` picks how the actor runs (``acting.choose_path``: one
    forward per version, per env from a gather of the ring, or per (chunk, version) pair of
    the lag-sorted envs when not on a mesh). ``k_lag`` None: every env at lag 0; ``lags``
    [B]: these lags instead of the law's (a replayed dropped rollout). ``steps``,
    ``first_step``: one chunk of the rollout (``rollout.rollout``; the async actors)."""
    cfg = setup.cfg
    if versions is not None:
        avail = jnp.minimum(lag_lib.available(versions), setup.num_versions)
        if lags is None:
            lags = (jnp.zeros((cfg.num_envs,), jnp.int32) if k_lag is None else
                    sample_lags(setup, values, k_lag, avail, idx))
        common = setup.law.kind == "fixed" and cfg.switch_every <= 0  # one lag for all envs
        actor_for_rollout = acting.acting_actor(
            setup.constrain("rollout_actor", versions), lags, num_lags=setup.num_versions,
            common_lag=(0 if k_lag is None else values.lag) if common else None,
            switch_every=cfg.switch_every, one_device=setup.spmd_axis is None)
    else:
        lags, actor_for_rollout = None, setup.constrain("rollout_actor", actor_params)
    return rollout_lib.rollout(
        setup.env, setup.env_params, setup.actor_logits, actor_for_rollout, env_carry, key,
        num_steps=cfg.num_steps, lags=lags, switch_every=cfg.switch_every,
        switch_stride=cfg.switch_stride, temperature=cfg.temperature, top_k=cfg.top_k,
        record_states=cfg.gt_every > 0, sampler=setup.sampler,
        env_discounts=setup.env_kind == "token",
        record_behaviour_log_probs=cfg.pi_old_route == "exact" or setup.route_diag,
        head=setup.head, steps=steps, first_step=first_step,
    )


def replay_drops(setup: Setup, values: GridValues, state: TrainState, idx) -> tuple[Any, Array]:
    """The rollouts a replayed run dropped before update ``idx``'s learned one (a ``trace``
    law with drops, ``LagLaw.drops_at``): env b advances through its ``counts[b]`` dropped
    rollouts, acting at the recorded lags (masked per env; their transitions and episode
    statistics discarded, as the learner of ``train.async_pipeline`` never sees them; the
    running episode return and length carry on). Every rollout, dropped or learned, takes
    the next key of the actor's chain (``key -> split(key, 5)[0]``, ``async_pipeline``'s
    ``actor_rollout``): the chain is ``offset`` rollouts ahead of the learner's state key.
    Returns (the env carries, the learned rollout's key)."""
    lags, counts, offset = setup.law.drops_at(idx, setup.cfg.num_envs)
    chain = jax.lax.fori_loop(0, offset, lambda _, k: jax.random.split(k, 5)[0], state.key)

    def body(carry):
        i, env, key = carry
        key, _, k_roll, _, _ = jax.random.split(key, 5)
        moved, _ = rollout_step(setup, values, state.actor_params, state.versions, env, k_roll,
                                idx, lags=lags[i])
        keep = i < counts
        env = jax.tree_util.tree_map(
            lambda new, old: jnp.where(keep.reshape(keep.shape + (1,) * (new.ndim - 1)), new,
                                       old), moved, env)
        return i + 1, env, key

    _, env, chain = jax.lax.while_loop(lambda c: c[0] < jnp.max(counts), body,
                                       (jnp.zeros((), jnp.int32), state.env, chain))
    return env, jax.random.split(chain, 5)[2]


def needs_critic_copy(setup: Setup) -> bool:
    """Whether the critic target reads the actor's critic copy (``behaviour_values``)."""
    return setup.cfg.critic in NEEDS_ACTOR_CRITIC


def with_behaviour_values(setup: Setup, critic_versions, critic_params, traj):
    """``traj`` with ``behaviour_values`` [T, B, 2]: V_{k-L}(s_t) and V_{k-L}(final_obs_t) from
    the critic copy of each step's behaviour version (``critic_versions`` read at the step's
    lag, or ``critic_params`` for every step when None) — what an actor holding that critic
    copy stores while acting. Unchanged (no forward) unless the critic reads it."""
    if not needs_critic_copy(setup):
        return traj
    obs = jnp.concatenate([traj.obs, traj.final_obs], 0)
    T = traj.reward.shape[0]
    if critic_versions is None:
        both = setup.critic_values(critic_params, obs)
    else:  # every ring version on every step (K small), then each step's own
        every = jax.vmap(lambda p: setup.critic_values(p, obs))(critic_versions.params)
        slot = lag_lib.slots(critic_versions, jnp.concatenate([traj.lag, traj.lag], 0))
        both = jnp.take_along_axis(every, slot[None], 0)[0]
    return traj.replace(behaviour_values=jnp.stack([both[:T], both[T:]], -1))


def sample_lags(setup: Setup, values: GridValues, key, avail, idx) -> Array:
    """This update's lags [B] from the lag law (its parameter: ``values.lag`` /
    ``values.lag_logits``; ``trace`` laws are static)."""
    B, K, law = setup.cfg.num_envs, setup.num_versions, setup.law
    if law.kind == "fixed":
        return lag_lib.cap_lags(jnp.full((B,), values.lag, jnp.int32), avail)
    if law.kind == "trace":
        return law.sample(key, B, K, available=avail, step=idx)
    return lag_lib.cap_lags(lag_lib.sample_from_logits(key, values.lag_logits, B), avail)


def with_replay(setup: Setup, state: TrainState, traj) -> tuple[Any, Optional[Array]]:
    """(the learner's trajectory ``ltraj``, sample validity or None): ``traj`` itself, or
    with ``replay_updates`` > 0 the fresh rollout next to the replayed ones (Eq 6)."""
    if state.replay is None:
        return traj, None
    return replay_lib.combine(state.replay, traj, state.update - traj.lag, state.update,
                              setup_lib.log_softmax_actor(setup, state.actor_params))


def vbar_params(setup: Setup, state: TrainState):
    """Vbar's params: the Polyak target critic, or the critic at the start of the update."""
    return state.target_critic_params if setup.cfg.polyak is not None else state.critic_params


def ground_truth(setup: Setup, values: GridValues, state: TrainState, traj, ltraj, valid,
                 prep, key, idx) -> dict:
    """Ground-truth metrics at the start-of-update params (``train.truth``): exact on
    tabular / token envs, Monte Carlo on gymnax; NaN off-cycle."""
    if setup.gt_exact:
        return truth.exact_truth(setup, values, state, traj, ltraj, valid, prep, idx)
    return truth.monte_carlo_truth(setup, state, traj, key, idx)


def learn_step(setup: Setup, values: GridValues, state: TrainState, batch, ltraj, key
               ) -> tuple[learner.Learnable, dict]:
    """The learner's epochs from the state's params: joint, or critic first."""
    params = learner.Learnable(state.actor_params, state.critic_params,
                               state.actor_opt_state, state.critic_opt_state,
                               state.baseline_params, state.baseline_opt_state)
    if setup.cfg.critic_first:
        return learner.learn_critic_first(setup, values, params, batch, ltraj, key)
    return learner.learn(setup, values, params, batch, key)


def push_version(setup: Setup, values: GridValues, state: TrainState,
                 learned: learner.Learnable, traj, env_carry, key) -> TrainState:
    """The next state: the learned params, the Polyak target, the new actor pushed into the
    version ring, this rollout pushed into the replay, the EWMA actor, the carried return."""
    target_critic = state.target_critic_params
    if setup.cfg.polyak is not None:
        tau = setup.cfg.polyak
        target_critic = jax.tree_util.tree_map(
            lambda t, p: (1.0 - tau) * t + tau * p, target_critic, learned.critic_params)
    versions, critic_versions = state.versions, state.critic_versions
    if versions is not None:
        versions = lag_lib.push(versions, learned.actor_params)
    if critic_versions is not None:
        critic_versions = lag_lib.push(critic_versions, learned.critic_params)
    replay = state.replay
    if replay is not None:
        replay = replay_lib.push(replay, traj, state.update - traj.lag)
    ewma = state.ewma
    if ewma is not None:  # once per update = once per version (tabular/decoupled)
        ewma = dec.ewma_update(ewma, learned.actor_params, values.ewma_decay)
    finished = jnp.sum(traj.episode_done)
    ret = jnp.sum(traj.episode_return) / jnp.maximum(finished, 1)
    return TrainState(
        actor_params=learned.actor_params, critic_params=learned.critic_params,
        target_critic_params=target_critic, actor_opt_state=learned.actor_opt,
        critic_opt_state=learned.critic_opt, versions=versions, env=env_carry, key=key,
        last_return=jnp.where(finished > 0, ret, state.last_return), update=state.update + 1,
        baseline_params=learned.baseline_params, baseline_opt_state=learned.baseline_opt,
        replay=replay, ewma=ewma, critic_versions=critic_versions)


def update_metrics(setup: Setup, values: GridValues, state: TrainState, new_state: TrainState,
                   traj, ltraj, valid, prep, batch, log_pi_old_all, loss_stats: dict,
                   key, idx) -> dict:
    """The update's metrics: return and episodes of the rollout, the batch's diagnostics
    (``train.batch_metrics``), losses, ground truth (:func:`ground_truth`, ``key``: its
    Monte-Carlo draws); with a ``pi_old_route`` its diagnostics (``train.route_metrics``)
    and KL(pi_k || pi_old)."""
    metrics = {
        "return": new_state.last_return,
        "episodes": jnp.sum(traj.episode_done).astype(jnp.int32),
        **data_metrics(setup, values, ltraj, valid, prep),
        **loss_stats,
        **ground_truth(setup, values, state, traj, ltraj, valid, prep, key, idx),
    }
    if setup.cfg.pi_old_route:
        metrics.update(rm.route_diagnostics(setup, values, state.actor_params, ltraj, prep,
                                            batch, idx))
        metrics["pi_old_kl"] = pi_old_kl(setup, ltraj, valid, log_pi_old_all)
    return metrics


# --------------------------------------------------------------------------------------
# Initial states, many updates, the compiled programs
# --------------------------------------------------------------------------------------


def init_state(setup: Setup, values: GridValues, key: Array) -> TrainState:
    """The initial state of one seed."""
    cfg = setup.cfg
    k_actor, k_critic, k_env, key = jax.random.split(key, 4)
    dummy = jnp.zeros((1,) + setup.obs_shape, jnp.float32)
    actor_params = setup.actor_net.init(k_actor, dummy[..., :setup.actor_obs_shape[-1]])
    critic_params = setup.critic_net.init(k_critic, dummy)
    versions = None
    extra = {}
    if setup.ring_size > 1:
        versions = lag_lib.init_buffer(actor_params, setup.ring_size)
        if needs_critic_copy(setup):
            extra["critic_versions"] = lag_lib.init_buffer(critic_params, setup.ring_size)
    if setup.baseline_net is not None:
        # b_psi starts as a copy of the critic: b = Vbar at the start (Eq 8 default)
        extra.update(baseline_params=critic_params,
                     baseline_opt_state=setup_lib.baseline_tx(setup, values).init(critic_params))
    env = rollout_lib.reset(setup.env, setup.env_params, k_env, cfg.num_envs)
    if cfg.pi_old_route == "ewma":  # debiased EMA at count 0 is all zeros: update first
        extra["ewma"] = dec.ewma_update(dec.ewma_init(actor_params), actor_params,
                                        values.ewma_decay)
    if cfg.replay_updates > 0:
        shapes = jax.eval_shape(lambda: rollout_step(setup, values, actor_params, versions,
                                                     env, key, 0)[1])
        extra["replay"] = replay_lib.init_replay(shapes, cfg.replay_updates)
    return TrainState(
        actor_params=actor_params,
        critic_params=critic_params,
        target_critic_params=critic_params if cfg.polyak is not None else None,
        actor_opt_state=setup_lib.actor_tx(setup, values).init(actor_params),
        critic_opt_state=setup_lib.critic_tx(setup, values).init(critic_params),
        versions=versions,
        env=env,
        key=key,
        last_return=jnp.zeros((), jnp.float32),
        update=jnp.zeros((), jnp.int32),
        **extra,
    )


def init_states(setup: Setup, keys: Array, values: GridValues) -> TrainState:
    """Initial states of every seed (leading seed axis). ``lax.map``, not vmap: a vmapped
    flax orthogonal init is a *batched* LAPACK QR, which jaxlib 0.10 splits over the
    2-thread XLA:CPU pool from inside a pool thread and can deadlock (observed on this
    2-core machine); unbatched QRs run inline."""
    return jax.lax.map(lambda k: init_state(setup, values, k), keys)


def train_scan(setup: Setup, states: TrainState, start: Array, num_updates: int,
               values: GridValues, finish: Callable = lambda s: s):
    """``num_updates`` updates of every seed from update index ``start``: (states,
    metrics [num_updates, num_seeds, ...]). ``finish(state)`` is applied to the state after
    every update (``train.sharding`` pins it to its sharding there)."""
    num_seeds = jax.tree_util.tree_leaves(states.key)[0].shape[0]
    steps = jnp.arange(num_updates, dtype=jnp.int32)
    if num_seeds == 1:
        # One seed: run unbatched (a size-1 vmap makes XLA:CPU emit batched dots and
        # gathers that are ~2x slower) and put the seed axis back on the way out.
        def body(s, i):
            s, m = update(setup, values, s, start + i)
            return finish(s), m

        squeeze = finish(jax.tree_util.tree_map(lambda x: x[0], states))
        final, metrics = jax.lax.scan(body, squeeze, steps)
        expand = lambda t, axis: jax.tree_util.tree_map(  # noqa: E731
            lambda x: jnp.expand_dims(x, axis), t)
        return expand(final, 0), expand(metrics, 1)

    def body_v(s, i):
        s, m = jax.vmap(lambda s1, i1: update(setup, values, s1, i1), in_axes=(0, None),
                        spmd_axis_name=setup.spmd_axis)(s, start + i)
        return finish(s), m

    return jax.lax.scan(body_v, finish(states), steps)


class Programs(NamedTuple):
    """The compiled programs of one ``program_key``: ``init(keys, values)`` and
    ``train(states, start, num_updates, values)`` (``num_updates`` static)."""

    init: Callable
    train: Callable


def compile_programs(setup: Setup, compiler_options: Optional[dict] = None) -> Programs:
    """The jitted init and training scan of ``setup`` (compiled on first call);
    ``compiler_options``: XLA options for both (``jax.jit``'s)."""
    return Programs(init=jax.jit(functools.partial(init_states, setup), compiler_options=compiler_options),
                    train=jax.jit(functools.partial(train_scan, setup), static_argnums=(2,),
                                  compiler_options=compiler_options))


class Trainer:
    """Builds and runs the jitted training function for one :class:`TrainConfig`.

    ``cache``: a ``train.programs.ProgramCache`` shared with other Trainers (key
    ``program_key(config)``: grid cells share one compile); None compiles its own.
    ``setup``: the static pieces (``train.setup.Setup``); ``values``: the config's grid
    values as host numbers (``train.programs.grid_values``; the compiled programs take them
    as ``program_values``)."""

    def __init__(self, config: TrainConfig, cache: Optional[ProgramCache] = None):
        self.config = config
        self.setup = make_setup(config)
        self.values = grid_values(config)
        self.num_updates = self.setup.num_updates
        build = functools.partial(compile_programs, self.setup)
        self.programs = build() if cache is None else cache.get(self.setup.cfg, build)

    def seed_keys(self) -> Array:
        """[num_seeds, 2] keys: seed s of a run is fold_in(PRNGKey(config.seed), s)."""
        base = jax.random.PRNGKey(self.config.seed)
        return jax.vmap(lambda s: jax.random.fold_in(base, s))(
            jnp.arange(self.config.num_seeds, dtype=jnp.uint32))

    def init(self, keys: Optional[Array] = None) -> TrainState:
        """Initial states for all seeds (leading seed axis)."""
        keys = self.seed_keys() if keys is None else keys
        return self.programs.init(keys, program_values(self.values))

    def train(self, states: TrainState, num_updates: Optional[int] = None,
              start: Optional[int] = None):
        """Run ``num_updates`` updates for every seed (one jitted scan).

        ``start`` is the index of the first update (default: read from ``states.update``),
        so a run split into chunks (for progress or checkpoints) equals a run in one piece.
        Returns (states, metrics) with metrics leaves shaped [num_updates, num_seeds, ...].
        """
        if num_updates is None:
            num_updates = self.num_updates
        if start is None:
            start = int(jax.device_get(states.update).reshape(-1)[0])
        return self.programs.train(states, jnp.asarray(start, jnp.int32), int(num_updates),
                                   program_values(self.values))

    def lower(self, states: TrainState, num_updates: int):
        """The lowered training function (for compile-time measurements)."""
        return self.programs.train.lower(states, jnp.asarray(0, jnp.int32), int(num_updates),
                                         abstract_values(program_values(self.values)))


def train(config: TrainConfig):
    """Convenience: init and run the whole configured training; returns (states, metrics)."""
    trainer = Trainer(config)
    return trainer.train(trainer.init())
