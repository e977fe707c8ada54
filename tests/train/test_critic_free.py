"""Critic-free trainer (GRPO / PS-PPO) on a tiny token env: rollout layout, prefix packing,
staleness, learner memory, runs as one compiled scan. One trainer per law, shared by the
module (the mesh run: tests/train/test_sharding.py)."""
import jax
import numpy as np
import pytest

from vccc_jax.train import critic_free as cf

ENV = "token:V=8,H=6,Q=4,C=4,P=3,accept=0.4,seed=1"


@pytest.fixture(scope="module")
def trainers():
    base = cf.CFConfig(env=ENV, groups=4, group_size=4, hidden=16, lr=1e-2)
    return {law: cf.CriticFree(base.replace(law=law, lag="uniform:2"))
            for law in ("full", "mixture:0.2")}


def test_rollout_groups_and_masks(trainers):
    tr = trainers["full"]
    st = tr.init(jax.random.PRNGKey(0))
    b = tr.rollout(st, jax.random.PRNGKey(1))
    H, B = 6, 16
    assert b.obs.shape[:2] == (H, B) and b.returns.shape == (B,)
    prompts = np.asarray(b.prompts).reshape(4, 4)
    assert np.all(prompts == prompts[:, :1])  # a group shares its prompt
    alive = np.asarray(b.alive)
    assert np.all(alive[0]) and np.all(np.diff(alive.astype(int), axis=0) <= 0)  # live prefix
    assert np.all(np.asarray(b.policy_step) <= alive)
    assert np.all(np.asarray(b.lags) == 0)  # only version 0 exists before the first update


def test_train_prefix_packing_and_staleness(trainers):
    full, ps = trainers["full"], trainers["mixture:0.2"]
    _, rows_ps = cf.train(ps.cfg, 6, trainer=ps, eval_every=3)
    _, rows_full = cf.train(full.cfg, 6, trainer=full, eval_every=3)
    assert all(r["kept_fraction"] == 1.0 and r["packed_rows"] == 6 * 16 for r in rows_full)
    kept = np.array([r["kept_fraction"] for r in rows_ps])
    assert np.all(kept < 1.0) and np.all(kept > 0.2)
    assert ps.capacity < full.capacity and rows_ps[-1]["compute_rows"] == 6 * ps.capacity
    assert max(r["mean_lag"] for r in rows_ps[2:]) > 0  # staleness once versions exist
    assert np.isfinite(rows_ps[2]["exact_return"]) and np.isnan(rows_ps[0]["exact_return"])
    # each run: two chunks of 3 updates, each ONE call of one compiled scan
    assert ps.run._cache_size() == 1 and full.run._cache_size() == 1


def test_learner_memory_is_smaller_with_prefix_sampling(trainers):
    costs = {}
    for law, tr in trainers.items():
        st = tr.init(jax.random.PRNGKey(0))
        key = jax.random.PRNGKey(2)
        costs[law] = cf.learner_cost(tr, st, tr.rollout(st, key), key, repeats=1)
    assert costs["mixture:0.2"]["temp_bytes"] < costs["full"]["temp_bytes"]
