"""Issue 46 experiment: do glibc's allocator settings stop fresh output buffers from being
page-faulted on every call?

glibc serves a buffer over its (dynamic, up to 32 MiB) mmap threshold with ``mmap`` and
``munmap``s it on free, so every call of a function that allocates a large output faults its
pages in again. Each child process below times, round-robin in one process (median of
``REPS``), the bandwidth ceiling (donated in-place ``x * a + b`` over 256 MiB), the stream
kernel ``(lr * d, r + v)`` (fresh outputs), ``vtrace`` (fresh outputs) and ``vtrace_inplace``
(donated) at two sizes, under one allocator setting; the parent runs one child per setting
back to back and prints them side by side, each as a fraction of its own ceiling.

    PYTHONPATH=$PWD .venv/bin/python experiments/alloc_tuning.py
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

SIZES = ((1024, 4096), (512, 65536))
REPS = 9
BIG = str(1 << 40)  # bytes: never trim the heap top
SETTINGS = {  # name -> environment of the child
    "default": {},
    "env: no mmap, no trim": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": BIG,
                              "MALLOC_TOP_PAD_": str(1 << 28)},
    "env: mmap threshold 32 MiB, no trim": {"MALLOC_MMAP_THRESHOLD_": str(1 << 25),
                                             "MALLOC_TRIM_THRESHOLD_": BIG},
    "env: THP (hugetlb=1)": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "env: one arena, no mmap, no trim": {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
                                         "MALLOC_TRIM_THRESHOLD_": BIG},
    "env: one arena, no mmap, no trim, THP": {
        "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": BIG,
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "runtime mallopt: one arena, no mmap, no trim (before jax runs)": {"_MALLOPT": "early"},
    "runtime mallopt: one arena, no mmap, no trim (after jax ran)": {"_MALLOPT": "late"},
}


def mallopt_no_mmap() -> bool:
    """mallopt(M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1) here."""
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
    return all(libc.mallopt(k, v) == 1 for k, v in (
        (m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, 2**31 - 1)))


def child() -> None:
    from vccc_jax.estimators import vtrace, vtrace_inplace  # noqa: PLC0415

    if os.environ.get("_MALLOPT") == "early":
        assert mallopt_no_mmap()
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros((1 << 24,))))
    if os.environ.get("_MALLOPT") == "late":
        assert mallopt_no_mmap()
    ceil_n = 64 * 2**20  # float32 elements: 256 MiB
    update = jax.jit(lambda x: x * 1.0000001 + 1e-7, donate_argnums=0)
    state = {"x": update(jnp.zeros((ceil_n,), jnp.float32))}

    def ceiling():
        state["x"] = update(state["x"])
        return state["x"]

    fns = {"stream": jax.jit(lambda lr, d, r, v, b: (lr * d, r + v)),
           "ours": jax.jit(vtrace),
           "inplace": jax.jit(vtrace_inplace, donate_argnums=(0, 2))}
    out = {"load": os.getloadavg()[0]}
    for t, b in SIZES:
        rng = np.random.default_rng(0)
        args = tuple(jnp.asarray(x.astype(np.float32)) for x in (
            rng.normal(0, 0.5, (t, b)), 0.99 * (rng.random((t, b)) > 0.01),
            rng.normal(size=(t, b)), rng.normal(size=(t, b)), rng.normal(size=(b,))))

        def make(donate):
            if not donate:
                return args
            a = (args[0].copy(), args[1], args[2].copy()) + args[3:]
            return jax.block_until_ready(a)

        calls = {k: (f, lambda k=k: make(k == "inplace")) for k, f in fns.items()}
        calls["ceiling"] = (ceiling, tuple)
        for f, mk in calls.values():
            jax.block_until_ready(f(*mk()))
        times = {k: [] for k in calls}
        faults = {k: 0 for k in calls}
        for _ in range(REPS):
            for k, (f, mk) in calls.items():
                a = mk()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                jax.block_until_ready(f(*a))
                times[k].append(time.perf_counter() - t0)
                faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                del a
        med = {k: statistics.median(v) for k, v in times.items()}
        gbs = 2 * ceil_n * 4 / med.pop("ceiling") / 1e9
        out[f"{t},{b}"] = {"ceil_gbs": gbs, **{k: t * b / s / 1e6 for k, s in med.items()},
                           **{f"{k} faults": n / REPS for k, n in faults.items()}}
    out["load_end"] = os.getloadavg()[0]
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(out))


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}, {os.cpu_count()} CPUs")
    for name, env in SETTINGS.items():
        proc = subprocess.run([sys.executable, __file__, "--child"], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=600, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}  (load {res['load']:.1f} -> {res['load_end']:.1f}, peak RSS "
              f"{res['maxrss_mib']} MiB)")
        for t, b in SIZES:
            r = res[f"{t},{b}"]
            ceil_mts = r["ceil_gbs"] * 1e9 / 24 / 1e6
            print(f"  T={t:5d} B={b:6d} ceil {r['ceil_gbs']:5.1f} GB/s  " + "  ".join(
                f"{k} {r[k]:5.0f} M/s ({100 * r[k] / ceil_mts:3.0f}%, "
                f"{r[k + ' faults']:.0f} faults)"
                for k in ("stream", "ours", "inplace")))


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
