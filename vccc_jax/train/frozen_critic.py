"""A neural (linear) critic trained on stale data from FROZEN actor versions (issue 11 §1).

The neural mirror of the tabular fixed-point rows (DESIGN.md §6): the actor history
pi_0..pi_K is fixed (e.g. ``tabular.history.policy_history``), every environment of a
:class:`~vccc_jax.envs.tabular_env.TabularEnv` acts for the whole run with one version
pi_{K - l}, its lag l drawn once from a lag law (``envs.lag.LagLaw``), and a critic
V_w(o) = o . w is trained by optax on the one-step targets of ``estimators.critic_targets``:

* ``"uncorrected"``: H = r + gamma(s') V(s'). Its expected update under the replay is
  T_{mubar} V - V with mubar = sum_i q_i(s) mu_i (Sec 1.3), so a one-hot critic converges to
  V^{mubar} (``exact_truth.VersionTruth.v_mix``), not to V^{pi_K};
* ``"vccc"``: Eq 4 with b = Vbar (= Eq 8); its expected update is T_{pi_K} V - V for every
  version (Eq 5/6), so the critic converges to V^{pi_K}.

With aliased features the fixed points are the projected ones of
``exact_truth.linear_fixed_point`` under the replay's state weights.

The actor is the linear map logits = o @ theta (theta [d, A]); with one-hot observations
that is a table of logits per state, so a ``policy_history`` computed on the env's
effective MDP plugs in directly. Envs use ``reset_prob = 1 - gamma`` (set in the env
params) so each version's data has the state law d^{mu_i} that the exact replay model
assumes. The whole run is one jitted ``lax.scan``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from vccc_jax.envs import exact_truth, rollout
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.tabular_env import EnvParams, TabularEnv, params_mdp
from vccc_jax.estimators.critic_targets import uncorrected_target, vccc_target

Array = chex.Array

TARGETS = ("uncorrected", "vccc")


@dataclasses.dataclass(frozen=True)
class FrozenCriticConfig:
    """target: one of ``TARGETS``; num_updates optimiser steps, each on the
    num_envs * steps_per_update transitions of a fresh rollout segment; burn_in env steps
    before the first update (to reach the stationary state law); learning rate decays
    linearly from ``learning_rate`` to ``final_learning_rate``; optimizer "sgd" or "adam"."""

    target: str = "uncorrected"
    num_envs: int = 64
    num_updates: int = 1500
    steps_per_update: int = 1
    burn_in: int = 60
    learning_rate: float = 1.0
    final_learning_rate: float = 0.02
    optimizer: str = "sgd"

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        for name in ("num_envs", "num_updates", "steps_per_update"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class FrozenCriticResult(NamedTuple):
    """values [N]: the trained critic on every effective state; weights [K + 1]: realised
    replay probability of each version (share of envs acting with it; index = version id);
    truth: ``exact_truth.VersionTruth`` for those weights; errors: ``CriticErrors`` with a
    leading [num_updates] axis (under d_mix)."""

    values: Array
    weights: Array
    truth: exact_truth.VersionTruth
    errors: exact_truth.CriticErrors


def linear_apply(theta: Array, obs: Array) -> Array:
    """logits (or values, for theta [d]) of a linear map on observations."""
    return obs @ theta


def history_buffer(history_logits: Array) -> lag_lib.VersionBuffer:
    """A version ring holding pi_0..pi_K (leading axis) with pi_K newest (lag l = version K - l)."""
    buffer = lag_lib.init_buffer(history_logits[0], history_logits.shape[0])
    return jax.lax.fori_loop(1, history_logits.shape[0],
                             lambda i, b: lag_lib.push(b, history_logits[i]), buffer)


def _optimizer(config: FrozenCriticConfig) -> optax.GradientTransformation:
    schedule = optax.linear_schedule(config.learning_rate, config.final_learning_rate,
                                     config.num_updates)
    return optax.sgd(schedule) if config.optimizer == "sgd" else optax.adam(schedule)


def _targets(use_vccc: Array, w: Array, traj: rollout.Trajectory, gamma: Array) -> Array:
    """Both targets are formed and one is selected, so the two share one compilation."""
    values = traj.obs @ w
    next_values = traj.final_obs @ w
    discounts = traj.discounts(gamma).astype(values.dtype)
    rewards = traj.reward.astype(values.dtype)
    log_pi = jnp.take_along_axis(traj.log_pi_all, traj.action[..., None], axis=-1)[..., 0]
    log_rhos = (log_pi - traj.log_mu).astype(values.dtype)
    return jnp.where(use_vccc,
                     vccc_target(rewards, discounts, values, next_values, log_rhos),
                     uncorrected_target(rewards, discounts, next_values))


def train_frozen_critic(
    env: TabularEnv,
    env_params: EnvParams,
    history_logits: Array,
    lags: Array,
    key: Array,
    config: FrozenCriticConfig,
) -> FrozenCriticResult:
    """Train a linear critic on data from frozen versions; see the module docstring.

    Jitted (``env`` and ``config`` static; configs that differ only in ``target`` share one
    compilation) and vmappable over ``key`` for seeds.

    Args:
      env, env_params: a tabular env (obs table [N, d]); set ``reset_prob = 1 - gamma``.
      history_logits: [K + 1, d, A] actor versions pi_0..pi_K (linear actor on obs).
      lags: int [num_envs], env b acts with version K - lags[b] for the whole run (draw
        with ``LagLaw.sample``).
      key: PRNG key.
    """
    use_vccc = jnp.asarray(config.target == "vccc")
    return _train(env, env_params, history_logits, lags, key, use_vccc,
                  dataclasses.replace(config, target=TARGETS[0]))


@functools.partial(jax.jit, static_argnames=("env", "config"))
def _train(env, env_params, history_logits, lags, key, use_vccc, config) -> FrozenCriticResult:
    K1 = history_logits.shape[0]
    obs_table = env_params.obs_table
    chex.assert_shape(lags, (config.num_envs,))
    chex.assert_shape(history_logits, (K1, obs_table.shape[1], env.num_actions))
    buffer = history_buffer(history_logits)
    gamma = env_params.gamma
    k_reset, k_burn, k_train = jax.random.split(key, 3)
    carry = rollout.reset(env, env_params, k_reset, config.num_envs)
    if config.burn_in > 0:
        carry, _ = rollout.rollout(env, env_params, linear_apply, buffer, carry, k_burn,
                                   num_steps=config.burn_in, lags=lags)

    lag_share = jnp.bincount(lags, length=K1).astype(jnp.float32) / config.num_envs
    log_pi = exact_truth.policy_log_probs(linear_apply, history_logits[-1], obs_table)
    log_mus = exact_truth.ring_log_probs(linear_apply, buffer, obs_table)  # by lag
    truth = exact_truth.version_truth(params_mdp(env_params), log_pi, log_mus, lag_share)

    opt = _optimizer(config)
    w0 = jnp.zeros((obs_table.shape[1],), jnp.float32)

    def loss_fn(w, traj):
        target = _targets(use_vccc, w, traj, gamma)
        return 0.5 * jnp.mean(jnp.square(target - traj.obs @ w))

    def update(state, k):
        w, opt_state, env_carry = state
        env_carry, traj = rollout.rollout(env, env_params, linear_apply, buffer, env_carry, k,
                                          num_steps=config.steps_per_update, lags=lags)
        grads = jax.grad(loss_fn)(w, traj)
        step, opt_state = opt.update(grads, opt_state, w)
        w = optax.apply_updates(w, step)
        errs = exact_truth.critic_errors(obs_table @ w, truth)
        return (w, opt_state, env_carry), errs

    (w, _, _), errors = jax.lax.scan(
        update, (w0, opt.init(w0), carry), jax.random.split(k_train, config.num_updates)
    )
    return FrozenCriticResult(values=obs_table @ w, weights=lag_share[::-1], truth=truth,
                              errors=errors)
