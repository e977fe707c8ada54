"""Sampled pi_old-route diagnostics of the trainer on gymnax (issue 13, ``train.route_metrics``).

Two trainer compiles (CartPole, 2 envs x 16 steps, 3 updates, ground truth at update 1 only):
the naive route pi_old := mu under a noisy inference sampler with lag 1 (biased against the
exact route), and the exact route with neither mismatch nor lag (the reference against itself).
(Two more, under the default emitters, for the one bitwise comparison of two programs.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _exact_programs import with_default_emitters

from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.train import route_metrics as rm
from vccc_jax.train import trainer as trainer_lib
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

TINY = dict(env="CartPole-v1", num_envs=2, num_steps=16, total_timesteps=2 * 16 * 3,
            update_epochs=1, num_minibatches=2, hidden=8, actor="truncate", actor_clip=2.0,
            gt_every=2, gt_states=2, gt_rollouts=2, gt_horizon=8, eval_envs=0)
NOISY = dict(TINY, lag="fixed:1", sampler="mismatch=noise,scale=0.3", pi_old_route="behaviour")
CLEAN = dict(TINY, lag="fixed:0", pi_old_route="exact")
ON = 1  # gt_every = 2: update index 1 is the only on-cycle one of 3


def _run(cfg, programs=lambda tr: tr):
    tr = programs(Trainer(TrainConfig(**cfg)))
    state0 = tr.init()
    _, m = tr.train(state0)
    return tr, state0, jax.device_get(m)


@pytest.fixture(scope="module")
def noisy():
    return _run(NOISY)


@pytest.fixture(scope="module")
def clean():
    return _run(CLEAN)


def test_metrics_present_and_nan_off_cycle(noisy):
    _, _, m = noisy
    for k in rm.ROUTE_METRICS:
        assert m[k].shape == (3, 1), k
        assert np.all(np.isnan(m[k][[0, 2]])), k  # off-cycle
        assert np.isfinite(m[k][ON, 0]), k
    for k in ("route_ppo_clip_frac", "route_w_clip_frac", "exact_ppo_clip_frac",
              "exact_w_clip_frac"):
        assert 0.0 <= m[k][ON, 0] <= 1.0, k
    assert -1.0 <= m["route_grad_cos"][ON, 0] <= 1.0


def test_behaviour_route_under_mismatch_is_biased(noisy):
    """pi_old := mu moves the whole inference noise into the PPO ratio: the gradient differs
    from the exact route's (noise std 0.3 on the logits: a relative bias far above float
    rounding), the discrepancy factor w(mu / mu) = 1 never fires, the PPO clip does."""
    _, _, m = noisy
    assert m["route_grad_rel_bias"][ON, 0] > 1e-3
    assert m["route_grad_cos"][ON, 0] < 1.0 - 1e-6
    assert m["route_w_clip_frac"][ON, 0] == 0.0
    assert m["route_ppo_clip_frac"][ON, 0] > 0.0


def test_exact_route_is_its_own_reference(clean):
    _, _, m = clean
    assert m["route_grad_rel_bias"][ON, 0] == 0.0
    assert m["route_grad_rel_var"][ON, 0] == m["exact_grad_rel_var"][ON, 0]
    np.testing.assert_allclose(m["route_grad_cos"][ON, 0], 1.0, rtol=1e-6)
    # lag 0, no mismatch: pi_old = pi_k = mu, so neither threshold fires
    assert m["exact_ppo_clip_frac"][ON, 0] == 0.0 and m["exact_w_clip_frac"][ON, 0] == 0.0


def test_without_mismatch_or_lag_behaviour_route_is_exact(clean):
    """mu == pi_old bit for bit (lag 0, plain softmax sampling): the behaviour route's
    pi_old is the exact route's, so its diagnostics are the exact route's (bias 0)."""
    tr, state0, _ = clean
    s = jax.tree_util.tree_map(lambda x: x[0], state0)
    _, traj = jax.jit(functools.partial(trainer_lib.rollout_step, tr.setup, tr.values))(
        s.actor_params, s.versions, s.env, jax.random.PRNGKey(1), 0)
    kw = dict(log_pi_all=traj.log_pi_all, log_mu_all=traj.log_mu_all,
              behaviour_log_pi_all=traj.log_b_all)
    exact = dec.route_log_pi_old("exact", traj.action, **kw)
    naive = dec.route_log_pi_old("behaviour", traj.action, **kw)
    for a, b in zip(exact, naive):
        np.testing.assert_array_equal(a, b)


def test_route_metrics_need_a_route_and_ground_truth_cycles():
    """pi_old_route "" records and computes nothing new (no keys: old outputs unchanged);
    gt_every = 0 (speed runs) computes nothing either. No compile here."""
    assert not Trainer(TrainConfig(**dict(TINY, pi_old_route=""))).setup.route_diag
    assert not Trainer(TrainConfig(**dict(NOISY, gt_every=0))).setup.route_diag
    assert Trainer(TrainConfig(**NOISY)).setup.route_diag  # noisy sampler + Monte-Carlo truth: fine


# -- pure parts ----------------------------------------------------------------------------


def test_grad_stats_closed_form():
    g_e = jnp.array([[1.0, 0.0], [3.0, 0.0]])  # mean (2, 0), spread 1
    g_r = jnp.array([[2.0, 1.0], [2.0, 3.0]])  # mean (2, 2), spread 1
    out = rm.grad_stats(g_r, g_e)
    np.testing.assert_allclose(out["route_grad_rel_bias"], 1.0)  # |(0, 2)| / |(2, 0)|
    np.testing.assert_allclose(out["route_grad_cos"], 1 / np.sqrt(2), rtol=1e-6)
    np.testing.assert_allclose(out["route_grad_rel_var"], 0.25)
    np.testing.assert_allclose(out["exact_grad_rel_var"], 0.25)
    same = rm.grad_stats(g_e, g_e)
    assert float(same["route_grad_rel_bias"]) == 0.0


def test_fire_rates_count_each_threshold():
    log_mu = jnp.log(jnp.array([0.5, 0.5, 0.5, 0.5]))
    log_old = jnp.log(jnp.array([0.5, 1.5, 0.5, 0.5]))  # d = 3 > c = 2 on token 1
    log_pi = jnp.log(jnp.array([0.5, 1.5, 0.8, 0.5]))  # r = 1.6 > 1.2 on token 2
    ppo, w = rm.fire_rates(log_pi, log_old, log_mu, None, kind="truncate", clip=2.0,
                           ppo_epsilon=0.2)
    np.testing.assert_allclose([ppo, w], [0.25, 0.25])
    ppo, w = rm.fire_rates(log_pi, log_old, log_mu, jnp.array([0.0, 1.0, 1.0, 1.0]),
                           kind="truncate", clip=2.0, ppo_epsilon=0.2)
    np.testing.assert_allclose([ppo, w], [1 / 3, 1 / 3], rtol=1e-6)


def test_interpolated_route_at_lag_one_is_the_behaviour_route(noisy):
    """A-3PO (pi_old_route "interpolated") has alpha = (l - 1) / l = 0 at lag 1: pi_prox = mu,
    so the whole run equals the behaviour route's, metric for metric: two different programs,
    compiled with the default emitters (_exact_programs.py) for a bitwise comparison."""
    tr, _, m_i = _run(dict(NOISY, pi_old_route="interpolated"), with_default_emitters)
    _, _, m_b = _run(NOISY, with_default_emitters)
    assert tr.config.pi_old_route == "interpolated"
    assert set(m_i) == set(m_b)
    for k in m_b:
        np.testing.assert_array_equal(m_i[k], m_b[k], err_msg=k)
