"""A run in chunks, with checkpoint round trips, is the run in one piece, update by update
(issue 27), on the plain trainer and on a (1, 1) mesh; and the Polyak target critic at
tau = 0.1, on the same compiled program (a grid cell of the chunked run's config).

In-process and split from tests/train/test_sharding.py (whose mesh subprocesses dominate
that file) so that ``pytest -n 2 --dist loadfile`` runs the two on different workers.
Compiles dominate (a trainer program costs ~3 CPU-s at XLA level 0, its run here ~0.1 s):
the tests share programs through the module's ``ProgramCache``."""

import jax
import numpy as np
import pytest

from vccc_jax.train import checkpoint
from vccc_jax.train import sharding as sh
from vccc_jax.train.programs import ProgramCache
from vccc_jax.train.trainer import TrainConfig, Trainer

PROGRAMS = ProgramCache()  # this module's compiled programs (key: program_key(config))

TRACE = (0, 2, 1, 0, 1)
CHUNKED = TrainConfig(env="tabular:family=garnet,S=5,A=3,gamma=0.9,seed=2", gamma=0.9, num_envs=4,
                      num_steps=8, num_minibatches=2, update_epochs=1, hidden=8, num_layers=1,
                      lag="trace:" + ",".join(map(str, TRACE)), gt_every=2, polyak=0.1,
                      total_timesteps=4 * 8 * 5)


def _chunks(train, state, n, reload=None):
    """``n`` calls of ``train(state, 1)``: metrics stacked [n, seeds, ...]. ``reload(state,
    k)``, if given, is applied after chunk k (a checkpoint round trip)."""
    parts = []
    for k in range(n):
        state, m = train(state, 1)
        parts.append(jax.device_get(m))
        if reload is not None:
            state = reload(state, k)
    return state, jax.tree_util.tree_map(lambda *x: np.concatenate(x), *parts)


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_chunked_runs_equal_one_run_at_every_update(num_seeds, tmp_path):
    """5 updates in one call vs 5 calls of one update, on the plain trainer (with a
    checkpoint save / load round trip after updates 2 and 4: update index, optimiser counts
    and keys all live in the state) and on a (1, 1) mesh (``ShardedTrainer``, the start index
    read from the state): every metric at every update is the same, bit for bit, and so is
    the final state. The run depends on the update index through the trace lag law (env b at
    update k acts at lag min(trace[(k B + b) mod 5], k)) and the ground-truth cadence (exact
    truth at updates k with (k + 1) mod 2 = 0, and at the last update), both checked against that brute-force
    schedule (and at the last update, k = 4), so a scan that restarts its index at 0 in
    every chunk fails."""
    cfg = CHUNKED.replace(num_seeds=num_seeds)
    tr = Trainer(cfg, PROGRAMS)
    init = jax.device_get(tr.init())
    whole_state, whole = jax.device_get(tr.train(init, 5))
    B, T, n = cfg.num_envs, cfg.num_steps, 5
    for k in range(n):  # the brute-force schedule
        lags = [min(TRACE[(k * B + b) % len(TRACE)], k) for b in range(B)]
        np.testing.assert_array_equal(whole["count_by_lag"][k], np.broadcast_to(
            T * np.bincount(lags, minlength=3), (num_seeds, 3)), err_msg=f"update {k}")
        assert np.all(np.isfinite(whole["exact_err_pi"][k])) == ((k + 1) % 2 == 0 or k == 4), k

    def reload(state, k):
        if k not in (1, 3):
            return state
        checkpoint.save(tmp_path / "ckpt", state, {"update": k + 1})
        return checkpoint.load(tmp_path / "ckpt", tr.init())

    mesh = sh.ShardedTrainer(tr, sh.make_mesh((1, 1)))
    runs = {"plain": _chunks(tr.train, init, n, reload),
            "1x1": _chunks(mesh.train, jax.device_put(init, mesh.shardings), n)}
    assert checkpoint.read_meta(tmp_path / "ckpt")["update"] == 4
    for name, (state, metrics) in runs.items():
        assert set(metrics) == set(whole)
        for k in whole:
            np.testing.assert_array_equal(metrics[k], whole[k], err_msg=f"{name}: {k}")
        for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(state)),
                        jax.tree_util.tree_leaves(whole_state)):
            np.testing.assert_array_equal(a, b, err_msg=name)


# -- Polyak target critic at tau != 1/2 (issue 27) ----------------------------------------

# the chunked run's config with its own critic learning rate: a grid value, so the same
# compiled program as test_chunked_runs_equal_one_run_at_every_update[1]
POLYAK = CHUNKED.replace(critic_lr=1e-2)


def test_polyak_target_moves_by_tau_at_tau_one_tenth():
    """Three single updates at tau = 0.1: the target starts as the critic and after each update
    is (1 - tau) target + tau critic_new, leaf by leaf, against that recursion in float64
    (at tau = 1/2 a swap of tau and 1 - tau is invisible; here it moves the target 9x too
    far)."""
    tau, tr = POLYAK.polyak, Trainer(POLYAK, PROGRAMS)
    assert tr.programs is Trainer(CHUNKED, PROGRAMS).programs  # one compile for both tests
    state = tr.init()
    leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(  # noqa: E731
        jax.device_get(tree))]
    target = leaves(state.critic_params)
    assert all(np.array_equal(a, b) for a, b in zip(leaves(state.target_critic_params), target))
    for _ in range(3):
        before = leaves(state.critic_params)
        state, _ = tr.train(state, 1)
        critic = leaves(state.critic_params)
        assert max(np.max(np.abs(c - b)) for c, b in zip(critic, before)) > 1e-3  # the critic moved
        target = [(1 - tau) * t + tau * c for t, c in zip(target, critic)]
        for got, want in zip(leaves(state.target_critic_params), target):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
