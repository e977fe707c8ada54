"""``vccc bench estimators``: V-trace throughput against rlax, measured in the same process.

Prints, for each (T, B), million transitions per second of

* ours      ``vccc_jax.estimators.vtrace.vtrace`` (jitted; fresh output buffers)
* inplace   ``vtrace_inplace`` (``log_rhos`` / ``rewards`` donated and reused for the outputs)
* assoc     ``vtrace_associative``
* rlax-BM   ``jax.vmap(rlax.vtrace)`` over batch-major [B, T] arrays (how its users call it)
* rlax-TM   ``jax.vmap(rlax.vtrace, in_axes=1, out_axes=1)`` over our time-major [T, B] data

all on the same inputs and with the same settings (lambda = 1, rhobar = cbar = 1; rlax's
trace clip is fixed at 1). The rlax callers include what a user must do to feed it from
log-ratios (``exp``, building ``v_t`` from ``values[1:]`` and the bootstrap). Note that
``rlax.vtrace`` returns only the value errors, while ours also returns the policy-gradient
advantages, i.e. ours writes twice as much.

Memory-bandwidth ceiling: a large jitted, donated, in-place ``x * a + b`` measured in the
same run (bytes read + written / time). A V-trace transition needs at least 24 bytes of
traffic in float32 (log_rhos, discounts, rewards, values in; vs, pg_advantages out), so the
ceiling in transitions/s is bandwidth / 24; the ``%ceil`` columns are our throughput as a
fraction of it.

Timing: everything is compiled and run once before timing; each measurement blocks until
ready; functions are timed round-robin (so background load hits all alike) and the median
of ``--reps`` repetitions is reported. Donated inputs are re-made before each timed call,
outside the timer.

Run: ``vccc bench estimators [--quick] [--reps N] [--sizes T,B T,B ...]`` (flags and printing
live in :mod:`vccc_jax.commands.bench`; this module returns rows and strings only).
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.vtrace import vtrace, vtrace_associative, vtrace_inplace

FULL_SIZES = ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))
QUICK_SIZES = ((128, 1024), (64, 16384))
BYTES_PER_TRANSITION = 24  # float32: 4 arrays in, 2 out

# Targets from the issue: speed-up at (128, 4096) and fraction of the ceiling at (512, 65536).
TARGET_VS_RLAX_BM = 2.0
TARGET_VS_RLAX_TM = 1.2
TARGET_CEILING_FRACTION = 0.30


def make_inputs(num_t: int, batch: int, seed: int = 0):
    """Time-major float32 inputs: log-ratios ~ N(0, 0.5^2), ~1% episode ends (gamma 0.99)."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 0.5, (num_t, batch)).astype(np.float32)
    discounts = (0.99 * (rng.random((num_t, batch)) > 0.01)).astype(np.float32)
    rewards = rng.normal(size=(num_t, batch)).astype(np.float32)
    values = rng.normal(size=(num_t, batch)).astype(np.float32)
    bootstrap = rng.normal(size=(batch,)).astype(np.float32)
    return tuple(jnp.asarray(x) for x in (log_rhos, discounts, rewards, values, bootstrap))


def load_rlax():
    """The optional reference library ``rlax``, or None when it is not installed."""
    try:
        import rlax  # noqa: PLC0415  (optional dependency: pip install vccc_jax[bench])

        return rlax
    except ImportError:
        return None


def build_functions(rlax):
    """name -> (jitted fn, layout, donates). Layout 'tm' = [T, B] inputs, 'bm' = [B, T]."""
    fns = {
        "ours": (jax.jit(vtrace), "tm", False),
        # Inside a jit (as in a training step) the arrays are tracers, so the API-boundary
        # value checks are skipped; donation is then the outer jit's, as a user would write.
        "inplace": (jax.jit(vtrace_inplace, donate_argnums=(0, 2)), "tm", True),
        "assoc": (jax.jit(vtrace_associative), "tm", False),
    }
    if rlax is not None:

        @jax.jit
        def rlax_bm(log_rhos, discounts, rewards, values, bootstrap):  # [B, T], [B]
            v_t = jnp.concatenate([values[:, 1:], bootstrap[:, None]], axis=1)
            return jax.vmap(rlax.vtrace)(values, v_t, rewards, discounts, jnp.exp(log_rhos))

        @jax.jit
        def rlax_tm(log_rhos, discounts, rewards, values, bootstrap):  # [T, B], [B]
            v_t = jnp.concatenate([values[1:], bootstrap[None]], axis=0)
            return jax.vmap(rlax.vtrace, in_axes=1, out_axes=1)(
                values, v_t, rewards, discounts, jnp.exp(log_rhos))

        fns["rlax-BM"] = (rlax_bm, "bm", False)
        fns["rlax-TM"] = (rlax_tm, "tm", False)
    return fns


def measure_ceiling(num_bytes: int, reps: int) -> float:
    """Bandwidth (bytes/s) of a donated in-place ``x * a + b`` over ``num_bytes`` of float32."""
    update = jax.jit(lambda x: x * 1.0000001 + 1e-7, donate_argnums=0)
    x = jnp.zeros((num_bytes // 4,), jnp.float32)
    x = update(x).block_until_ready()  # compile + touch the pages
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = update(x)
        x.block_until_ready()
        times.append(time.perf_counter() - t0)
    del x
    return 2 * num_bytes / float(np.median(times))


def _check_agreement(fns, tm_args, bm_args):
    """Sanity: our vs - values equals rlax's errors; scan and associative variants agree."""
    ours = fns["ours"][0](*tm_args)
    assoc = fns["assoc"][0](*tm_args)
    np.testing.assert_allclose(np.asarray(ours.vs), np.asarray(assoc.vs), rtol=1e-4, atol=1e-4)
    if "rlax-TM" in fns:
        err_tm = fns["rlax-TM"][0](*tm_args)
        err_bm = fns["rlax-BM"][0](*bm_args)
        mine = np.asarray(ours.vs) - np.asarray(tm_args[3])
        np.testing.assert_allclose(mine, np.asarray(err_tm), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(mine, np.asarray(err_bm).T, rtol=1e-4, atol=1e-4)


def bench_size(fns, num_t: int, batch: int, reps: int) -> dict:
    """Million transitions/s of every function at one (T, B): ``{name: M/s}``."""
    tm_args = make_inputs(num_t, batch)
    bm_args = None
    if any(layout == "bm" for _, layout, _ in fns.values()):
        bm_args = tuple(jnp.asarray(np.ascontiguousarray(np.asarray(a).T)) for a in tm_args)
    _check_agreement(fns, tm_args, bm_args)

    def args_for(layout, donates):
        args = bm_args if layout == "bm" else tm_args
        if donates:  # fresh copies of the donated arrays (log_rhos, rewards), made untimed
            args = (args[0].copy(), args[1], args[2].copy()) + args[3:]
            jax.block_until_ready(args)
        return args

    for fn, layout, donates in fns.values():  # compile and warm up
        jax.block_until_ready(fn(*args_for(layout, donates)))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, (fn, layout, donates) in fns.items():
            args = args_for(layout, donates)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
            del args
    return {name: num_t * batch / float(np.median(ts)) / 1e6 for name, ts in times.items()}


def settings(quick: bool = False, reps: Optional[int] = None,
             sizes: Optional[Sequence[tuple]] = None, ceiling_mib: Optional[int] = None):
    """(sizes, reps, ceiling MiB) with the defaults of the quick / full runs filled in."""
    sizes = tuple(tuple(s) for s in sizes) if sizes else (QUICK_SIZES if quick else FULL_SIZES)
    reps = reps or (5 if quick else 9)
    ceiling_mib = ceiling_mib or (64 if quick else 512)
    return sizes, reps, ceiling_mib


def header(reps: int, have_rlax: bool) -> str:
    """The lines printed before any measurement (platform, load average at start)."""
    lines = [f"V-trace throughput, million transitions/s (median of {reps}); "
             f"jax {jax.__version__} on {jax.devices()[0].platform} "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f} at start)"]
    if not have_rlax:
        lines.append("rlax is not installed (pip install 'vccc_jax[bench]'): reference columns skipped")
    return "\n".join(lines)


def ceiling_line(ceiling: float, ceiling_mib: int) -> str:
    return (f"bandwidth ceiling (in-place donated update of {ceiling_mib} MiB): "
            f"{ceiling / 1e9:.1f} GB/s = {ceiling / BYTES_PER_TRANSITION / 1e6:.0f} M transitions/s at "
            f"{BYTES_PER_TRANSITION} B/transition")


def run_sizes(fns, sizes: Sequence[tuple], reps: int,
              progress: Optional[Callable[[str], None]] = None) -> list[dict]:
    """One row per (T, B): ``{"T", "B", name: M transitions/s for every function}``.
    ``progress`` (if given) receives a line after each size."""
    rows = []
    for num_t, batch in sizes:
        rows.append({"T": num_t, "B": batch, **bench_size(fns, num_t, batch, reps)})
        if progress is not None:
            progress(f"  done T={num_t} B={batch}")
    return rows


def format_table(rows: Sequence[dict], names: Sequence[str], ceiling_mts: float) -> str:
    """Throughputs, ratios to rlax and fractions of the bandwidth ceiling, right-aligned."""
    head = ["T", "B"] + [f"{n} M/s" for n in names]
    have_rlax = "rlax-BM" in names
    if have_rlax:
        head += ["ours/BM", "ours/TM", "inpl/BM", "inpl/TM"]
    head += ["ours %ceil", "inpl %ceil"]
    lines = []
    for r in rows:
        cells = [str(r["T"]), str(r["B"])] + [f"{r[n]:.0f}" for n in names]
        if have_rlax:
            cells += [f"{r['ours'] / r['rlax-BM']:.2f}x", f"{r['ours'] / r['rlax-TM']:.2f}x",
                      f"{r['inplace'] / r['rlax-BM']:.2f}x", f"{r['inplace'] / r['rlax-TM']:.2f}x"]
        cells += [f"{100 * r['ours'] / ceiling_mts:.0f}%", f"{100 * r['inplace'] / ceiling_mts:.0f}%"]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in lines]
    return "\n".join(out)


def footer(rows: Sequence[dict], ceiling_mts: float, have_rlax: bool) -> str:
    """Load average at the end and the issue's targets, for the sizes that were run."""
    lines = [f"load average at end: {os.getloadavg()[0]:.1f} (other processes share the CPUs)"]
    by_size = {(r["T"], r["B"]): r for r in rows}
    if have_rlax and (128, 4096) in by_size:
        r = by_size[(128, 4096)]
        lines.append(f"target ours >= {TARGET_VS_RLAX_BM}x rlax-BM at (128, 4096): "
                     f"{r['ours'] / r['rlax-BM']:.2f}x; >= {TARGET_VS_RLAX_TM}x rlax-TM: "
                     f"{r['ours'] / r['rlax-TM']:.2f}x")
    if (512, 65536) in by_size:
        r = by_size[(512, 65536)]
        lines.append(f"target >= {TARGET_CEILING_FRACTION:.0%} of the ceiling at (512, 65536): "
                     f"ours {r['ours'] / ceiling_mts:.0%}, inplace {r['inplace'] / ceiling_mts:.0%}")
    return "\n".join(lines)
