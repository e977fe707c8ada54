"""Issue 46 experiment: the fastest reverse loop XLA:CPU runs here, against the ceiling.

The minimal loop is ``y_t = x_t + a_t y_{t+1}`` (``lax.scan(reverse=True)``: two [T, B] arrays
read, one written, 12 B a float32 transition, no exp, one carry), on one device and with the
batch split over two forced host devices (``shard_map``), next to ``vtrace_inplace`` (24 B)
and the bandwidth ceiling (donated in-place ``x * a + b`` over 256 MiB), round-robin in one
process, median of ``REPS``. The allocator is tuned first (train.host_malloc), so no call
page-faults its output. Each rate is also given as GB/s at its own bytes a transition and
as a fraction of the ceiling, and as a fraction of the ceiling's rate in V-trace transitions
(24 B each, the issue's ``%ceil``): V-trace's loop does strictly more per step than the
minimal one (twice the bytes, an exp), so the minimal loop's rate bounds what a per-step
loop of V-trace reaches here.

    PYTHONPATH=$PWD .venv/bin/python experiments/loop_floor.py
"""
import os
import statistics
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2")

from vccc_jax.train.host_malloc import keep_freed_memory  # noqa: E402

assert keep_freed_memory()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from vccc_jax.estimators import vtrace_inplace  # noqa: E402

SIZES = ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))
REPS = 9


def minimal(x, a):
    def step(acc, xa):
        acc = xa[0] + xa[1] * acc
        return acc, acc

    return jax.lax.scan(step, jnp.zeros_like(x[0]), (x, a), reverse=True)[1]


def main():
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}, "
          f"{len(jax.devices())} host devices, {os.cpu_count()} CPUs, float32")
    mesh = Mesh(np.array(jax.devices()[:2]), ("b",))
    tb = P(None, "b")
    fns = {  # name -> (fn, bytes a transition, donate, split)
        "minimal": (jax.jit(minimal), 12, False, False),
        "minimal 2dev": (jax.jit(jax.shard_map(minimal, mesh=mesh, in_specs=(tb, tb),
                                               out_specs=tb)), 12, False, True),
        "inplace": (jax.jit(vtrace_inplace, donate_argnums=(0, 2)), 24, True, False),
        "inplace 2dev": (jax.jit(jax.shard_map(vtrace_inplace, mesh=mesh,
                                               in_specs=(tb,) * 4 + (P("b"),), out_specs=tb),
                                 donate_argnums=(0, 2)), 24, True, True),
    }
    ceil_n = 64 * 2**20
    update = jax.jit(lambda x: x * 1.0000001 + 1e-7, donate_argnums=0)
    state = {"x": update(jnp.zeros((ceil_n,), jnp.float32))}

    def ceiling():
        state["x"] = update(state["x"])
        return state["x"]

    for t, b in SIZES:
        rng = np.random.default_rng(0)
        host = tuple(x.astype(np.float32) for x in (
            rng.normal(0, 0.5, (t, b)), 0.99 * (rng.random((t, b)) > 0.01),
            rng.normal(size=(t, b)), rng.normal(size=(t, b)), rng.normal(size=(b,))))
        one = tuple(jnp.asarray(x) for x in host)
        two = tuple(jax.device_put(x, NamedSharding(mesh, tb if x.ndim == 2 else P("b")))
                    for x in host)

        def make(name, donate, split):
            args = two if split else one
            if name.startswith("minimal"):
                return args[2], args[1]
            if donate:
                args = (args[0].copy(), args[1], args[2].copy()) + args[3:]
            return jax.block_until_ready(args)

        calls = {k: (f, lambda k=k, d=d, s=s: make(k, d, s)) for k, (f, _, d, s) in fns.items()}
        calls["ceiling"] = (ceiling, tuple)
        for f, mk in calls.values():
            jax.block_until_ready(f(*mk()))
        times = {k: [] for k in calls}
        for _ in range(REPS):
            for k, (f, mk) in calls.items():
                a = mk()
                t0 = time.perf_counter()
                jax.block_until_ready(f(*a))
                times[k].append(time.perf_counter() - t0)
                del a
        med = {k: statistics.median(v) for k, v in times.items()}
        gbs = 2 * ceil_n * 4 / med.pop("ceiling") / 1e9
        cells = []
        for k, s in med.items():
            rate = t * b / s / 1e6
            moved = rate * 1e6 * fns[k][1] / 1e9
            vtrace_ceil = gbs * 1e9 / 24 / 1e6  # the ceiling in V-trace transitions/s
            cells.append(f"{k} {rate:5.0f} M/s {moved:4.1f} GB/s ({100 * moved / gbs:3.0f}% of "
                         f"the bytes, {100 * rate / vtrace_ceil:3.0f}% of the V-trace rate)")
        print(f"T={t:5d} B={b:6d} ceil {gbs:5.1f} GB/s  " + "  ".join(cells)
              + f"  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
