"""Subprocess worker (2 fake CPU devices) for tests/train/test_async_mesh.py: the ``lag1``
pipeline (two actor threads on device 0, deterministic) for 4 updates with the learner on
device 1 and with the learner sharded over devices 0 and 1; the second also through
``run_async``, stopped after update 2 (the sharded state checkpointed) and resumed. Writes
OUT/async_mesh.npz (per run: every update's metrics, the batches' versions and actions, the
final learner state; the run_async rows' losses and lags)."""

import sys

from _scale_common import flat, set_devices

set_devices(2)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from vccc_jax.runs.train import Interrupted  # noqa: E402
from vccc_jax.runs.train_async import run_async  # noqa: E402
from vccc_jax.train import async_pipeline as ap  # noqa: E402
from vccc_jax.train.config import TrainConfig  # noqa: E402
from vccc_jax.train.trainer import Trainer  # noqa: E402


def run(trainer, learner):
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    spec = ap.AsyncSpec(actors=2, actor_devices=(0,), learner_devices=learner, timeout=120.0)
    pipe = ap.Pipeline(trainer, spec, state, ap.initial_actor_keys(state.key, 2), 0)
    state = pipe.place_state(state)
    if len(learner) > 1:  # the state really is spread over the mesh
        assert len(state.env.obs.sharding.device_set) == 2, state.env.obs.sharding
    out = []
    try:
        for k, batch, state, m in pipe.drive(state, trainer.num_updates):
            out.append(jax.device_get((m, batch.traj.version, batch.traj.action)))
    finally:
        assert pipe.close() == []
    metrics = jax.tree_util.tree_map(lambda *x: np.stack(x), *[o[0] for o in out])
    res = flat(metrics, "metrics")
    res["version"] = np.stack([o[1] for o in out])
    res["action"] = np.stack([o[2] for o in out])
    res.update(flat(jax.device_get(state.actor_params), "actor"))
    res.update(flat(jax.device_get(state.critic_params), "critic"))
    return res


def main(out: str) -> None:
    assert jax.device_count() == 2, jax.devices()
    cfg = TrainConfig(env="CartPole-v1", num_envs=4, num_steps=8, update_epochs=2,
                      num_minibatches=2, hidden=8, gt_every=0, eval_envs=0, seed=3,
                      total_timesteps=4 * 8 * 4)
    trainer = Trainer(cfg)
    res = {f"one/{k}": v for k, v in run(trainer, (1,)).items()}
    res.update({f"mesh/{k}": v for k, v in run(trainer, (0, 1)).items()})
    spec = ap.AsyncSpec(actors=2, actor_devices=(0,), learner_devices=(0, 1), timeout=120.0)
    try:
        run_async(cfg, spec, f"{out}/run", stop=lambda: True)  # stops after update 1
    except Interrupted as e:
        assert e.update == 1, e
    _, rows = run_async(cfg, spec, f"{out}/run", resume=True, checkpoint_every=2)
    for name in ("actor_loss", "critic_loss", "version_diff_avg"):
        res[f"run_async/{name}"] = np.array([r[name] for r in rows], np.float64)
    np.savez(f"{out}/async_mesh.npz", **res)


if __name__ == "__main__":
    main(sys.argv[1])
