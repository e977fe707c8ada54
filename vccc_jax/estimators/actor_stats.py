"""Statistics the actor-correction rows read (``estimators.actor_registry``; issue 21, 29).

Masks, per-sequence sums of log-ratios (a column of axis 0 is one sequence, or several when
``starts`` marks where each begins), GSPO's geometric mean, PPO's keep indicator and M2PO's
second-moment masks (finite batch and population). Sequence and batch statistics are formed
from the RAW finite log-ratios and the overflow guard ``MAX_LOG_RHO`` is applied to the
aggregate (issue 29): a token at log r = 30 and one at -29 give log R = 1, as the published
definitions (verl ``rollout_corr_helper``, GSPO, TOPR, AReaL's M2PO) have it.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import MAX_LOG_RHO

Array = chex.Array


def mask_on(mask: Optional[Array]):
    """The contract's mask as bool (True when None: every token is an action)."""
    return True if mask is None else mask.astype(bool)


def clean_log_ratios(log_rhos: Array, mask: Optional[Array]) -> Array:
    """Log-ratios as the sequence and batch statistics read them: masked tokens 0; NaN and
    +inf (invalid data, weight 0 as in ``safe_ratios``) -> -inf, so a sequence holding one has
    weight 0; finite values RAW (issue 29: no per-token ``MAX_LOG_RHO`` cap -- a token at
    log r = 30 and one at -29 make a sequence at log R = 1, as the published definitions
    have it; the guard applies to the aggregate, :func:`sequence_total`)."""
    invalid = jnp.isnan(log_rhos) | (log_rhos == jnp.inf)
    x = jnp.where(invalid, -jnp.inf, log_rhos)
    return jnp.where(mask_on(mask), x, 0.0)


def sequence_sum(x: Array, starts: Optional[Array] = None) -> Array:
    """Per-token total of ``x`` over the token's sequence, [T, ...] (module docstring: a
    column of axis 0 is one sequence, or several when ``starts`` marks where each begins;
    row 0 always starts one). Two scans over T, no [T, T] array."""
    if starts is None:
        return jnp.broadcast_to(jnp.sum(x, axis=0, keepdims=True), x.shape)
    chex.assert_equal_shape([x, starts])
    starts = starts.astype(bool).at[0].set(True)

    def fwd(run, xs):
        xt, st = xs
        run = jnp.where(st, xt, run + xt)
        return run, run

    _, running = jax.lax.scan(fwd, jnp.zeros(x.shape[1:], x.dtype), (x, starts))
    ends = jnp.concatenate([starts[1:], jnp.ones((1,) + x.shape[1:], bool)], axis=0)

    def bwd(total, xs):
        rt, et = xs
        total = jnp.where(et, rt, total)
        return total, total

    _, totals = jax.lax.scan(bwd, jnp.zeros(x.shape[1:], x.dtype), (running, ends), reverse=True)
    return totals


def sequence_total(log_rhos: Array, mask: Optional[Array], starts: Optional[Array]) -> Array:
    """Uncapped sum over the sequence's action tokens of the raw finite log-ratios, -inf when
    one of them is -inf / NaN / +inf (weight 0). The finite part and the count of -inf
    tokens are summed apart (one scan pair over a stacked trailing axis), so a finite sum
    that overflows the dtype stays +inf (then capped by the callers) instead of inf - inf
    (a float32 sum overflowing BOTH ways may still give NaN: weight 0, as invalid data)."""
    x = clean_log_ratios(log_rhos, mask)
    dead = x == -jnp.inf
    both = jnp.stack([jnp.where(dead, 0.0, x), dead.astype(x.dtype)], axis=-1)
    st = None if starts is None else jnp.broadcast_to(starts[..., None], both.shape)
    sums = sequence_sum(both, st)
    return jnp.where(sums[..., 1] > 0, -jnp.inf, sums[..., 0])


def sequence_log_ratio(log_rhos: Array, mask: Optional[Array] = None,
                       starts: Optional[Array] = None) -> Array:
    """log R = sum over the sequence's action tokens of the RAW log rho, then the overflow
    guard min(log R, ``MAX_LOG_RHO``) on the aggregate (issue 29), broadcast to every token;
    -inf when a token's log rho is -inf (R = 0) or invalid (NaN / +inf: weight 0)."""
    return jnp.minimum(sequence_total(log_rhos, mask, starts), MAX_LOG_RHO)


def sequence_mean(x: Array, mask: Optional[Array] = None,
                  starts: Optional[Array] = None) -> Array:
    """(1/|y|) sum_t x_t over the sequence's |y| action tokens of raw per-token log-values x,
    then min(., ``MAX_LOG_RHO``); -inf when one is -inf / NaN / +inf; 0 for a sequence with
    no action token."""
    n = sequence_sum(jnp.ones_like(x) if mask is None else mask.astype(x.dtype), starts)
    total = sequence_total(x, mask, starts)
    return jnp.where(n > 0, jnp.minimum(total / jnp.maximum(n, 1.0), MAX_LOG_RHO), 0.0)


def geometric_mean_log_ratio(log_rhos: Array, mask: Optional[Array] = None,
                             starts: Optional[Array] = None) -> Array:
    """GSPO's log s = (1/|y|) sum_t log rho_t over the sequence's |y| action tokens, of the raw
    log-ratios, then min(log s, ``MAX_LOG_RHO``) (0 for a sequence with no action token)."""
    return sequence_mean(log_rhos, mask, starts)


def ppo_keep(ratio: Array, advantages: Array, eps_low, eps_high) -> Array:
    """1 where d/dr min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) at r = ratio is A (the
    unclipped branch is the min), 0 where the clip zeroes the gradient:
    (A > 0 and r > 1 + eps_high) or (A < 0 and r < 1 - eps_low)."""
    clipped = ((advantages > 0) & (ratio > 1.0 + eps_high)) | \
              ((advantages < 0) & (ratio < 1.0 - eps_low))
    return (~clipped).astype(ratio.dtype)


def band(x: Array, lo, hi) -> Array:
    """1 where lo <= x <= hi, else 0 (x's dtype)."""
    return ((x >= lo) & (x <= hi)).astype(x.dtype)


# ------------------------------------------------------------------ M2PO second-moment mask


def second_moment_keep(log_rhos: Array, tau, mask: Optional[Array] = None) -> Array:
    """M2PO's batch mask (0 / 1, the shape of ``log_rhos``): drop the tokens with the largest
    (log r)^2 until the mean of (log r)^2 over the KEPT tokens is <= tau -- the largest set
    of smallest-(log r)^2 tokens whose mean second moment is <= tau (nothing is dropped when
    the whole batch's is). Every masked-in token of the arrays is one batch; ties at the
    boundary are broken by flat index (deterministic). One sort of the batch.

    Edge rules (issue 29, docs/method.md A9): (log r)^2 of the RAW log-ratio (a token at
    log r = 25 has 625, not the guard's 400); NaN / +-inf count as +inf (dropped first).
    When every token's (log r)^2 exceeds tau the single smallest is kept (AReaL's
    ``_get_m2po_loss_mask``: "mask all but one"), so a non-empty batch never loses every
    token. A kept mean exactly at tau is kept (the constraint M2 <= tau); AReaL's test is
    ``avg < tau``, which differs only on that exact tie (probability 0 for continuous
    log-ratios; the population limit is the same under both)."""
    x2 = jnp.square(clean_log_ratios(log_rhos, mask))
    x2 = jnp.where(jnp.isfinite(x2), x2, jnp.inf)  # log r = -inf / invalid / overflow
    on = jnp.broadcast_to(mask_on(mask), x2.shape).reshape(-1)
    flat = jnp.where(on, x2.reshape(-1), jnp.inf)
    order = jnp.argsort(flat, stable=True)
    s = flat[order]
    k = jnp.arange(1, s.size + 1, dtype=x2.dtype)
    csum = jnp.cumsum(jnp.where(jnp.isfinite(s), s, 0.0))
    ok = jnp.isfinite(s) & (csum <= tau * k)  # prefix mean <= tau (nondecreasing in k)
    n_keep = jnp.maximum(jnp.sum(ok), jnp.minimum(jnp.sum(on), 1))  # keep >= 1 (AReaL)
    rank = jnp.zeros(s.size, jnp.int32).at[order].set(jnp.arange(s.size, dtype=jnp.int32))
    return ((rank < n_keep) & on).astype(log_rhos.dtype).reshape(log_rhos.shape)


def second_moment_threshold(log_rhos: Array, probs: Array, tau) -> tuple[Array, Array]:
    """The population (infinite-batch) M2PO mask for token atoms with probabilities
    ``probs`` (same shape, >= 0, any total): (kappa, frac) such that keep(x2) = 1[x2 <
    kappa] + frac 1[x2 = kappa] is the largest mask, in the order of x2 = (log r)^2, with
    E[x2 keep] <= tau E[keep] -- equality when the mask binds (frac in [0, 1) is the kept
    fraction of the boundary atom). kappa = inf, frac = 1 when nothing is dropped. When every
    atom's x2 exceeds tau nothing is kept (the finite batch's keep-the-smallest fallback keeps
    one token of N: mass 1/N, 0 in the limit). x2 of the raw log-ratio, as the batch mask."""
    chex.assert_equal_shape([log_rhos, probs])
    x2 = jnp.square(clean_log_ratios(log_rhos, None)).reshape(-1)
    x2 = jnp.where(jnp.isfinite(x2), x2, jnp.inf)
    p = jnp.where(probs.reshape(-1) > 0, probs.reshape(-1), 0.0).astype(x2.dtype)
    order = jnp.argsort(x2, stable=True)
    s, ps = x2[order], p[order]
    excess = jnp.cumsum(jnp.where(ps > 0, ps * (jnp.where(jnp.isfinite(s), s, 0.0) - tau), 0.0))
    bad = (ps > 0) & ((excess > 0) | ~jnp.isfinite(s))
    any_bad = jnp.any(bad)
    kappa = jnp.where(any_bad, s[jnp.argmax(bad)], jnp.inf)
    below = x2 < kappa
    at = x2 == kappa
    m_below = jnp.sum(jnp.where(below, p * (jnp.where(below, x2, 0.0) - tau), 0.0))
    p_at = jnp.sum(jnp.where(at, p, 0.0))
    frac = jnp.where(jnp.isfinite(kappa) & (p_at > 0),
                     -m_below / jnp.maximum(p_at * (jnp.where(jnp.isfinite(kappa), kappa, 0.0) - tau),
                                            1e-300), 0.0)
    frac = jnp.where(any_bad, jnp.clip(frac, 0.0, 1.0), 1.0)
    return kappa, frac


def threshold_keep(log_rhos: Array, kappa, frac) -> Array:
    """keep(x2) = 1[x2 < kappa] + frac 1[x2 = kappa] of :func:`second_moment_threshold`."""
    x2 = jnp.square(clean_log_ratios(log_rhos, None))
    x2 = jnp.where(jnp.isfinite(x2), x2, jnp.inf)
    return jnp.where(x2 < kappa, 1.0, jnp.where(x2 == kappa, frac, 0.0)).astype(log_rhos.dtype)


__all__ = [
    "band", "clean_log_ratios", "geometric_mean_log_ratio", "mask_on", "ppo_keep",
    "second_moment_keep", "second_moment_threshold", "sequence_log_ratio", "sequence_mean",
    "sequence_sum", "sequence_total", "threshold_keep",
]
