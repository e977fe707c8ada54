"""Continuous-action trainer (issue 31): a Gaussian actor under a lag ring, with the same
critic targets and actor weights as the discrete trainer, in PureJaxRL's continuous-PPO shape.

Kept apart from ``train.trainer`` (whose rollout, learner and diagnostics carry full
categorical rows) so the discrete trainer is untouched; what is shared is what the issue asks
to work unchanged: the version ring (``envs.lag``), the logged log mu of the distribution
really sampled, every one-step critic target and V-trace / GAE (``train.targets``, the same
``TargetInputs``), and ``estimators.actor.policy_loss`` (ratio / truncate / mask weights,
PPO clip). The actor's distribution is one object, ``policy_heads.GaussianHead``; the trainer samples
and scores the pre-squash u (``GaussianHead.raw``).

One update = rollout -> prepare -> learn -> push version -> metrics, one jitted function:

* rollout: env b acts with the version ``lag_b`` updates old (a per-env gather from the ring;
  lag 0 is exactly on-policy), samples u ~ N(mean, (std * noise_scale)^2), steps the env with
  u clipped to the action box (PureJaxRL's ClipAction; with ``squash`` the head maps u into
  the box with tanh instead) and logs log mu(u) of the distribution sampled;
* prepare: Vbar on s_t / the final observation, log rho = log pi_k(u) - log mu(u) (pi_k the
  newest version at rollout time), targets and advantages by ``train.targets`` (time-limit
  cuts bootstrap from the final observation);
* learn: ``update_epochs`` x ``num_minibatches`` Adam steps of the actor loss and the critic
  regression 0.5 (V - Y)^2.

Config: a ``TrainConfig``; options that need full categorical rows (samplers, top-k,
temperature, centred actors, Z-centred targets, replay, Polyak, decoupled routes, learned
baselines) are refused with a one-line error. Exact critic error on ``lqr:`` envs: there the
actor's mean is linear (``linear_actor``), so pi_k is linear-Gaussian, V^{pi_k} is the closed
form of ``tabular.lqr`` and :func:`lqr_critic_error` measures the critic against it. On the
other envs (``gt_every > 0``) :meth:`ContinuousTrainer.mc_critic_error` measures it against a
Monte-Carlo V^{pi_k} (``envs.ground_truth.mc_values_policy``) at the envs' current states.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.make import make_env
from vccc_jax.envs.rollout import env_step_info
from vccc_jax.envs.spec import env_kind
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators.types import Transitions
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.networks import Critic, GaussianActor
from vccc_jax.train.policy_heads import GaussianHead
from vccc_jax.train.targets import TargetInputs, gae_advantages, get_critic_target

UNSUPPORTED = dict(sampler="", top_k=0, temperature=1.0, replay_updates=0, polyak=None,
                   pi_old_route="", centering_topk=0, switch_every=0)
CONTINUOUS_GYMNAX = ("Pendulum-v1", "MountainCarContinuous-v0")


def is_continuous(env, params) -> bool:
    """Whether the env's action space is a Box (continuous)."""
    return not hasattr(env.action_space(params), "n")


def wants_continuous(env_name: str) -> bool:
    """Pure-Python: does ``vccc train --env NAME`` run this trainer (``lqr:`` and ``brax:``
    specs and the continuous gymnax envs)?"""
    return env_kind(env_name) in ("lqr", "brax") or env_name in CONTINUOUS_GYMNAX


def check_config(cfg: TrainConfig) -> None:
    """One-line ValueError for an option the continuous trainer does not support."""
    for name, default in UNSUPPORTED.items():
        if getattr(cfg, name) != default:
            raise ValueError(f"{name} is not supported with continuous actions")
    if cfg.actor.startswith("centered") or cfg.actor not in ("ratio", "truncate", "mask"):
        raise ValueError(f"actor must be ratio | truncate | mask with continuous actions, got {cfg.actor!r}")
    if cfg.critic in ("centered_baseline", "vccc_bstar") or cfg.baseline == "learned":
        raise ValueError(f"critic {cfg.critic!r} / baseline {cfg.baseline!r} need full "
                         "categorical rows (not supported with continuous actions)")


class State(NamedTuple):
    actor_params: Any
    critic_params: Any
    actor_opt: Any
    critic_opt: Any
    ring: lag_lib.VersionBuffer
    env_state: Any
    obs: jax.Array
    ep_return: jax.Array
    key: jax.Array


class ContinuousTrainer:
    """Builds the jitted update for one TrainConfig on a continuous-action env."""

    def __init__(self, cfg: TrainConfig, head: GaussianHead = None, log_std_init: float = -0.5,
                 linear_actor: bool = None):
        """``head``: the actor's distribution (default: unsquashed Gaussian, actions clipped
        to the box). ``linear_actor``: mean linear in the observation (default: on ``lqr:``
        envs, where it makes V^{pi_k} exact); the critic is always the MLP of the config."""
        check_config(cfg)
        self.cfg = cfg
        self.env, self.env_params = make_env(cfg.env)
        if not is_continuous(self.env, self.env_params):
            raise ValueError(f"env {cfg.env!r} has discrete actions (use train.trainer)")
        space = self.env.action_space(self.env_params)
        self.low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        self.high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        self.head = head or GaussianHead()
        hidden = (cfg.hidden,) * cfg.num_layers
        self.linear_actor = env_kind(cfg.env) == "lqr" if linear_actor is None else linear_actor
        self.actor_net = GaussianActor(int(np.prod(space.shape)), () if self.linear_actor else hidden,
                                       cfg.activation, log_std_init=log_std_init)
        self.critic_net = Critic(hidden, cfg.activation)
        self.target_fn = get_critic_target(cfg.critic)
        self.law = cfg.lag_law
        self.num_versions = cfg.resolved_num_versions
        self.law.check(self.num_versions)
        clip = optax.clip_by_global_norm(cfg.max_grad_norm)
        self.actor_tx = optax.chain(clip, optax.adam(cfg.actor_lr, eps=1e-5))
        self.critic_tx = optax.chain(clip, optax.adam(cfg.critic_lr, eps=1e-5))
        self.update = jax.jit(self._update)
        self.mc_critic_error = jax.jit(self._mc_critic_error)

    # -- pieces -------------------------------------------------------------------------
    def init(self, key) -> State:
        k_a, k_c, k_env, k_run = jax.random.split(key, 4)
        obs0 = jnp.zeros(self.env.observation_space(self.env_params).shape, jnp.float32)
        actor_params = self.actor_net.init(k_a, obs0)
        critic_params = self.critic_net.init(k_c, obs0)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(
            jax.random.split(k_env, self.cfg.num_envs), self.env_params)
        # strong types, as the update returns them (a weak-typed reset leaf, e.g. Pendulum's
        # last_u, would otherwise compile the update twice)
        env_state = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=x.dtype), env_state)
        return State(actor_params, critic_params, self.actor_tx.init(actor_params),
                     self.critic_tx.init(critic_params), lag_lib.init_buffer(actor_params, self.num_versions),
                     env_state, obs, jnp.zeros(self.cfg.num_envs), k_run)

    def to_env(self, u):
        """The action the env receives: tanh-squashed by the head, else clipped to the box."""
        if self.head.squash:
            return self.head.squash_action(u)
        return jnp.clip(u, jnp.broadcast_to(self.low, u.shape), jnp.broadcast_to(self.high, u.shape))

    def rollout(self, state: State, lags, key):
        cfg = self.cfg
        behaviour = lag_lib.gather(state.ring, lags)                 # per-env params [B, ...]
        newest = lag_lib.get(state.ring, jnp.zeros((), jnp.int32))
        step_env = jax.vmap(env_step_info, in_axes=(None, 0, 0, 0, None))

        def one(carry, k):
            env_state, obs, ep_ret = carry
            k_act, k_env = jax.random.split(k)
            out_mu = jax.vmap(self.actor_net.apply)(behaviour, obs)
            beh = self.head.raw(out_mu, self.head.noise_scale)
            u = beh.sample(seed=k_act)
            log_mu = beh.log_prob(u)
            log_pi_old = self.head.raw(self.actor_net.apply(newest, obs), 1.0).log_prob(u)
            obs2, env_state, reward, term, trunc, final_obs, _ = step_env(
                self.env, jax.random.split(k_env, cfg.num_envs), env_state, self.to_env(u),
                self.env_params)
            done = term | trunc
            ep_ret = ep_ret + reward
            rec = dict(obs=obs, u=u, reward=reward, term=term, trunc=trunc, final_obs=final_obs,
                       log_mu=log_mu, log_pi_old=log_pi_old, ret=jnp.where(done, ep_ret, 0.0),
                       done=done)
            return (env_state, obs2, jnp.where(done, 0.0, ep_ret)), rec

        (env_state, obs, ep_ret), traj = jax.lax.scan(
            one, (state.env_state, state.obs, state.ep_return), jax.random.split(key, cfg.num_steps))
        return state._replace(env_state=env_state, obs=obs, ep_return=ep_ret), traj

    def prepare(self, critic_params, traj):
        cfg = self.cfg
        T = traj["reward"].shape[0]
        both = self.critic_net.apply(critic_params, jnp.concatenate([traj["obs"], traj["final_obs"]], 0))
        values, next_values = both[:T], both[T:]
        log_rhos = traj["log_pi_old"] - traj["log_mu"]
        if not cfg.correct:
            log_rhos = jnp.zeros_like(log_rhos)
        dummy = jnp.zeros(log_rhos.shape + (1,), log_rhos.dtype)   # no categorical rows
        inputs = TargetInputs(
            transitions=Transitions(rewards=traj["reward"],
                                    discounts=cfg.gamma * (1.0 - traj["term"].astype(jnp.float32)),
                                    values=values, next_values=next_values, log_rhos=log_rhos),
            truncated=traj["trunc"], log_mu_all=dummy, log_pi_all=dummy,
            baseline=values if cfg.baseline == "value" else jnp.zeros_like(values))
        out = self.target_fn(inputs, cfg, cfg.clip)
        adv = out.advantages if cfg.advantage == "target" else gae_advantages(inputs, cfg.gae_lambda)
        log_mu = traj["log_pi_old"] if not cfg.correct else traj["log_mu"]
        return jax.lax.stop_gradient(out.targets), jax.lax.stop_gradient(adv), log_mu, log_rhos

    def _losses(self, actor_params, critic_params, mb):
        cfg = self.cfg
        adv = mb["adv"]
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        dist = self.head.raw(self.actor_net.apply(actor_params, mb["obs"]), 1.0)
        log_pi = dist.log_prob(mb["u"])
        kind = self.cfg.actor
        pg = actor_lib.policy_loss(log_pi, mb["log_mu"], adv, kind=kind,
                                   clip=None if kind == "ratio" else cfg.actor_clip,
                                   ppo_epsilon=cfg.ppo_epsilon, log_pi_old=mb["log_pi_old"])
        actor_loss = pg - cfg.ent_coef * jnp.mean(dist.entropy())
        v = self.critic_net.apply(critic_params, mb["obs"])
        return actor_loss, 0.5 * jnp.mean(jnp.square(v - mb["targets"]))

    def _mc_critic_error(self, state: State, key):
        """(RMS of V_critic - V^{pi_k}, mean MC standard error) on the first ``gt_states`` envs'
        current states; V^{pi_k} by ``gt_rollouts`` Monte-Carlo rollouts of the newest actor
        (noise scale 1, actions mapped to the env as in training) over ``gt_horizon`` steps
        (default: gamma^H <= 0.01), the env's time limit lifted (``envs.ground_truth``)."""
        cfg = self.cfg
        n = min(cfg.gt_states, cfg.num_envs)
        states = jax.tree_util.tree_map(lambda x: x[:n], state.env_state)

        def act(params, ob, k):
            return self.to_env(self.head.raw(self.actor_net.apply(params, ob), 1.0).sample(seed=k))

        gt = gt_lib.mc_values_policy(
            self.env, self.env_params, act, state.actor_params, states, state.obs[:n], key,
            num_rollouts=cfg.gt_rollouts, horizon=cfg.gt_horizon or gt_lib.horizon_for(cfg.gamma, 0.01),
            gamma=cfg.gamma)
        v = self.critic_net.apply(state.critic_params, state.obs[:n])
        return jnp.sqrt(jnp.mean(jnp.square(v - gt.value))), jnp.mean(gt.stderr)

    def _update(self, state: State):
        cfg = self.cfg
        key, k_lag, k_roll, k_learn = jax.random.split(state.key, 4)
        lags = self.law.sample(k_lag, cfg.num_envs, self.num_versions,
                               available=lag_lib.available(state.ring))
        state, traj = self.rollout(state, lags, k_roll)
        targets, adv, log_mu, log_rhos = self.prepare(state.critic_params, traj)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        data = dict(obs=flat(traj["obs"]), u=flat(traj["u"]), log_mu=flat(log_mu),
                    log_pi_old=flat(traj["log_pi_old"]), adv=flat(adv), targets=flat(targets))
        n = cfg.num_envs * cfg.num_steps
        mb_size = n // cfg.num_minibatches

        def step(carry, idx):
            ap, cp, ao, co = carry
            mb = jax.tree_util.tree_map(lambda x: x[idx], data)
            # one backward pass: the actor loss does not read the critic and vice versa
            ga, gc = jax.grad(lambda a, c: sum(self._losses(a, c, mb)), argnums=(0, 1))(ap, cp)
            ua, ao = self.actor_tx.update(ga, ao, ap)
            uc, co = self.critic_tx.update(gc, co, cp)
            return (optax.apply_updates(ap, ua), optax.apply_updates(cp, uc), ao, co), None

        perms = jnp.stack([jax.random.permutation(k, n) for k in jax.random.split(k_learn, cfg.update_epochs)])
        carry, _ = jax.lax.scan(step, (state.actor_params, state.critic_params, state.actor_opt,
                                       state.critic_opt), perms.reshape(-1, mb_size))
        ap, cp, ao, co = carry
        ring = lag_lib.push(state.ring, ap)
        done = traj["done"]
        metrics = dict(
            episode_return=jnp.where(jnp.sum(done) > 0, jnp.sum(traj["ret"]) / jnp.maximum(jnp.sum(done), 1),
                                     jnp.nan),   # NaN: no episode ended in this update
            episodes=jnp.sum(done), mean_lag=jnp.mean(lags.astype(jnp.float32)),
            rho_mean=jnp.mean(jnp.exp(log_rhos)), rho_max=jnp.max(jnp.exp(log_rhos)),
            log_std=jnp.mean(ap["params"]["log_std"]))
        return state._replace(actor_params=ap, critic_params=cp, actor_opt=ao, critic_opt=co,
                              ring=ring, key=key), metrics


def lqr_critic_error(trainer: ContinuousTrainer, state: State, states: np.ndarray) -> float:
    """RMS of V_critic - V^{pi_k} on ``states`` [N, n] for an ``lqr:`` env and a linear actor,
    V^{pi_k} exact (``tabular.lqr.value``, float64; inf if pi_k destabilises the system).
    Raises otherwise."""
    from vccc_jax.envs.lqr_env import env_lqr
    from vccc_jax.tabular import lqr as lq

    cfg = trainer.cfg
    if env_kind(cfg.env) != "lqr" or not trainer.linear_actor or trainer.head.squash:
        raise ValueError("exact critic error needs an lqr: env, a linear actor and no squash")
    p = state.actor_params["params"]
    gain = np.asarray(p["Dense_0"]["kernel"], np.float64).T
    with jax.enable_x64(True):
        prob = env_lqr(cfg.env)._replace(gamma=jnp.asarray(cfg.gamma, jnp.float64))
        pol = lq.GaussianPolicy(jnp.asarray(gain), jnp.asarray(np.asarray(p["Dense_0"]["bias"], np.float64)),
                                jnp.asarray(np.asarray(p["log_std"], np.float64)))
        if float(lq.closed_loop_radius(prob, pol)) >= 1.0:
            return float("inf")
        v_true = np.asarray(lq.value(prob, pol)(jnp.asarray(states, jnp.float64)))
    v = np.asarray(trainer.critic_net.apply(state.critic_params, jnp.asarray(states, jnp.float32)))
    return float(np.sqrt(np.mean((v - v_true) ** 2)))


def train(cfg: TrainConfig, on_update=None, eval_states: int = 32) -> list[dict]:
    """Run ``cfg.num_updates`` updates for each of ``cfg.num_seeds`` seeds (one compiled
    update, seeds in turn); returns one row per (seed, update) with the update's metrics and,
    on ``lqr:`` envs every ``gt_every`` updates (and at the last), ``critic_error`` = the
    exact RMS error of the critic against V^{pi_k} on ``eval_states`` start-law states; on
    other envs with ``gt_every > 0``, every ``gt_every`` updates and at the last,
    ``critic_error`` against a Monte-Carlo V^{pi_k} and ``critic_error_mc_se`` (the mean
    standard error of the MC values, the error's noise floor).
    ``on_update(row)`` is called after each update (progress)."""
    trainer = ContinuousTrainer(cfg)
    exact = env_kind(cfg.env) == "lqr"
    if exact:
        from vccc_jax.envs.lqr_env import env_lqr

        p = env_lqr(cfg.env)
        rng = np.random.default_rng(cfg.seed)
        states = (np.asarray(p.s0_mean) + rng.standard_normal((eval_states, p.n))
                  @ np.linalg.cholesky(np.asarray(p.s0_cov)).T)
    rows = []
    for seed in range(cfg.seed, cfg.seed + cfg.num_seeds):
        state = trainer.init(jax.random.PRNGKey(seed))
        for u in range(1, cfg.num_updates + 1):
            state, m = trainer.update(state)
            row = dict(seed=seed, update=u, **{k: float(v) for k, v in m.items()})
            if exact and (u == cfg.num_updates or (cfg.gt_every and u % cfg.gt_every == 0)):
                row["critic_error"] = lqr_critic_error(trainer, state, states)
            elif not exact and cfg.gt_every and (u == cfg.num_updates or u % cfg.gt_every == 0):
                err, se = trainer.mc_critic_error(state, jax.random.fold_in(jax.random.PRNGKey(seed), u))
                row["critic_error"], row["critic_error_mc_se"] = float(err), float(se)
            rows.append(row)
            if on_update is not None:
                on_update(row)
    return rows
