"""BRACE: anchored Bellman-residual correction for a stale critic (comparator, issue 13).

Source: the BRACE abstract in ``shared/seeds/related_abstracts.txt`` ("BRACE bounds the
correction horizon to a prefix of policy tokens and anchors a constant-weight Monte-Carlo
tail beyond it, which separates policy correction from reward propagation"); our reading
is DESIGN.md Sec 5. Notation of the write-up (Eq 11, Sec 4.3, Sec 4.4).

Target (time-major ``[T, ...]``, the same inputs as :func:`vccc_jax.estimators.vtrace.vtrace`)
---------------------------------------------------------------------------------------
For a start step t let b_t be the first step *after* the n-th policy action counted from t
(the prefix is [t, b_t); everything from b_t on is the tail). With
delta_k = r_k + gamma_k Vbar(s_{k+1}) - Vbar(s_k):

    v_t = Vbar(s_t)
          + sum_{k=t}^{b_t - 1} ( prod_{j=t}^{k-1} gamma_j c_j ) rho^c_k delta_k      (prefix)
          + W_t * ( prod_{j=t}^{b_t - 1} gamma_j ) * D_{b_t}                             (tail)

    rho^c_k = min(rhobar, rho_k),  c_j = min(cbar, rho_j)      (None = no clipping)
    D_k     = sum_{k' >= k} ( prod_{j=k}^{k'-1} gamma_j ) delta_k' = G^mu_k - Vbar(s_k)
            (the ratio-free Monte-Carlo residual of the behaviour return)

Choices the abstract leaves open, and how we read them:

* **Prefix** = Eq 11 (V-trace with lambda = 1) cut after n policy actions: importance-
  corrected Bellman residuals whose ratio products are never longer than n.
  ``is_action`` (optional bool [T, ...]) marks policy steps; a step with
  ``is_action = False`` (a tool-observation token, not sampled from the policy) has ratio 1
  (rho^c = c = 1, whatever ``log_rhos`` holds) and does not count toward n.
* **Tail anchor** (``tail_anchor``): the tail is the behaviour Monte-Carlo return beyond
  the prefix, written as the residual D against the critic, so the target stays
  "Bellman-residual" form (Vbar + residuals). Its weight W_t is constant along the tail
  (no ratio enters it after b_t). Two readings of "anchored":

  - ``"prefix"`` (default): W_t = prod_{prefix actions} c_j, the prefix's own trace
    weight. Equivalently, V-trace whose trace/correction coefficients revert to 1 after
    n policy actions. Unclipped, E[v_t] = "follow pi for n policy steps, then mu", a value
    that does not depend on Vbar at all (tabular/brace.py gives its bias in closed form).
  - ``"constant"``: W_t = 1, i.e. the tail is anchored at weight one regardless of the
    prefix ratios (the literal "constant-weight" reading; lower variance, more bias).

* **End of the data**: the tail bootstraps from ``bootstrap_value`` (Vbar(s_T)) at the end
  of the segment, like V-trace (a pure Monte-Carlo tail is the special case of segments
  that end at a terminal, discounts = 0). Episode ends (discount 0) cut both prefix and
  tail; a time-limit truncation (``truncations[t]``) bootstraps from
  ``truncation_values[t]`` and stops the trace there (DESIGN.md Sec 3), exactly as in
  :mod:`vccc_jax.estimators.vtrace`.

Reductions (tested): n >= T with no clipping (and lambda = 1) is untruncated V-trace, i.e.
the importance-corrected (per-decision, control-variate) return; n = 0 is the behaviour
Monte-Carlo return G^mu_t (bootstrapped at the segment end); rho == 1 (on-policy) gives the
Monte-Carlo return for every n.

``pg_advantages`` follow V-trace: min(rhobar_pg, rho_t) (r_t + gamma_t v_{t+1} - Vbar(s_t))
(ratio 1 at non-action steps).

Implementation: one reverse ``lax.scan`` over time whose carry holds the running target at
every remaining budget m = 0..n (``[n + 1, width]``, two copies: prefix part X and tail part
Z), so the cost is O(n T) and n is capped at T (a budget that outlasts the segment never
reaches the tail):

    level 0:        X^0 = 0,                           Z^0_k = delta_k + gamma_k Z^0_{k+1}
    m >= 1, action: X^m_k = rho^c delta + gamma c X^{m-1}_{k+1},  Z^m_k = gamma w Z^{m-1}_{k+1}
    m >= 1, tool:   X^m_k = delta + gamma X^m_{k+1},              Z^m_k = gamma Z^m_{k+1}
    v_t = Vbar(s_t) + X^n_t + Z^n_t,   w = c ("prefix") or 1 ("constant").
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vccc_jax.estimators.importance import safe_ratios

Array = chex.Array

TAIL_ANCHORS = ("prefix", "constant")


class BraceOutput(NamedTuple):
    """vs: BRACE value targets v_t, [T, ...].
    pg_advantages: min(rhobar_pg, rho_t) (r_t + gamma_t v_{t+1} - Vbar(s_t)), [T, ...]."""

    vs: Array
    pg_advantages: Array


def _threshold(name: str, value) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating)):
        raise ValueError(f"{name} must be a positive static number or None, got {value!r}")
    if not float(value) > 0:
        raise ValueError(f"{name} must be > 0 (or None for no clipping), got {value}")
    return float(value)


def _validate(log_rhos, discounts, rewards, values, bootstrap_value, is_action, truncations,
              truncation_values, n, tail_anchor):
    for name, x in dict(log_rhos=log_rhos, discounts=discounts, rewards=rewards,
                        values=values).items():
        if np.ndim(x) < 1:
            raise ValueError(f"{name} must have rank >= 1 (time-major [T, ...]), got shape {np.shape(x)}")
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got {jnp.result_type(x)}")
        if np.shape(x) != np.shape(values):
            raise ValueError(f"{name} has shape {np.shape(x)} but values has shape {np.shape(values)}")
    if np.size(values) == 0:
        raise ValueError(f"values must be non-empty (no zero-length axis), got shape {np.shape(values)}")
    if np.shape(bootstrap_value) != np.shape(values)[1:]:
        raise ValueError(f"bootstrap_value must have shape values.shape[1:] = {np.shape(values)[1:]}, "
                         f"got {np.shape(bootstrap_value)}")
    if is_action is not None and np.shape(is_action) != np.shape(values):
        raise ValueError(f"is_action has shape {np.shape(is_action)} but values has shape {np.shape(values)}")
    if (truncations is None) != (truncation_values is None):
        raise ValueError("truncations and truncation_values must be given together")
    if truncations is not None:
        for name, x in dict(truncations=truncations, truncation_values=truncation_values).items():
            if np.shape(x) != np.shape(values):
                raise ValueError(f"{name} has shape {np.shape(x)} but values has shape {np.shape(values)}")
    if isinstance(n, bool) or not isinstance(n, (numbers.Integral, np.integer)) or n < 0:
        raise ValueError(f"n must be a static int >= 0 (policy steps in the prefix), got {n!r}")
    if tail_anchor not in TAIL_ANCHORS:
        raise ValueError(f"tail_anchor must be one of {TAIL_ANCHORS}, got {tail_anchor!r}")
    if not isinstance(discounts, jax.core.Tracer) and np.size(discounts):
        d = np.asarray(discounts)
        if not (d.min() >= 0.0 and d.max() <= 1.0):
            raise ValueError(f"discounts must lie in [0, 1]; got values in [{d.min()}, {d.max()}]")


@functools.partial(jax.jit, static_argnames=("n", "thresholds", "tail_anchor", "stop"))
def _core(log_rhos, discounts, rewards, values, bootstrap_value, is_action, truncations,
          truncation_values, *, n, thresholds, tail_anchor, stop):
    shape = values.shape
    num_t = shape[0]
    dtype = jnp.result_type(log_rhos, discounts, rewards, values, bootstrap_value)
    if stop:
        log_rhos, discounts, rewards, values, bootstrap_value = map(
            lax.stop_gradient, (log_rhos, discounts, rewards, values, bootstrap_value))
        if truncation_values is not None:
            truncation_values = lax.stop_gradient(truncation_values)
    flat = lambda x, kind=dtype: None if x is None else x.reshape(num_t, -1).astype(kind)  # noqa: E731
    lr, d, r, v = (flat(x) for x in (log_rhos, discounts, rewards, values))
    bv = bootstrap_value.reshape(1, -1).astype(dtype)
    act = jnp.ones_like(v, dtype=bool) if is_action is None else flat(is_action, bool)

    rho = safe_ratios(lr)
    clip = lambda bar: rho if bar is None else jnp.minimum(rho, bar)  # noqa: E731
    rho_c, c, rho_pg = (jnp.where(act, clip(bar), 1.0).astype(dtype) for bar in thresholds)
    next_v = jnp.concatenate([v[1:], bv], axis=0)
    g = d
    if truncations is not None:
        trunc = flat(truncations, bool)
        next_v = jnp.where(trunc, flat(truncation_values), next_v)
        g = jnp.where(trunc, jnp.zeros_like(d), d)
    delta = r + d * next_v - v
    w_tail = c if tail_anchor == "prefix" else jnp.ones_like(c)

    def step(carry, inp):
        x_next, z_next = carry  # [n + 1, width] at step k + 1, indexed by remaining budget
        dk, gk, rck, ck, wk, ak = (y[None] for y in inp)
        z0 = dk + gk * z_next[:1]
        x_act = rck * dk + (gk * ck) * x_next[:-1]
        z_act = (gk * wk) * z_next[:-1]
        x_tool = dk + gk * x_next[1:]
        z_tool = gk * z_next[1:]
        x = jnp.concatenate([jnp.zeros_like(z0), jnp.where(ak, x_act, x_tool)], axis=0)
        z = jnp.concatenate([z0, jnp.where(ak, z_act, z_tool)], axis=0)
        return (x, z), x[-1] + z[-1]

    init = jnp.zeros((n + 1, v.shape[1]), dtype)
    _, corr = lax.scan(step, (init, init), (delta, g, rho_c, c, w_tail, act), reverse=True)
    vs = v + corr
    vs_next = jnp.concatenate([vs[1:], bv], axis=0)
    if truncations is not None:
        vs_next = jnp.where(trunc, flat(truncation_values), vs_next)
    pg = rho_pg * (r + d * vs_next - v)
    vs, pg = vs.reshape(shape), pg.reshape(shape)
    if stop:
        vs, pg = lax.stop_gradient(vs), lax.stop_gradient(pg)
    return BraceOutput(vs=vs, pg_advantages=pg)


def brace(
    log_rhos: Array,
    discounts: Array,
    rewards: Array,
    values: Array,
    bootstrap_value: Array,
    *,
    n: int,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    is_action: Optional[Array] = None,
    truncations: Optional[Array] = None,
    truncation_values: Optional[Array] = None,
    tail_anchor: str = "prefix",
    stop_target_gradients: bool = True,
) -> BraceOutput:
    """BRACE targets (module docstring): n-action importance-corrected prefix + MC tail.

    Args:
      log_rhos: [T, ...] log pi(a_t|s_t) - log mu(a_t|s_t) (ignored where not ``is_action``).
      discounts: [T, ...] gamma * (1 - terminal_{t+1}) in [0, 1] (0 cuts prefix and tail).
      rewards, values: [T, ...] r_t and Vbar(s_t).
      bootstrap_value: [...] Vbar(s_T).
      n: static int >= 0, the number of policy actions in the prefix (capped at T).
      clip_rho_threshold, clip_c_threshold: rhobar (per-residual) and cbar (trace), or None.
      clip_pg_rho_threshold: the clip of ``pg_advantages``' ratio, or None.
      is_action: optional bool [T, ...]; False = tool/observation step (ratio 1, not counted).
      truncations, truncation_values: optional [T, ...] time-limit cuts and Vbar(final obs).
      tail_anchor: ``"prefix"`` (tail weighted by the prefix trace product) or
        ``"constant"`` (tail weight 1).
      stop_target_gradients: wrap both outputs in ``stop_gradient``.

    Returns:
      ``BraceOutput(vs, pg_advantages)``, [T, ...] each.
    """
    _validate(log_rhos, discounts, rewards, values, bootstrap_value, is_action, truncations,
              truncation_values, n, tail_anchor)
    thresholds = tuple(_threshold(name, x) for name, x in (
        ("clip_rho_threshold", clip_rho_threshold), ("clip_c_threshold", clip_c_threshold),
        ("clip_pg_rho_threshold", clip_pg_rho_threshold)))
    n_eff = min(int(n), int(np.shape(values)[0]))
    return _core(log_rhos, discounts, rewards, values, bootstrap_value, is_action, truncations,
                 truncation_values, n=n_eff, thresholds=thresholds, tail_anchor=tail_anchor,
                 stop=bool(stop_target_gradients))


def brace_reference(log_rhos, discounts, rewards, values, bootstrap_value, *, n,
                    clip_rho_threshold=1.0, clip_c_threshold=1.0, is_action=None,
                    truncations=None, truncation_values=None, tail_anchor="prefix") -> np.ndarray:
    """Slow NumPy transcription of the defining sum (module docstring), [T] trajectories only.

    O(T^2) double loop, for tests and brute-force checks; returns ``vs`` as float64 [T].
    """
    lr, d, r, v = (np.asarray(x, np.float64) for x in (log_rhos, discounts, rewards, values))
    num_t = len(v)
    act = np.ones(num_t, bool) if is_action is None else np.asarray(is_action, bool)
    rho = np.where(np.isnan(lr) | (lr == np.inf), 0.0, np.exp(np.minimum(lr, 20.0)))  # safe_ratios
    rho_c = np.where(act, rho if clip_rho_threshold is None else np.minimum(rho, clip_rho_threshold), 1.0)
    c = np.where(act, rho if clip_c_threshold is None else np.minimum(rho, clip_c_threshold), 1.0)
    next_v = np.append(v[1:], float(bootstrap_value))
    g = d.copy()
    if truncations is not None:
        trunc = np.asarray(truncations, bool)
        next_v = np.where(trunc, np.asarray(truncation_values, np.float64), next_v)
        g = np.where(trunc, 0.0, d)
    delta = r + d * next_v - v
    out = np.zeros(num_t)
    for t in range(num_t):
        total, trace, gam, used = v[t], 1.0, 1.0, 0  # trace: prod c; gam: prod gamma
        for k in range(t, num_t):
            if used < n:  # prefix
                total += gam * trace * rho_c[k] * delta[k]
                if act[k]:
                    used += 1
                    trace *= c[k]
            else:  # tail: constant weight (prefix trace product, or 1)
                weight = trace if tail_anchor == "prefix" else 1.0
                total += gam * weight * delta[k]
            gam *= g[k]
            if gam == 0.0:
                break
        out[t] = total
    return out


__all__ = ["BraceOutput", "TAIL_ANCHORS", "brace", "brace_reference"]
