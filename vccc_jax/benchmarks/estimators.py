"""``vccc bench estimators``: V-trace, GAE and the one-step critic targets against rlax and a
memory-bandwidth ceiling, all measured in the same process.

V-trace table, million transitions/s of

* ours      ``vccc_jax.estimators.vtrace.vtrace`` (jitted; fresh output buffers)
* inplace   ``vtrace_inplace`` (``log_rhos`` / ``rewards`` donated and reused for the outputs)
* assoc     ``vtrace_associative``
* rlax-BM   ``jax.vmap(rlax.vtrace)`` over batch-major [B, T] arrays (how its users call it)
* rlax-TM   ``jax.vmap(rlax.vtrace, in_axes=1, out_axes=1)`` over our time-major [T, B] data
* stream    a bound, not an estimator: ``(lr * d, r + v)``, the same four [T, B]
            inputs and two fresh [T, B] outputs with no recursion and no exp. No function
            that allocates its outputs can beat it here; ``ours/stream`` is how close we get.

all on the same inputs and with the same settings (lambda = 1, rhobar = cbar = 1; rlax's
trace clip is fixed at 1). The rlax callers include what a user must do to feed it from
log-ratios (``exp``, building ``v_t`` from ``values[1:]`` and the bootstrap). ``rlax.vtrace``
returns only the value errors, while ours also returns the policy-gradient advantages, i.e.
ours writes twice as much.

Targets table: the one-step targets (``vccc_target`` as IW-TD, Eq 8, and with a baseline,
Eq 4; ``clipped_target``, Eq 10; ``centered_clipped_target``, Sec 4.2) and ``gae`` (Eq 11
with rho = 1), each with its own minimum traffic (logged arrays read once, the outputs written
once), against ``vtrace`` with zero log-ratios (how GAE was computed before ``gae``) and
``rlax.truncated_generalized_advantage_estimation`` vmapped over time-major data.

Memory-bandwidth ceiling: a large jitted, donated, in-place ``x * a + b`` (bytes read + written
/ time), measured once at the start and again inside every size's round-robin (``ceil GB/s``:
each row's ``%ceil`` uses its own, timed between its functions). A V-trace transition needs at least 6 arrays of traffic (4
in, 2 out: 24 bytes in float32, 48 in float64), so the ceiling in transitions/s is the
bandwidth over that; the ``%ceil`` columns are a throughput as a fraction of it.

Timing: everything is compiled and run once before timing; each measurement blocks until
ready; functions are timed round-robin (so background load hits all alike) and the median
of ``--reps`` repetitions is reported. Donated inputs are re-made before each timed call,
outside the timer. ``--dtypes float32,float64`` runs every table in both precisions (float64
inside a ``jax.enable_x64`` scope). ``--crossover`` times ``vtrace`` (the sequential loop)
against ``vtrace_associative`` over a (T, B) grid: the measurement behind
``vtrace.ASSOCIATIVE_WINS``.

Process settings (docs/scaling.md, "V-trace and GAE on a CPU host"): the header names the
host allocator (``train.host_malloc.describe``); ``--tuned-malloc`` applies
``keep_freed_memory`` before JAX starts, so large fresh outputs stop being page-faulted in
on every call (the default allocator and the tuned one are two runs: the setting holds for a
whole process). ``--host-devices N`` forces N host CPU devices and adds the rows
``ours-Ndev`` / ``inpl-Ndev``: the same functions with the batch split over the N devices
(:func:`shard_batch`, one loop per device on its own thread), in the same round-robin as
the single-device rows, with their ratio to them.

Run: ``vccc bench estimators [--quick] [--reps N] [--sizes T,B ...] [--dtypes ...]
[--crossover] [--tuned-malloc] [--host-devices N]`` (flags and printing live in
:mod:`vccc_jax.commands.bench`; this module returns rows and strings only).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.critic_targets import (
    centered_clipped_target,
    clipped_target,
    vccc_target,
)
from vccc_jax.estimators.vtrace import gae, vtrace, vtrace_associative, vtrace_inplace
from vccc_jax.train import host_malloc

FULL_SIZES = ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))
QUICK_SIZES = ((128, 1024), (64, 16384))
CROSSOVER_T = (32, 128, 1024, 4096)
CROSSOVER_B = (1, 4, 16, 64, 256, 1024, 4096)
CROSSOVER_MAX = 2**22  # transitions per grid cell
ARRAYS_PER_TRANSITION = 6  # V-trace: 4 arrays in, 2 out
BYTES_PER_TRANSITION = 4 * ARRAYS_PER_TRANSITION  # float32
GAE_LAMBDA = 0.95

# The targets (issue 46): at every size the allocating function >= 50% of the
# ceiling and the in-place one >= 60%; at (128, 4096) >= 4x rlax batch-major, 2x time-major.
TARGET_OURS_CEILING = 0.50
TARGET_INPLACE_CEILING = 0.60
TARGET_VS_RLAX_BM = 4.0
TARGET_VS_RLAX_TM = 2.0
TARGET_SIZE = (128, 4096)


def bytes_per_transition(dtype=np.float32, arrays: int = ARRAYS_PER_TRANSITION) -> int:
    return arrays * np.dtype(dtype).itemsize


def precision(dtype):
    """The context in which ``dtype`` arrays exist (float64 needs ``jax.enable_x64``)."""
    if np.dtype(dtype) == np.float64:
        return jax.enable_x64(True)
    return contextlib.nullcontext()


def make_inputs(num_t: int, batch: int, seed: int = 0, dtype=np.float32):
    """Time-major inputs: log-ratios ~ N(0, 0.5^2), ~1% episode ends (gamma 0.99)."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 0.5, (num_t, batch))
    discounts = 0.99 * (rng.random((num_t, batch)) > 0.01)
    rewards = rng.normal(size=(num_t, batch))
    values = rng.normal(size=(num_t, batch))
    bootstrap = rng.normal(size=(batch,))
    return tuple(jnp.asarray(x.astype(dtype))
                 for x in (log_rhos, discounts, rewards, values, bootstrap))


def load_rlax():
    """The optional reference library ``rlax``, or None when it is not installed."""
    try:
        import rlax  # noqa: PLC0415  (optional dependency: pip install vccc_jax[bench])

        return rlax
    except ImportError:
        return None


def _stream(log_rhos, discounts, rewards, values, bootstrap):
    """The bound: V-trace's inputs and fresh outputs, no recursion (module docstring). Each
    output reads two inputs that the other does not, so XLA's two kernels read every input
    once: exactly V-trace's 6 arrays of traffic."""
    return log_rhos * discounts, rewards + values


def build_functions(rlax, host_devices: int = 1):
    """name -> (jitted fn, layout, donates). Layout 'tm' = [T, B] inputs, 'bm' = [B, T],
    'split:N' = [T, B] with B split over N = ``host_devices`` devices (rows ``ours-Ndev``,
    ``inpl-Ndev``: :func:`shard_batch` of ``vtrace`` / ``vtrace_inplace``)."""
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
    fns["stream"] = (jax.jit(_stream), "tm", False)
    if host_devices > 1:
        split = f"split:{host_devices}"
        fns[f"ours-{host_devices}dev"] = (jax.jit(shard_batch(vtrace, host_devices)), split,
                                          False)
        fns[f"inpl-{host_devices}dev"] = (jax.jit(shard_batch(vtrace_inplace, host_devices),
                                                  donate_argnums=(0, 2)), split, True)
    return fns


def shard_batch(fn, host_devices: int):
    """``fn`` of V-trace's five time-major inputs with the batch axis split over the first
    ``host_devices`` devices (``shard_map``): one loop per device, each on its own thread.
    Feed it arrays placed by :func:`batch_sharding` (others are resharded inside the call)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:host_devices]), ("b",))
    tb, b = jax.sharding.PartitionSpec(None, "b"), jax.sharding.PartitionSpec("b")
    return jax.shard_map(fn, mesh=mesh, in_specs=(tb,) * 4 + (b,), out_specs=tb)


def batch_sharding(x, host_devices: int):
    """``x`` ([T, B] or [B]) placed with its batch axis split over ``host_devices`` devices."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:host_devices]), ("b",))
    spec = jax.sharding.PartitionSpec(*([None] * (x.ndim - 1)), "b")
    return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def build_target_functions(rlax):
    """name -> (jitted fn of the V-trace inputs, arrays of traffic per transition).

    One-step targets get ``next_values`` as a logged array (as ``Transitions`` carries it),
    a baseline b = 0.5 Vbar and Z = 0.9 (array inputs made outside the timer would cost the
    same; these are fused constants of the inputs, so the traffic counted is what is read).
    """
    def one_step(fn, **kw):
        def call(lr, d, r, v, vn):
            return fn(r, d, v, vn, lr, **kw)
        return jax.jit(call)

    fns = {
        "iw-td": (one_step(vccc_target), 6),  # r, d, v, v', log_rho in; Y out
        "clipped": (one_step(clipped_target, clip=1.0), 6),
        "vccc-b": (jax.jit(lambda lr, d, r, v, vn, b: vccc_target(r, d, v, vn, lr, b)), 7),
        "centered": (jax.jit(lambda lr, d, r, v, vn, b, z: centered_clipped_target(
            r, d, v, vn, lr, b, z, clip=1.0)), 8),
        "gae": (jax.jit(lambda d, r, v, bv: gae(d, r, v, bv, lambda_=GAE_LAMBDA)), 5),
        "gae-via-vtrace": (jax.jit(lambda d, r, v, bv: vtrace(
            jnp.zeros_like(v), d, r, v, bv, lambda_=GAE_LAMBDA, clip_rho_threshold=None,
            clip_c_threshold=None, clip_pg_rho_threshold=None)), 5),
    }
    if rlax is not None:

        @jax.jit
        def rlax_gae(d, r, v, bv):  # time-major, advantages + returns as ours
            values = jnp.concatenate([v, bv[None]], axis=0)
            adv = jax.vmap(rlax.truncated_generalized_advantage_estimation,
                           in_axes=(1, 1, None, 1), out_axes=1)(r, d, GAE_LAMBDA, values)
            return adv, adv + v

        fns["rlax-gae"] = (rlax_gae, 5)
    return fns


def _target_args(name, tm_args):
    lr, d, r, v, bv = tm_args
    if name.startswith("gae") or name == "rlax-gae":
        return (d, r, v, bv)
    vn = jnp.concatenate([v[1:], bv[None]], axis=0)
    extra = {"vccc-b": (0.5 * v,), "centered": (0.5 * v, jnp.full_like(v, 0.9))}
    return (lr, d, r, v, vn) + extra.get(name, ())


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


class Ceiling:
    """The ceiling kernel as one more function of the round-robin: each call is the donated
    in-place ``x * a + b`` of :func:`measure_ceiling` over ``num_bytes`` of float32, so every
    row gets its own ceiling, timed between its own functions (the load moves during a run,
    and it slows this two-core kernel more than the one-core loops)."""

    def __init__(self, num_bytes: int):
        self.num_bytes = num_bytes
        self._update = jax.jit(lambda x: x * 1.0000001 + 1e-7, donate_argnums=0)
        self._x = self._update(jnp.zeros((num_bytes // 4,), jnp.float32))

    def __call__(self):
        self._x = self._update(self._x)
        return self._x

    def gbs(self, seconds: float) -> float:
        return 2 * self.num_bytes / seconds / 1e9


def row_ceiling_mts(row: dict, ceiling_mts: float, dtype=np.float32) -> float:
    """The row's own ceiling (M transitions/s) when it has one, else the run's."""
    if "ceiling_gbs" in row:
        return row["ceiling_gbs"] * 1e9 / bytes_per_transition(dtype) / 1e6
    return ceiling_mts


def _check_agreement(fns, tm_args, bm_args):
    """Sanity: our vs - values equals rlax's errors; scan and associative variants agree."""
    tol = dict(rtol=1e-4, atol=1e-4)
    ours = fns["ours"][0](*tm_args)
    assoc = fns["assoc"][0](*tm_args)
    np.testing.assert_allclose(np.asarray(ours.vs), np.asarray(assoc.vs), **tol)
    if "rlax-TM" in fns:
        err_tm = fns["rlax-TM"][0](*tm_args)
        err_bm = fns["rlax-BM"][0](*bm_args)
        mine = np.asarray(ours.vs) - np.asarray(tm_args[3])
        np.testing.assert_allclose(mine, np.asarray(err_tm), **tol)
        np.testing.assert_allclose(mine, np.asarray(err_bm).T, **tol)


def _time_round_robin(calls: dict, reps: int) -> dict:
    """calls: name -> (fn, make_args). Median seconds per name over ``reps`` rounds."""
    for fn, make in calls.values():  # compile and warm up
        jax.block_until_ready(fn(*make()))
    times = {name: [] for name in calls}
    for _ in range(reps):
        for name, (fn, make) in calls.items():
            args = make()
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
            del args
    return {name: float(np.median(ts)) for name, ts in times.items()}


def bench_size(fns, num_t: int, batch: int, reps: int, dtype=np.float32,
               ceiling: Optional[Ceiling] = None) -> dict:
    """Million transitions/s of every function at one (T, B): ``{name: M/s}``, and with a
    ``ceiling`` its GB/s timed in the same round-robin under ``"ceiling_gbs"``."""
    tm_args = make_inputs(num_t, batch, dtype=dtype)
    layouts = {"tm": tm_args}
    if any(layout == "bm" for _, layout, _ in fns.values()):
        layouts["bm"] = tuple(jnp.asarray(np.ascontiguousarray(np.asarray(a).T))
                              for a in tm_args)
    _check_agreement(fns, tm_args, layouts.get("bm"))
    split = {name: layout for name, (_, layout, _) in fns.items() if layout.startswith("split:")}
    if split:  # the same loop on each device's columns: bit for bit the one-device result
        ref = np.asarray(fns["ours"][0](*tm_args).vs)
    for name, layout in split.items():  # layout "split:N": the batch over N devices
        layouts.setdefault(layout, tuple(batch_sharding(a, int(layout[6:])) for a in tm_args))
        out = fns[name][0](*(a.copy() for a in layouts[layout]))
        np.testing.assert_array_equal(np.asarray(out.vs), ref)

    def maker(layout, donates):
        def make():
            args = layouts[layout]
            if donates:  # fresh copies of the donated arrays (log_rhos, rewards), made untimed
                args = (args[0].copy(), args[1], args[2].copy()) + args[3:]
                jax.block_until_ready(args)
            return args
        return make

    calls = {name: (fn, maker(layout, donates)) for name, (fn, layout, donates) in fns.items()}
    if ceiling is not None:
        calls["ceiling"] = (ceiling, tuple)
    secs = _time_round_robin(calls, reps)
    row = {name: num_t * batch / s / 1e6 for name, s in secs.items() if name != "ceiling"}
    if ceiling is not None:
        row["ceiling_gbs"] = ceiling.gbs(secs["ceiling"])
    return row


def bench_targets(tfns, num_t: int, batch: int, reps: int, dtype=np.float32) -> dict:
    """Million transitions/s of every target function at one (T, B): ``{name: M/s}``."""
    tm_args = make_inputs(num_t, batch, dtype=dtype)
    ours, ref = tfns["gae"][0](*tm_args[1:]), tfns["gae-via-vtrace"][0](*tm_args[1:])
    np.testing.assert_allclose(np.asarray(ours.returns), np.asarray(ref.vs), rtol=1e-4, atol=1e-4)
    if "rlax-gae" in tfns:
        adv, _ = tfns["rlax-gae"][0](*tm_args[1:])
        np.testing.assert_allclose(np.asarray(ours.advantages), np.asarray(adv), rtol=1e-4,
                                   atol=1e-4)
    calls = {}
    for name, (fn, _) in tfns.items():
        args = _target_args(name, tm_args)
        jax.block_until_ready(args)
        calls[name] = (fn, lambda args=args: args)
    secs = _time_round_robin(calls, reps)
    return {name: num_t * batch / s / 1e6 for name, s in secs.items()}


def settings(quick: bool = False, reps: Optional[int] = None,
             sizes: Optional[Sequence[tuple]] = None, ceiling_mib: Optional[int] = None):
    """(sizes, reps, ceiling MiB) with the defaults of the quick / full runs filled in."""
    sizes = tuple(tuple(s) for s in sizes) if sizes else (QUICK_SIZES if quick else FULL_SIZES)
    reps = reps or (5 if quick else 9)
    ceiling_mib = ceiling_mib or (64 if quick else 512)
    return sizes, reps, ceiling_mib


def header(reps: int, have_rlax: bool) -> str:
    """The lines printed before any measurement (platform, load average at start)."""
    lines = [f"V-trace, GAE and one-step targets, million transitions/s (median of {reps}); "
             f"jax {jax.__version__} on {jax.devices()[0].platform} "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f} at start)",
             f"host allocator: {host_malloc.describe()}"]
    if not have_rlax:
        lines.append("rlax is not installed (pip install 'vccc_jax[bench]'): reference columns skipped")
    return "\n".join(lines)


def ceiling_line(ceiling: float, ceiling_mib: int, dtype=np.float32) -> str:
    per = bytes_per_transition(dtype)
    return (f"bandwidth ceiling (in-place donated update of {ceiling_mib} MiB): "
            f"{ceiling / 1e9:.1f} GB/s = {ceiling / per / 1e6:.0f} M transitions/s at "
            f"{per} B/transition ({np.dtype(dtype).name})")


def run_sizes(fns, sizes: Sequence[tuple], reps: int,
              progress: Optional[Callable[[str], None]] = None, dtype=np.float32,
              tfns: Optional[dict] = None, ceiling: Optional[Ceiling] = None) -> list[dict]:
    """One row per (T, B): ``{"T", "B", name: M transitions/s for every function}``, and with
    ``tfns`` the target functions' rates under ``"targets"``. ``progress`` (if given) receives
    a line after each size."""
    rows = []
    with precision(dtype):
        for num_t, batch in sizes:
            row = {"T": num_t, "B": batch,
                   **bench_size(fns, num_t, batch, reps, dtype, ceiling)}
            if tfns:
                row["targets"] = bench_targets(tfns, num_t, batch, reps, dtype)
            rows.append(row)
            if progress is not None:
                progress(f"  done T={num_t} B={batch} ({np.dtype(dtype).name}, load average "
                         f"{os.getloadavg()[0]:.1f})")
    return rows


def _aligned(head: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in lines]
    return "\n".join(out)


def format_table(rows: Sequence[dict], names: Sequence[str], ceiling_mts: float,
                 dtype=np.float32) -> str:
    """Throughputs, ratios to rlax and fractions of the bandwidth ceiling (each row's own
    when it has one), right-aligned."""
    per_row = bool(rows) and "ceiling_gbs" in rows[0]
    head = ["T", "B"] + [f"{n} M/s" for n in names] + (["ceil GB/s"] if per_row else [])
    have_rlax = "rlax-BM" in names
    if have_rlax:
        head += ["ours/BM", "ours/TM", "inpl/BM", "inpl/TM"]
    head += ["ours %ceil", "inpl %ceil"]
    if "stream" in names:
        head += ["ours/stream"]
    split = [n for n in names if n.endswith("dev")]  # ours-Ndev / inpl-Ndev over one device
    head += [h for n in split for h in (f"{n}/1dev", f"{n} %ceil")]
    lines = []
    for r in rows:
        ceil = row_ceiling_mts(r, ceiling_mts, dtype)
        cells = [str(r["T"]), str(r["B"])] + [f"{r[n]:.0f}" for n in names]
        cells += [f"{r['ceiling_gbs']:.1f}"] if per_row else []
        if have_rlax:
            cells += [f"{r['ours'] / r['rlax-BM']:.2f}x", f"{r['ours'] / r['rlax-TM']:.2f}x",
                      f"{r['inplace'] / r['rlax-BM']:.2f}x", f"{r['inplace'] / r['rlax-TM']:.2f}x"]
        cells += [f"{100 * r['ours'] / ceil:.0f}%", f"{100 * r['inplace'] / ceil:.0f}%"]
        if "stream" in names:
            cells += [f"{r['ours'] / r['stream']:.2f}"]
        for n in split:
            one = r["ours" if n.startswith("ours") else "inplace"]
            cells += [f"{r[n] / one:.2f}x", f"{100 * r[n] / ceil:.0f}%"]
        lines.append(cells)
    return _aligned(head, lines)


def format_targets(rows: Sequence[dict], arrays: dict, ceiling_bps: float,
                   dtype=np.float32) -> str:
    """One line per (T, B, target): M/s, bytes per transition, % of the ceiling at those bytes,
    and ``gae`` over its two references."""
    head = ["T", "B", "target", "B/tr", "M/s", "%ceil", "vs gae-via-vtrace", "vs rlax-gae"]
    lines = []
    for r in rows:
        t = r.get("targets", {})
        for name, rate in t.items():
            per = bytes_per_transition(dtype, arrays[name])
            bps = r["ceiling_gbs"] * 1e9 if "ceiling_gbs" in r else ceiling_bps
            cells = [str(r["T"]), str(r["B"]), name, str(per), f"{rate:.0f}",
                     f"{100 * rate * 1e6 * per / bps:.0f}%"]
            is_gae = name == "gae"
            cells.append(f"{rate / t['gae-via-vtrace']:.2f}x" if is_gae else "")
            cells.append(f"{rate / t['rlax-gae']:.2f}x" if is_gae and "rlax-gae" in t else "")
            lines.append(cells)
    return _aligned(head, lines) if lines else ""


def footer(rows: Sequence[dict], ceiling_mts: float, have_rlax: bool,
           dtype=np.float32) -> str:
    """Load average at the end and the issue's targets, for the sizes that were run."""
    lines = [f"load average at end: {os.getloadavg()[0]:.1f} (other processes share the CPUs)"]
    if not rows:
        return lines[0]
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    by_size = {(r["T"], r["B"]): r for r in rows}
    if have_rlax and TARGET_SIZE in by_size:
        r = by_size[TARGET_SIZE]
        bm, tm = r["ours"] / r["rlax-BM"], r["ours"] / r["rlax-TM"]
        lines.append(f"target ours >= {TARGET_VS_RLAX_BM:.0f}x rlax-BM at {TARGET_SIZE}: "
                     f"{bm:.2f}x ({met(bm >= TARGET_VS_RLAX_BM)}); >= {TARGET_VS_RLAX_TM:.0f}x "
                     f"rlax-TM: {tm:.2f}x ({met(tm >= TARGET_VS_RLAX_TM)})")
    for key, name, target in (("ours", "ours", TARGET_OURS_CEILING),
                              ("inplace", "inplace", TARGET_INPLACE_CEILING)):
        worst = min(rows, key=lambda r: r[key] / row_ceiling_mts(r, ceiling_mts, dtype))
        frac = worst[key] / row_ceiling_mts(worst, ceiling_mts, dtype)
        lines.append(f"target {name} >= {target:.0%} of the ceiling at every size: worst "
                     f"{frac:.0%} at ({worst['T']}, {worst['B']}) ({met(frac >= target)})")
    if "stream" in rows[0]:
        fracs = ", ".join(f"{r['stream'] / row_ceiling_mts(r, ceiling_mts, dtype):.0%}"
                          for r in rows)
        lines.append(f"stream (fresh outputs, no recursion) reaches {fracs} of the ceiling: "
                     "the most any allocating function can, here")
    return "\n".join(lines)


def crossover(reps: int, num_ts: Sequence[int] = CROSSOVER_T,
              batches: Sequence[int] = CROSSOVER_B, max_size: int = CROSSOVER_MAX,
              progress: Optional[Callable[[str], None]] = None,
              stop: Optional[Callable[[], bool]] = None) -> list[dict]:
    """``vtrace`` (sequential loop) over ``vtrace_associative`` time at each (T, B) up to
    ``max_size`` transitions: ``[{"T", "B", "scan_s", "assoc_s"}]`` (assoc wins where
    assoc_s < scan_s). ``stop()`` True ends the grid early (the rows so far are returned)."""
    fns = {"scan": jax.jit(vtrace), "assoc": jax.jit(vtrace_associative)}
    rows = []
    for num_t in num_ts:
        for batch in batches:
            if num_t * batch > max_size:
                continue
            if stop is not None and stop():
                return rows
            args = make_inputs(num_t, batch)
            secs = _time_round_robin({k: (f, lambda: args) for k, f in fns.items()}, reps)
            rows.append({"T": num_t, "B": batch, "scan_s": secs["scan"],
                         "assoc_s": secs["assoc"]})
        if progress is not None:
            progress(f"  crossover T={num_t} done (load average {os.getloadavg()[0]:.1f})")
    return rows


def format_crossover(rows: Sequence[dict]) -> str:
    """T down, B across: scan time / associative time (> 1: the associative scan wins)."""
    num_ts = sorted({r["T"] for r in rows})
    batches = sorted({r["B"] for r in rows})
    cell = {(r["T"], r["B"]): r["scan_s"] / r["assoc_s"] for r in rows}
    head = ["T \\ B"] + [str(b) for b in batches]
    lines = [[str(t)] + [f"{cell[(t, b)]:.2f}" if (t, b) in cell else "-" for b in batches]
             for t in num_ts]
    wins = sorted(k for k, v in cell.items() if v > 1.0)
    note = ("associative wins at " + ", ".join(map(str, wins))) if wins else \
        "associative wins nowhere: the loop is chosen at every shape"
    return (_aligned(head, lines) + "\n(scan time / associative time; > 1: associative "
            f"faster) {note}")
