"""``vccc bench train --continuous``: the one trainer (``train.trainer``, Gaussian head) against
an in-process PureJaxRL continuous-PPO reference on Pendulum-v1 (issue 31).

Rows (same timing as ``benchmarks.train``: whole training compiled once, round-robin, best of
``--repeats``, wall clock and process CPU time):

  reference   PureJaxRL's ``ppo_continuous_action.py`` shape for a gymnax env: LogWrapper,
              ClipAction, actor and critic MLPs (64-unit tanh here, as our rows), a state-
              independent log-std, distrax ``MultivariateNormalDiag``, GAE scan, value clipping,
              one annealed Adam over both towers (no observation / reward normalisation,
              PureJaxRL's ``NORMALIZE_ENV=False``)
  sync-gae    our continuous trainer, lag 0, K = 1, GAE critic
  lag8-gae    K = 8, lags uniform on {0..7}, GAE critic
  lag8-vccc   K = 8, uniform lags, VCCC one-step critic

Config: Pendulum-v1, 4 envs x 128 steps, 4 epochs x 4 minibatches, lr 3e-4. Our rows run the
trainer's ``train_scan`` (``benchmarks.train.prepare_trainer``: one ``lax.scan`` over the
updates, seeds vmapped), so no Python loop is timed. Targets (issue 31): sync-gae >= 1.0x the
reference; lag8-vccc within 10% of sync-gae.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.benchmarks.train import ROWS, Prepared, compile_cold_warm, compile_placements
from vccc_jax.benchmarks.train import prepare_trainer as prepare_our_trainer

ENV = "Pendulum-v1"
CONFIG = {"LR": 3e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 4,
          "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.0, "VF_COEF": 0.5,
          "MAX_GRAD_NORM": 0.5, "ENV_NAME": ENV}
CONTINUOUS_ROWS = {k: ROWS[k] for k in ("sync-gae", "lag8-gae", "lag8-vccc")}
ROW_NAMES = ("reference",) + tuple(CONTINUOUS_ROWS)


def make_reference_train(config: dict):
    """PureJaxRL ``make_train`` (ppo_continuous_action.py) for a gymnax Box-action env."""
    import distrax
    import flax.linen as nn
    import gymnax
    import optax
    from flax.linen.initializers import constant, orthogonal
    from flax.training.train_state import TrainState
    from gymnax.wrappers.purerl import LogWrapper

    class ActorCritic(nn.Module):
        action_dim: int

        @nn.compact
        def __call__(self, x):
            def dense(n, scale):
                return nn.Dense(n, kernel_init=orthogonal(scale), bias_init=constant(0.0))

            a = nn.tanh(dense(64, np.sqrt(2))(x))
            a = nn.tanh(dense(64, np.sqrt(2))(a))
            mean = dense(self.action_dim, 0.01)(a)
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
            c = nn.tanh(dense(64, np.sqrt(2))(x))
            c = nn.tanh(dense(64, np.sqrt(2))(c))
            return pi, jnp.squeeze(dense(1, 1.0)(c), axis=-1)

    class Transition(NamedTuple):
        done: jnp.ndarray
        action: jnp.ndarray
        value: jnp.ndarray
        reward: jnp.ndarray
        log_prob: jnp.ndarray
        obs: jnp.ndarray
        info: dict

    cfg = dict(config)
    cfg["NUM_UPDATES"] = cfg["TOTAL_TIMESTEPS"] // cfg["NUM_STEPS"] // cfg["NUM_ENVS"]
    cfg["MINIBATCH_SIZE"] = cfg["NUM_ENVS"] * cfg["NUM_STEPS"] // cfg["NUM_MINIBATCHES"]
    env, env_params = gymnax.make(cfg["ENV_NAME"])
    env = LogWrapper(env)
    space = env.action_space(env_params)
    network = ActorCritic(space.shape[0])

    def linear_schedule(count):
        frac = 1.0 - (count // (cfg["NUM_MINIBATCHES"] * cfg["UPDATE_EPOCHS"])) / cfg["NUM_UPDATES"]
        return cfg["LR"] * frac

    def init(rng):
        _, _rng = jax.random.split(rng)
        return network.init(_rng, jnp.zeros(env.observation_space(env_params).shape))

    def train(rng, params):
        tx = optax.chain(optax.clip_by_global_norm(cfg["MAX_GRAD_NORM"]),
                         optax.adam(learning_rate=linear_schedule, eps=1e-5))
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        rng, _rng = jax.random.split(rng)
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(_rng, cfg["NUM_ENVS"]), env_params)

        def _update_step(runner_state, unused):
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state
                rng, _rng = jax.random.split(rng)
                pi, value = network.apply(train_state.params, last_obs)
                action = pi.sample(seed=_rng)
                log_prob = pi.log_prob(action)
                rng, _rng = jax.random.split(rng)
                obsv, env_state, reward, terminated, truncated, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(_rng, cfg["NUM_ENVS"]), env_state,
                    jnp.clip(action, space.low, space.high), env_params)   # ClipAction
                done = jnp.logical_or(terminated, truncated)
                return (train_state, env_state, obsv, rng), Transition(
                    done, action, value, reward, log_prob, last_obs, info)

            runner_state, traj_batch = jax.lax.scan(_env_step, runner_state, None, cfg["NUM_STEPS"])
            train_state, env_state, last_obs, rng = runner_state
            _, last_val = network.apply(train_state.params, last_obs)

            def _get_advantages(gae_and_next_value, transition):
                gae, next_value = gae_and_next_value
                delta = (transition.reward + cfg["GAMMA"] * next_value * (1 - transition.done)
                         - transition.value)
                gae = delta + cfg["GAMMA"] * cfg["GAE_LAMBDA"] * (1 - transition.done) * gae
                return (gae, transition.value), gae

            _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                                         traj_batch, reverse=True, unroll=16)
            targets = advantages + traj_batch.value

            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj, gae, targets = batch_info

                    def _loss_fn(params):
                        pi, value = network.apply(params, traj.obs)
                        log_prob = pi.log_prob(traj.action)
                        v_clipped = traj.value + (value - traj.value).clip(-cfg["CLIP_EPS"], cfg["CLIP_EPS"])
                        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets),
                                                       jnp.square(v_clipped - targets)).mean()
                        ratio = jnp.exp(log_prob - traj.log_prob)
                        g = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor = -jnp.minimum(
                            ratio * g, jnp.clip(ratio, 1.0 - cfg["CLIP_EPS"], 1.0 + cfg["CLIP_EPS"]) * g).mean()
                        return loss_actor + cfg["VF_COEF"] * value_loss - cfg["ENT_COEF"] * pi.entropy().mean()

                    grads = jax.grad(_loss_fn)(train_state.params)
                    return train_state.apply_gradients(grads=grads), None

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = cfg["MINIBATCH_SIZE"] * cfg["NUM_MINIBATCHES"]
                perm = jax.random.permutation(_rng, batch_size)
                batch = jax.tree_util.tree_map(lambda x: x.reshape((batch_size,) + x.shape[2:]),
                                               (traj_batch, advantages, targets))
                minibatches = jax.tree_util.tree_map(
                    lambda x: jnp.take(x, perm, axis=0).reshape([cfg["NUM_MINIBATCHES"], -1] + list(x.shape[1:])),
                    batch)
                train_state, _ = jax.lax.scan(_update_minbatch, train_state, minibatches)
                return (train_state, traj_batch, advantages, targets, rng), None

            update_state, _ = jax.lax.scan(_update_epoch, (train_state, traj_batch, advantages, targets, rng),
                                           None, cfg["UPDATE_EPOCHS"])
            return (update_state[0], env_state, last_obs, update_state[-1]), traj_batch.info

        rng, _rng = jax.random.split(rng)
        runner_state, metric = jax.lax.scan(_update_step, (train_state, env_state, obsv, _rng), None,
                                            cfg["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metric}

    return init, train


def prepare_reference(seeds: int, timesteps: int, warm: bool = True) -> Prepared:
    """The continuous reference at ``seeds`` seeds (vmapped when > 1)."""
    init, train = make_reference_train(dict(CONFIG, TOTAL_TIMESTEPS=timesteps))
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    if seeds == 1:
        fn, args = train, (keys[0], jax.jit(init)(keys[0]))
    else:
        fn, args = jax.vmap(train), (keys, jax.jit(lambda k: jax.lax.map(init, k))(keys))
    compiled, cold, warm_s = compile_cold_warm(fn, args) if warm else (
        jax.jit(fn).lower(*args).compile(), float("nan"), None)

    def final(out):
        info = out["metrics"]
        done = np.asarray(info["returned_episode"])[-10:]
        rets = np.asarray(info["returned_episode_returns"])[-10:]
        return float(rets[done].mean()) if done.any() else float("nan")

    n = CONFIG["NUM_ENVS"] * CONFIG["NUM_STEPS"]
    return Prepared("reference (PureJaxRL continuous)", compiled, args, cold,
                    (timesteps // n) * n * seeds, final, warm_s)


def train_config(name: str, seeds: int, timesteps: int, actor: str = "truncate"):
    """The TrainConfig of one of our rows."""
    from vccc_jax.train.config import TrainConfig

    return TrainConfig(**config_fields(name, seeds, timesteps, actor))


def config_fields(name: str, seeds: int, timesteps: int, actor: str = "truncate") -> dict:
    """The TrainConfig fields of one of our rows (the reference's sizes and rates)."""
    return dict(env=ENV, num_envs=CONFIG["NUM_ENVS"], num_steps=CONFIG["NUM_STEPS"],
                update_epochs=CONFIG["UPDATE_EPOCHS"], num_minibatches=CONFIG["NUM_MINIBATCHES"],
                actor_lr=CONFIG["LR"], critic_lr=CONFIG["LR"], ent_coef=CONFIG["ENT_COEF"],
                total_timesteps=timesteps, num_seeds=seeds, actor=actor, **CONTINUOUS_ROWS[name])


def prepare_trainer(name: str, seeds: int, timesteps: int, actor: str = "truncate",
                    warm: bool = True) -> Prepared:
    """One of our rows: the one trainer (``train.trainer``, its Gaussian head chosen from
    Pendulum's Box action space), exactly as ``benchmarks.train`` times the discrete rows."""
    fields = config_fields(name, seeds, timesteps, actor)
    fields.pop("total_timesteps"), fields.pop("num_seeds")
    return prepare_our_trainer(name, seeds, timesteps, warm, **fields)


def prepare(names: Sequence[str], seeds: int, timesteps: int, actor: str = "truncate",
            progress: Optional[Callable[[str], None]] = None, warm: bool = True,
            placements: int = 1) -> list[Prepared]:
    """Compile every row in order, ``placements`` times (``train.prepare``'s placements:
    fresh compiles under the row's name); ``progress`` gets one line per row."""
    out = []
    for name in names:
        mine = compile_placements(
            lambda w: (prepare_reference(seeds, timesteps, w) if name == "reference"
                       else prepare_trainer(name, seeds, timesteps, actor, w)),
            placements, warm)
        out += mine
        if progress is not None:
            progress(f"  compiled {name} in {mine[0].compile_s:.2f}s cold")
    return out


def header(timesteps: int, seeds: int, repeats: int) -> str:
    import os

    return (f"# vccc bench train --continuous: {ENV}, 4 envs x 128 steps, 4 epochs x 4 minibatches, "
            f"64-unit tanh MLPs, {timesteps} steps/seed, {seeds} seed(s), best of {repeats} "
            f"round-robin rounds; jax {jax.__version__} on {jax.devices()[0].platform}, "
            f"{os.cpu_count()} CPUs, load average " + "/".join(f"{x:.1f}" for x in os.getloadavg()))
