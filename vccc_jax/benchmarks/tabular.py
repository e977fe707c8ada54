"""``vccc bench tabular``: exact V^pi for batches of MDPs, against NumPy in the same process.

For each (N, S, A) the table reports MDPs/s of

  numpy f32 / f64    P_pi and r_pi by ``np.einsum`` (optimised), then NumPy's batched
                     ``np.linalg.solve`` (the reference)
  jax vmap           ``jit(vmap(tabular.exact.policy_value))``: the plain library routine
  jax lapack         ``tabular.exact.batched_policy_value(method="lapack")``: fused
                     construction of P_pi and r_pi, batched LU
  jax auto           ``batched_policy_value(method="auto")``: the pivot-free elimination
                     vectorised over the batch for S <= 48, else BiCGSTAB checked by its
                     residual (LU fallback): random MDPs mix fast, so I - gamma P_pi has a
                     clustered spectrum and a few O(S^2) mat-vecs replace the O(S^3) LU

All JAX variants run in float32 (exactness is not the point here; the error against a
float64 NumPy solve is printed). Construction of P_pi and r_pi is included in every
timing; inputs are already on the device / in memory. Each entry is the best of several
repeats after a warm-up (compile time is reported separately). Other processes share the
CPU: the load average is printed next to the table. Flags and printing live in
:mod:`vccc_jax.commands.bench` (``vccc bench tabular``); this module returns rows and strings.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import TabularMDP

SIZES = ((1024, 20, 4), (256, 100, 4), (16, 500, 8))
SMALL_SIZES = ((64, 10, 3), (8, 40, 3))  # --small: a smoke test
GAMMA = 0.9


def make_batch(num_mdps: int, num_states: int, num_actions: int, seed: int = 0):
    """Random MDPs and policies in NumPy float64 (Dirichlet(1) rows, N(0,1) rewards)."""
    rng = np.random.default_rng(seed)
    P = rng.exponential(size=(num_mdps, num_states, num_actions, num_states))
    P /= P.sum(-1, keepdims=True)
    R = rng.normal(size=P.shape)
    pi = rng.exponential(size=(num_mdps, num_states, num_actions))
    pi /= pi.sum(-1, keepdims=True)
    gamma = np.full((num_mdps,), GAMMA)
    return P, R, pi, gamma


def numpy_policy_value(P, R, pi, gamma):
    """The NumPy reference: einsum construction + batched ``np.linalg.solve``."""
    S = P.shape[1]
    p_pi = np.einsum("nsa,nsat->nst", pi, P, optimize=True)
    r_pi = np.einsum("nsa,nsa->ns", pi, np.einsum("nsat,nsat->nsa", P, R))
    a = np.eye(S, dtype=P.dtype)[None] - gamma[:, None, None] * p_pi
    return np.linalg.solve(a, r_pi[..., None])[..., 0]


def best_time(fn: Callable[[], object], repeats: int, min_time: float = 0.2) -> float:
    """Best wall time of ``fn`` over ``repeats`` rounds (each round loops until ``min_time``)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time:
                break
        best = min(best, elapsed / n)
    return best


def _jax_variants() -> dict:
    vmapped = jax.jit(jax.vmap(exact.policy_value))
    lapack = jax.jit(lambda m, p: exact.batched_policy_value(m, p, method="lapack"))
    auto = jax.jit(lambda m, p: exact.batched_policy_value(m, p, method="auto"))
    return {"jax vmap": vmapped, "jax lapack": lapack, "jax auto": auto}


def run(sizes: Sequence[tuple] = SIZES, repeats: int = 5, min_time: float = 0.2) -> list[dict]:
    rows = []
    variants = _jax_variants()
    for N, S, A in sizes:
        P, R, pi, gamma = make_batch(N, S, A)
        ref = numpy_policy_value(P, R, pi, gamma)
        row = {"N": N, "S": S, "A": A}
        for name, dtype in (("numpy f32", np.float32), ("numpy f64", np.float64)):
            args = [x.astype(dtype) for x in (P, R, pi, gamma)]
            row[name] = N / best_time(lambda: numpy_policy_value(*args), repeats, min_time)
        mdps = TabularMDP(
            P=jnp.asarray(P, jnp.float32), R=jnp.asarray(R, jnp.float32), gamma=jnp.asarray(gamma, jnp.float32),
            init=jnp.full((N, S), 1.0 / S, jnp.float32), terminal=jnp.zeros((N, S), jnp.float32),
        )
        pis = jnp.asarray(pi, jnp.float32)
        for name, fn in variants.items():
            t0 = time.perf_counter()
            out = np.asarray(jax.block_until_ready(fn(mdps, pis)))
            row[f"{name} compile_s"] = time.perf_counter() - t0
            row[f"{name} err"] = float(np.max(np.abs(out - ref)))
            row[name] = N / best_time(lambda: jax.block_until_ready(fn(mdps, pis)), repeats, min_time)
        rows.append(row)
    return rows


def format_rows(rows: Sequence[dict]) -> str:
    names = ["numpy f32", "numpy f64", "jax vmap", "jax lapack", "jax auto"]
    head = f"{'N,S,A':>14} " + " ".join(f"{n + ' MDP/s':>16}" for n in names)
    head += f" {'vmap/np32':>10} {'lapack/np32':>11} {'auto/np32':>10} {'auto err':>9} {'compile(auto)':>13}"
    lines = [head]
    for r in rows:
        line = f"{str((r['N'], r['S'], r['A'])):>14} " + " ".join(f"{r[n]:>16,.0f}" for n in names)
        base = r["numpy f32"]
        line += (f" {r['jax vmap'] / base:>9.2f}x {r['jax lapack'] / base:>10.2f}x {r['jax auto'] / base:>9.2f}x"
                 f" {r['jax auto err']:>9.1e} {r['jax auto compile_s']:>12.1f}s")
        lines.append(line)
    return "\n".join(lines)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def header() -> str:
    """The line printed before the measurements (versions, threads, load average before)."""
    return (f"exact V^pi throughput; gamma={GAMMA}; float32 JAX vs NumPy {np.__version__}; "
            f"jax {jax.__version__} on {jax.devices()[0].platform}; cpus={os.cpu_count()}; "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}; "
            f"load avg {_load():.1f} (before)")


def footer() -> str:
    """The line printed after the table (load average after)."""
    return f"load avg {_load():.1f} (after); other processes share this CPU, so ratios are noisy"
