"""Issue 46 experiment: is V-trace faster with its ratios, clips and delta as one whole-array
(multi-threaded) pre-pass and a loop that only accumulates acc_t = x_t + a_t acc_{t+1}?

Against the library's fused loop (``estimators.vtrace``), both returning ``vs`` only (so XLA
drops the policy-gradient advantages from both), rho_bar = c_bar = 1, lambda = 1, float32;
round-robin in one process, median of 9 calls. Run on an idle machine:

    PYTHONPATH=$PWD .venv/bin/python experiments/vtrace_prepass.py
"""
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import vtrace

SIZES = ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))


def prepass(log_rhos, discounts, rewards, values, bootstrap):
    rho = jnp.exp(jnp.minimum(log_rhos, 20.0))
    next_values = jnp.concatenate([values[1:], bootstrap[None]], 0)
    x = jnp.minimum(1.0, rho) * (rewards + discounts * next_values - values)
    a = discounts * jnp.minimum(1.0, rho)

    def step(acc, xa):
        acc = xa[0] + xa[1] * acc
        return acc, acc

    _, acc = jax.lax.scan(step, jnp.zeros_like(bootstrap), (x, a), reverse=True)
    return values + acc


def main():
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__} on "
          f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs")
    fns = {"fused loop": jax.jit(lambda *a: vtrace(*a, lambda_=1.0).vs),
           "pre-pass + loop": jax.jit(prepass)}
    for t, b in SIZES:
        ks = jax.random.split(jax.random.PRNGKey(0), 4)
        args = (0.3 * jax.random.normal(ks[0], (t, b)), jnp.full((t, b), 0.99),
                jax.random.normal(ks[1], (t, b)), jax.random.normal(ks[2], (t, b)),
                jax.random.normal(ks[3], (b,)))
        out = {k: np.asarray(f(*args)) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(9):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f(*args).block_until_ready()
                times[k].append(time.perf_counter() - t0)
        rate = {k: t * b / statistics.median(v) / 1e6 for k, v in times.items()}
        print(f"T={t:5d} B={b:6d}  " + "  ".join(f"{k} {m:5.0f} M/s" for k, m in rate.items())
              + f"  pre-pass / fused {rate['pre-pass + loop'] / rate['fused loop']:.2f}x"
              + f"  max |difference| {np.max(np.abs(out['pre-pass + loop'] - out['fused loop'])):.1e}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
