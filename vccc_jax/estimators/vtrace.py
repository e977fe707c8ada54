"""Multi-step V-trace targets (Eq 11 of the write-up; IMPALA, Espeholt et al. 2018).

For a time-major trajectory ``[T, ...]`` (any trailing batch dims) this computes

    v_t = Vbar(s_t) + sum_{k=t}^{t+n-1} ( prod_{j=t}^{k-1} gamma_j c_j ) rho^c_k delta_k      (Eq 11)

    delta_k   = r_k + gamma_k Vbar(s_{k+1}) - Vbar(s_k)
    rho^c_k   = min(rhobar, rho_k)            (clip_rho_threshold; None = no clipping)
    c_j       = lambda * min(cbar, rho_j)     (clip_c_threshold;   None = no clipping)
    pg_adv_t  = min(rhobar_pg, rho_t) (r_t + gamma_t v_{t+1} - Vbar(s_t))

with per-step discounts ``gamma_t = discounts[t]`` standing in for ``gamma^{k-t}`` (a 0 cuts
the trace at an episode end), ``v_T = Vbar(s_T) = bootstrap_value`` and ``n = T`` unless
``n_steps`` bounds the horizon (then products of c are never longer than n - 1).
Reductions: untruncated (all thresholds None) with lambda = 1 gives the importance-weighted
n-step return (the exact multi-step pi-backup); rho == 1 gives the GAE(gamma, lambda)
value target; ``n_steps=1`` gives the one-step clipped target Vbar + min(rhobar, rho) delta
(Eq 10 with truncation).

Time-limit truncation (DESIGN.md §3, termination is not truncation): where
``truncations[t]`` is True the episode was cut after step t by a time limit. Then
``Vbar(s_{t+1})`` in delta_t (and v_{t+1} in the policy-gradient advantage) is
``truncation_values[t]`` (the value of the final observation), the discount is kept, and the
trace does not continue past t (nothing of the next episode leaks in).

Ratios are ``exp`` of the log-ratios with the overflow guard of
:func:`vccc_jax.estimators.importance.safe_ratios` (log-ratio capped at ``MAX_LOG_RHO``;
-inf, +inf and NaN -> weight 0), so any log-ratio gives finite targets from finite rewards,
values and discounts.

Implementation (performance notes)
----------------------------------
:func:`vtrace` is one reverse loop over time (``lax.fori_loop`` with static bounds, i.e. a
``lax.scan``) that reads one row of each input and writes one row of each output per step,
with ratio, clips and delta fused into the step; nothing is transposed, ``values[1:]`` is
never materialised (Vbar(s_{t+1}) is read from ``values`` at t + 1) and the carry is the one
[block] accumulator ``vs_{t+1} - Vbar(s_{t+1})``. On a 2-core CPU at (T, B) = (128, 4096)
the time goes into the loop's kernels, so the step is written to need few of them:

* the NaN guard of the ratio is folded into the exponent (:func:`~vccc_jax.estimators.importance.safe_ratios`), so only the
  kernel that computes rho reads the log-ratio;
* a concrete ``lambda_`` is a compile-time constant; with equal thresholds (the default)
  ``pg_t = acc_t + (1 - lambda) gamma_t w_t acc_{t+1}``, which for lambda = 1 is ``acc_t``
  itself: one fused kernel per step computes it and two write the rows (rlax needs three
  full-array passes before its loop and one after);
* the batch is processed in column blocks of ``_BLOCK`` elements (the whole time axis of
  one block, then the next), so the rows one step touches stay in L1/L2 at large B.

At large sizes the cost is memory: 24 bytes per float32 transition at minimum (4 arrays in,
2 out), and under glibc's defaults every fresh output buffer over ~32 MiB is page-faulted in
on every call (``vccc_jax.train.host_malloc.keep_freed_memory`` stops that for a whole
process; docs/scaling.md, "V-trace and GAE on a CPU host"). The two output
buffers are filled with different constants before the loop (write-only; one shared zero
buffer was CSE'd and copied, a read + write pass more). Where the time goes on CPU, measured:
docs/results.md, "Critic targets at memory speed".
:func:`vtrace_inplace` donates ``log_rhos`` and ``rewards`` and runs the same loop *in
place*: it carries those two buffers and overwrites row t with ``vs_t`` / ``pg_t`` one
iteration after reading it (a one-step lag, so no kernel reads a row another kernel has
already overwritten and XLA inserts no copies), so it allocates no output memory at all.
Under ``jax.shard_map`` with the batch axis split (the loop's carry starts varying like the
inputs) each device runs the same loop on its columns, bit for bit the same results.

:func:`vtrace_associative` computes the same targets with ``lax.associative_scan`` on the
linear recurrence ``y_t = x_t + a_t y_{t+1}`` (log-depth, fully parallel passes). With
``n_steps < T`` all variants use an exact O(n T) Horner recursion
``y^{(m)}_t = x_t + a_t y^{(m-1)}_{t+1}`` over whole arrays (no difference of two scans, so
no cancellation). :func:`vtrace` picks the loop or the associative scan per backend and
shape by :func:`scan_method` from the measured table ``ASSOCIATIVE_WINS`` (docs/scaling.md;
on CPU the loop everywhere). :func:`gae` is the same loop with rho == 1: no log-ratio array,
no exp.

Value checks (discounts in [0, 1], lambda in [0, 1]) run at the API boundary when the
arguments are concrete; inside ``jit``/``vmap`` only shapes, ranks and static arguments can
be checked. Targets are ``stop_gradient``-ed by default (``stop_target_gradients=True``);
then both ``vs`` and ``pg_advantages`` carry no gradient (as in IMPALA).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vccc_jax.estimators import checks
from vccc_jax.estimators.importance import MAX_LOG_RHO, safe_ratios

Array = chex.Array

# Column block of the cache-blocked loop (elements). Chosen on a 2-core Zen CPU by timing
# 2048..65536 at (512, 65536): a step then touches ~7 rows of 32 KiB (inputs, Vbar(s_{t+1}),
# outputs), which stay in L2 (see vccc_jax/benchmarks/estimators.py).
_BLOCK = 8192
_MIN_BLOCK = 1024


# Where the associative scan beats the sequential loop, per backend: (min T, max width of
# the flattened batch), or None = nowhere. Measured by `vccc bench estimators --crossover`
# (docs/scaling.md): on CPU the loop wins at every (T, B) from (32, 1) to (4096, 4096).
# Backends not listed (GPU, TPU) are not measured yet and use the loop too; `make
# bench-device` prints the same grid there.
ASSOCIATIVE_WINS: dict = {"cpu": None}

_RHO_ONE = object()  # log_rhos stand-in of gae() (rho == 1)


def scan_method(platform: str, num_t: int, width: int) -> str:
    """'associative' where ``ASSOCIATIVE_WINS`` says it wins on ``platform``, else 'scan'."""
    rule = ASSOCIATIVE_WINS.get(platform)
    if rule is None:
        return "scan"
    min_t, max_width = rule
    return "associative" if num_t >= min_t and width <= max_width else "scan"


class GAEOutput(NamedTuple):
    """returns: the lambda-returns Vbar(s_t) + A_t (the GAE value target), [T, ...].
    advantages: A_t = GAE(gamma, lambda) advantages, [T, ...]."""

    returns: Array
    advantages: Array


class VTraceOutput(NamedTuple):
    """vs: V-trace value targets v_t (Eq 11), [T, ...].
    pg_advantages: min(rhobar_pg, rho_t) (r_t + gamma_t v_{t+1} - Vbar(s_t)), [T, ...]."""

    vs: Array
    pg_advantages: Array


# ----------------------------------------------------------------------------- validation


def _check_threshold(name: str, value) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) == 0:
        if not checks.is_concrete(value):
            raise ValueError(f"{name} must be a static Python number or None (it is a tracer)")
        value = float(value)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
    value = float(value)
    if not value > 0:
        raise ValueError(f"{name} must be > 0 (or None for no clipping), got {value}")
    return value


def _check_discounts(discounts) -> None:
    """discounts in [0, 1] (NaN fails), when concrete: two NumPy reductions (no temporaries).

    NumPy, not jnp: a concrete array closed over inside someone else's ``jit`` trace is
    still checkable, but jnp ops on it would be staged into that trace.
    """
    if not checks.is_concrete(discounts) or np.size(discounts) == 0:
        return
    a = np.asarray(discounts)
    lo, hi = float(a.min()), float(a.max())
    if not (0.0 <= lo and hi <= 1.0):  # also False for NaN
        raise ValueError(f"discounts must lie in [0, 1]; got values in [{lo}, {hi}]")


def _validate(log_rhos, discounts, rewards, values, bootstrap_value, lambda_,
              clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold,
              truncations, truncation_values, n_steps):
    """Static checks (always) and value checks (concrete arguments only)."""
    named = dict(log_rhos=log_rhos, discounts=discounts, rewards=rewards, values=values)
    if log_rhos is _RHO_ONE:  # gae(): rho == 1, no log-ratios
        del named["log_rhos"]
    for name, x in named.items():
        if x is None:
            raise ValueError(f"{name} is required")
        checks.check_rank_at_least(name, x, 1)
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")
    # values first, so messages read "<arg> has shape .. but values has shape ..".
    checks.check_same_shape(values=values, **{k: x for k, x in named.items() if k != "values"})
    checks.check_nonempty("values", values)
    batch_shape = np.shape(values)[1:]
    if bootstrap_value is None:
        raise ValueError("bootstrap_value is required (Vbar(s_T), shape values.shape[1:])")
    if np.shape(bootstrap_value) != batch_shape:
        raise ValueError(
            f"bootstrap_value must have shape values.shape[1:] = {batch_shape} (rank "
            f"{len(batch_shape)}), got shape {np.shape(bootstrap_value)}"
        )
    if (truncations is None) != (truncation_values is None):
        raise ValueError(
            "truncations and truncation_values must be given together "
            f"(got truncations={'None' if truncations is None else 'array'}, "
            f"truncation_values={'None' if truncation_values is None else 'array'})"
        )
    if truncations is not None:
        checks.check_same_shape(values=values, truncations=truncations,
                                truncation_values=truncation_values)
    thresholds = tuple(
        _check_threshold(n, v)
        for n, v in (("clip_rho_threshold", clip_rho_threshold),
                     ("clip_c_threshold", clip_c_threshold),
                     ("clip_pg_rho_threshold", clip_pg_rho_threshold))
    )
    if n_steps is not None:
        if isinstance(n_steps, bool) or not isinstance(n_steps, numbers.Integral) or n_steps < 1:
            raise ValueError(f"n_steps must be None or a static int >= 1, got {n_steps!r}")
        n_steps = int(n_steps)
    if np.ndim(lambda_) != 0:
        raise ValueError(f"lambda_ must be a scalar, got shape {np.shape(lambda_)}")
    checks.check_unit_interval("lambda_", lambda_)
    _check_discounts(discounts)
    if truncations is not None and checks.is_concrete(truncations):
        t = np.asarray(truncations)
        if t.dtype != np.bool_ and np.any((t != 0) & (t != 1)):
            raise ValueError("truncations must be boolean (or 0/1)")
    return thresholds, n_steps


# ----------------------------------------------------------------------------- math pieces


def _coefficients(rho, lambda_, rho_bar, c_bar, pg_bar):
    """rho^c = min(rhobar, rho), c = lambda min(cbar, rho), rho_pg = min(rhobar_pg, rho)."""
    clip = lambda bar: rho if bar is None else jnp.minimum(rho, bar)  # noqa: E731
    return clip(rho_bar), lambda_ * clip(c_bar), clip(pg_bar)


def _block_size(width: int) -> int:
    """Largest divisor of ``width`` that is <= _BLOCK, or ``width`` if none >= _MIN_BLOCK."""
    if width <= _BLOCK:
        return width
    for bs in range(_BLOCK, _MIN_BLOCK - 1, -1):
        if width % bs == 0:
            return bs
    return width


def _row_step(lr, r, d, v, v_next, trunc, tv, acc, lambda_, thresholds):
    """One time step for one row: ratio, clips, delta and both outputs, all elementwise.

    ``acc`` = vs_{t+1} - Vbar(s_{t+1}); returns (vs_t - Vbar(s_t), vs_t, pg_t). ``lr=None``
    is rho == 1 (GAE, :func:`gae`): no log-ratio is read, no exp is taken and the third
    output is the GAE advantage vs_t - Vbar(s_t).
    """
    g = d  # the discount that continues the trace (0 past a time-limit truncation)
    if trunc is not None:
        v_next = jnp.where(trunc, tv, v_next)
        g = jnp.where(trunc, jnp.zeros_like(d), d)
    delta = r + d * v_next - v
    if lr is None:
        acc_t = delta + (g * lambda_) * acc
        return acc_t, v + acc_t, acc_t
    rho_c, c, rho_pg = _coefficients(safe_ratios(lr), lambda_, *thresholds)
    acc_t = rho_c * delta + (g * c) * acc
    if thresholds[0] == thresholds[1] == thresholds[2]:
        # rho_pg = rho^c = w and c = lambda w: pg = w (delta + g acc) = acc_t + (1 - lambda) g w acc,
        # which reuses acc_t instead of recomputing delta in the kernel that writes pg; with a
        # static lambda = 1 (IMPALA's default) pg = acc_t, and the step needs 3 kernels, not 5.
        if isinstance(lambda_, float) and lambda_ == 1.0:
            return acc_t, v + acc_t, acc_t
        return acc_t, v + acc_t, acc_t + ((1 - lambda_) * g * rho_c) * acc
    return acc_t, v + acc_t, rho_pg * (delta + g * acc)


def _reverse_loop(lr, d, r, v, bootstrap, trunc, tv, lambda_, thresholds, *, in_place):
    """Reverse loop over time, one [block] row per step, column block after column block.

    Each step reads one row of every input (Vbar(s_{t+1}) straight from ``values``, so the
    carry is only the [block] accumulator) and writes one row of each output with
    ``dynamic_update_slice``. ``in_place=False`` writes into fresh buffers. ``in_place=True``
    carries the ``log_rhos`` and ``rewards`` buffers, reads row t from them and overwrites it
    with (vs_t, pg_t) one iteration later: a row is read before anything writes it and no
    kernel reads one carried buffer while another writes it, so XLA keeps both in place
    (and aliases them to donated inputs). Its last iteration re-reads a clamped row whose
    outputs are discarded.
    """
    num_t, width = v.shape
    bs = _block_size(width)
    num_blocks = width // bs
    total = num_t * num_blocks

    def row(x, t, col):
        return None if x is None else lax.dynamic_slice(x, (t, col), (1, bs))[0]

    def step(i, acc, lr_src, r_src):
        t, col = num_t - 1 - i % num_t, (i // num_t) * bs
        last = t == num_t - 1  # Vbar(s_{t+1}) is the bootstrap; a column block starts
        boot = bootstrap if num_blocks == 1 else lax.dynamic_slice(bootstrap, (col,), (bs,))
        v_next = jnp.where(last, boot, row(v, jnp.minimum(t + 1, num_t - 1), col))
        if num_blocks > 1:
            acc = jnp.where(last, jnp.zeros_like(acc), acc)
        out = _row_step(row(lr_src, t, col), row(r_src, t, col), row(d, t, col), row(v, t, col),
                        v_next, row(trunc, t, col), row(tv, t, col), acc, lambda_, thresholds)
        return (t, col), out

    acc0 = jnp.zeros_like(bootstrap[:bs])  # varying like the inputs under shard_map
    if not in_place:
        def body(i, state):
            vs_buf, pg_buf, acc = state
            at, (acc, vs, pg) = step(i, acc, lr, r)
            return (lax.dynamic_update_slice(vs_buf, vs[None], at),
                    lax.dynamic_update_slice(pg_buf, pg[None], at), acc)

        # Two different fill values: one shared zero buffer would be CSE'd and then copied
        # (a read + write pass over [T, B] before the loop); two fills are write-only.
        vs_buf, pg_buf = jnp.zeros_like(v), jnp.full_like(v, jnp.nan)
        vs, pg, _ = lax.fori_loop(0, total, body, (vs_buf, pg_buf, acc0))
        return vs, pg

    # The carry holds the previous step's accumulator, and its pg row only when pg is not
    # the accumulator itself (lambda = 1, equal clips): vs_{t'} = Vbar(s_{t'}) + acc_{t'} is
    # recomputed inside the kernel that writes it (Vbar's row is still in cache), so no row
    # temporary and no row copy per step (10 -> 8 kernels per step at lambda = 1).
    at0, (acc, _, pg) = step(0, acc0, lr, r)
    pg_is_acc = pg is acc

    def body(i, state):
        a, b, at_prev, acc, pg = state
        vs = row(v, *at_prev) + acc
        a = lax.dynamic_update_slice(a, vs[None], at_prev)
        b = lax.dynamic_update_slice(b, (acc if pg_is_acc else pg)[None], at_prev)
        at, (acc, _, pg) = step(i, acc, a, b)
        return a, b, at, acc, None if pg_is_acc else pg

    init = (lr, r, at0, acc, None if pg_is_acc else pg)
    a, b, *_ = lax.fori_loop(1, total + 1, body, init)
    return a, b


def _deltas(log_rhos, discounts, rewards, values, bootstrap_value, truncations,
            truncation_values, lambda_, thresholds):
    """Full-array pieces of the recurrence y_t = x_t + a_t y_{t+1} (y = vs - Vbar).

    x = rho^c delta, a = gamma c (0 at a truncation), and for the policy-gradient advantage
    pg_t = rho_pg (delta_t + g_t y_{t+1}) with g = gamma (0 at a truncation).
    """
    rho = safe_ratios(log_rhos)
    rho_c, c, rho_pg = _coefficients(rho, lambda_, *thresholds)
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    g = discounts
    if truncations is not None:
        next_values = jnp.where(truncations, truncation_values, next_values)
        g = jnp.where(truncations, jnp.zeros_like(discounts), discounts)
    delta = rewards + discounts * next_values - values
    return rho_c * delta, g * c, delta, g, rho_pg


def _shift_up(y):
    """y_{t+1} with y_T = 0."""
    return jnp.concatenate([y[1:], jnp.zeros_like(y[:1])], axis=0)


def _finish(values, y, delta, g, rho_pg):
    return values + y, rho_pg * (delta + g * _shift_up(y))


def _horner(x, a, n_steps):
    """Exact n-step truncation of y_t = x_t + a_t y_{t+1}: n - 1 shifted multiply-adds."""
    return lax.fori_loop(0, n_steps - 1, lambda _, y: x + a * _shift_up(y), x)


def _affine_compose(later, earlier):
    """(a, x) pairs of y -> x + a y; returns earlier o later."""
    a_l, x_l = later
    a_e, x_e = earlier
    return a_e * a_l, x_e + a_e * x_l


# ----------------------------------------------------------------------------- cores


def _core(log_rhos, discounts, rewards, values, bootstrap_value, truncations,
          truncation_values, lambda_, *, lambda_static, thresholds, n_steps,
          stop_target_gradients, method):
    """``lambda_static`` (a float, or None to use the traced ``lambda_``) is static when the
    caller passed a concrete lambda, so constants fold (and lambda = 1 takes a shortcut)."""
    num_t = values.shape[0]
    batch_shape = values.shape[1:]
    floats = (discounts, rewards, values, bootstrap_value)
    dtype = jnp.result_type(*floats, *(() if log_rhos is None else (log_rhos,)))
    if lambda_static is not None:
        lambda_ = lambda_static
    else:
        lambda_ = jnp.asarray(lambda_, dtype)
    if stop_target_gradients:  # no gradient path at all, rather than zeroing one at the end
        sg = lax.stop_gradient
        discounts, rewards, values, bootstrap_value = map(sg, floats)
        log_rhos = None if log_rhos is None else sg(log_rhos)
        if lambda_static is None:
            lambda_ = sg(lambda_)
        if truncation_values is not None:
            truncation_values = sg(truncation_values)
    width = math.prod(batch_shape)

    def flat(x, kind=None):
        return None if x is None else x.reshape(num_t, width).astype(kind or dtype)

    lr, d, r, v = (flat(x) for x in (log_rhos, discounts, rewards, values))
    trunc, tv = flat(truncations, jnp.bool_), flat(truncation_values)
    bv = bootstrap_value.reshape(width).astype(dtype)

    if n_steps is not None and n_steps < num_t:
        x, a, delta, g, rho_pg = _deltas(lr, d, r, v, bv, trunc, tv, lambda_, thresholds)
        vs, pg = _finish(v, _horner(x, a, n_steps), delta, g, rho_pg)
    elif method == "associative":
        x, a, delta, g, rho_pg = _deltas(lr, d, r, v, bv, trunc, tv, lambda_, thresholds)
        _, y = lax.associative_scan(_affine_compose, (a, x), reverse=True, axis=0)
        vs, pg = _finish(v, y, delta, g, rho_pg)
    else:
        vs, pg = _reverse_loop(lr, d, r, v, bv, trunc, tv, lambda_, thresholds,
                               in_place=method == "in_place")

    vs = vs.reshape(values.shape)
    pg = pg.reshape(values.shape)
    if stop_target_gradients:
        vs, pg = lax.stop_gradient(vs), lax.stop_gradient(pg)
    return VTraceOutput(vs=vs, pg_advantages=pg)


_STATIC = ("lambda_static", "thresholds", "n_steps", "stop_target_gradients", "method")
_core_jit = jax.jit(_core, static_argnames=_STATIC)
# log_rhos (arg 0) and rewards (arg 2) are donated; jax pairs them in order with the
# outputs (vs, pg_advantages), which the in-place loop writes into exactly those buffers.
_core_donating = jax.jit(_core, static_argnames=_STATIC, donate_argnums=(0, 2))


def _call(core, method, log_rhos, discounts, rewards, values, bootstrap_value, *, lambda_,
          clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, truncations,
          truncation_values, n_steps, stop_target_gradients):
    thresholds, n_steps = _validate(
        log_rhos, discounts, rewards, values, bootstrap_value, lambda_, clip_rho_threshold,
        clip_c_threshold, clip_pg_rho_threshold, truncations, truncation_values, n_steps)
    lambda_static = None
    if checks.is_concrete(lambda_):
        lambda_static, lambda_ = float(lambda_), None
    if method == "auto":  # shapes are valid now
        shape = np.shape(values)
        method = scan_method(jax.default_backend(), shape[0], math.prod(shape[1:]))
    return core(log_rhos, discounts, rewards, values, bootstrap_value, truncations,
                truncation_values, lambda_, lambda_static=lambda_static, thresholds=thresholds,
                n_steps=n_steps, stop_target_gradients=bool(stop_target_gradients),
                method=method)


# ----------------------------------------------------------------------------- public API


def vtrace(
    log_rhos: Array,
    discounts: Array,
    rewards: Array,
    values: Array,
    bootstrap_value: Array,
    *,
    lambda_=1.0,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    truncations: Optional[Array] = None,
    truncation_values: Optional[Array] = None,
    n_steps: Optional[int] = None,
    stop_target_gradients: bool = True,
) -> VTraceOutput:
    """V-trace targets and policy-gradient advantages, Eq 11, by a reverse scan over time.

    Args:
      log_rhos: [T, ...] log pi(a_t|s_t) - log mu(a_t|s_t).
      discounts: [T, ...] gamma * (1 - terminal_{t+1}), in [0, 1] (0 cuts the trace).
      rewards: [T, ...] r_t.
      values: [T, ...] Vbar(s_t).
      bootstrap_value: [...] Vbar(s_T).
      lambda_: scalar in [0, 1] (may be traced).
      clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold: rhobar, cbar and the
        policy-gradient clip, positive static numbers, or None for no truncation.
      truncations: optional bool [T, ...]: episode cut by a time limit after step t.
      truncation_values: [T, ...] Vbar(final observation), used where ``truncations``.
      n_steps: optional static int >= 1 bounding the correction horizon of Eq 11.
      stop_target_gradients: stop gradients through ``vs`` and ``pg_advantages``.

    Returns:
      ``VTraceOutput(vs, pg_advantages)``, both [T, ...] in the inputs' float dtype.

    Raises:
      ValueError naming the argument for mismatched shapes, an empty time axis (T = 0) or
      batch, a wrong-rank bootstrap_value, non-positive thresholds, an invalid n_steps, and (concrete arguments only) discounts
      or lambda_ outside [0, 1].
    """
    return _call(_core_jit, "auto", log_rhos, discounts, rewards, values, bootstrap_value,
                 lambda_=lambda_, clip_rho_threshold=clip_rho_threshold,
                 clip_c_threshold=clip_c_threshold,
                 clip_pg_rho_threshold=clip_pg_rho_threshold, truncations=truncations,
                 truncation_values=truncation_values, n_steps=n_steps,
                 stop_target_gradients=stop_target_gradients)


def vtrace_associative(
    log_rhos: Array,
    discounts: Array,
    rewards: Array,
    values: Array,
    bootstrap_value: Array,
    *,
    lambda_=1.0,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    truncations: Optional[Array] = None,
    truncation_values: Optional[Array] = None,
    n_steps: Optional[int] = None,
    stop_target_gradients: bool = True,
) -> VTraceOutput:
    """Same contract as :func:`vtrace` (Eq 11), via ``lax.associative_scan``.

    The recurrence vs_t - Vbar(s_t) = x_t + a_t (vs_{t+1} - Vbar(s_{t+1})), x = rho^c delta,
    a = gamma c (0 at a truncation), is a composition of affine maps, which is associative:
    log2(T) parallel passes instead of T sequential steps.
    """
    return _call(_core_jit, "associative", log_rhos, discounts, rewards, values,
                 bootstrap_value, lambda_=lambda_, clip_rho_threshold=clip_rho_threshold,
                 clip_c_threshold=clip_c_threshold,
                 clip_pg_rho_threshold=clip_pg_rho_threshold, truncations=truncations,
                 truncation_values=truncation_values, n_steps=n_steps,
                 stop_target_gradients=stop_target_gradients)


def vtrace_inplace(
    log_rhos: Array,
    discounts: Array,
    rewards: Array,
    values: Array,
    bootstrap_value: Array,
    *,
    lambda_=1.0,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    truncations: Optional[Array] = None,
    truncation_values: Optional[Array] = None,
    n_steps: Optional[int] = None,
    stop_target_gradients: bool = True,
) -> VTraceOutput:
    """:func:`vtrace` computed in place, jitted with ``log_rhos`` and ``rewards`` donated.

    Their buffers are reused for ``vs`` and ``pg_advantages`` (same shape and dtype), so no
    output memory is allocated; both input arrays are invalid after the call. Use it at
    large sizes when those arrays are dead afterwards. Inside your own ``jit`` the inner
    donation does not apply: donate ``log_rhos`` and ``rewards`` to your ``jit`` (in that
    order relative to other same-shaped donated arguments) and XLA aliases them the same
    way. With ``n_steps < T`` the result is correct but not computed in place.
    """
    return _call(_core_donating, "in_place", log_rhos, discounts, rewards, values,
                 bootstrap_value, lambda_=lambda_, clip_rho_threshold=clip_rho_threshold,
                 clip_c_threshold=clip_c_threshold,
                 clip_pg_rho_threshold=clip_pg_rho_threshold, truncations=truncations,
                 truncation_values=truncation_values, n_steps=n_steps,
                 stop_target_gradients=stop_target_gradients)


def gae(
    discounts: Array,
    rewards: Array,
    values: Array,
    bootstrap_value: Array,
    *,
    lambda_=0.95,
    truncations: Optional[Array] = None,
    truncation_values: Optional[Array] = None,
    stop_target_gradients: bool = True,
) -> GAEOutput:
    """GAE(gamma, lambda) advantages and lambda-returns: Eq 11 with rho == 1, in one pass.

    A_t = delta_t + gamma_t lambda A_{t+1} (A_T = 0), returns_t = Vbar(s_t) + A_t, with the
    termination / truncation conventions of :func:`vtrace`. Equal to ``vtrace`` with
    ``log_rhos = 0`` (``returns`` = its ``vs``, ``advantages`` = ``vs - values``), but the
    loop reads no log-ratio array and takes no exp: 20 bytes per float32 transition.
    Arguments as :func:`vtrace` (no log-ratios, clips or ``n_steps``).
    """
    _validate(_RHO_ONE, discounts, rewards, values, bootstrap_value, lambda_, None, None,
              None, truncations, truncation_values, None)
    lambda_static = None
    if checks.is_concrete(lambda_):
        lambda_static, lambda_ = float(lambda_), None
    out = _core_jit(None, discounts, rewards, values, bootstrap_value, truncations,
                    truncation_values, lambda_, lambda_static=lambda_static,
                    thresholds=(None, None, None), n_steps=None,
                    stop_target_gradients=bool(stop_target_gradients), method="scan")
    return GAEOutput(returns=out.vs, advantages=out.pg_advantages)


__all__ = ["VTraceOutput", "GAEOutput", "vtrace", "vtrace_associative", "vtrace_inplace", "gae",
           "scan_method", "ASSOCIATIVE_WINS", "MAX_LOG_RHO"]
