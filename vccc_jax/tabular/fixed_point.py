"""Exact moments, fixed points and weight diagnostics of a critic target on the replay.

**Exact fixed point.** The expected semi-gradient TD update at state s is
d_mix(s) (E_replay[Y | s; Vbar] - V(s)) with Vbar = V. Every target here is affine in Vbar,
so g(V) = E_replay[Y | s; V] = c + M V is recovered exactly from S + 1 evaluations
(:func:`affine_map`) and the fixed point solves (I - M) V = c. States whose expected update
is identically zero (never replayed, d_mix = 0, or every action masked: a zero row of
I - M) keep the critic's initial value 0, which is also what the trained critic does there.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.registry import TargetExtras
from vccc_jax.estimators.types import Transitions
from vccc_jax.tabular import exact
from vccc_jax.tabular.replay import Replay, mixture_optimal_baseline
from vccc_jax.tabular.resolve import _as_resolved, _clip_or_inf

Array = chex.Array


def _mix_moments(posterior: Array, means: Array, variances: Array) -> tuple[Array, Array]:
    """Moments of a mixture over versions at each state (law of total variance)."""
    mean = jnp.sum(posterior * means, axis=0)
    second = jnp.sum(posterior * (variances + means**2), axis=0)
    return mean, jnp.maximum(second - mean**2, 0.0)


def expected_target(
    method, replay: Replay, vbar: Array, clip, options: Optional[dict], baseline: Array,
    z: Optional[Array] = None,
) -> tuple[Array, Array]:
    """Exact E_replay[Y | s] and Var_replay[Y | s] of a method's target at bootstrap Vbar.

    ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved`.
    One-step methods: the method's own target function on every version's enumerated
    [S, A, S'] grid (``exact.transition_grid``), exact moments by ``exact.target_moments``,
    mixed over versions with the posterior q_i(s). Multi-step: the method's ``moments``.
    Returns (mean [S], var [S]).
    """
    r = _as_resolved(method, options)
    clip = _clip_or_inf(r, clip)
    if r.multi_step:
        means, variances = jax.vmap(
            lambda mu: r.moments(replay.mdp, replay.pi, mu, vbar, clip)
        )(replay.mus)
        return _mix_moments(replay.posterior, means, variances)
    z = r.z(replay, clip) if z is None else z
    b_star = mixture_optimal_baseline(replay, vbar) if r.needs_bstar else vbar

    def per_version(mu, z_i):
        grid = exact.transition_grid(replay.mdp, replay.pi, mu, vbar)
        t = Transitions(rewards=grid.rewards, discounts=grid.discounts, values=grid.values,
                        next_values=grid.next_values, log_rhos=grid.log_rhos)
        e = TargetExtras(baseline=grid.state(baseline), z=grid.state(z_i),
                         b_star=grid.state(b_star))
        return exact.target_moments(replay.mdp, mu, r.one_step(t, e, clip))

    means, variances = jax.vmap(per_version)(replay.mus, z)
    return _mix_moments(replay.posterior, means, variances)


def affine_map(f: Callable[[Array], Array], num_states: int, dtype) -> tuple[Array, Array]:
    """(c, M) with f(v) = c + M v for an affine f: [S] -> [S], from S + 1 evaluations.

    Exact for affine maps (every target here is affine in the bootstrap Vbar), and
    indifferent to ``stop_gradient`` inside f, unlike a Jacobian.
    """
    c = f(jnp.zeros((num_states,), dtype))
    cols = jax.vmap(f)(jnp.eye(num_states, dtype=dtype))  # row j = f(e_j)
    return c, (cols - c[None, :]).T


class FixedPoint(NamedTuple):
    """values [S]: the fixed point; c [S], M [S, S]: E_replay[Y | s; V] = c + M V;
    identified [S] bool: states with a non-zero expected update (others keep 0)."""

    values: Array
    c: Array
    M: Array
    identified: Array


def fixed_point(
    method, replay: Replay, clip, options: Optional[dict], baseline: Array
) -> FixedPoint:
    """Exact fixed point of the expected semi-gradient TD update under the replay mixture.

    Solves V = E_replay[Y | s; Vbar = V] on the states the update touches; see the module
    docstring. ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved`.
    Returns a :class:`FixedPoint`.
    """
    r = _as_resolved(method, options)
    S = replay.pi.shape[0]
    dtype = replay.pi.dtype
    z = None if r.multi_step else r.z(replay, _clip_or_inf(r, clip))
    c, M = affine_map(
        lambda v: expected_target(r, replay, v, clip, None, baseline, z)[0], S, dtype
    )
    A = jnp.eye(S, dtype=dtype) - M
    scale = jnp.max(jnp.abs(A)) + jnp.max(jnp.abs(c)) + 1.0
    identified = (replay.state_dist > 0) & (jnp.max(jnp.abs(A), axis=1) > 1e-12 * scale)
    A = jnp.where(identified[:, None], A, jnp.eye(S, dtype=dtype))
    rhs = jnp.where(identified, c, 0.0)
    # I - M with M >= 0 and row sums <= 1 for every registered target: elimination without
    # pivoting is stable, and avoids jaxlib 0.10's CPU LU, which can deadlock when two LU
    # calls run concurrently (see exact.solve_dominant).
    return FixedPoint(values=exact.solve_dominant(A, rhs), c=c, M=M, identified=identified)


# ============================================================================ diagnostics


def weight_diagnostics(
    method, replay: Replay, clip, options: Optional[dict] = None
) -> tuple[Array, Array, Array, Array]:
    """Population ESS fraction and clip rate, overall (replay) and by version.

    For version i with (s, a) ~ d^{mu_i}(s) mu_i(a|s): ESS_i = E[w]^2 / E[w^2] (the Kish
    fraction of ``estimators.importance.ratio_diagnostics`` in the infinite-sample limit)
    and clip_i = P(w != rho). Overall: the same under the replay mixture.
    Returns (ess [], clip_rate [], ess_by_version [V], clip_by_version [V]).
    """
    r = _as_resolved(method, options)
    log_rhos = replay.log_pi[None] - replay.log_mus  # [V, S, A]
    w, clipped = r.weights(log_rhos, _clip_or_inf(r, clip))
    p = replay.visitation[:, :, None] * replay.mus  # [V, S, A]
    m1 = jnp.sum(p * w, axis=(1, 2))
    m2 = jnp.sum(p * w**2, axis=(1, 2))
    cr = jnp.sum(p * clipped, axis=(1, 2))
    ess_v = jnp.where(m2 > 0, m1**2 / jnp.where(m2 > 0, m2, 1.0), 0.0)
    M1, M2 = replay.weights @ m1, replay.weights @ m2
    ess = jnp.where(M2 > 0, M1**2 / jnp.where(M2 > 0, M2, 1.0), 0.0)
    return ess, replay.weights @ cr, ess_v, cr
