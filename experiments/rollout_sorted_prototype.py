"""Prototype, measured for issue 28 §1's next step (not used by the trainer): an exact,
cheaper per-env actor for large B on CPU.

Sort the envs by their (iid) lags once per rollout, cut the sorted batch into B/C chunks of C
envs and run the actor once per (chunk, version) pair that occurs: consecutive chunks share at
most one lag, so there are at most B/C + K - 1 pairs, a static bound, and each pair is a C-row
matmul (the table's efficiency) instead of C matvecs (the per-env path's). Every env is
evaluated under its own version, so the law is untouched (lag counts stay multinomial). On a
mesh the sort must stay on each device (sort within device blocks: the trainer would pass the
data-axis size), which is why it is not in ``envs/`` yet.

    .venv/bin/python experiments/rollout_sorted_prototype.py 512 8

prints the CPU ms of a T = 128 scan of the behaviour logits (actor 4-64-64-2) for the table,
the per-env path (which also runs the newest's plain forward for lag 0) and the sorted pairs,
and the max |difference| of the sorted pairs' logits from the table's.
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.train.networks import Actor


def main(B: int, K: int, T: int = 128) -> None:
    C = max(1, B // K)
    assert B % C == 0, (B, C)
    n_pairs = B // C + K - 1
    net = Actor(2, (64, 64))
    keys = jax.random.split(jax.random.PRNGKey(0), K)
    buf = lag_lib.init_buffer(net.init(keys[0], jnp.zeros((1, 4))), K)
    for k in keys[1:]:
        buf = lag_lib.push(buf, net.init(k, jnp.zeros((1, 4))))
    lags = jax.random.randint(jax.random.PRNGKey(1), (B,), 0, K)
    obs0 = jax.random.normal(jax.random.PRNGKey(2), (B, 4))

    def sorted_prep(buf, lags):
        order = jnp.argsort(lags, stable=True)
        sl = lags[order]
        lo, hi = sl[::C], sl[C - 1::C]
        count = hi - lo + 1
        start = jnp.cumsum(count) - count
        p = jnp.arange(n_pairs)
        chunk = jnp.clip(jnp.searchsorted(start, p, side="right") - 1, 0, B // C - 1)
        pair_lag = jnp.minimum(lo[chunk] + (p - start[chunk]), K - 1)  # padding: any version
        i = jnp.arange(B)
        env_pair = start[i // C] + sl - lo[i // C]  # sorted position -> its pair
        return order, jnp.argsort(order), chunk, env_pair, lag_lib.gather(buf, pair_lag)

    def sorted_fn(st, obs):
        order, inverse, chunk, env_pair, params = st
        out = jax.vmap(net.apply)(params, obs[order].reshape(B // C, C, -1)[chunk])
        return out[env_pair, jnp.arange(B) % C][inverse]

    def table_fn(tab, obs):
        return rollout_lib.versioned_logits(net.apply, tab, tab.rows(lags), obs)[0]

    def env_fn(ev, obs):
        return rollout_lib.per_env_logits(net.apply, ev.newest, ev.params, ev.lag, obs)[0]

    out = {}
    for name, f, prep in [("table", table_fn, lambda b, _: lag_lib.lag_table(b)),
                          ("per_env", env_fn, lag_lib.env_versions),
                          ("sorted", sorted_fn, sorted_prep)]:
        def run(buf, lags, obs0, f=f, prep=prep):
            st = prep(buf, lags)
            return jax.lax.scan(lambda o, _: (o * 0.99 + 0.01 * f(st, o)[:, :1], f(st, o)),
                                obs0, None, T)
        g = jax.jit(run).lower(buf, lags, obs0).compile()
        out[name] = np.asarray(g(buf, lags, obs0)[1])
        best = float("inf")
        for _ in range(5):
            c = time.process_time()
            jax.block_until_ready(g(buf, lags, obs0))
            best = min(best, time.process_time() - c)
        print(f"B={B} K={K} {name}: {1e3 * best:.2f} CPU ms", flush=True)
    print("sorted vs table max |diff|", float(np.abs(out["sorted"] - out["table"]).max()))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
