"""rlax (DeepMind's JAX RL building blocks), unchanged, under the verify contracts.

rlax functions take ONE trajectory, time-major and batch-free: ``r_t``, ``discount_t`` [T]
for the steps t -> t+1, ``v_tm1`` = V(s_0..s_{T-1}), ``v_t`` = V(s_1..s_T) (or ``values``
[T+1]), ``rho_tm1`` = pi/mu as a ratio; they return TD errors ``target - v_tm1`` (V-trace,
TD(lambda), the importance-corrected errors) or returns / advantages. The sequence
adapters build those arguments from the contract's ``log_rhos, discounts, rewards,
values [T, ...], bootstrap_value [...]``, ``jax.vmap`` the rlax function over the
trailing batch, and return the target ``vs = v_tm1 + errors`` (and the V-trace policy-
gradient advantage). The actor adapters call rlax's loss on the tokens as given:
``clipped_surrogate_pg_loss(exp(log_pi - log_mu), A, epsilon)`` and
``policy_gradient_loss`` with two-action logits [log pi, log(1 - pi)] (log_softmax gives
back log pi, and its derivative in log pi is exactly 1: the loss's own score). Arguments the rlax
signature leaves without a default are stated here (``lambda_ = 0.95``, ``epsilon = 0.2``)
and can be changed with ``--kw NAME=VALUE`` like any other rlax argument.
"""

from __future__ import annotations

import importlib.metadata

import jax
import jax.numpy as jnp

from vccc_jax.verify.adapters import Adapter


def _version() -> str:
    return importlib.metadata.version("rlax")


def per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value):
    """``f(rho_tm1, discount_t, r_t, v_tm1, v_t) -> tuple`` on every trajectory of a
    time-major batch [T, ...]: flattens the trailing axes, vmaps over them, restores them."""
    T, batch = log_rhos.shape[0], log_rhos.shape[1:]
    flat = [x.reshape((T, -1)) for x in (log_rhos, discounts, rewards, values)]
    boot = jnp.reshape(bootstrap_value, (1, -1))
    v_t = jnp.concatenate([flat[3][1:], boot], axis=0)
    outs = jax.vmap(f, in_axes=1, out_axes=1)(jnp.exp(flat[0]), flat[1], flat[2], flat[3], v_t)
    return tuple(o.reshape((T,) + batch) for o in outs)


def _f(x) -> float:
    return float(x)


def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=1.0, clip_rho_threshold=1.0):
    """``rlax.vtrace`` -> vs = v_tm1 + errors (defaults of rlax: lambda 1, rho_bar 1; c_bar = 1 fixed)."""
    import rlax

    def f(rho, d, r, v_tm1, v_t):
        return (v_tm1 + rlax.vtrace(v_tm1, v_t, r, d, rho, _f(lambda_), _f(clip_rho_threshold)),)

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)[0]


def vtrace_td_error_and_advantage(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=1.0,
                                  clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0):
    """``rlax.vtrace_td_error_and_advantage`` -> (vs = v_tm1 + errors, pg_advantage)."""
    import rlax

    def f(rho, d, r, v_tm1, v_t):
        out = rlax.vtrace_td_error_and_advantage(v_tm1, v_t, r, d, rho, _f(lambda_), _f(clip_rho_threshold),
                                                 _f(clip_pg_rho_threshold))
        return v_tm1 + out.errors, out.pg_advantage

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)


def td_lambda(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=0.95):
    """``rlax.td_lambda`` (no ratios) -> v_tm1 + errors."""
    import rlax

    def f(rho, d, r, v_tm1, v_t):
        return (v_tm1 + rlax.td_lambda(v_tm1, r, d, v_t, _f(lambda_)),)

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)[0]


def lambda_returns(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=1.0):
    """``rlax.lambda_returns`` (no ratios; default stop_target_gradients=False kept)."""
    import rlax

    def f(rho, d, r, v_tm1, v_t):
        return (rlax.lambda_returns(r, d, v_t, _f(lambda_)),)

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)[0]


def importance_corrected_td_errors(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=0.95):
    """``rlax._src.multistep.importance_corrected_td_errors`` (per-decision ratios, unclipped)
    -> v_tm1 + errors (rlax 0.1.9 does not re-export it at the top level)."""
    from rlax._src import multistep

    def f(rho, d, r, v_tm1, v_t):
        vals = jnp.concatenate([v_tm1, v_t[-1:]])
        return (v_tm1 + multistep.importance_corrected_td_errors(r, d, rho, _f(lambda_), vals),)

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)[0]


def truncated_generalized_advantage_estimation(log_rhos, discounts, rewards, values, bootstrap_value,
                                               lambda_=0.95):
    """``rlax.truncated_generalized_advantage_estimation`` -> the GAE value target v_tm1 + A."""
    import rlax

    def f(rho, d, r, v_tm1, v_t):
        vals = jnp.concatenate([v_tm1, v_t[-1:]])
        return (v_tm1 + rlax.truncated_generalized_advantage_estimation(r, d, _f(lambda_), vals),)

    return per_trajectory(f, log_rhos, discounts, rewards, values, bootstrap_value)[0]


def clipped_surrogate_pg_loss(log_pi, log_mu, advantages, epsilon=0.2):
    """``rlax.clipped_surrogate_pg_loss(exp(log_pi - log_mu), A, epsilon)`` (PPO's clip; the
    ratio is to the behaviour: the rollout policy is PPO's pi_old here)."""
    import rlax

    return rlax.clipped_surrogate_pg_loss(jnp.exp(log_pi - log_mu), advantages, _f(epsilon))


def policy_gradient_loss(log_pi, log_mu, advantages):
    """``rlax.policy_gradient_loss`` with w_t = 1 on the taken actions (no importance weight):
    two-action logits [log pi, log(1 - pi)], a_t = 0. ``log_mu`` is not used by rlax."""
    import rlax

    logits = jnp.stack([log_pi, jnp.log1p(-jnp.exp(log_pi))], axis=-1)
    a = jnp.zeros(log_pi.shape, jnp.int32)
    return rlax.policy_gradient_loss(logits, a, advantages, jnp.ones_like(log_pi))


def _a(function, kind, claim, claims, fn, biased_by="") -> Adapter:
    calls = ("rlax._src.multistep." if function == "importance_corrected_td_errors" else "rlax.") + function
    return Adapter("rlax", function, calls, kind, claim, claims, lambda: fn, _version, biased_by)


ADAPTERS = (
    _a("vtrace", "sequence", "clipped:1",
       "V-trace target, rho_bar = c_bar = 1 (rlax defaults): V^pitilde with pitilde ∝ min(mu, pi)", vtrace,
       "rho_bar = 1"),
    _a("vtrace_td_error_and_advantage", "sequence", "clipped:1",
       "V-trace target and pg advantage min(rho, 1)(r + g vs' - V): V^pitilde (c = 1)",
       vtrace_td_error_and_advantage, "rho_bar = 1"),
    _a("importance_corrected_td_errors", "sequence", "vpi",
       "per-decision importance-sampled TD(lambda = 0.95) errors (unclipped): V^pi",
       importance_corrected_td_errors),
    _a("td_lambda", "sequence", "vpi", "TD(lambda = 0.95) on-policy target (no ratio): V of the data's policy",
       td_lambda),
    _a("lambda_returns", "sequence", "vpi", "lambda-return (lambda = 1, no ratio): V of the data's policy",
       lambda_returns),
    _a("truncated_generalized_advantage_estimation", "sequence", "vpi",
       "GAE(lambda = 0.95) value target V + A (no ratio): V of the data's policy",
       truncated_generalized_advantage_estimation),
    _a("clipped_surrogate_pg_loss", "actor", "vpi",
       "PPO clipped surrogate, epsilon = 0.2, ratio to the behaviour: the policy gradient inside the trust region",
       clipped_surrogate_pg_loss, "PPO clip"),
    _a("policy_gradient_loss", "actor", "vpi", "REINFORCE -A log pi (w = 1): the on-policy policy gradient",
       policy_gradient_loss),
)
