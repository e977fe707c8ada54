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
3. critic targets from the registry :data:`CRITIC_TARGETS` (ONE signature for all:
   uncorrected GAE, uncorrected TD, VCCC (Eq 4/8), clipped (Eq 10), Z-centred (§4.2), the
   naive clipped negative control, V-trace(lambda, rhobar, cbar, n) (Eq 11); comparators
   register more with :func:`register_critic_target`).
4. actor advantages: GAE(gamma, lambda) on Vbar (default) or the target's own advantages.
5. epochs x minibatches of: actor loss = ``estimators.actor.policy_loss`` with weight
   kind ratio / truncate / mask, PPO clip against pi_k, optional score centering (Eq 13);
   critic loss = 0.5 (V(s) - sg[y])^2 (Eq 7); entropy bonus. Separate Adam optimisers.
6. Polyak update of the target critic (optional); push the new actor into the ring buffer.

Metrics per update: episode return (behaviour episodes finished in the rollout), mean lag,
losses, importance diagnostics (ESS, clip rate overall and by lag, log-ratio quantiles,
guard / non-finite counts), KL(pi_k || mu), and every ``gt_every`` updates the critic error
against Monte-Carlo V^{pi_k} (``envs.ground_truth``) and the current policy's return.

Lag 0 is exactly on-policy: the behaviour and target logits come from the same batched
forward pass, so log-ratios are exactly 0, every weight is exactly 1 and every corrected
target reduces to its uncorrected form (tests/train check this bit for bit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import chex
import gymnax
import jax
import jax.numpy as jnp
import optax
from flax import struct

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators import importance
from vccc_jax.train.networks import Actor, Critic

Array = chex.Array

ENVS = ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar", "DeepSea-bsuite", "UmbrellaChain-bsuite")
ACTOR_KINDS = ("ratio", "truncate", "mask")
ADVANTAGES = ("gae", "target")
BASELINES = ("value", "zero")


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (frozen; saved next to every result).

    Defaults reproduce the PureJaxRL CartPole PPO configuration (4 envs x 128 steps,
    4 epochs x 4 minibatches, 64-unit tanh MLPs, lr 2.5e-4 annealed, GAE(0.99, 0.95)).
    """

    env: str = "CartPole-v1"
    num_envs: int = 4
    num_steps: int = 128
    total_timesteps: int = 500_000
    update_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    actor_lr: float = 2.5e-4
    critic_lr: float = 2.5e-4
    anneal_lr: bool = True
    max_grad_norm: float = 0.5
    ppo_epsilon: Optional[float] = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    hidden: int = 64
    num_layers: int = 2
    activation: str = "tanh"
    normalize_advantages: bool = True
    # simulated lag
    lag: str = "fixed:0"
    num_versions: Optional[int] = None  # ring size K; None: from the lag law (1 = synchronous)
    switch_every: int = 0  # mid-rollout weight switches every m steps (0: off)
    switch_stride: int = 1  # versions gained per switch
    temperature: float = 1.0  # behaviour sampling temperature (logged in log mu)
    top_k: int = 0  # behaviour top-k sampling (0: off)
    # critic
    critic: str = "gae"  # a key of CRITIC_TARGETS
    critic_lambda: Optional[float] = None  # lambda of gae / vtrace targets (None: gae_lambda)
    clip: float = 2.0  # weight clip c of clipped / zcentered / naive-clipped targets
    clip_kind: str = "truncate"  # truncate | mask
    baseline: str = "value"  # b(s) of vccc / zcentered / naive-clipped: value (Vbar) | zero
    rho_bar: float = 1.0  # V-trace rhobar
    c_bar: float = 1.0  # V-trace cbar
    vtrace_n: Optional[int] = None  # V-trace n-step window (None: whole rollout)
    correct: bool = True  # False: ignore log mu, treat data as on-policy (rho := 1)
    polyak: Optional[float] = None  # target-critic Polyak rate tau (None: Vbar = critic)
    # actor
    actor: str = "truncate"  # [centered-]ratio | truncate | mask
    actor_clip: float = 2.0
    advantage: str = "gae"  # gae | target
    # ground truth / evaluation
    gt_every: int = 0  # every N updates (0: off)
    gt_states: int = 8
    gt_rollouts: int = 8
    gt_horizon: Optional[int] = None  # None: gamma^H <= 0.01
    eval_envs: int = 8  # current-policy episodes at each ground-truth update (0: off)
    # seeds
    seed: int = 0
    num_seeds: int = 1

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}")
        need(self.num_steps >= 1, f"num_steps must be >= 1, got {self.num_steps}")
        need(self.update_epochs >= 1, f"update_epochs must be >= 1, got {self.update_epochs}")
        need(
            self.num_minibatches >= 1
            and (self.num_envs * self.num_steps) % self.num_minibatches == 0,
            f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
            f"{self.num_envs * self.num_steps}",
        )
        need(self.total_timesteps >= self.num_envs * self.num_steps,
             f"total_timesteps={self.total_timesteps} is less than one update "
             f"({self.num_envs * self.num_steps} steps)")
        need(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}")
        need(0 <= self.gae_lambda <= 1, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        need(self.critic_lambda is None or 0 <= self.critic_lambda <= 1,
             f"critic_lambda must be in [0, 1], got {self.critic_lambda}")
        need(self.clip_kind in ("truncate", "mask"),
             f"clip_kind must be truncate or mask, got {self.clip_kind!r}")
        need(self.baseline in BASELINES,
             f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        need(self.advantage in ADVANTAGES,
             f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")
        need(self.polyak is None or 0 < self.polyak <= 1,
             f"polyak must be in (0, 1] or None, got {self.polyak}")
        need(self.ppo_epsilon is None or 0 < self.ppo_epsilon < 1,
             f"ppo_epsilon must be in (0, 1) or None, got {self.ppo_epsilon}")
        need(self.num_seeds >= 1, f"num_seeds must be >= 1, got {self.num_seeds}")
        need(self.gt_every >= 0, f"gt_every must be >= 0, got {self.gt_every}")
        need(self.gt_rollouts >= 2, f"gt_rollouts must be >= 2, got {self.gt_rollouts}")
        need(self.gt_states >= 1, f"gt_states must be >= 1, got {self.gt_states}")
        need(self.eval_envs >= 0, f"eval_envs must be >= 0, got {self.eval_envs}")
        need(self.switch_every >= 0, f"switch_every must be >= 0, got {self.switch_every}")
        need(self.switch_stride >= 1, f"switch_stride must be >= 1, got {self.switch_stride}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        need(self.rho_bar > 0 and self.c_bar > 0, "rho_bar and c_bar must be > 0")
        need(self.vtrace_n is None or self.vtrace_n >= 1,
             f"vtrace_n must be >= 1 or None, got {self.vtrace_n}")
        actor_kind, _ = parse_actor(self.actor)
        if actor_kind != "ratio":
            try:
                importance.check_weight_kind(actor_kind, self.actor_clip)
            except ValueError as err:
                raise ValueError(f"actor_clip: {err}") from None
        try:
            importance.check_weight_kind(self.clip_kind, self.clip)
        except ValueError as err:
            raise ValueError(f"clip: {err}") from None
        law = lag_lib.LagLaw.parse(self.lag)
        law.check(self.resolved_num_versions)

    @property
    def resolved_num_versions(self) -> int:
        if self.num_versions is not None:
            return int(self.num_versions)
        return lag_lib.LagLaw.parse(self.lag).default_num_versions()

    @property
    def lag_law(self) -> lag_lib.LagLaw:
        return lag_lib.LagLaw.parse(self.lag)

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // (self.num_envs * self.num_steps)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def target_lambda(self) -> float:
        return self.gae_lambda if self.critic_lambda is None else self.critic_lambda

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {unknown}")
        return cls(**d)


def parse_actor(spec: str) -> tuple[str, bool]:
    """``"centered-mask"`` -> ("mask", True); ``"truncate"`` -> ("truncate", False)."""
    text = spec.strip().lower()
    centered = text.startswith("centered-")
    kind = text[len("centered-"):] if centered else text
    kind = {"is": "ratio", "tis": "truncate", "mis": "mask"}.get(kind, kind)
    if kind not in ACTOR_KINDS:
        raise ValueError(
            f"actor must be [centered-]{{{'|'.join(ACTOR_KINDS)}}}, got {spec!r}"
        )
    return kind, centered


# --------------------------------------------------------------------------------------
# Critic-target registry: one signature for every target
# --------------------------------------------------------------------------------------


class TargetInputs(NamedTuple):
    """What a critic target may use; all [T, B] unless noted (time-major).

    values / next_values: Vbar(s_t) / Vbar(s_{t+1}) (the final observation's value at a
    time-limit cut). discounts: gamma (1 - terminated). truncated: time-limit cut after t.
    log_rhos: log pi_k(a_t|s_t) - log mu(a_t|s_t) (0 when ``config.correct`` is False).
    log_mu_all / log_pi_all: [T, B, A] full behaviour / target log-probs. baseline: b(s_t).
    """

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    truncated: Array
    log_rhos: Array
    log_mu_all: Array
    log_pi_all: Array
    baseline: Array


class TargetOutput(NamedTuple):
    targets: Array  # [T, B] regression targets (stop-gradient)
    advantages: Array  # [T, B] the target's own actor advantages


TargetFn = Callable[[TargetInputs, TrainConfig], TargetOutput]
CRITIC_TARGETS: dict[str, TargetFn] = {}


def register_critic_target(name: str, fn: TargetFn, *, overwrite: bool = False) -> None:
    """Add a critic target ``fn(inputs: TargetInputs, config: TrainConfig) -> TargetOutput``."""
    if name in CRITIC_TARGETS and not overwrite:
        raise ValueError(f"critic target {name!r} is already registered")
    CRITIC_TARGETS[name] = fn


def get_critic_target(name: str) -> TargetFn:
    if name not in CRITIC_TARGETS:
        raise ValueError(f"critic must be one of {sorted(CRITIC_TARGETS)}, got {name!r}")
    return CRITIC_TARGETS[name]


def _vtrace(x: TargetInputs, log_rhos: Array, lambda_: float, rho_bar: float, c_bar: float,
            n_steps: Optional[int]):
    from vccc_jax.estimators.vtrace import vtrace  # written in parallel; imported lazily

    return vtrace(
        log_rhos,
        x.discounts,
        x.rewards,
        x.values,
        x.next_values[-1],
        lambda_=lambda_,
        clip_rho_threshold=rho_bar,
        clip_c_threshold=c_bar,
        clip_pg_rho_threshold=rho_bar,
        truncations=x.truncated,
        truncation_values=x.next_values,
        n_steps=n_steps,
    )


def gae_advantages(x: TargetInputs, lambda_: float) -> Array:
    """Uncorrected GAE(gamma, lambda) advantages on Vbar (V-trace with rho := 1, minus Vbar)."""
    out = _vtrace(x, jnp.zeros_like(x.log_rhos), lambda_, 1.0, 1.0, None)
    return out.vs - x.values


def _gae_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """Uncorrected GAE(gamma, lambda) value target: V-trace with rho := 1 (Eq 11, on-policy)."""
    out = _vtrace(x, jnp.zeros_like(x.log_rhos), cfg.target_lambda, 1.0, 1.0, cfg.vtrace_n)
    return TargetOutput(out.vs, out.vs - x.values)


def _vtrace_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """V-trace(lambda, rhobar, cbar, n), Eq 11; advantages are V-trace's policy-gradient ones."""
    out = _vtrace(x, x.log_rhos, cfg.target_lambda, cfg.rho_bar, cfg.c_bar, cfg.vtrace_n)
    return TargetOutput(out.vs, out.pg_advantages)


def _td_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """Uncorrected one-step target H = r + gamma Vbar(s') (conditional mean T_mu Vbar)."""
    y = ct.uncorrected_target(x.rewards, x.discounts, x.next_values)
    return TargetOutput(y, y - x.values)


def _vccc_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """VCCC, Eq 4 (b = baseline) / Eq 8 (b = Vbar): conditional mean T_{pi_k} Vbar."""
    b = None if cfg.baseline == "value" else x.baseline
    y = ct.vccc_target(x.rewards, x.discounts, x.values, x.next_values, x.log_rhos, b)
    return TargetOutput(y, y - x.values)


def _clipped_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """Clipped IW-TD, Eq 10: Vbar + w delta with w = min(rho, c) or a double-sided mask."""
    y = ct.clipped_target(x.rewards, x.discounts, x.values, x.next_values, x.log_rhos,
                          clip=cfg.clip, kind=cfg.clip_kind)
    return TargetOutput(y, y - x.values)


def _zcentered_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """Z-centred clipped target with a general baseline (§4.2); Z(s) from the logged mu."""
    z = importance.expected_weight(x.log_pi_all, x.log_mu_all, kind=cfg.clip_kind, clip=cfg.clip)
    y = ct.centered_clipped_target(x.rewards, x.discounts, x.values, x.next_values, x.log_rhos,
                                   x.baseline, z, clip=cfg.clip, kind=cfg.clip_kind)
    return TargetOutput(y, y - x.values)


def _naive_clipped_target(x: TargetInputs, cfg: TrainConfig) -> TargetOutput:
    """Negative control (§4.2): H + (w - 1)(H - b), leaks (1 - Z) b into the fixed point."""
    y = ct.naive_clipped_target(x.rewards, x.discounts, x.values, x.next_values, x.log_rhos,
                                x.baseline, clip=cfg.clip, kind=cfg.clip_kind)
    return TargetOutput(y, y - x.values)


for _name, _fn in (
    ("gae", _gae_target),
    ("vtrace", _vtrace_target),
    ("td", _td_target),
    ("vccc", _vccc_target),
    ("clipped", _clipped_target),
    ("zcentered", _zcentered_target),
    ("naive-clipped", _naive_clipped_target),
):
    register_critic_target(_name, _fn)


# --------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------


def make_env(name: str):
    """gymnax env + params; ``DeepSea-bsuite:N`` / ``UmbrellaChain-bsuite:N`` set the size."""
    base, _, arg = name.partition(":")
    kwargs = {}
    if arg:
        if base == "DeepSea-bsuite":
            kwargs["size"] = int(arg)
        elif base == "UmbrellaChain-bsuite":
            kwargs["n_distractor"] = int(arg)
        else:
            raise ValueError(f"env {name!r}: only DeepSea-bsuite:SIZE and "
                             "UmbrellaChain-bsuite:DISTRACTORS take a parameter")
    try:
        env, params = gymnax.make(base, **kwargs)
    except ValueError as err:
        raise ValueError(f"env {name!r} is not a gymnax environment ({err})") from None
    return env, params


# --------------------------------------------------------------------------------------
# Train state
# --------------------------------------------------------------------------------------


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


class Prepared(NamedTuple):
    """What the learner needs from one trajectory (all [T, B])."""

    inputs: TargetInputs
    targets: Array
    advantages: Array
    log_pi_old: Array  # log pi_k(a_t|s_t)
    log_mu: Array  # behaviour log-probs used by the actor (= log_pi_old if not correct)


class _Batch(NamedTuple):
    obs: Array
    action: Array
    log_mu: Array
    log_pi_old: Array
    log_mu_all: Array
    log_pi_old_all: Array
    advantages: Array
    targets: Array


def _nan():
    return jnp.full((), jnp.nan, jnp.float32)


class Trainer:
    """Builds and runs the jitted training function for one :class:`TrainConfig`."""

    def __init__(self, config: TrainConfig):
        self.config = cfg = config
        self.env, self.env_params = make_env(cfg.env)
        obs_shape = tuple(self.env.observation_space(self.env_params).shape)
        self.obs_shape = obs_shape
        self.num_actions = int(self.env.action_space(self.env_params).n)
        hidden = (cfg.hidden,) * cfg.num_layers
        self.actor_net = Actor(self.num_actions, hidden, cfg.activation, len(obs_shape))
        self.critic_net = Critic(hidden, cfg.activation, len(obs_shape))
        self.law = cfg.lag_law
        self.num_versions = cfg.resolved_num_versions
        self.target_fn = get_critic_target(cfg.critic)
        self.actor_kind, self.centered = parse_actor(cfg.actor)
        if self.actor_kind != "ratio":
            importance.check_weight_kind(self.actor_kind, cfg.actor_clip)
        self.num_updates = cfg.num_updates
        self.gt_horizon = cfg.gt_horizon or gt_lib.horizon_for(cfg.gamma, 0.01)
        self.eval_horizon = int(min(getattr(self.env_params, "max_steps_in_episode", 1000), 5000))
        self.actor_tx = self._optimizer(cfg.actor_lr)
        self.critic_tx = self._optimizer(cfg.critic_lr)
        self._train = jax.jit(self._train_impl, static_argnums=(2,))
        # lax.map, not vmap: a vmapped flax orthogonal init is a *batched* LAPACK QR, which
        # jaxlib 0.10 splits over the 2-thread XLA:CPU pool from inside a pool thread and
        # can deadlock (observed on this 2-core machine); unbatched QRs run inline.
        self._init = jax.jit(lambda keys: jax.lax.map(self.init_one, keys))

    # -- construction ------------------------------------------------------------------
    def _optimizer(self, lr: float):
        cfg = self.config
        steps_per_update = cfg.update_epochs * cfg.num_minibatches

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
        actor_params = self.actor_net.init(k_actor, dummy)
        critic_params = self.critic_net.init(k_critic, dummy)
        versions = None
        if self.num_versions > 1:
            versions = lag_lib.init_buffer(actor_params, self.num_versions)
        return TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=critic_params if cfg.polyak is not None else None,
            actor_opt_state=self.actor_tx.init(actor_params),
            critic_opt_state=self.critic_tx.init(critic_params),
            versions=versions,
            env=rollout_lib.reset(self.env, self.env_params, k_env, cfg.num_envs),
            key=key,
            last_return=jnp.zeros((), jnp.float32),
            update=jnp.zeros((), jnp.int32),
        )

    def init(self, keys: Optional[Array] = None) -> TrainState:
        """Initial states for all seeds (leading seed axis)."""
        keys = self.seed_keys() if keys is None else keys
        return self._init(keys)

    # -- networks ----------------------------------------------------------------------
    def actor_logits(self, params, obs):
        return self.actor_net.apply(params, obs)

    def critic_values(self, params, obs):
        return self.critic_net.apply(params, obs)

    # -- one update --------------------------------------------------------------------
    def update(self, state: TrainState, idx: Array) -> tuple[TrainState, dict]:
        """One rollout + learning phase for one seed. ``idx`` is the (unbatched) update index."""
        cfg = self.config
        key, k_lag, k_roll, k_perm, k_gt = jax.random.split(state.key, 5)
        K, B, T = self.num_versions, cfg.num_envs, cfg.num_steps
        record_states = cfg.gt_every > 0

        # 1. rollout with stale versions
        if state.versions is not None:
            lags = self.law.sample(k_lag, B, K, available=lag_lib.available(state.versions),
                                   step=idx)
            actor_for_rollout = state.versions
        else:
            lags, actor_for_rollout = None, state.actor_params
        env_carry, traj = rollout_lib.rollout(
            self.env, self.env_params, self.actor_logits, actor_for_rollout, state.env, k_roll,
            num_steps=T, lags=lags, switch_every=cfg.switch_every,
            switch_stride=cfg.switch_stride, temperature=cfg.temperature, top_k=cfg.top_k,
            record_states=record_states,
        )

        # 2-3. Vbar, ratios, critic targets, actor advantages
        vbar_params = state.target_critic_params if cfg.polyak is not None else state.critic_params
        prep = self.prepare(traj, vbar_params)
        values, targets, advantages = prep.inputs.values, prep.targets, prep.advantages
        log_pi_old, log_mu, log_mu_all = prep.log_pi_old, prep.log_mu, prep.inputs.log_mu_all

        # 4. ground truth (every gt_every updates; a real cond: idx is not batched)
        gt_metrics = self._ground_truth(state, traj, k_gt, idx)

        # 5. epochs x minibatches
        def flat(x):
            return x.reshape((T * B,) + x.shape[2:])

        batch = _Batch(
            obs=flat(traj.obs), action=flat(traj.action), log_mu=flat(log_mu),
            log_pi_old=flat(log_pi_old), log_mu_all=flat(log_mu_all),
            log_pi_old_all=flat(prep.inputs.log_pi_all),
            advantages=flat(advantages), targets=flat(targets),
        )
        learn = (state.actor_params, state.critic_params, state.actor_opt_state,
                 state.critic_opt_state)
        learn, loss_stats = self._learn(learn, batch, k_perm)
        actor_params, critic_params, actor_opt, critic_opt = learn

        target_critic = state.target_critic_params
        if cfg.polyak is not None:
            tau = cfg.polyak
            target_critic = jax.tree_util.tree_map(
                lambda t, p: (1.0 - tau) * t + tau * p, target_critic, critic_params)
        versions = state.versions
        if versions is not None:
            versions = lag_lib.push(versions, actor_params)

        # 6. metrics
        finished = jnp.sum(traj.episode_done)
        ret = jnp.sum(traj.episode_return) / jnp.maximum(finished, 1)
        last_return = jnp.where(finished > 0, ret, state.last_return)
        # diagnostics describe the data (true behaviour log-probs) even when correct=False
        diag = importance.ratio_diagnostics(
            log_pi_old - traj.log_mu, kind=cfg.clip_kind, clip=cfg.clip, versions=traj.lag,
            num_versions=K)
        pi_all = jnp.exp(traj.log_pi_all)
        # KL(pi_k || mu); actions mu cannot emit (top-k) count with log-ratio MAX_LOG_RHO
        log_mu_floor = jnp.maximum(traj.log_mu_all, traj.log_pi_all - importance.MAX_LOG_RHO)
        kl = jnp.mean(jnp.sum(pi_all * (traj.log_pi_all - log_mu_floor), axis=-1))
        metrics = {
            "return": last_return,
            "episodes": finished.astype(jnp.int32),
            "lag_mean": jnp.mean(traj.lag.astype(jnp.float32)),
            "ess": diag.ess_fraction,
            "clip_frac": diag.clip_fraction,
            "clip_frac_by_lag": diag.clip_fraction_by_version,
            "count_by_lag": diag.count_by_version,
            "log_rho_q": diag.log_rho_quantiles,
            "guard_frac": diag.guard_fraction,
            "nonfinite": diag.num_nonfinite.astype(jnp.int32),
            "kl_pi_mu": kl,
            "value_mean": jnp.mean(values),
            "target_mean": jnp.mean(targets),
            "target_std": jnp.std(targets),
            **loss_stats,
            **gt_metrics,
        }
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
        )
        return new_state, metrics

    def prepare(self, traj: rollout_lib.Trajectory, vbar_params) -> "Prepared":
        """Vbar on s_t / s_{t+1}, log-ratios, critic targets and actor advantages.

        next_values[t] = Vbar(final_obs[t]): the observation the step produced before any
        auto-reset, so a time-limit cut bootstraps from the state it actually reached;
        discounts are 0 only where the step terminated.
        """
        cfg = self.config
        T = traj.reward.shape[0]
        both = self.critic_values(vbar_params, jnp.concatenate([traj.obs, traj.final_obs], 0))
        values, next_values = both[:T], both[T:]
        log_pi_old = jnp.take_along_axis(traj.log_pi_all, traj.action[..., None], -1)[..., 0]
        if cfg.correct:
            log_mu, log_mu_all = traj.log_mu, traj.log_mu_all
        else:  # pretend on-policy: the uncorrected learner
            log_mu, log_mu_all = log_pi_old, traj.log_pi_all
        inputs = TargetInputs(
            rewards=traj.reward,
            discounts=traj.discounts(cfg.gamma),
            values=values,
            next_values=next_values,
            truncated=traj.truncated,
            log_rhos=log_pi_old - log_mu,
            log_mu_all=log_mu_all,
            log_pi_all=traj.log_pi_all,
            baseline=values if cfg.baseline == "value" else jnp.zeros_like(values),
        )
        out = self.target_fn(inputs, cfg)
        if cfg.advantage == "target":
            advantages = out.advantages
        elif cfg.critic == "gae" and cfg.vtrace_n is None and cfg.critic_lambda is None:
            advantages = out.advantages
        else:
            advantages = gae_advantages(inputs, cfg.gae_lambda)
        return Prepared(inputs, jax.lax.stop_gradient(out.targets),
                        jax.lax.stop_gradient(advantages), log_pi_old, log_mu)

    def _learn(self, learn, batch: _Batch, key):
        cfg = self.config
        n, mb = cfg.batch_size, cfg.minibatch_size

        def loss_fn(params, mb_: _Batch):
            actor_params, critic_params = params
            logits = self.actor_logits(actor_params, mb_.obs)
            log_pi_all = jax.nn.log_softmax(logits, axis=-1)
            log_pi = jnp.take_along_axis(log_pi_all, mb_.action[:, None], -1)[:, 0]
            adv = mb_.advantages
            if cfg.normalize_advantages:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            centering = None
            if self.centered:
                centering = actor_lib.centering_term(
                    log_pi_all, mb_.log_mu_all, kind=self.actor_kind,
                    clip=None if self.actor_kind == "ratio" else cfg.actor_clip,
                    log_pi_old_all=mb_.log_pi_old_all)
            pg_loss = actor_lib.policy_loss(
                log_pi, mb_.log_mu, adv, kind=self.actor_kind,
                clip=None if self.actor_kind == "ratio" else cfg.actor_clip,
                ppo_epsilon=cfg.ppo_epsilon, log_pi_old=mb_.log_pi_old, centering=centering)
            entropy = -jnp.mean(jnp.sum(jnp.exp(log_pi_all) * log_pi_all, axis=-1))
            v = self.critic_values(critic_params, mb_.obs)
            v_loss = 0.5 * jnp.mean(jnp.square(v - mb_.targets))
            total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
            log_r = log_pi - mb_.log_pi_old
            approx_kl = jnp.mean(jnp.exp(log_r) - 1.0 - log_r)
            ppo_clip = (jnp.mean((jnp.abs(jnp.exp(log_r) - 1.0) > cfg.ppo_epsilon)
                                 .astype(jnp.float32)) if cfg.ppo_epsilon is not None
                        else jnp.zeros((), jnp.float32))
            return total, (pg_loss, v_loss, entropy, approx_kl, ppo_clip)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def minibatch_step(carry, mb_: _Batch):
            actor_params, critic_params, actor_opt, critic_opt = carry
            (_, aux), (g_actor, g_critic) = grad_fn((actor_params, critic_params), mb_)
            upd, actor_opt = self.actor_tx.update(g_actor, actor_opt, actor_params)
            actor_params = optax.apply_updates(actor_params, upd)
            upd, critic_opt = self.critic_tx.update(g_critic, critic_opt, critic_params)
            critic_params = optax.apply_updates(critic_params, upd)
            return (actor_params, critic_params, actor_opt, critic_opt), aux

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, n)
            def split(x):
                return jnp.take(x, perm, axis=0).reshape((cfg.num_minibatches, mb) + x.shape[1:])

            shuffled = jax.tree_util.tree_map(split, batch)
            return jax.lax.scan(minibatch_step, carry, shuffled)

        learn, aux = jax.lax.scan(epoch, learn, jax.random.split(key, cfg.update_epochs))
        pg_loss, v_loss, entropy, approx_kl, ppo_clip = (jnp.mean(a) for a in aux)
        stats = {"actor_loss": pg_loss, "critic_loss": v_loss, "entropy": entropy,
                 "approx_kl": approx_kl, "ppo_clip_frac": ppo_clip}
        return learn, stats

    def _ground_truth(self, state: TrainState, traj, key, idx) -> dict:
        """Critic error vs Monte-Carlo V^{pi_k} at saved states, and pi_k's episode return."""
        cfg = self.config
        names = ("gt_mse", "gt_mae", "gt_bias", "gt_stderr", "gt_value", "gt_critic_value",
                 "eval_return")
        if cfg.gt_every <= 0:
            return {k: _nan() for k in names}
        T, B = cfg.num_steps, cfg.num_envs
        n = T * B
        pos = (jnp.arange(cfg.gt_states) * n) // cfg.gt_states
        pick = lambda x: jnp.take(x.reshape((n,) + x.shape[2:]), pos, axis=0)  # noqa: E731
        states = jax.tree_util.tree_map(pick, traj.env_state)
        obs = pick(traj.obs)

        def compute(_):
            k_mc, k_reset, k_eval = jax.random.split(key, 3)
            mc = gt_lib.mc_values(
                self.env, self.env_params, self.actor_logits, state.actor_params, states, obs,
                k_mc, num_rollouts=cfg.gt_rollouts, horizon=self.gt_horizon, gamma=cfg.gamma)
            v = self.critic_values(state.critic_params, obs)
            err = v - mc.value
            out = {
                "gt_mse": jnp.mean(jnp.square(err)),
                "gt_mae": jnp.mean(jnp.abs(err)),
                "gt_bias": jnp.mean(err),
                "gt_stderr": jnp.mean(mc.stderr),
                "gt_value": jnp.mean(mc.value),
                "gt_critic_value": jnp.mean(v),
                "eval_return": _nan(),
            }
            if cfg.eval_envs > 0:
                carry = rollout_lib.reset(self.env, self.env_params, k_reset, cfg.eval_envs)
                ev = gt_lib.mc_values(
                    self.env, self.env_params, self.actor_logits, state.actor_params,
                    carry.env_state, carry.obs, k_eval, num_rollouts=2,
                    horizon=self.eval_horizon, gamma=1.0, ignore_time_limit=False)
                out["eval_return"] = jnp.mean(ev.value)
            return out

        def skip(_):
            return {k: _nan() for k in names}

        # at updates N-1, 2N-1, ...: the last evaluation falls at the end of training
        return jax.lax.cond((idx + 1) % cfg.gt_every == 0, compute, skip, None)

    # -- many updates ------------------------------------------------------------------
    def _train_impl(self, states: TrainState, start: Array, num_updates: int):
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
        return self._train(states, jnp.asarray(start, jnp.int32), int(num_updates))

    def lower(self, states: TrainState, num_updates: int):
        """The lowered training function (for compile-time measurements)."""
        return self._train.lower(states, jnp.asarray(0, jnp.int32), int(num_updates))


def train(config: TrainConfig):
    """Convenience: init and run the whole configured training; returns (states, metrics)."""
    trainer = Trainer(config)
    return trainer.train(trainer.init())
