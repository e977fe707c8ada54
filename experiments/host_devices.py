"""Issue 46 experiment: V-trace with the batch split over two host CPU devices.

XLA:CPU runs a ``while`` loop's kernels on one thread, so ``vtrace`` uses one core of two.
With ``--xla_force_host_platform_device_count=2`` JAX sees two CPU devices; ``shard_map``
over a 1-D mesh of both, with the batch axis split (``P(None, "b")``), gives each device its
own [T, B / 2] loop, and PjRt runs the two devices' programs on their own threads. Each
setting is timed round-robin in one process (median of ``REPS``) against the single-device
call on the same inputs, with the bandwidth ceiling (donated in-place ``x * a + b`` over
256 MiB) timed between them; outputs are checked bit for bit against the single-device call.

    PYTHONPATH=$PWD .venv/bin/python experiments/host_devices.py [--malloc]

``--malloc`` first applies the allocator setting of experiments/alloc_tuning.py (one arena,
no mmap, no trim), before JAX runs anything.
"""
import os
import statistics
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2")

if "--malloc" in sys.argv:
    sys.path.insert(0, os.path.dirname(__file__))
    from alloc_tuning import mallopt_no_mmap  # noqa: E402

    assert mallopt_no_mmap()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from vccc_jax.estimators import vtrace, vtrace_inplace  # noqa: E402

SIZES = ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))
REPS = 9


def main():
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}, devices "
          f"{jax.devices()}, {os.cpu_count()} CPUs, malloc tuned: {'--malloc' in sys.argv}")
    mesh = Mesh(np.array(jax.devices()[:2]), ("b",))
    tb, b1 = NamedSharding(mesh, P(None, "b")), NamedSharding(mesh, P("b"))
    specs = (P(None, "b"),) * 4 + (P("b"),)

    def sharded(fn):
        return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=P(None, "b"),
                             check_vma=False)

    fns = {"ours": (jax.jit(vtrace), False, False),
           "ours 2dev": (jax.jit(sharded(vtrace)), False, True),
           "inplace": (jax.jit(vtrace_inplace, donate_argnums=(0, 2)), True, False),
           "inplace 2dev": (jax.jit(sharded(vtrace_inplace), donate_argnums=(0, 2)), True,
                            True)}
    ceil_n = 64 * 2**20
    update = jax.jit(lambda x: x * 1.0000001 + 1e-7, donate_argnums=0)
    state = {"x": update(jnp.zeros((ceil_n,), jnp.float32))}

    def ceiling():
        state["x"] = update(state["x"])
        return state["x"]

    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            for t, b in SIZES:
                rng = np.random.default_rng(0)
                host = tuple(x.astype(dtype) for x in (
                    rng.normal(0, 0.5, (t, b)), 0.99 * (rng.random((t, b)) > 0.01),
                    rng.normal(size=(t, b)), rng.normal(size=(t, b)), rng.normal(size=(b,))))
                one = tuple(jax.device_put(x, jax.devices()[0]) for x in host)
                two = tuple(jax.device_put(x, tb if x.ndim == 2 else b1) for x in host)

                def make(donate, split):
                    args = two if split else one
                    if donate:
                        args = (args[0].copy(), args[1], args[2].copy()) + args[3:]
                    return jax.block_until_ready(args)

                calls = {k: (f, lambda d=d, s=s: make(d, s)) for k, (f, d, s) in fns.items()}
                calls["ceiling"] = (ceiling, tuple)
                ref = np.asarray(fns["ours"][0](*one).vs)
                for k, (f, mk) in calls.items():
                    out = f(*mk())
                    if k != "ceiling":
                        assert np.array_equal(np.asarray(out.vs), ref), k
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
                per = 6 * np.dtype(dtype).itemsize
                ceil_mts = gbs * 1e9 / per / 1e6
                rate = {k: t * b / s / 1e6 for k, s in med.items()}
                print(f"{np.dtype(dtype).name} T={t:5d} B={b:6d} ceil {gbs:5.1f} GB/s  "
                      + "  ".join(f"{k} {m:5.0f} ({100 * m / ceil_mts:3.0f}%)"
                                  for k, m in rate.items())
                      + f"  2dev/1dev ours {rate['ours 2dev'] / rate['ours']:.2f}x inplace "
                      f"{rate['inplace 2dev'] / rate['inplace']:.2f}x  (load "
                      f"{os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
