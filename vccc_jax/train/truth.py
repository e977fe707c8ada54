"""Ground-truth metrics of one trainer update: exact (tabular / token envs) or Monte Carlo.

Plain functions of the static ``train.setup.Setup``, the grid values and the update's
arrays, evaluated every ``gt_every`` updates and at the last (:func:`due`) inside a real
``lax.cond`` (the update index is not batched over seeds):

* :func:`exact_truth` wires ``train.exact_metrics`` (closed-form V^{pi_k}, V^{mu_l},
  the replay mixture (also on ``lqr:`` envs, Lyapunov), the exact actor-update bias on the
  tabular and token envs, with the config's
  actor weight kind / clip / Eq 13 centring; see that module for the metric names)
  and, with the learned baseline on a tabular env, ``bstar_err`` (b_psi vs the sample b* of
  Eq 9);
* :func:`monte_carlo_truth` (gymnax envs): critic error vs Monte-Carlo V^{pi_k}
  (``envs.ground_truth``) at saved rollout states, and pi_k's episode return.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators import critic_targets as ct_lib
from vccc_jax.tabular import lqr as lq
from vccc_jax.train import exact_metrics
from vccc_jax.train import setup as setup_lib
from vccc_jax.train.programs import GridValues
from vccc_jax.train.setup import Setup

Array = chex.Array

__all__ = ["bstar_err", "exact_truth", "monte_carlo_truth", "nan"]

MC_METRICS = ("gt_mse", "gt_mae", "gt_bias", "gt_stderr", "gt_value", "gt_critic_value",
              "eval_return")


def nan():
    return jnp.full((), jnp.nan, jnp.float32)


def bstar_err(setup: Setup, state, traj, prep) -> Array:
    """RMSE (over the states where Eq 9 is identified, weighted by visits) between b_psi(s)
    and the sample b*(s) of the fresh rollout (``estimators.critic_targets.optimal_baseline``)."""
    b = traj.action.shape[1]
    ids = traj.env_state.state
    log_rhos = prep.inputs.transitions.log_rhos[:, :b]
    b_star, ok = ct_lib.optimal_baseline(log_rhos, prep.bstar_h[:, :b], ids,
                                         setup.env_params.obs_table.shape[0])
    b_psi = setup.baseline_net.apply(state.baseline_params, setup.env_params.obs_table)
    counts = jax.ops.segment_sum(jnp.ones(ids.size, jnp.float32), ids.reshape(-1),
                                 num_segments=b_star.shape[0]) * ok
    return jnp.sqrt(jnp.sum(counts * jnp.square(b_psi - b_star)) / jnp.maximum(jnp.sum(counts), 1.0))


def exact_truth(setup: Setup, values: GridValues, state, traj, ltraj, valid, prep,
                idx) -> dict:
    """Exact metrics (``train.exact_metrics``) of pi_k, the ring's versions, the replay
    mixture and the critic at the start of the update, every ``gt_every`` updates; with the
    learned baseline on a tabular env also ``bstar_err`` (:func:`bstar_err`)."""
    cfg = setup.cfg
    nv = setup.ring_size

    def compute(_):
        stacked = exact_metrics.ring_params(state.actor_params, state.versions, nv)
        w_all = jnp.ones(ltraj.lag.shape, jnp.float32) if valid is None else valid
        if ltraj.is_action is not None:
            w_all = w_all * ltraj.is_action.astype(jnp.float32)
        weights = exact_metrics.lag_weights(ltraj.lag, w_all, nv)
        fresh_w = jnp.ones(traj.lag.shape, jnp.float32)
        actor = dict(kind=setup.actor_kind, centred=setup.centered,
                     clip=None if setup.actor_kind == "ratio" else values.actor_clip,
                     correction_params=setup_lib.actor_row_params(setup, values))
        if setup.env_kind == "lqr":
            e = setup.env_params  # the problem the env simulates (lqr_env.EnvParams)
            prob = lq.LQR(a=e.a, b=e.b, w=e.w_chol @ e.w_chol.T, q=e.q, r=e.r,
                          gamma=jnp.asarray(cfg.gamma, jnp.float32), s0_mean=e.s0_mean,
                          s0_cov=e.s0_chol @ e.s0_chol.T)
            return exact_metrics.lqr_metrics(
                prob, setup.critic_values, state.actor_params, state.critic_params, stacked,
                float(np.log(cfg.noise_scale)), weights, traj.obs, fresh_w)
        if setup.env_kind == "tabular":
            out = exact_metrics.tabular_metrics(
                setup.env_params, setup.actor_logits, setup.critic_values, state.actor_params,
                state.critic_params, stacked, setup.log_mu_fn, weights,
                traj.env_state.state, fresh_w, **actor)
            if setup.baseline_net is not None:
                out["bstar_err"] = bstar_err(setup, state, traj, prep)
            return out
        return exact_metrics.token_metrics(
            setup.env, setup.actor_logits, setup.critic_values, state.actor_params,
            state.critic_params, stacked, setup.log_mu_fn, weights, traj.env_state,
            traj.lag, fresh_w, **actor)

    def skip(_):
        out = exact_metrics.nan_metrics(nv)
        if setup.baseline_net is not None and setup.env_kind == "tabular":
            out["bstar_err"] = nan()
        return out

    return jax.lax.cond(due(setup, idx), compute, skip, None)


def due(setup: Setup, idx) -> Array:
    """Whether update ``idx`` evaluates the ground truth: at updates N-1, 2N-1, ... (N =
    ``gt_every``) and at the last update, so a run's last evaluation is its end (39 updates
    with N = 15 evaluated last at update 29, 75% of the run)."""
    return ((idx + 1) % setup.cfg.gt_every == 0) | (idx + 1 == setup.num_updates)


def monte_carlo_truth(setup: Setup, state, traj, key, idx) -> dict:
    """Critic error vs Monte-Carlo V^{pi_k} at saved states, and pi_k's episode return."""
    cfg = setup.cfg
    if cfg.gt_every <= 0:
        return {k: nan() for k in MC_METRICS}
    T, B = cfg.num_steps, cfg.num_envs
    n = T * B
    pos = (jnp.arange(cfg.gt_states) * n) // cfg.gt_states
    pick = lambda x: jnp.take(x.reshape((n,) + x.shape[2:]), pos, axis=0)  # noqa: E731
    states = jax.tree_util.tree_map(pick, traj.env_state)
    obs = pick(traj.obs)

    def compute(_):
        k_mc, k_reset, k_eval = jax.random.split(key, 3)
        mc = gt_lib.mc_values_policy(
            setup.env, setup.env_params, setup.act, state.actor_params, states, obs,
            k_mc, num_rollouts=cfg.gt_rollouts, horizon=setup.gt_horizon, gamma=cfg.gamma)
        v = setup.critic_values(state.critic_params, obs)
        err = v - mc.value
        out = {
            "gt_mse": jnp.mean(jnp.square(err)),
            "gt_mae": jnp.mean(jnp.abs(err)),
            "gt_bias": jnp.mean(err),
            "gt_stderr": jnp.mean(mc.stderr),
            "gt_value": jnp.mean(mc.value),
            "gt_critic_value": jnp.mean(v),
            "eval_return": nan(),
        }
        if cfg.eval_envs > 0:
            carry = rollout_lib.reset(setup.env, setup.env_params, k_reset, cfg.eval_envs)
            ev = gt_lib.mc_values_policy(
                setup.env, setup.env_params, setup.act, state.actor_params,
                carry.env_state, carry.obs, k_eval, num_rollouts=2,
                horizon=setup.eval_horizon, gamma=1.0, ignore_time_limit=False)
            out["eval_return"] = jnp.mean(ev.value)
        return out

    def skip(_):
        return {k: nan() for k in MC_METRICS}

    return jax.lax.cond(due(setup, idx), compute, skip, None)
