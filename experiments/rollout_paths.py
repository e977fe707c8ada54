"""Measure the lagged rollout's actor paths (issue 28 §1): a benchmark, not a test.

Two measurements, each in one process, programs compiled ahead, timed round-robin (every
round runs every row once, odd rounds in reverse), best of ``--repeats``, wall AND process
CPU time (the machine is shared: compare CPU-time ratios; the load is printed):

``micro``  the actor alone inside a T = 128 ``lax.scan`` (no env): per step the behaviour and
           newest logits of B envs, their log-softmax and one categorical draw, with the
           observations carried (so nothing is hoisted). Rows per (B, K): ``plain`` (sync:
           one forward), ``table`` (``acting.versioned_logits`` over ``acting.lag_table``: K x B
           rows), ``per_env`` (``acting.per_env_logits`` on ``acting.env_versions``, gathered
           once), ``per_env_switch`` (re-gathered at every step, as under mid-rollout
           switches) and ``sorted`` (``acting.sorted_logits`` on ``acting.sorted_versions``,
           chunk ``acting.sort_chunk``); the last three compute pi_k after the loop, in one
           forward over the T x B observations (``acting.newest_log_probs``), as the rollout
           does. Ratios are CPU time relative to ``table``.
``train``  the whole trainer (``benchmarks.train.prepare_trainer`` / ``time_rows``): rows
           sync-gae (fixed:0, K = 1), lag8-vccc (uniform:7, K = 8, vccc critic) and
           lag32-vtrace (uniform:31, K = 32, vtrace critic) at each ``--envs`` size, x 128
           steps; ratios are env steps/s relative to sync-gae. It uses only APIs that exist
           on main, so ``/work/main/.venv/bin/python experiments/rollout_paths.py train``
           measures main ("before") with the same script.

    .venv/bin/python experiments/rollout_paths.py micro --envs 4,64,512,4096 --versions 2,4,8,32
    .venv/bin/python experiments/rollout_paths.py train --envs 4,64,512 --timesteps 65536
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" taskset -c 1 \
      .venv/bin/python experiments/rollout_paths.py profile --envs 64,512 \
      --timesteps 32768,65536 --seeds 8 --repeats 5

``profile``  per row (``--rows``; the extra rows take the update apart: the lagged rows'
           critics without lag, the lagged rollout with sync's critic, a K = 32 ring under
           uniform:7) and rollout path (``--paths``), the whole training program and a program
           of its rollouts alone, CPU and wall seconds, and the rollouts' CPU time over
           sync-gae's (the numbers in ``acting.choose_path``'s docstring).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _best(fns: dict, repeats: int) -> dict:
    """name -> (best wall s, best CPU s) of fn() over round-robin rounds."""
    best = {n: [float("inf"), float("inf")] for n in fns}
    names = list(fns)
    for i in range(repeats):
        for n in (names if i % 2 == 0 else names[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(fns[n]())
            best[n][0] = min(best[n][0], time.perf_counter() - t0)
            best[n][1] = min(best[n][1], time.process_time() - c0)
    return best


def micro(envs, versions, hidden: int, steps: int, repeats: int) -> None:
    from vccc_jax.envs import acting, rollout
    from vccc_jax.envs import lag as lag_lib
    from vccc_jax.train.networks import Actor

    net = Actor(2, (hidden, hidden))
    obs_dim = 4
    print(f"# micro: actor {obs_dim}-{hidden}-{hidden}-2, T={steps}, best of {repeats}; "
          f"{_load()}")
    print("B,K,params,row,wall_ms,cpu_ms,cpu_vs_table")
    for B in envs:
        for K in versions:
            keys = jax.random.split(jax.random.PRNGKey(0), K)
            buf = lag_lib.init_buffer(net.init(keys[0], jnp.zeros((1, obs_dim))), K)
            for k in keys[1:]:
                buf = lag_lib.push(buf, net.init(k, jnp.zeros((1, obs_dim))))
            lags = jax.random.randint(jax.random.PRNGKey(1), (B,), 0, K)
            obs0 = jax.random.normal(jax.random.PRNGKey(2), (B, obs_dim))
            n_params = acting.num_params(buf)

            def scan(logits_fn, prep):
                def run(buf, lags, obs0, key):
                    actor = prep(buf, lags)

                    def step(obs, xs):
                        t, _, _, noise = xs
                        mu, pi = logits_fn(actor, lags, t, obs)
                        lb = jax.nn.log_softmax(mu)
                        a = jnp.argmax(lb + noise, axis=-1)  # drawn as rollout.rollout does
                        lp = lb if pi is None else jax.nn.log_softmax(pi)
                        nxt = obs * 0.99 + 0.01 * (a[:, None] + lp[:, :1])
                        return nxt, (obs, lp)
                    _, (obs, lp) = jax.lax.scan(step, obs0, rollout.step_draws(
                        key, steps, B, jax.ShapeDtypeStruct((B, 2), jnp.float32)))
                    newest = acting.newest_after(actor)
                    if newest is not None:  # pi_k after the loop, as rollout.rollout does
                        lag = jnp.broadcast_to(actor.lag, lp.shape[:2])
                        lp = acting.newest_log_probs(net.apply, newest, obs, lag, lp)
                    return lp
                return jax.jit(run).lower(buf, lags, obs0, jax.random.PRNGKey(3)).compile()

            def table_fn(tab, lags, t, obs):
                return acting.versioned_logits(net.apply, tab, tab.rows(lags), obs)

            def env_fn(ev, lags, t, obs):
                return acting.per_env_logits(net.apply, ev.params, obs), None

            def switch_fn(ev, lags, t, obs):
                lag_t = lag_lib.switch_lags(ev.lag, t, every=1)
                lag_t = jnp.maximum(lag_t, ev.lag)  # same lags, but gathered every step
                return acting.per_env_logits(net.apply, lag_lib.gather(ev.buffer, lag_t),
                                             obs), None

            def sorted_fn(sv, lags, t, obs):
                return acting.sorted_logits(net.apply, sv, obs), None

            def plain_fn(p, lags, t, obs):
                out = net.apply(p, obs)
                return out, out

            progs = {
                "plain": scan(plain_fn, lambda b, lg: lag_lib.get(b, 0)),
                "table": scan(table_fn, lambda b, lg: acting.lag_table(b)),
                "per_env": scan(env_fn, acting.env_versions),
                "sorted": scan(sorted_fn, lambda b, lg, B=B, K=K: acting.sorted_versions(
                    b, lg, acting.sort_chunk(B, K))),
                "per_env_switch": scan(switch_fn, acting.env_versions),
            }
            args = (buf, lags, obs0, jax.random.PRNGKey(3))
            best = _best({n: (lambda p=p: p(*args)) for n, p in progs.items()}, repeats)
            for n, (w, c) in best.items():
                print(f"{B},{K},{n_params},{n},{1e3 * w:.2f},{1e3 * c:.2f},"
                      f"{c / best['table'][1]:.2f}", flush=True)
        print(f"# {_load()}", flush=True)


ROWS = {
    "sync-gae": dict(lag="fixed:0", num_versions=1, critic="gae"),
    "lag8-vccc": dict(lag="uniform:7", num_versions=8, critic="vccc"),
    "lag32-vtrace": dict(lag="uniform:31", num_versions=32, critic="vtrace"),
}
# optional rows (``--rows``) that take the update apart: the lagged rows' critics without lag,
# and the lagged rollout with sync's critic
EXTRA_ROWS = {
    "sync-vccc": dict(lag="fixed:0", num_versions=1, critic="vccc"),
    "sync-vtrace": dict(lag="fixed:0", num_versions=1, critic="vtrace"),
    "lag8-gae": dict(lag="uniform:7", num_versions=8, critic="gae"),
    "lag32-gae": dict(lag="uniform:31", num_versions=32, critic="gae"),
    "lag8k32-gae": dict(lag="uniform:7", num_versions=32, critic="gae"),  # the ring's cost
}


def train(envs, timesteps, seeds: int, repeats: int) -> None:
    import vccc_jax
    from vccc_jax.benchmarks import train as bench
    print(f"# train: {vccc_jax.__file__}; seeds={seeds}, best of {repeats}; {_load()}")
    print("envs,row,timesteps,wall_s,cpu_s,wall_vs_sync,cpu_vs_sync,final_return")
    for B, T in zip(envs, timesteps):
        rows = [bench.prepare_trainer(n, seeds, T, warm=False, num_envs=B, **cfg)
                for n, cfg in ROWS.items()]
        res = {r.name: r for r in bench.time_rows(rows, repeats)}
        sync = res["sync-gae"]
        for n, r in res.items():
            print(f"{B},{n},{T},{r.run_s:.3f},{r.cpu_s:.3f},"
                  f"{sync.run_s / r.run_s:.3f},{sync.cpu_s / r.cpu_s:.3f},"
                  f"{r.final_return:.1f}", flush=True)
        print(f"# {_load()}", flush=True)


def profile(envs, timesteps, seeds: int, repeats: int, paths, rows) -> None:
    """Where an update's time goes: per row and rollout path, the whole training program vs
    a program of the same number of rollouts alone (``train.trainer.rollout_step``, the env
    carry threaded through). Run it on one core (``taskset -c 1``) with
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false". Each program runs on one copy of its
    inputs: its time moves by up to ~10% from one copy to another (``benchmarks.train.
    time_rows``' placements), so smaller differences are not resolved here."""
    from vccc_jax.envs import acting
    from vccc_jax.train.programs import program_values
    from vccc_jax.train.trainer import TrainConfig, Trainer, rollout_step, train_scan

    print(f"# profile: seeds={seeds}, best of {repeats}; {_load()}")
    print("envs,row,path,program,cpu_s,wall_s,rollouts_vs_sync")
    choose = acting.choose_path
    for B, T in zip(envs, timesteps):
        fns = {}
        for name, cfg in rows.items():
            for path in (("auto",) if cfg["lag"] == "fixed:0" else paths):
                acting.choose_path = (choose if path == "auto" else
                                       (lambda *a, p=path, **k: p))
                tr = Trainer(TrainConfig(total_timesteps=T, num_envs=B, num_seeds=seeds,
                                         **cfg))
                st, n, v = tr.init(), tr.num_updates, program_values(tr.values)

                def rollouts(s, tr=tr, n=n, v=v):
                    def one(s1):
                        def body(env, i):
                            k = jax.random.fold_in(s1.key, i)
                            env, traj = rollout_step(tr.setup, v, s1.actor_params,
                                                     s1.versions, env, k, i, k)
                            return env, traj.log_mu.sum() + traj.log_pi_all.sum()
                        return jax.lax.scan(body, s1.env, jnp.arange(n))[1]
                    return jax.vmap(one)(s)

                whole = jax.jit(lambda s, tr=tr, n=n, v=v: train_scan(
                    tr.setup, s, jnp.asarray(0, jnp.int32), n, v)).lower(st).compile()
                run = jax.jit(rollouts).lower(st).compile()
                fns[(name, path, "rollouts")] = (lambda f=run, s=st: f(s))
                fns[(name, path, "train")] = (lambda f=whole, s=st: f(s))
        acting.choose_path = choose
        best = _best(fns, repeats)
        sync = best[("sync-gae", "auto", "rollouts")][1]
        for (name, path, prog), (w, c) in best.items():
            print(f"{B},{name},{path},{prog},{c:.3f},{w:.3f},"
                  f"{c / sync if prog == 'rollouts' else float('nan'):.2f}", flush=True)
        print(f"# {_load()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("micro", "train", "profile"))
    ap.add_argument("--envs", default="4,64,512")
    ap.add_argument("--versions", default="2,4,8,32")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--timesteps", default="65536",
                    help="total timesteps per run: one value, or one per --envs size")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", default="auto,sorted,per_env,table",
                    help="profile: the rollout paths of the lagged rows")
    ap.add_argument("--rows", default=",".join(ROWS),
                    help="profile: rows, of " + ",".join([*ROWS, *EXTRA_ROWS]))
    a = ap.parse_args()
    envs = [int(x) for x in a.envs.split(",")]
    if a.what == "micro":
        micro(envs, [int(x) for x in a.versions.split(",")], a.hidden, a.steps, a.repeats)
    else:
        ts = [int(x) for x in a.timesteps.split(",")]
        ts = ts * len(envs) if len(ts) == 1 else ts
        if a.what == "train":
            train(envs, ts, a.seeds, a.repeats)
        else:
            table = {**ROWS, **EXTRA_ROWS}
            profile(envs, ts, a.seeds, a.repeats, a.paths.split(","),
                    {n: table[n] for n in ["sync-gae", *a.rows.split(",")]})


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
