"""Tabular policies: [..., S, A] probability tables (rows sum to 1).

Softmax policies from logits (with temperature), uniform policies, and the truncated
samplers top-k / top-p (nucleus). The truncated samplers put probability 0 on some actions
and so *deliberately* violate the support assumption pi > 0 => mu > 0 (Sec 7) when used as
behaviour policies; :func:`support_violation` measures by how much.

Probabilities cross the estimator API as log-probabilities: :func:`log_probs` maps 0 to
-inf, and :func:`log_ratio_table` forms log pi - log mu.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = chex.Array

PROB_ATOL = 1e-6


def validate_policy(pi: Array, name: str = "pi", atol: float = PROB_ATOL) -> Array:
    """Raise ValueError naming ``name`` unless ``pi`` is a [..., S, A] table of distributions.

    Shape/rank are always checked; values (no negative entries, rows summing to 1) only on
    concrete arrays (under jit the value check is skipped).
    """
    if np.ndim(pi) < 2:
        raise ValueError(f"{name} must be a [..., S, A] probability table, got shape {np.shape(pi)}")
    if isinstance(pi, jax.core.Tracer):
        return pi
    p = np.asarray(pi)
    if not np.all(np.isfinite(p)) or np.any(p < -atol):
        raise ValueError(f"{name} has negative or non-finite probabilities (min {np.nanmin(p)})")
    rows = p.sum(-1)
    if np.any(np.abs(rows - 1.0) > atol):
        bad = tuple(np.argwhere(np.abs(rows - 1.0) > atol)[0])
        raise ValueError(f"{name} rows must sum to 1: {name}[{', '.join(map(str, bad))}, :] sums to {rows[bad]}")
    return pi


def softmax_policy(logits: Array, temperature: float = 1.0) -> Array:
    """pi(a|s) = softmax(logits[s] / temperature) over the last axis."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return jax.nn.softmax(logits / temperature, axis=-1)


def uniform_policy(num_states: int, num_actions: int, dtype=None) -> Array:
    """The uniform policy [S, A]."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    return jnp.full((num_states, num_actions), 1.0 / num_actions, dtype)


def top_k_policy(probs: Array, k: int) -> Array:
    """Keep the k most probable actions of every row and renormalise (ties: lower index).

    Actions outside the top k get probability exactly 0 (a support violation on purpose).
    """
    A = probs.shape[-1]
    if not 1 <= k <= A:
        raise ValueError(f"k must lie in [1, num_actions={A}], got {k}")
    order = jnp.argsort(-probs, axis=-1, stable=True)
    ranks = jnp.argsort(order, axis=-1)
    kept = jnp.where(ranks < k, probs, 0.0)
    return kept / jnp.sum(kept, axis=-1, keepdims=True)


def top_p_policy(probs: Array, p: float) -> Array:
    """Nucleus sampling: the smallest set of most probable actions with mass >= p, renormalised.

    An action is kept when the mass of the strictly more probable actions (in the sorted
    order) is below ``p``; so the most probable action is always kept and ``p = 1`` keeps
    every action with positive probability.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must lie in (0, 1], got {p}")
    order = jnp.argsort(-probs, axis=-1, stable=True)
    sorted_p = jnp.take_along_axis(probs, order, axis=-1)
    mass_before = jnp.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = mass_before < p
    ranks = jnp.argsort(order, axis=-1)
    keep = jnp.take_along_axis(keep_sorted, ranks, axis=-1)
    kept = jnp.where(keep, probs, 0.0)
    return kept / jnp.sum(kept, axis=-1, keepdims=True)


def mix_policies(pi: Array, other: Array, weight) -> Array:
    """(1 - weight) * pi + weight * other (e.g. epsilon-mixing with the uniform policy)."""
    return (1.0 - weight) * pi + weight * other


def log_probs(pi: Array) -> Array:
    """log pi with log 0 = -inf exactly (no warnings, no NaN)."""
    return jnp.where(pi > 0, jnp.log(jnp.where(pi > 0, pi, 1.0)), -jnp.inf)


def log_ratio_table(pi: Array, mu: Array) -> Array:
    """log rho(s, a) = log pi(a|s) - log mu(a|s) as a table [..., S, A].

    Where mu = 0 the action is never sampled; the entry is +inf if pi > 0 (support
    violation) and -inf if pi = 0 too, so that ``safe_ratios`` gives a finite guard or 0.
    Exact expectations under mu mask these entries anyway.
    """
    lp, lm = log_probs(pi), log_probs(mu)
    return jnp.where(mu > 0, lp - jnp.where(mu > 0, lm, 0.0), jnp.where(pi > 0, jnp.inf, -jnp.inf))


def support_violation(pi: Array, mu: Array) -> Array:
    """Target mass on actions the behaviour never samples: sum_a pi(a|s) 1[mu(a|s) = 0]. [..., S]."""
    return jnp.sum(jnp.where(mu > 0, 0.0, pi), axis=-1)
