"""Subprocess worker (8 fake CPU devices): one device vs meshes (1,1), (8,1), (4,2) (data x
seed: 2 seeds, one per seed-axis slot), and an orbax checkpoint saved on (4,2) and restored
onto (8,1). Writes OUT/mesh.npz, with the (8,1) step's collectives by loop nest and the
per-device memory (``memory_analysis``) of the (8,1) step at 16 envs and of the (1,1) step
at 2 envs (weak scaling: the same envs per device).

Compiled programs: the plain init and train, per mesh one training step and on (1,1) and
(8,1) one rollout probe (the meshes start from the plain initial state, placed with device_put;
``ShardedTrainer.init`` is exercised by the two-process and kill-test workers), plus the
AOT-only (1,1) step at 2 envs."""

import sys

from _scale_common import flat, set_devices, tiny_config

set_devices(8)

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from vccc_jax.benchmarks.scale import collectives_by_loop  # noqa: E402
from vccc_jax.train import checkpoint as ck  # noqa: E402
from vccc_jax.train import sharding as sh  # noqa: E402
from vccc_jax.train.sharding import gather_to_host  # noqa: E402
from vccc_jax.train.trainer import Trainer  # noqa: E402

CHUNK = 2
T0 = __import__('time').time()


def tick(what):
    print(f'{__import__("time").time() - T0:6.1f}s {what}', file=sys.stderr, flush=True)


def memory(compiled) -> np.ndarray:
    """Per-device [temp, argument, output] bytes of a compiled step."""
    m = compiled.memory_analysis()
    return np.array([m.temp_size_in_bytes, m.argument_size_in_bytes, m.output_size_in_bytes])


def main(out: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    tr = Trainer(tiny_config(num_seeds=2))
    res = {}
    init = jax.device_get(tr.init())
    plain_state, plain_m = tr.train(init, 2 * CHUNK)
    res.update(flat(jax.device_get(plain_state), "plain/state"))
    res.update(flat(jax.device_get(plain_m), "plain/metrics"))
    tick('plain')
    trainers, steps = {}, {}
    for shape in [(1, 1), (8, 1), (4, 2)]:
        name = f"{shape[0]}x{shape[1]}"
        st = trainers[shape] = sh.ShardedTrainer(tr, sh.make_mesh(shape))
        s = jax.device_put(init, st.shardings)  # no init program per mesh (fewer compiles)
        if shape != (4, 2):  # (rollouts cross no device: one sharded probe is enough)
            res.update(flat(gather_to_host(st.rollout_fn()(s)), f"{name}/rollout"))
        if shape == (8, 1):  # AOT: the same program the calls run, and its HLO
            steps[shape] = step = st.lower(CHUNK).compile()
            loops = collectives_by_loop(step.as_text())
            res["hlo/8x1"] = np.array(json.dumps([[list(k), v] for k, v in loops.items()]))
            res["mem/8x1"] = memory(step)
            weak = sh.ShardedTrainer(Trainer(tiny_config(num_seeds=2, num_envs=2)),
                                     sh.make_mesh((1, 1)))
            res["mem/1x1_weak"] = memory(weak.lower(CHUNK).compile())
            st.train = lambda s_, n, start=None, step=step, st=st: step(
                s_, jnp.asarray(start if start is not None else
                                int(jax.device_get(s_.update).reshape(-1)[0]), jnp.int32),
                st.values)
        s, m1 = st.train(s, CHUNK)
        if shape == (4, 2):  # save the state after CHUNK updates (async), keep going
            mngr = ck.manager(f"{out}/ckpt", keep=2, every=CHUNK)
            assert ck.save(mngr, CHUNK, s, {"update": CHUNK})
            mid = jax.device_get(s)
        s, m2 = st.train(s, CHUNK)
        m = jax.tree_util.tree_map(lambda a, b: np.concatenate([a, b]), *jax.device_get((m1, m2)))
        res.update(flat(gather_to_host(s), f"{name}/state"))
        res.update(flat(m, f"{name}/metrics"))
        tick(name)
    # restore the (4,2) checkpoint onto (8,1) and continue ...
    st8 = trainers[(8, 1)]
    ck.wait(mngr)
    assert ck.latest_step(mngr) == CHUNK
    restored, meta = ck.restore(mngr, st8.abstract_state, st8.shardings)
    assert meta == {"update": CHUNK}, meta
    assert restored.env.obs.sharding.spec == st8.shardings.env.obs.spec
    s, m = st8.train(restored, CHUNK)
    res.update(flat(gather_to_host(s), "resumed/state"))
    res.update(flat(jax.device_get(m), "resumed/metrics"))
    # ... and the same schedule without a checkpoint: (4,2) state moved to (8,1) in memory
    moved = jax.device_put(mid, st8.shardings)
    s, m = st8.train(moved, CHUNK)
    res.update(flat(gather_to_host(s), "moved/state"))
    res.update(flat(jax.device_get(m), "moved/metrics"))
    mngr.close()
    tick('checkpoint')
    critic_free(res)
    tick('critic-free')
    np.savez(f"{out}/mesh.npz", **res)


def critic_free(res: dict) -> None:
    """The critic-free trainer (GRPO / PS-PPO) on (1,1) and (8,1): rows of 3 updates (one
    scan) and the (8,1) run's collectives by loop nest (an ample token budget: no overflow,
    so both meshes pack the same tokens)."""
    from vccc_jax.train import critic_free as cf

    cfg = cf.CFConfig(env="token:V=8,H=6,Q=4,C=4,P=3,accept=0.4,seed=1", groups=8,
                      group_size=2, hidden=8, lr=1e-2, law="mixture:0.2", lag="uniform:2",
                      slack=4.0)
    for shape in [(1, 1), (8, 1)]:
        tr = cf.CriticFree(cfg, mesh=sh.make_mesh(shape))
        name = f"{shape[0]}x{shape[1]}"
        if shape == (8, 1):  # AOT: the program the run calls, and its HLO
            key = jax.random.PRNGKey(0)
            state, key = tr.place((tr.init(key), key))
            run = tr.run.lower(state, key, 3).compile()
            loops = collectives_by_loop(run.as_text())
            res["hlo/cf8x1"] = np.array(json.dumps([[list(k), v] for k, v in loops.items()]))
            tr.run = lambda s_, k_, n, run=run: run(s_, k_)
        _, rows = cf.train(cfg, 3, eval_every=4, trainer=tr)  # (no exact J: one compile less)
        for k in ("loss", "return", "kept_fraction", "overflow"):
            res[f"cf/{name}/{k}"] = np.array([r[k] for r in rows])


if __name__ == "__main__":
    main(sys.argv[1])
