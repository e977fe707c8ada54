"""The write-up's training protocol in the trainer (issue 11 §2): critic first, replay, b_psi."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs.rollout import Trajectory
from vccc_jax.train import replay as replay_lib
from vccc_jax.train import route_metrics
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

TAB = "tabular:family=garnet,S=4,A=2,gamma=0.8,seed=3"
SMALL = dict(env=TAB, gamma=0.8, num_envs=4, num_steps=8, num_minibatches=2, hidden=8,
             update_epochs=1, anneal_lr=False)


def _traj(t, b, a, fill):
    z = lambda *s: jnp.full(s, fill, jnp.float32)  # noqa: E731
    i = lambda *s: jnp.full(s, int(fill), jnp.int32)  # noqa: E731
    return Trajectory(obs=z(t, b, 2), action=i(t, b), reward=z(t, b), terminated=z(t, b) > 9,
                      truncated=z(t, b) > 9, final_obs=z(t, b, 2), log_mu=-z(t, b),
                      log_mu_all=-z(t, b, a), log_pi_all=z(t, b, a) * 0 - 0.7, lag=i(t, b) * 0,
                      version=i(t, b), episode_return=z(t, b), episode_length=i(t, b),
                      episode_done=z(t, b) > 9)


def test_replay_returns_logged_log_probs_and_versions():
    fresh = _traj(3, 2, 4, 2.0)

    @jax.jit  # one compile instead of many eager ops
    def run(fresh):
        buf = replay_lib.init_replay(_traj(3, 2, 4, 0.0), 2)
        buf = replay_lib.push(buf, _traj(3, 2, 4, 1.0), jnp.full((3, 2), 7, jnp.int32))
        return replay_lib.combine(buf, fresh, jnp.full((3, 2), 9, jnp.int32), jnp.int32(9),
                                  lambda o: jnp.zeros(o.shape[:-1] + (4,)) - 0.25)

    out, valid = run(fresh)
    assert out.log_mu.shape == (3, 6)
    np.testing.assert_array_equal(out.log_mu[:, :2], -2.0)  # fresh first
    stored = np.asarray(valid[0]) > 0
    np.testing.assert_array_equal(stored, [1, 1, 1, 1, 0, 0])  # slot 0 written, slot 1 empty
    np.testing.assert_array_equal(out.log_mu[:, 2:4], -1.0)  # logged behaviour log-probs
    np.testing.assert_array_equal(out.log_mu_all[:, 2:4], -1.0)
    np.testing.assert_array_equal(out.version[:, 2:4], 7)  # logged version ids
    np.testing.assert_array_equal(out.lag[:, 2:4], 2)  # current 9 - version 7
    np.testing.assert_array_equal(out.log_pi_all[:, :2], fresh.log_pi_all)  # fresh: rollout's log pi_k
    np.testing.assert_array_equal(out.log_pi_all[:, 2:], -0.25)  # replayed: recomputed


CRITIC_FIRST = dict(SMALL, lag="fixed:0", critic="uncorrected", critic_first=True,
                    critic_steps=4, actor_lr=0.0, critic_lr=0.05, gt_every=1,
                    total_timesteps=32 * 25)


@pytest.fixture(scope="module")
def critic_first_run():
    tr = Trainer(TrainConfig(**CRITIC_FIRST))
    s0 = tr.init()
    s1, m = tr.train(s0)
    return s0, s1, jax.device_get(m)


def test_critic_first_with_frozen_actor_converges_to_v_pi(critic_first_run):
    s0, s1, m = critic_first_run
    for a, b in zip(jax.tree_util.tree_leaves(s0.actor_params), jax.tree_util.tree_leaves(s1.actor_params)):
        np.testing.assert_array_equal(a, b)  # frozen actor
    err = m["exact_err_pi"][:, 0]
    assert err[-1] < 0.35 * err[0], err
    np.testing.assert_allclose(m["exact_gap"], 0.0, atol=1e-5)  # synchronous: V^mix = V^pi


@pytest.fixture(scope="module")
def replay_run():
    # also the PPO-EWMA pi_old route (issue 13) on the replayed batch
    cfg = TrainConfig(**SMALL, lag="fixed:1", critic="vccc", replay_updates=2,
                      baseline="learned", gt_every=2, total_timesteps=32 * 6,
                      pi_old_route="ewma")
    tr = Trainer(cfg)
    s, m = tr.train(tr.init())
    return tr, jax.device_get(s), jax.device_get(m)


def test_replay_lags_and_learned_baseline(replay_run):
    tr, _, m = replay_run
    assert tr.setup.ring_size == 4  # K = 2 plus the 2 replayed versions (exact truth)
    counts = m["count_by_lag"][:, 0]  # [updates, K + R]
    assert counts.shape == (6, 4)
    assert counts[-1, 3] > 0 and counts[-1, 2] > 0  # replayed data: lags 2 and 3
    for k in ("baseline_loss", "critic_loss", "actor_loss"):
        assert np.all(np.isfinite(m[k])), k
    ev = m["exact_err_pi"][1::2, 0]
    assert np.all(np.isfinite(ev)) and np.all(np.isfinite(m["bstar_err"][1::2, 0]))
    assert m["exact_err_mu"].shape == (6, 1, 4)


# -- decoupled pi_old routes (issue 13) --------------------------------------------------


def test_route_exact_without_mismatch_equals_default_bitwise(critic_first_run):
    """Synchronous, plain softmax sampling: the behaviour version IS pi_k, so the exact
    route's pi_old is pi_k bit for bit and the whole run equals the default trainer."""
    _, s0, m0 = critic_first_run
    tr = Trainer(TrainConfig(**CRITIC_FIRST, pi_old_route="exact"))
    s1, m1 = jax.device_get(tr.train(tr.init()))
    for a, b in zip(jax.tree_util.tree_leaves(s0), jax.tree_util.tree_leaves(s1)):
        np.testing.assert_array_equal(a, b)
    assert set(m1) == set(m0) | {"pi_old_kl"} | set(route_metrics.ROUTE_METRICS)
    for k in m0:
        np.testing.assert_array_equal(m0[k], m1[k], err_msg=k)
    np.testing.assert_array_equal(m1["pi_old_kl"], 0.0)


def test_route_ewma_runs_on_replay(replay_run):
    _, s, m = replay_run
    np.testing.assert_array_equal(s.ewma.count, 7)  # init counts one EMA step, then 1 per update
    assert np.all(np.isfinite(m["pi_old_kl"])) and np.all(m["pi_old_kl"] >= -1e-6)


def test_route_behaviour_runs_with_lag():
    tr = Trainer(TrainConfig(**SMALL, critic="vccc", actor="truncate", lag="fixed:1",
                             total_timesteps=32 * 2, pi_old_route="behaviour"))
    _, m = jax.device_get(tr.train(tr.init()))
    for k in ("actor_loss", "critic_loss", "pi_old_kl"):
        assert np.all(np.isfinite(m[k])), k
    # temperature 1, no mismatch: pi_old = mu, so KL(pi_k || pi_old) = KL(pi_k || mu)
    np.testing.assert_allclose(m["pi_old_kl"], m["kl_pi_mu"], rtol=1e-6)
