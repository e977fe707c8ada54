"""One-step critic targets (DESIGN.md §4; equations of vccc_blog_en.txt).

Per transition, with a frozen bootstrap function Vbar:

    H_t     = r_t + gamma_t * Vbar(s_{t+1})          (the one-step Bellman sample)
    delta_t = H_t - Vbar(s_t)
    rho_t   = exp(log pi_k(a_t|s_t) - log mu_i(a_t|s_t))

All functions are elementwise: arrays may have any (equal) shape, e.g. time-major [T, B] or
an enumerated [S, A, S'] grid (which is how ``tabular.exact`` takes exact expectations of
these very functions). ``discounts[t] = gamma * (1 - terminal_{t+1})``; a time-limit cut keeps
its discount and passes the final observation's value as ``next_values``. Every target is
wrapped in ``stop_gradient`` unless ``stop_target_gradients=False``.

| function                  | target                                   | E_mu[Y | s]                  |
|---------------------------|------------------------------------------|------------------------------|
| uncorrected_target        | H                                        | T_mu Vbar (stale)            |
| vccc_target (Eq 4)        | H + (rho - 1)(H - b)                     | T_pi Vbar, any state-only b  |
| vccc_target, b=None (Eq 8)| Vbar + rho delta                         | T_pi Vbar                    |
| clipped_target (Eq 10)    | Vbar + w delta                           | Z (T_pitilde Vbar - Vbar) + Vbar |
| naive_clipped_target      | H + (w - 1)(H - b)                       | Z T_pitilde Vbar + (1 - Z) b |
| centered_clipped_target   | Vbar + w delta - (w - Z)(b - Vbar)       | as Eq 10, for any b          |
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import checks
from vccc_jax.estimators.importance import WeightKind, importance_weights, safe_ratios

Array = chex.Array


def _finish(target: Array, stop_target_gradients: bool) -> Array:
    return jax.lax.stop_gradient(target) if stop_target_gradients else target


def _validate(**arrays) -> None:
    checks.check_same_shape(**arrays)
    for name, x in arrays.items():
        if x is not None:
            chex.assert_type(x, float)
    checks.check_unit_interval("discounts", arrays.get("discounts"))


def bellman_sample(rewards: Array, discounts: Array, next_values: Array) -> Array:
    """H = r + gamma * Vbar(s') — the one-step Bellman sample of Sec 3.1."""
    _validate(rewards=rewards, discounts=discounts, next_values=next_values)
    return rewards + discounts * next_values


def uncorrected_target(
    rewards: Array, discounts: Array, next_values: Array, *, stop_target_gradients: bool = True
) -> Array:
    """The stale target H_t; its conditional mean is T_mu Vbar(s), the behaviour backup."""
    return _finish(bellman_sample(rewards, discounts, next_values), stop_target_gradients)


def vccc_target(
    rewards: Array,
    discounts: Array,
    values: Array,
    next_values: Array,
    log_rhos: Array,
    baseline: Optional[Array] = None,
    *,
    stop_target_gradients: bool = True,
) -> Array:
    """Version Centered Critic Correction target, Eq 4: Y = H + (rho - 1)(H - b(s)).

    E_{mu_i}[Y | s] = T_{pi_k} Vbar(s) for every behaviour version mu_i and every state-only
    baseline b (Eq 5), hence also under any replay mixture of versions (Eq 6).

    ``baseline=None`` means b = Vbar(s_t) = ``values``, where Eq 4 reduces to the
    importance-weighted TD target of Eq 8, Y = Vbar(s_t) + rho * delta_t (computed in that
    form, which is the cheaper and better-conditioned one).
    """
    _validate(
        rewards=rewards,
        discounts=discounts,
        values=values,
        next_values=next_values,
        log_rhos=log_rhos,
        baseline=baseline,
    )
    rhos = safe_ratios(log_rhos)
    h = rewards + discounts * next_values
    if baseline is None:
        target = values + rhos * (h - values)
    else:
        target = h + (rhos - 1.0) * (h - baseline)
    return _finish(target, stop_target_gradients)


def clipped_target(
    rewards: Array,
    discounts: Array,
    values: Array,
    next_values: Array,
    log_rhos: Array,
    *,
    clip: float,
    kind: WeightKind = "truncate",
    stop_target_gradients: bool = True,
) -> Array:
    """Clipped importance-weighted TD target, Eq 10: Y = Vbar(s_t) + w_t * delta_t.

    ``kind="truncate"``: w = min(rho, c); ``kind="mask"``: w = rho * 1[1/c <= rho <= c].
    E_mu[w delta | s] = Z(s) (T_pitilde Vbar(s) - Vbar(s)) with Z = E_mu[w|s] and
    pitilde ∝ mu w, so the tabular fixed point is V^{pitilde} (pitilde ∝ min(c mu, pi) for
    truncation, as in V-trace).
    """
    _validate(
        rewards=rewards, discounts=discounts, values=values, next_values=next_values,
        log_rhos=log_rhos,
    )
    w = importance_weights(log_rhos, kind, clip)
    delta = rewards + discounts * next_values - values
    return _finish(values + w * delta, stop_target_gradients)


def naive_clipped_target(
    rewards: Array,
    discounts: Array,
    values: Array,
    next_values: Array,
    log_rhos: Array,
    baseline: Array,
    *,
    clip: float,
    kind: WeightKind = "truncate",
    stop_target_gradients: bool = True,
) -> Array:
    """NEGATIVE CONTROL (Sec 4.2): Eq 4 with w substituted for rho, Y = H + (w - 1)(H - b).

    Its mean is Z T_pitilde Vbar + (1 - Z) b: the arbitrary baseline leaks into the fixed
    point whenever b != Vbar. Kept so experiments can show the leak;
    use :func:`centered_clipped_target` instead.
    """
    _validate(
        rewards=rewards, discounts=discounts, values=values, next_values=next_values,
        log_rhos=log_rhos, baseline=baseline,
    )
    w = importance_weights(log_rhos, kind, clip)
    h = rewards + discounts * next_values
    return _finish(h + (w - 1.0) * (h - baseline), stop_target_gradients)


def centered_clipped_target(
    rewards: Array,
    discounts: Array,
    values: Array,
    next_values: Array,
    log_rhos: Array,
    baseline: Array,
    z: Array,
    *,
    clip: float,
    kind: WeightKind = "truncate",
    stop_target_gradients: bool = True,
) -> Array:
    """Z-centred clipped target with a general baseline (Sec 4.2, the Y^{clip,b} equation):

        Y = Vbar(s_t) + w_t delta_t - (w_t - Z(s_t)) (b(s_t) - Vbar(s_t)),

    with ``z`` = Z(s_t) = E_mu[w | s_t] supplied by the caller (it needs the behaviour
    distribution, e.g. logged top-k statistics). The control variate has zero conditional
    mean for any state-only b, so the mean equals Eq 10's and the fixed point stays
    V^{pitilde}. Reduces to Eq 4 when w = rho (Z = 1) and to Eq 10 when b = Vbar.
    """
    _validate(
        rewards=rewards, discounts=discounts, values=values, next_values=next_values,
        log_rhos=log_rhos, baseline=baseline, z=z,
    )
    w = importance_weights(log_rhos, kind, clip)
    delta = rewards + discounts * next_values - values
    target = values + w * delta - (w - z) * (baseline - values)
    return _finish(target, stop_target_gradients)


def optimal_baseline(
    log_rhos: Array, bellman_samples: Array, state_ids: Array, num_states: int
) -> tuple[Array, Array]:
    """Empirical variance-minimising baseline of Eq 9, grouped by state:

        b*(s) = E_mu[(rho - 1) rho H | s] / E_mu[(rho - 1)^2 | s],

    with both expectations replaced by per-state sample means over the transitions whose
    ``state_ids`` equal s. Where the denominator is 0 (rho == 1 for every sample, or no
    sample) the baseline has no effect on the target; we return the sample mean of rho*H
    there (0 for unvisited states) and report it in the mask.

    Args:
      log_rhos, bellman_samples: same shape, any rank (flattened).
      state_ids: int array of the same shape, values in [0, num_states).
      num_states: static.

    Returns:
      (b_star [num_states], identified [num_states] bool: denominator > 0).
    """
    _validate(log_rhos=log_rhos, bellman_samples=bellman_samples)
    checks.check_same_shape(log_rhos=log_rhos, state_ids=state_ids)
    chex.assert_type(state_ids, int)
    rho = safe_ratios(log_rhos).reshape(-1)
    h = bellman_samples.reshape(-1)
    ids = state_ids.reshape(-1)

    def per_state_sum(x):
        return jax.ops.segment_sum(x, ids, num_segments=num_states)

    numerator = per_state_sum((rho - 1.0) * rho * h)
    denominator = per_state_sum((rho - 1.0) ** 2)
    count = per_state_sum(jnp.ones_like(h))
    fallback = per_state_sum(rho * h) / jnp.maximum(count, 1.0)
    identified = denominator > 0
    b_star = jnp.where(identified, numerator / jnp.where(identified, denominator, 1.0), fallback)
    return b_star, identified
