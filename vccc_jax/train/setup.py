"""The static pieces of a training program, built once from a config (:func:`make_setup`).

:class:`Setup` holds what does not change during training and does not differ between the
grid cells of one program (``train.programs.program_key``): the env, the networks, shapes,
the critic target, the actor row and flags such as ``gt_exact``, ``ring_size``, ``masked``.
Its ``cfg`` IS the program key, so a grid value read from it is a placeholder: functions
that need one take ``values`` (``train.programs.GridValues``) as well. Every function of the
update (``train.trainer``, ``train.learner``, ``train.losses``, ``train.truth``,
``train.route_metrics``) takes the ``Setup`` as its first argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import chex
import numpy as np
import optax

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.envs import samplers
from vccc_jax.envs.make import env_kind, make_env
from vccc_jax.envs.policy_heads import CategoricalHead, GaussianHead
from vccc_jax.estimators import importance
from vccc_jax.estimators.actor_registry import ActorCorrection
from vccc_jax.train import actor_weights
from vccc_jax.train.config import TrainConfig, parse_actor
from vccc_jax.train.networks import Actor, Critic, GaussianActor
from vccc_jax.train.programs import GridValues, program_key
from vccc_jax.train.targets import TargetFn, get_critic_target

Array = chex.Array

__all__ = ["Setup", "make_setup"]


def _identity(name: str, tree: Any) -> Any:
    return tree


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
    """Static pieces of one training program (module docstring)."""

    cfg: TrainConfig  # the program key: grid values at placeholders
    env: Any
    env_params: Any
    env_kind: str  # gymnax | tabular | token
    obs_shape: tuple
    actor_obs_shape: tuple
    actor_features: Optional[int]  # token env: the actor reads the first n features only
    num_actions: int  # the head's row width P (A logits, or 2m: a Gaussian's mean, log_std)
    head: Any  # envs.policy_heads: CategoricalHead | GaussianHead (from the action space)
    actor_net: Any  # networks.Actor | networks.GaussianActor
    critic_net: Critic
    baseline_net: Optional[Critic]  # the learned b_psi head (baseline="learned")
    sampler: Any  # envs.samplers.SamplerSpec or None
    law: Any  # envs.lag.LagLaw (its parameter: a grid value)
    num_versions: int  # K
    ring_size: int  # K (+ R replayed versions with exact truth)
    gt_exact: bool
    masked: bool  # sample weights in the learner batch (replay slots, tool steps)
    route_diag: bool  # pi_old route diagnostics (train.route_metrics)
    target_fn: TargetFn
    actor_kind: str
    centered: bool
    actor_row: ActorCorrection
    row_params: dict  # the row's static parameters (its clip: values.actor_clip)
    num_updates: int
    gt_horizon: int
    eval_horizon: int
    critic_epochs: int
    # ``constrain(name, tree) -> tree`` (identity by default) is applied to the rollout
    # ("traj"), every minibatch ("minibatch") and the rollout's versions ("rollout_actor");
    # ``train.sharding`` passes ``with_sharding_constraint`` there
    constrain: Callable[[str, Any], Any] = _identity
    spmd_axis: Optional[str] = None  # the mesh axis of the vmapped seed axis (train.sharding)

    # -- networks ------------------------------------------------------------------------
    def actor_logits(self, params, obs):
        if self.actor_features is not None:
            obs = obs[..., :self.actor_features]
        return self.actor_net.apply(params, obs)

    def critic_values(self, params, obs):
        return self.critic_net.apply(params, obs)

    def act(self, params, obs, key):
        """An action of the policy at ``params`` (the env's form: clipped / squashed)."""
        return self.head.env_action(self.head.sample_out(key, self.actor_logits(params, obs)))

    def log_mu_fn(self, logits):
        """Deterministic behaviour log-probs of logits (exact truth)."""
        if self.sampler is not None:
            return samplers.sampler_log_probs(logits, self.sampler)
        return rollout_lib.sampling_log_probs(logits, self.cfg.temperature, self.cfg.top_k)


def make_setup(config: TrainConfig) -> Setup:
    """Validate ``config`` against its env and build its :class:`Setup` (whose ``cfg`` is
    ``program_key(config)``)."""
    cfg = config
    env, env_params = make_env(cfg.env)
    kind = env_kind(cfg.env)
    _check_env_gamma(cfg, env, env_params, kind)
    obs_shape = tuple(env.observation_space(env_params).shape)
    # token env: the actor reads only the exact features (prompt, position, automaton
    # state), so its V^pi is exact; the critic also sees the last-token distractors
    actor_features = env.num_exact_features if kind == "token" else None
    actor_shape = obs_shape if actor_features is None else (actor_features,)
    hidden = (cfg.hidden,) * cfg.num_layers
    head, actor_net = policy(cfg, env.action_space(env_params), kind, hidden, len(actor_shape))
    sampler = cfg.sampler_spec
    gt_exact = cfg.gt_every > 0 and (
        cfg.gt_kind == "exact" or (cfg.gt_kind == "auto" and kind in ("tabular", "token", "lqr")))
    if gt_exact and kind not in ("tabular", "token", "lqr"):
        raise ValueError(f"gt_kind='exact' needs a tabular:, token: or lqr: env, got {cfg.env!r}")
    if gt_exact and sampler is not None and sampler.needs_key:
        raise ValueError("exact ground truth needs a deterministic sampler (no mismatch=noise)")
    num_versions = cfg.resolved_num_versions
    key = program_key(cfg)
    actor_kind, centered = parse_actor(cfg.actor)
    if actor_kind in ("truncate", "mask"):
        importance.check_weight_kind(actor_kind, cfg.actor_clip)
    # the actor-correction row (issue 21) and its parameters (train.actor_weights)
    actor_row, row_params = actor_weights.resolve(actor_kind, cfg.actor_params, cfg.actor_clip)
    return Setup(
        cfg=key, env=env, env_params=env_params, env_kind=kind,
        obs_shape=obs_shape, actor_obs_shape=actor_shape, actor_features=actor_features,
        num_actions=2 * head.action_dim if head.continuous else actor_net.num_actions,
        head=head, actor_net=actor_net,
        critic_net=Critic(hidden, cfg.activation, len(obs_shape)),
        baseline_net=(Critic(hidden, cfg.activation, len(obs_shape))
                      if cfg.baseline == "learned" else None),
        sampler=sampler, law=key.lag_law, num_versions=num_versions,
        # ring of actor versions: K for the lag law; with replay + exact truth it also keeps
        # the R older versions whose data is replayed (lags are still drawn from 0..K-1)
        ring_size=num_versions + (cfg.replay_updates if gt_exact else 0),
        gt_exact=gt_exact,
        masked=cfg.replay_updates > 0 or kind == "token",
        # route diagnostics (train.route_metrics) need the exact route's pi_old for every route
        route_diag=bool(cfg.pi_old_route) and cfg.gt_every > 0,
        target_fn=get_critic_target(cfg.critic), actor_kind=actor_kind, centered=centered,
        actor_row=actor_row, row_params=row_params, num_updates=cfg.num_updates,
        gt_horizon=cfg.gt_horizon or gt_lib.horizon_for(cfg.gamma, 0.01),
        eval_horizon=int(min(getattr(env_params, "max_steps_in_episode", 1000), 5000)),
        critic_epochs=cfg.critic_steps if cfg.critic_first else cfg.update_epochs,
    )


#: the Gaussian actor's initial log-std (PureJaxRL's continuous PPO uses 0; -0.5 learns
#: Pendulum faster at this size, issue 31)
LOG_STD_INIT = -0.5


def policy(cfg: TrainConfig, space, kind: str, hidden: tuple, obs_ndim: int):
    """(head, actor network) from the env's action space: ``Discrete`` -> categorical head and
    logits actor; ``Box`` -> Gaussian head over the box (tanh-squashed with ``cfg.squash``,
    behaviour noise ``cfg.noise_scale``) and a Gaussian actor, linear in the observation on
    ``lqr:`` envs (the linear-Gaussian family whose V^pi is exact there)."""
    if hasattr(space, "n"):
        return (CategoricalHead(cfg.temperature, cfg.top_k),
                Actor(int(space.n), hidden, cfg.activation, obs_ndim))
    m = int(np.prod(space.shape))
    box = lambda b: tuple(float(x) for x in np.broadcast_to(np.asarray(b, np.float64), (m,)))  # noqa: E731
    head = GaussianHead(box(space.low), box(space.high), cfg.squash, cfg.noise_scale)
    return head, GaussianActor(m, () if kind == "lqr" else hidden, cfg.activation, obs_ndim,
                               log_std_init=LOG_STD_INIT)


def _check_env_gamma(cfg: TrainConfig, env, env_params, kind: str) -> None:
    if kind in ("gymnax", "brax"):
        return
    if kind == "lqr":
        from vccc_jax.envs.spec import env_gamma as spec_gamma

        env_gamma = float(spec_gamma(cfg.env))
    else:
        env_gamma = float(env_params.gamma if kind == "tabular" else env.task.gamma)
    if abs(env_gamma - cfg.gamma) > 1e-6:
        raise ValueError(f"gamma={cfg.gamma} differs from the env's gamma={env_gamma:g} "
                         f"({cfg.env!r}): set gamma={env_gamma:g} in the config")


# -- what the grid values set ------------------------------------------------------------


def weight_clip(setup: Setup, values: GridValues):
    """The weight clip c of critic targets and ratio diagnostics: the grid value ``clip``, or
    the static ``cfg.clip`` (brace)."""
    return setup.cfg.clip if values.clip is None else values.clip


def actor_row_params(setup: Setup, values: GridValues) -> dict:
    """The actor row's parameters; its ``clip`` is the grid value ``actor_clip``."""
    if "clip" not in setup.row_params:
        return setup.row_params
    return dict(setup.row_params, clip=values.actor_clip)


def optimizer(setup: Setup, lr, epochs: Optional[int] = None):
    """Clipped Adam at learning rate ``lr`` (linearly annealed over the run's minibatch steps
    when ``anneal_lr``; ``epochs`` per update: ``update_epochs`` by default)."""
    cfg = setup.cfg
    steps_per_update = (epochs or cfg.update_epochs) * cfg.num_minibatches

    def schedule(count):
        frac = 1.0 - (count // steps_per_update) / setup.num_updates
        return lr * frac

    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adam(learning_rate=schedule if cfg.anneal_lr else lr, eps=1e-5),
    )


def actor_tx(setup: Setup, values: GridValues):
    return optimizer(setup, values.actor_lr)


def critic_tx(setup: Setup, values: GridValues):
    return optimizer(setup, values.critic_lr, setup.critic_epochs)


def baseline_tx(setup: Setup, values: GridValues):
    return optimizer(setup, values.baseline_lr, setup.critic_epochs)


def log_softmax_actor(setup: Setup, params) -> Callable[[Array], Array]:
    """obs -> the head's rows of pi(.|obs) at ``params`` (log-probs of a categorical actor)."""
    return lambda obs: setup.head.normalize(setup.actor_logits(params, obs))
