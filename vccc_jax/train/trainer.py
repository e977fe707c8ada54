"""A fully jitted asynchronous actor-critic trainer with simulated policy lag.

PureJaxRL manner: one training run is ONE jitted function — a ``lax.scan`` over updates,
each update a rollout (``envs.rollout``) followed by epochs x minibatches of a PPO-style
learner — and seeds are ``vmap``-ed. All state lives in :class:`TrainState`, a pytree whose
every leaf has an explicit leading seed axis, so sharding it later changes placement, not
code.

Asynchrony is simulated with a ring buffer of the last K actor versions (``envs.lag``):
at update k each env draws a lag L from the configured law and acts with pi_{k-L}; the
learner then trains pi_k and the critic on those stale transitions using the logged
behaviour log-probabilities.

Per update k (one seed):

1. rollout: B envs x T steps with behaviour versions mu_i = pi_{k - L_b} (temperature /
   top-k sampling logged exactly); log pi_k of every action is logged alongside.
2. Vbar = the critic at the start of the update (or its Polyak average) on s_t and on the
   next observation (the final observation at a time-limit cut: truncation bootstraps,
   termination does not).
3. critic targets from ``train.targets.CRITIC_TARGETS`` (ONE signature for all; the
   canonical names of ``estimators.registry``: uncorrected, vccc (Eq 4/8), truncated /
   masked (Eq 10), centered_baseline (Sec 4.2), the naive_baseline negative control,
   vtrace(lambda, rhobar, cbar, n) (Eq 11), plus the trainer's uncorrected lambda-return
   gae; comparators register more with ``train.targets.register_critic_target``).
4. actor advantages: GAE(gamma, lambda) on Vbar (default) or the target's own advantages.
5. epochs x minibatches of: actor loss = ``estimators.actor.policy_loss`` with weight
   kind ratio / truncate / mask, PPO clip against pi_k, optional score centering (Eq 13);
   critic loss = 0.5 (V(s) - sg[y])^2 (Eq 7); entropy bonus. Separate Adam optimisers.
6. Polyak update of the target critic (optional); push the new actor into the ring buffer.

Metrics per update: episode return (behaviour episodes finished in the rollout), mean lag,
losses, importance diagnostics (ESS, clip rate overall and by lag, log-ratio quantiles,
guard / non-finite counts), KL(pi_k || mu), and every ``gt_every`` updates the critic error
against Monte-Carlo V^{pi_k} (``envs.ground_truth``) and the current policy's return; with a
``pi_old_route``, on the same cycle, the route's actor-gradient bias / variance vs the exact
route and both routes' clip / mask fire rates (``train.route_metrics``).

Layout (read top to bottom): this file holds :class:`TrainState` and :class:`Trainer`
(construction, rollout, ``update``, the scans over updates and seeds); the learner
(``Prepared``: targets and advantages; ``Batch``; minibatch losses, epochs, both protocols)
is the mixin ``train.learner.Learner``; ground-truth metrics (exact on tabular / token envs,
Monte Carlo on gymnax) are the mixin ``train.truth.Truth`` over ``train.exact_metrics``.
The actor's proximal policy pi_old is pi_k unless ``pi_old_route`` picks a decoupled route
(issue 13: exact / ewma / behaviour, :meth:`Trainer._pi_old`).

Lag 0 is exactly on-policy: an env at lag 0 takes its behaviour logits from the newest
version's row of the rollout's per-version forward pass, so log-ratios are exactly 0, every
weight is exactly 1 and every corrected target reduces to its uncorrected form (tests/train
check this bit for bit).

Compiled programs: the learning rates, clips and the lag law's parameter are traced inputs
(:func:`program_values`), so Trainers whose configs differ only in them
(:func:`program_config` equal: grid cells) share one compiled init and one training step.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.envs import samplers
from vccc_jax.envs.make import env_kind, make_env
from vccc_jax.estimators import importance
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.train import actor_weights
from vccc_jax.train import replay as replay_lib
from vccc_jax.train import route_metrics as rm
from vccc_jax.train.config import TrainConfig, parse_actor
from vccc_jax.train.learner import (
    Batch,
    Learner,
    Prepared,
    effective_advantages,
    flat_rows,
    wmean,
)
from vccc_jax.train.networks import Actor, Critic
from vccc_jax.train.targets import get_critic_target
from vccc_jax.train.truth import Truth

Array = chex.Array

__all__ = ["TrainConfig", "TrainState", "Trainer", "Prepared", "program_config", "program_values",
           "train"]

# --------------------------------------------------------------------------------------
# Values traced into the compiled program (grid cells share one program)
# --------------------------------------------------------------------------------------

_LAG_PLACEHOLDER = {"fixed": "fixed:0", "uniform": "uniform:0", "geometric": "geometric:1",
                    "zipf": "zipf:1"}


def _clip_traced(cfg: TrainConfig) -> bool:
    return cfg.critic != "brace"


def program_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every traced value at a placeholder and the ring size K pinned: two
    configs with equal ``program_config`` run the same compiled program
    (:func:`program_values` carries what differs), so a grid over learning rates, clip
    thresholds or lags compiles once.

    Traced: ``actor_lr``, ``critic_lr``, ``baseline_lr``, ``actor_clip``, ``clip`` (static
    for ``brace``, whose estimator needs a Python number), the lag law's parameter
    (``fixed`` / ``uniform`` / ``geometric`` / ``zipf``; K = ``resolved_num_versions`` stays
    static, so lag cells share a program when they share K), the resolved ``ewma_decay`` and
    ``seed`` (it only makes the initial keys). Static: everything else, ``ppo_epsilon`` and
    ``rho_bar`` / ``c_bar`` included (``estimators.actor.policy_loss`` and ``vtrace``
    validate them as Python numbers)."""
    law = cfg.lag_law
    changes = dict(actor_lr=1.0, critic_lr=1.0, baseline_lr=None, actor_clip=2.0,
                   ewma_decay=None, seed=0, num_versions=cfg.resolved_num_versions)
    if _clip_traced(cfg):
        changes["clip"] = 2.0
    if law.kind in _LAG_PLACEHOLDER:
        changes["lag"] = _LAG_PLACEHOLDER[law.kind]
    return cfg.replace(**changes)


def program_values(cfg: TrainConfig) -> dict:
    """The traced values of ``cfg`` (numpy scalars / arrays): lrs, clips, the lag law's
    parameter as ``lag`` (fixed:L) or ``lag_logits`` (its log pmf over K lags) and the
    resolved ``ewma_decay``."""
    f32 = np.float32
    law, k = cfg.lag_law, cfg.resolved_num_versions
    out = {"actor_lr": f32(cfg.actor_lr), "critic_lr": f32(cfg.critic_lr),
           "baseline_lr": f32(cfg.critic_lr if cfg.baseline_lr is None else cfg.baseline_lr),
           "actor_clip": f32(cfg.actor_clip),
           "ewma_decay": f32(dec.trainer_ewma_decay(cfg.ewma_decay, law.mean(k)))}
    if _clip_traced(cfg):
        out["clip"] = f32(cfg.clip)
    if law.kind == "fixed":
        out["lag"] = np.int32(law.param)
    elif law.kind in _LAG_PLACEHOLDER:
        out["lag_logits"] = law.logits(k)
    return out


class TracedConfig:
    """A TrainConfig seen from inside the compiled program: the :func:`program_values`
    names read as the traced values, every other attribute as the config's."""

    def __init__(self, config: TrainConfig, values: dict):
        self._config, self.values = config, values

    def __getattr__(self, name: str):
        values = self.__dict__["values"]
        if name in values:
            return values[name]
        return getattr(self.__dict__["_config"], name)


# Trainers whose compiled programs later Trainers of the same program_config reuse
_PROGRAMS: "collections.OrderedDict[Any, Trainer]" = collections.OrderedDict()
_MAX_PROGRAMS = 16


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


class Trainer(Learner, Truth, rm.RouteDiagnostics):
    """Builds and runs the jitted training function for one :class:`TrainConfig`."""

    def __init__(self, config: TrainConfig, constrain=None):
        """``constrain(name, tree) -> tree`` (default identity) is applied to the rollout
        ("traj", leaves [T, B, ...]) and to every minibatch ("minibatch", leaves [mb, ...]);
        ``train.sharding`` passes ``with_sharding_constraint`` there."""
        self.config = cfg = config
        self.constrain = constrain or (lambda name, x: x)
        self.env, self.env_params = make_env(cfg.env)
        self.env_kind = env_kind(cfg.env)
        self._check_env_gamma()
        obs_shape = tuple(self.env.observation_space(self.env_params).shape)
        self.obs_shape = obs_shape
        self.num_actions = int(self.env.action_space(self.env_params).n)
        # token env: the actor reads only the exact features (prompt, position, automaton
        # state), so its V^pi is exact; the critic also sees the last-token distractors
        self.actor_features = (self.env.num_exact_features if self.env_kind == "token" else None)
        actor_shape = obs_shape if self.actor_features is None else (self.actor_features,)
        self.actor_obs_shape = actor_shape
        hidden = (cfg.hidden,) * cfg.num_layers
        self.actor_net = Actor(self.num_actions, hidden, cfg.activation, len(actor_shape))
        self.critic_net = Critic(hidden, cfg.activation, len(obs_shape))
        self.baseline_net = (Critic(hidden, cfg.activation, len(obs_shape))
                             if cfg.baseline == "learned" else None)
        self.sampler = cfg.sampler_spec
        self.law = cfg.lag_law
        self.num_versions = cfg.resolved_num_versions
        self.gt_exact = cfg.gt_every > 0 and (
            cfg.gt_kind == "exact" or (cfg.gt_kind == "auto" and self.env_kind != "gymnax"))
        if self.gt_exact and self.env_kind == "gymnax":
            raise ValueError(f"gt_kind='exact' needs a tabular: or token: env, got {cfg.env!r}")
        if self.gt_exact and self.sampler is not None and self.sampler.needs_key:
            raise ValueError("exact ground truth needs a deterministic sampler (no mismatch=noise)")
        # ring of actor versions: K for the lag law; with replay + exact truth it also keeps
        # the R older versions whose data is replayed (lags are still drawn from 0..K-1)
        self.ring_size = self.num_versions + (cfg.replay_updates if self.gt_exact else 0)
        self.masked = cfg.replay_updates > 0 or self.env_kind == "token"
        self.target_fn = get_critic_target(cfg.critic)
        self.actor_kind, self.centered = parse_actor(cfg.actor)
        if self.actor_kind in ("truncate", "mask"):
            importance.check_weight_kind(self.actor_kind, cfg.actor_clip)
        # the actor-correction row (issue 21) and its parameters (train.actor_weights)
        self.actor_row, self._row_params = actor_weights.resolve(
            self.actor_kind, cfg.actor_params, cfg.actor_clip)
        self.num_updates = cfg.num_updates
        self.gt_horizon = cfg.gt_horizon or gt_lib.horizon_for(cfg.gamma, 0.01)
        self.eval_horizon = int(min(getattr(self.env_params, "max_steps_in_episode", 1000), 5000))
        self.critic_epochs = cfg.critic_steps if cfg.critic_first else cfg.update_epochs
        # route diagnostics (train.route_metrics) need the exact route's pi_old for every route
        self.route_diag = bool(cfg.pi_old_route) and cfg.gt_every > 0
        # the traced values (learning rates, clips, the lag law's parameter, ...) and the
        # compiled programs, shared by every Trainer of the same program_config
        self.host_values = program_values(cfg)
        self.program_key = program_config(cfg)
        template = _PROGRAMS.get(self.program_key) if constrain is None else None
        if template is None:
            template = self
            self._train = jax.jit(self._train_impl, static_argnums=(2,))
            # lax.map, not vmap: a vmapped flax orthogonal init is a *batched* LAPACK QR,
            # which jaxlib 0.10 splits over the 2-thread XLA:CPU pool from inside a pool
            # thread and can deadlock (observed on this 2-core machine); unbatched QRs run
            # inline.
            self._init = jax.jit(self._init_impl)
            if constrain is None:
                _PROGRAMS[self.program_key] = self
                while len(_PROGRAMS) > _MAX_PROGRAMS:
                    _PROGRAMS.popitem(last=False)
        else:
            _PROGRAMS.move_to_end(self.program_key)
            self._train, self._init = template._train, template._init

    # -- construction ------------------------------------------------------------------
    def _check_env_gamma(self):
        cfg = self.config
        if self.env_kind == "gymnax":
            return
        env_gamma = float(self.env_params.gamma if self.env_kind == "tabular"
                          else self.env.task.gamma)
        if abs(env_gamma - cfg.gamma) > 1e-6:
            raise ValueError(f"gamma={cfg.gamma} differs from the env's gamma={env_gamma:g} "
                             f"({cfg.env!r}): set gamma={env_gamma:g} in the config")

    # -- traced values -------------------------------------------------------------------
    def values(self) -> dict:
        """This config's traced values as arrays (the program's second argument)."""
        return {k: jnp.asarray(v) for k, v in self.host_values.items()}

    @contextlib.contextmanager
    def traced(self, values: Optional[dict]):
        """Inside: ``self.config`` reads the :func:`program_values` names as ``values``
        (traced arrays), so the program being traced does not depend on them."""
        if values is None:
            yield
            return
        saved = self.config
        self.config = TracedConfig(saved, values)
        try:
            yield
        finally:
            self.config = saved

    def _value(self, name: str):
        """A traced value inside :meth:`traced`, else this config's (a constant)."""
        cfg = self.config
        return cfg.values[name] if isinstance(cfg, TracedConfig) else self.host_values[name]

    @property
    def actor_tx(self):
        return self._optimizer(self._value("actor_lr"))

    @property
    def critic_tx(self):
        return self._optimizer(self._value("critic_lr"), self.critic_epochs)

    @property
    def baseline_tx(self):
        return self._optimizer(self._value("baseline_lr"), self.critic_epochs)

    @property
    def actor_row_params(self) -> dict:
        """The actor row's parameters; its ``clip`` (``actor_clip``) is a traced value."""
        if "clip" not in self._row_params:
            return self._row_params
        return dict(self._row_params, clip=self._value("actor_clip"))

    @actor_row_params.setter
    def actor_row_params(self, params: dict):
        self._row_params = dict(params)

    @property
    def ewma_decay(self):
        """PPO-EWMA rate (decoupled pi_old, issue 13): from the lag law's mean unless given."""
        return self._value("ewma_decay")

    def _optimizer(self, lr: float, epochs: Optional[int] = None):
        cfg = self.config
        steps_per_update = (epochs or cfg.update_epochs) * cfg.num_minibatches

        def schedule(count):
            frac = 1.0 - (count // steps_per_update) / self.num_updates
            return lr * frac

        return optax.chain(
            optax.clip_by_global_norm(cfg.max_grad_norm),
            optax.adam(learning_rate=schedule if cfg.anneal_lr else lr, eps=1e-5),
        )

    def seed_keys(self) -> Array:
        """[num_seeds, 2] keys: seed s of a run is fold_in(PRNGKey(config.seed), s)."""
        base = jax.random.PRNGKey(self.config.seed)
        return jax.vmap(lambda s: jax.random.fold_in(base, s))(
            jnp.arange(self.config.num_seeds, dtype=jnp.uint32))

    def init_one(self, key: Array) -> TrainState:
        """The initial state of one seed."""
        cfg = self.config
        k_actor, k_critic, k_env, key = jax.random.split(key, 4)
        dummy = jnp.zeros((1,) + self.obs_shape, jnp.float32)
        actor_params = self.actor_net.init(k_actor, dummy[..., :self.actor_obs_shape[-1]])
        critic_params = self.critic_net.init(k_critic, dummy)
        versions = None
        if self.ring_size > 1:
            versions = lag_lib.init_buffer(actor_params, self.ring_size)
        extra = {}
        if self.baseline_net is not None:
            # b_psi starts as a copy of the critic: b = Vbar at the start (Eq 8 default)
            extra.update(baseline_params=critic_params,
                         baseline_opt_state=self.baseline_tx.init(critic_params))
        env = rollout_lib.reset(self.env, self.env_params, k_env, cfg.num_envs)
        if cfg.pi_old_route == "ewma":  # debiased EMA at count 0 is all zeros: update first
            extra["ewma"] = dec.ewma_update(dec.ewma_init(actor_params), actor_params,
                                            self.ewma_decay)
        if cfg.replay_updates > 0:
            shapes = jax.eval_shape(lambda: self._rollout(actor_params, versions, env, key, 0)[1])
            extra["replay"] = replay_lib.init_replay(shapes, cfg.replay_updates)
        return TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=critic_params if cfg.polyak is not None else None,
            actor_opt_state=self.actor_tx.init(actor_params),
            critic_opt_state=self.critic_tx.init(critic_params),
            versions=versions,
            env=env,
            key=key,
            last_return=jnp.zeros((), jnp.float32),
            update=jnp.zeros((), jnp.int32),
            **extra,
        )

    def _init_impl(self, keys: Array, values: Optional[dict] = None) -> TrainState:
        with self.traced(values):
            return jax.lax.map(self.init_one, keys)

    def init(self, keys: Optional[Array] = None) -> TrainState:
        """Initial states for all seeds (leading seed axis)."""
        keys = self.seed_keys() if keys is None else keys
        return self._init(keys, self.values())

    # -- networks ----------------------------------------------------------------------
    def actor_logits(self, params, obs):
        if self.actor_features is not None:
            obs = obs[..., :self.actor_features]
        return self.actor_net.apply(params, obs)

    def log_mu_fn(self, logits):
        """Deterministic behaviour log-probs of logits (exact truth)."""
        if self.sampler is not None:
            return samplers.sampler_log_probs(logits, self.sampler)
        return rollout_lib.sampling_log_probs(logits, self.config.temperature, self.config.top_k)

    def _sample_lags(self, key, avail, idx) -> Array:
        """This update's lags [B] from the lag law (its parameter traced, ``_value``)."""
        B, K, law = self.config.num_envs, self.num_versions, self.law
        if law.kind == "fixed":
            return lag_lib.cap_lags(jnp.full((B,), self._value("lag"), jnp.int32), avail)
        if law.kind == "trace":
            return law.sample(key, B, K, available=avail, step=idx)
        return lag_lib.cap_lags(lag_lib.sample_from_logits(key, self._value("lag_logits"), B),
                                avail)

    def _rollout(self, actor_params, versions, env_carry, key, idx, k_lag=None):
        """One rollout; ``lag.acting_actor`` picks how the actor runs (``lag.choose_path``)."""
        cfg = self.config
        if versions is not None:
            avail = jnp.minimum(lag_lib.available(versions), self.num_versions)
            lags = (jnp.zeros((cfg.num_envs,), jnp.int32) if k_lag is None else
                    self._sample_lags(k_lag, avail, idx))
            common = self.law.kind == "fixed" and cfg.switch_every <= 0  # one lag for all envs
            actor_for_rollout = lag_lib.acting_actor(
                self.constrain("rollout_actor", versions), lags, num_lags=self.num_versions,
                common_lag=(0 if k_lag is None else self._value("lag")) if common else None,
                switch_every=cfg.switch_every)
        else:
            lags, actor_for_rollout = None, self.constrain("rollout_actor", actor_params)
        return rollout_lib.rollout(
            self.env, self.env_params, self.actor_logits, actor_for_rollout, env_carry, key,
            num_steps=cfg.num_steps, lags=lags, switch_every=cfg.switch_every,
            switch_stride=cfg.switch_stride, temperature=cfg.temperature, top_k=cfg.top_k,
            record_states=cfg.gt_every > 0, sampler=self.sampler,
            env_discounts=self.env_kind == "token",
            record_behaviour_log_probs=cfg.pi_old_route == "exact" or self.route_diag,
        )

    def critic_values(self, params, obs):
        return self.critic_net.apply(params, obs)

    # -- one update --------------------------------------------------------------------
    def update(self, state: TrainState, idx: Array) -> tuple[TrainState, dict]:
        """One rollout + learning phase for one seed. ``idx`` is the (unbatched) update index."""
        cfg = self.config
        key, k_lag, k_roll, k_perm, k_gt = jax.random.split(state.key, 5)

        # 1. rollout with stale versions (+ replayed rollouts: the learner's batch ltraj)
        env_carry, traj = self._rollout(state.actor_params, state.versions, state.env, k_roll,
                                        idx, k_lag)
        traj = self.constrain("traj", traj)
        fresh_version = state.update - traj.lag
        valid = None
        ltraj = traj
        if state.replay is not None:
            log_pi_fn = lambda o: jax.nn.log_softmax(  # noqa: E731
                self.actor_logits(state.actor_params, o), axis=-1)
            ltraj, valid = replay_lib.combine(state.replay, traj, fresh_version, state.update,
                                              log_pi_fn)

        # 2-3. Vbar, ratios, critic targets, actor advantages; the actor's pi_old
        vbar_params = state.target_critic_params if cfg.polyak is not None else state.critic_params
        prep = self.prepare(ltraj, vbar_params, state.baseline_params)
        log_pi_old, log_pi_old_all = self._pi_old(state, ltraj, prep)

        # 4. ground truth (every gt_every updates; a real cond: idx is not batched)
        if self.gt_exact:
            gt_metrics = self._exact_truth(state, traj, ltraj, valid, prep, idx)
        else:
            gt_metrics = self._ground_truth(state, traj, k_gt, idx)

        # 5. epochs x minibatches over the [T, B] batch (env-local shuffles)
        batch = self._learner_batch(ltraj, prep, valid, log_pi_old, log_pi_old_all)
        learn = (state.actor_params, state.critic_params, state.actor_opt_state,
                 state.critic_opt_state, state.baseline_params, state.baseline_opt_state)
        if cfg.critic_first:
            learn, loss_stats = self._learn_critic_first(learn, batch, ltraj, k_perm)
        else:
            learn, loss_stats = self._learn(learn, batch, k_perm)
        actor_params, critic_params, actor_opt, critic_opt, base_params, base_opt = learn

        # 6. Polyak target, version ring, replay, EWMA
        target_critic = state.target_critic_params
        if cfg.polyak is not None:
            tau = cfg.polyak
            target_critic = jax.tree_util.tree_map(
                lambda t, p: (1.0 - tau) * t + tau * p, target_critic, critic_params)
        versions = state.versions
        if versions is not None:
            versions = lag_lib.push(versions, actor_params)
        replay = state.replay
        if replay is not None:
            replay = replay_lib.push(replay, traj, fresh_version)
        ewma = state.ewma
        if ewma is not None:  # once per update = once per version (tabular/decoupled)
            ewma = dec.ewma_update(ewma, actor_params, self.ewma_decay)

        # 7. metrics
        finished = jnp.sum(traj.episode_done)
        ret = jnp.sum(traj.episode_return) / jnp.maximum(finished, 1)
        last_return = jnp.where(finished > 0, ret, state.last_return)
        metrics = {
            "return": last_return,
            "episodes": finished.astype(jnp.int32),
            **self._data_metrics(ltraj, valid, prep),
            **loss_stats,
            **gt_metrics,
        }
        if cfg.pi_old_route:
            metrics.update(self._route_metrics(state, ltraj, prep, self._fixed_rows(batch), idx))
            pi_all = jnp.exp(ltraj.log_pi_all)
            metrics["pi_old_kl"] = wmean(
                jnp.sum(pi_all * (ltraj.log_pi_all - jnp.maximum(
                    log_pi_old_all, ltraj.log_pi_all - importance.MAX_LOG_RHO)), axis=-1), valid)
        new_state = TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=target_critic,
            actor_opt_state=actor_opt,
            critic_opt_state=critic_opt,
            versions=versions,
            env=env_carry,
            key=key,
            last_return=last_return,
            update=state.update + 1,
            baseline_params=base_params,
            baseline_opt_state=base_opt,
            replay=replay,
            ewma=ewma,
        )
        return new_state, metrics

    def _learner_batch(self, ltraj, prep: Prepared, valid, log_pi_old, log_pi_old_all) -> Batch:
        """The update's learner :class:`Batch` [T, B, ...]: sample weights (replay validity,
        tool steps), pi_old (:meth:`_pi_old`) and a per-update actor row's weights."""
        actor_w = critic_w = None
        if self.masked:
            critic_w = jnp.ones(ltraj.action.shape, jnp.float32) if valid is None else valid
            actor_w = critic_w
            if ltraj.is_action is not None:
                actor_w = critic_w * ltraj.is_action.astype(jnp.float32)
        return Batch(
            obs=ltraj.obs, action=ltraj.action, log_mu=prep.log_mu, log_pi_old=log_pi_old,
            log_mu_all=prep.inputs.log_mu_all, log_pi_old_all=log_pi_old_all,
            advantages=prep.advantages, targets=prep.targets, critic_w=critic_w,
            actor_w=actor_w,
            log_rho=prep.inputs.transitions.log_rhos if self.baseline_net else None,
            bstar_h=prep.bstar_h if self.baseline_net else None,
            actor_weight=self._update_actor_weights(ltraj, prep, log_pi_old, actor_w),
        )

    def _fixed_rows(self, batch: Batch) -> Batch:
        """The [T B] time-major rows the route diagnostics split into ``num_minibatches``
        fixed contiguous minibatches, advantages as the actor loss takes them on each
        (:func:`~vccc_jax.train.learner.effective_advantages`)."""
        rows = flat_rows(batch)
        m = self.config.num_minibatches
        per_mb = lambda x: None if x is None else x.reshape((m, -1))  # noqa: E731
        adv = effective_advantages(per_mb(rows.advantages), per_mb(rows.actor_w),
                                   self.config.normalize_advantages)
        return rows._replace(advantages=adv.reshape(-1))

    def _pi_old(self, state: TrainState, ltraj, prep) -> tuple[Array, Array]:
        """The actor's proximal policy (log pi_old(a_t|s_t), log pi_old(.|s_t)), [T, B(, A)].

        Default (``pi_old_route=""``): pi_k, the learner at the start of the update. The
        decoupled routes of issue 13 (``estimators.related.decoupled.route_log_pi_old``):
        "exact" (training-side log-probs of each token's behaviour version, recorded by the
        rollout), "ewma" (PPO-EWMA: the actor at the debiased EMA of its parameters),
        "behaviour" (the sampler's mu), "interpolated" (AReaL's A-3PO: log-probs interpolated
        between mu and pi_k by each token's lag, no forward pass). The actor loss is then
        w(pi_old / mu) x PPO-clip(pi_theta / pi_old) (``actor.policy_loss`` with
        ``log_pi_old``)."""
        route = self.config.pi_old_route
        if not route:
            return prep.log_pi_old, prep.inputs.log_pi_all
        ewma_logits = (self.actor_logits(dec.ewma_params(state.ewma, self.ewma_decay), ltraj.obs)
                       if route == "ewma" else None)
        return dec.route_log_pi_old(
            route, ltraj.action, log_pi_all=ltraj.log_pi_all, log_mu_all=prep.inputs.log_mu_all,
            behaviour_log_pi_all=ltraj.log_b_all, ewma_logits=ewma_logits, lags=ltraj.lag)

    def _data_metrics(self, ltraj, valid, prep) -> dict:
        """Lag, importance-ratio diagnostics (ESS, clip rate overall and by lag, log-ratio
        quantiles, guards), KL(pi_k || mu), value / target statistics of the batch, and
        with a truncating sampler (``sampler`` or ``top_k``) ``support_violation``: the
        pi_k mass on actions the sampler cannot emit (Sec 5.2), mean over policy steps.

        The diagnostics describe the data (true behaviour log-probs) even when
        ``correct=False``; replay: all columns, not-yet-filled slots count as log rho = 0."""
        cfg = self.config
        K = self.num_versions
        log_rho_data = prep.log_pi_old - ltraj.log_mu
        if valid is not None:
            log_rho_data = jnp.where(valid > 0, log_rho_data, 0.0)
        diag = importance.ratio_diagnostics(  # env-major [B, T]: flattens on a mesh
            log_rho_data.T, kind=cfg.clip_kind, clip=cfg.clip,
            versions=jnp.clip(ltraj.lag, 0, K + cfg.replay_updates - 1).T,
            num_versions=K + cfg.replay_updates)
        pi_all = jnp.exp(ltraj.log_pi_all)
        # KL(pi_k || mu); actions mu cannot emit (top-k) count with log-ratio MAX_LOG_RHO
        log_mu_floor = jnp.maximum(ltraj.log_mu_all, ltraj.log_pi_all - importance.MAX_LOG_RHO)
        kl = wmean(jnp.sum(pi_all * (ltraj.log_pi_all - log_mu_floor), axis=-1), valid)
        targets = prep.targets
        out = {}
        if self.sampler is not None or cfg.top_k > 0:
            # pi_k mass off the sampler's support (top-k / top-p: log mu = -inf), averaged
            # over the batch's policy steps (tool steps have mu := pi_k, so none there)
            off = jnp.sum(jnp.where(jnp.isneginf(ltraj.log_mu_all), pi_all, 0.0), axis=-1)
            w = jnp.ones(off.shape, jnp.float32) if valid is None else valid
            if ltraj.is_action is not None:
                w = w * ltraj.is_action.astype(jnp.float32)
            out["support_violation"] = wmean(off, w)
        return out | {
            "lag_mean": wmean(ltraj.lag.astype(jnp.float32), valid),
            "ess": diag.ess_fraction,
            "clip_frac": diag.clip_fraction,
            "clip_frac_by_lag": diag.clip_fraction_by_version,
            "count_by_lag": diag.count_by_version,
            "log_rho_q": diag.log_rho_quantiles,
            "guard_frac": diag.guard_fraction,
            "nonfinite": diag.num_nonfinite.astype(jnp.int32),
            "kl_pi_mu": kl,
            "value_mean": jnp.mean(prep.inputs.transitions.values),
            "target_mean": jnp.mean(targets),
            "target_std": jnp.std(targets),
        }

    # -- many updates ------------------------------------------------------------------
    def _train_impl(self, states: TrainState, start: Array, num_updates: int,
                    values: Optional[dict] = None):
        """``num_updates`` updates from index ``start``; ``values``: the traced
        :func:`program_values` (None: this config's, as constants)."""
        with self.traced(values):
            return self._train_scan(states, start, num_updates)

    def _train_scan(self, states: TrainState, start: Array, num_updates: int):
        num_seeds = jax.tree_util.tree_leaves(states.key)[0].shape[0]
        steps = jnp.arange(num_updates, dtype=jnp.int32)
        if num_seeds == 1:
            # One seed: run unbatched (a size-1 vmap makes XLA:CPU emit batched dots and
            # gathers that are ~2x slower) and put the seed axis back on the way out.
            squeeze = jax.tree_util.tree_map(lambda x: x[0], states)
            final, metrics = jax.lax.scan(lambda s, i: self.update(s, start + i), squeeze, steps)
            expand = lambda t, axis: jax.tree_util.tree_map(  # noqa: E731
                lambda x: jnp.expand_dims(x, axis), t)
            return expand(final, 0), expand(metrics, 1)

        def body(s, i):
            return jax.vmap(self.update, in_axes=(0, None))(s, start + i)

        return jax.lax.scan(body, states, steps)

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
        return self._train(states, jnp.asarray(start, jnp.int32), int(num_updates),
                           self.values())

    def lower(self, states: TrainState, num_updates: int):
        """The lowered training function (for compile-time measurements)."""
        return self._train.lower(states, jnp.asarray(0, jnp.int32), int(num_updates),
                                 self.values())


def train(config: TrainConfig):
    """Convenience: init and run the whole configured training; returns (states, metrics)."""
    trainer = Trainer(config)
    return trainer.train(trainer.init())
