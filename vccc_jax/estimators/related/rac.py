"""RAC: Retroactive Advantage Correction for delayed reward channels (related_abstracts.txt #1).

The abstract: "each pending slow completion is queued, aged through a non-negative kernel,
and reinjected as a clipped residual into the next optimiser step's advantage ...
exactly unbiased when the effective delay kernel reinjects all of its mass, ... a bias
linear in the unreinjected fraction otherwise; at the no-delay identity kernel it reduces
to V-trace." (DESIGN.md §5.)

How we read it where it leaves a choice open
--------------------------------------------
* **Channels are additive.** The reward is r = sum_c r_c over channels c (rule, judge,
  human ...). Each channel has its own value component V_c (sum_c V_c = Vbar), so every
  quantity that is linear in (rewards, values) splits over channels.
* **Residual of a channel** = that channel's V-trace policy-gradient advantage computed on
  (r_c, V_c): a_c,t = r_c,t + gamma_t v_c,t+1 - V_c(s_t) (``vccc_jax.estimators.vtrace``
  with the rewards and values of channel c; v_c are its V-trace targets). A fast channel
  contributes it at the step that consumes the batch; a slow channel's residual becomes
  available D optimiser steps later and waits in the queue.
* **Clipped** means the importance ratio is clipped, not the residual's value: at the step
  where a queued completion is reinjected it is multiplied by min(cbar, pi_now / mu),
  pi_now being the policy at *that* step (the ratio is recomputed on the queued sample).
  This is what makes the no-delay identity kernel coincide with V-trace's
  min(rhobar, rho) policy-gradient weight.
* **Kernel.** k = (k_0, ..., k_{L-1}) >= 0, k_j = fraction of a completion reinjected when it
  is j steps past arrival; the reinjected mass is K = sum_j k_j. "Reinjects all of its mass"
  = K = 1 (e.g. k = (1,) reinjects everything at arrival; (0.5, 0.3, 0.2) spreads it over
  three steps). K < 1 leaves the unreinjected fraction 1 - K of the slow signal unused; K = 0
  is the drop-late-rewards baseline. Kernels with K > 1 are allowed (over-injection).
* **Into a later step's advantage.** The reinjected amount is an extra advantage on the
  *queued* sample's own (s, a) in that step's actor loss (the later step's loss gains terms
  -adv * log pi(a|s) for the old samples); the current batch's advantages are unchanged.

Functions here are pure and jit-safe; the queue is a fixed-size pytree (``RACQueue``)
holding the last L arrivals' residuals and behaviour log-probabilities by age.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.estimators.vtrace import vtrace

Array = chex.Array


def validate_kernel(kernel) -> np.ndarray:
    """A concrete 1-D non-negative finite kernel k(age), age = 0..L-1 (float64 copy)."""
    k = np.asarray(kernel, dtype=np.float64)
    if k.ndim != 1 or k.size == 0:
        raise ValueError(f"kernel must be a non-empty 1-D array over ages, got shape {k.shape}")
    if not np.all(np.isfinite(k)) or np.any(k < 0):
        raise ValueError(f"kernel must be finite and non-negative, got {k.tolist()}")
    return k


def kernel_mass(kernel) -> float:
    """K = sum_age k(age): the fraction of a slow completion that RAC reinjects."""
    return float(validate_kernel(kernel).sum())


def scaled_kernel(kernel, mass: float) -> np.ndarray:
    """The kernel rescaled to total mass ``mass`` (same shape over ages)."""
    k = validate_kernel(kernel)
    if not k.sum() > 0:
        raise ValueError("kernel has zero mass; cannot rescale it")
    if not mass >= 0:
        raise ValueError(f"mass must be >= 0, got {mass}")
    return k * (mass / k.sum())


def channel_residuals(log_rhos: Array, discounts: Array, rewards: Array, values: Array,
                      bootstrap_value: Array, *, lambda_=1.0,
                      clip_rho_threshold: Optional[float] = 1.0,
                      clip_c_threshold: Optional[float] = 1.0) -> Array:
    """Unclipped residual of one channel: (r_c,t + gamma_t v_c,t+1 - V_c(s_t)), [T, ...].

    v_c are the V-trace targets of the channel (Eq 11 with its rewards and values;
    v_c,T = ``bootstrap_value``). The policy-gradient clip is *not* applied here: RAC applies
    min(cbar, rho) when the residual is injected (:func:`inject`), with the ratio of that
    step. The residual is formed directly from the targets, never by dividing a weighted
    advantage by rho_t, so it does not depend on log rho_t at all and stays exact for any
    log-ratio (-inf, beyond the overflow guard, NaN); later log-ratios enter only through
    v_c,t+1 (``importance.safe_ratios`` semantics).
    """
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=lambda_,
                 clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_c_threshold,
                 clip_pg_rho_threshold=None)
    vs_next = jnp.concatenate([out.vs[1:], jnp.asarray(bootstrap_value, out.vs.dtype)[None]])
    return jax.lax.stop_gradient(rewards + discounts * vs_next - values)


def inject(residuals: Array, log_rhos: Array, weight, *,
           clip_pg_rho_threshold: Optional[float] = 1.0) -> Array:
    """weight * min(cbar, rho) * residuals: one (clipped) reinjection. [same shape]

    rho = ``importance.safe_ratios(log_rhos)``: 0 for a log-ratio of -inf, +inf or NaN,
    e^MAX_LOG_RHO above the overflow guard."""
    chex.assert_equal_shape([residuals, log_rhos])
    rho = safe_ratios(log_rhos)
    if clip_pg_rho_threshold is not None:
        rho = jnp.minimum(rho, clip_pg_rho_threshold)
    return jax.lax.stop_gradient(weight * rho * residuals)


class RACQueue(NamedTuple):
    """Pending slow completions by age since arrival: residuals, log_mu, valid: [L, N]."""

    residuals: Array
    log_mu: Array
    valid: Array


def init_queue(length: int, size: int, dtype=jnp.float32) -> RACQueue:
    """An empty queue with ``length`` ages (the kernel length) and ``size`` slots per age."""
    if length < 1 or size < 1:
        raise ValueError(f"queue length and size must be >= 1, got {length}, {size}")
    z = jnp.zeros((length, size), dtype)
    return RACQueue(z, z, jnp.zeros((length, size), bool))


def queue_push(queue: RACQueue, residuals: Array, log_mu: Array) -> RACQueue:
    """Age every entry by one step and insert the newly arrived completions at age 0."""
    chex.assert_equal_shape([residuals, log_mu, queue.residuals[0]])
    shift = lambda buf, new: jnp.concatenate([new[None], buf[:-1]], axis=0)  # noqa: E731
    return RACQueue(shift(queue.residuals, residuals.astype(queue.residuals.dtype)),
                    shift(queue.log_mu, log_mu.astype(queue.log_mu.dtype)),
                    shift(queue.valid, jnp.ones(residuals.shape, bool)))


def queue_advantages(queue: RACQueue, log_pi_now: Array, kernel, *,
                     clip_pg_rho_threshold: Optional[float] = 1.0) -> Array:
    """Reinjected advantages of every queued sample at this step:
    k(age) * min(cbar, pi_now / mu) * residual, zero on empty slots. [L, N]"""
    k = validate_kernel(kernel)
    if k.size != queue.residuals.shape[0]:
        raise ValueError(f"kernel has {k.size} ages but the queue holds {queue.residuals.shape[0]}")
    chex.assert_equal_shape([log_pi_now, queue.log_mu])
    w = jnp.asarray(k, queue.residuals.dtype)[:, None]
    out = inject(queue.residuals, log_pi_now - queue.log_mu, w,
                 clip_pg_rho_threshold=clip_pg_rho_threshold)
    return jnp.where(queue.valid, out, 0.0)


def rac_advantages(fast_advantages: Array, slow_residuals: Array, log_rhos: Array, *,
                   kernel=(1.0,), delay: int = 0,
                   clip_pg_rho_threshold: Optional[float] = 1.0) -> Array:
    """Advantage of the *current* batch when the slow residuals arrive with ``delay`` = 0.

    With no delay the age-0 weight k(0) is applied at once: fast + k(0) min(cbar, rho) a_slow.
    (For delay > 0 use the queue; the current batch then gets the fast advantages only.)
    At the identity kernel k = (1,) this is V-trace's pg advantage on the summed channels.
    """
    k = validate_kernel(kernel)
    if delay != 0:
        return fast_advantages
    return fast_advantages + inject(slow_residuals, log_rhos, float(k[0]),
                                    clip_pg_rho_threshold=clip_pg_rho_threshold)
