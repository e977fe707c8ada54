"""``vccc train --async --actor-sync-every M`` (issue 48): mid-rollout weight updates. An actor
runs its rollout as T / M chunks of the same jitted rollout (each chunk its slice of the
rollout's draws) and takes parameters before each, so every step keeps its own version.
Deterministic: the chunks against the whole rollout given the versions, and ``lag1`` mode
(chunk 0 one version stale, later chunks wait for the newest) against the simulator's
``fixed:1`` with ``switch_every`` = M; no assertion depends on thread timing."""

import functools

import jax
import numpy as np
import pytest

from vccc_jax.envs.lag import LagLaw, switch_lags
from vccc_jax.train import async_lag as al
from vccc_jax.train import async_pipeline as ap
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

SMALL = dict(env="CartPole-v1", num_envs=4, num_steps=8, update_epochs=1, num_minibatches=2,
             hidden=8, gt_every=0, eval_envs=0, seed=3)
T, M = 8, 4


@functools.lru_cache(maxsize=None)
def _rollout_setup(env="CartPole-v1"):
    trainer = Trainer(TrainConfig(**(SMALL | {"env": env}), total_timesteps=4 * 8 * 2))
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    roll = jax.jit(functools.partial(ap.actor_rollout, trainer.setup), static_argnames=("steps",))
    return trainer, state, roll


def _equal(a, b):
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


@pytest.mark.parametrize("every,env", [(0, "CartPole-v1"), (T, "CartPole-v1"),
                                       (2, "CartPole-v1"), (2, "Pendulum-v1")])
def test_chunks_of_one_version_are_the_whole_rollout_bit_for_bit(every, env):
    """Chunks run one after the other with the same parameters give the whole rollout's
    trajectory, carry and next key bit for bit (the same draws, sliced), stamped per step;
    on the categorical and the Gaussian head (0 and T: one call, the current code path)."""
    trainer, state, roll = _rollout_setup(env)
    values = ap.program_values(trainer.values)
    whole = roll(values, state.actor_params, state.env, state.key, np.int32(5))
    calls = []

    def take(c):
        calls.append(c)
        return 5, state.actor_params

    carry, traj, key, first = ap.chunked_rollout(roll, values, take, state.env, state.key, T,
                                                 every)
    assert calls == list(range(T // every if every else 1)) and first == 5
    if env == "CartPole-v1":
        _equal((carry, traj, key), whole)
    else:  # continuous states: the chunked physics compiles to other fused float32 kernels
        _equal(key, whole[2])  # the same draws; states and actions to float32 rounding
        jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                                 atol=1e-6),
                               jax.device_get((carry, traj)), jax.device_get(whole[:2]))
        _equal(traj.version, whole[1].version)
    np.testing.assert_array_equal(np.asarray(traj.version), 5)


def test_versions_change_exactly_at_chunk_boundaries():
    """Versions 2, 2, 3, 6 for the chunks of M = 2 steps: every step is stamped with its
    chunk's version; chunk 0 equals the whole rollout's first steps (same params), and the
    steps after the first new version act with other parameters (their log mu differ)."""
    trainer, state, roll = _rollout_setup()
    values = ap.program_values(trainer.values)
    versions = [2, 2, 3, 6]
    other = jax.tree_util.tree_map(lambda x: x + 0.5, state.actor_params)
    take = lambda c: (versions[c], state.actor_params if versions[c] == 2 else other)  # noqa: E731
    _, traj, _, first = ap.chunked_rollout(roll, values, take, state.env, state.key, T, 2)
    _, whole, _ = roll(values, state.actor_params, state.env, state.key, np.int32(2))
    assert first == 2
    np.testing.assert_array_equal(np.asarray(traj.version),
                                  np.repeat(versions, 2)[:, None] * np.ones((1, 4), int))
    _equal(jax.tree_util.tree_map(lambda x: x[:4], traj.replace(version=whole.version)),
           jax.tree_util.tree_map(lambda x: x[:4], whole))
    assert not np.array_equal(np.asarray(traj.log_mu[4:]), np.asarray(whole.log_mu[4:]))


def test_spec_refuses_a_chunk_that_does_not_divide_the_rollout():
    trainer, state, _ = _rollout_setup()
    with pytest.raises(ValueError, match="must be >= 0"):
        ap.AsyncSpec(sync_every=-1)
    with pytest.raises(ValueError, match="--actor-sync-every 3 must divide num_steps 8"):
        ap.Pipeline(trainer, ap.AsyncSpec(sync_every=3), state,
                    ap.initial_actor_keys(state.key, 1), 0)


def test_lag1_with_mid_rollout_sync_is_the_simulators_fixed1_with_switches():
    """One actor thread, ``lag1``, M = T / 2: rollout k acts with version k - 1 for its first
    M steps and k after (waiting for it), deterministically: the simulator's ``fixed:1`` with
    ``switch_every`` = M. Versions change exactly at the chunk boundary; actions, rewards,
    episodes and lags equal exactly, floats to 1e-4 (as in test_async.py's lag1 test: log pi_k
    of stale steps from a differently shaped forward). The metrics see the two-version
    rollouts (lag 0 and 1 in one batch), and the first-step lags of lags.trace with the
    simulator's ``switch_lags`` reproduce every step's lag (the hop per chunk is 1 here)."""
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 5, lag="fixed:1", switch_every=M)
    trainer = Trainer(cfg)
    _, sim = trainer.train(trainer.init())
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    pipe = ap.Pipeline(trainer, ap.AsyncSpec(timeout=120.0, sync_every=M), state,
                       ap.initial_actor_keys(state.key, 1), 0)
    got, trajs = [], al.TrajectoryLags(cfg.num_envs)
    try:
        for k, batch, state, m in pipe.drive(state, trainer.num_updates):
            version, done = jax.device_get((batch.traj.version, batch.traj.episode_done))
            lag = k - np.asarray(version)
            got.append(jax.device_get(m) | {"version": np.asarray(version), "lag": lag}
                       | al.transition_metrics(lag) | trajs.update(version, lag, done))
    finally:
        assert pipe.close() == []
    for k, g in enumerate(got):  # versions change exactly at t = M (from update 1 on)
        want = np.array([max(k - 1, 0)] * M + [k] * M)[:, None] * np.ones((1, 4), int)
        np.testing.assert_array_equal(g["version"], want)
    for name, column in sim.items():
        want = np.asarray(column)[:, 0]
        have = np.stack([np.asarray(g[name]) for g in got])
        np.testing.assert_array_equal(have[0], want[0], err_msg=name)
        if name in ("return", "episodes", "lag_mean", "count_by_lag", "nonfinite"):
            np.testing.assert_array_equal(have, want, err_msg=name)
        else:
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-6, err_msg=name)
    for g in got[1:]:  # multi-version rollouts: half the steps at lag 1, half at lag 0
        assert (g["version_diff_min"], g["version_diff_max"]) == (0, 1)
        assert g["lag_hist0"] == g["lag_hist1"] == 0.5
    assert np.nanmax([g["traj_multi_version_frac"] for g in got]) > 0
    trace = al.LagTrace()
    for g in got:
        trace.add(g["lag"][0])
    law = LagLaw("trace", 0.0, tuple(x for row in trace.rows for x in row))
    for k, g in enumerate(got):
        lag0 = law.sample(jax.random.PRNGKey(0), 4, 2, available=k + 1, step=k)
        replayed = np.stack([np.asarray(switch_lags(lag0, t, every=M)) for t in range(T)])
        np.testing.assert_array_equal(replayed, g["lag"])


def test_bounded_with_mid_rollout_sync_under_real_threads():
    """``bounded:1``, 2 actor threads, queue 2, M = 2 (timing decides the versions, not the
    assertions): in every rollout each chunk has one version, versions never go back inside
    a rollout, and the bound holds for every step (it is checked on the oldest, first one)."""
    trainer = Trainer(TrainConfig(**SMALL, total_timesteps=4 * 8 * 6))
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    spec = ap.AsyncSpec(actors=2, queue=2, mode="bounded:1", timeout=120.0, sync_every=2)
    pipe = ap.Pipeline(trainer, spec, state, ap.initial_actor_keys(state.key, 2), 0)
    try:
        for k, batch, state, _ in pipe.drive(state, trainer.num_updates):
            version = np.asarray(jax.device_get(batch.traj.version))  # [T, B]
            chunks = version.reshape(T // 2, 2, 4)
            np.testing.assert_array_equal(chunks[:, 0], chunks[:, 1])  # one version per chunk
            assert (np.diff(version, axis=0) >= 0).all()
            assert 0 <= (k - version).min() and (k - version).max() <= 1
    finally:
        assert pipe.close() == []
