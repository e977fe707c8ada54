"""The field's asynchronous critics as trainer targets (issue 48): ``cleanba_mixed``,
``recompute_no_ratio`` (the trainer's ``gae``) and ``stale_gae`` equal
``estimators.related.field_critics.field_critic_target`` exactly, equal ``gae`` bit for bit at
lag 0, read the right critic version from the ring, and run in the simulator and in
``--async``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import lag as lag_lib
from vccc_jax.estimators.related.field_critics import FIELD_CRITICS, field_critic_target
from vccc_jax.estimators.types import Transitions
from vccc_jax.runs.train_async import run_async
from vccc_jax.train import async_pipeline as ap
from vccc_jax.train import learner
from vccc_jax.train import trainer as tr
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.targets import CRITIC_TARGETS, NEEDS_ACTOR_CRITIC, TargetInputs

SMALL = dict(env="CartPole-v1", num_envs=4, num_steps=8, update_epochs=1, num_minibatches=2,
             hidden=8, gt_every=0, eval_envs=0, seed=5)


def _inputs(T=6, B=3, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 6)
    u = lambda i: jax.random.normal(k[i], (T, B))  # noqa: E731
    discounts = 0.97 * (jax.random.uniform(k[5], (T, B)) > 0.2)  # some terminations
    t = Transitions(rewards=u(0), discounts=discounts, values=u(1), next_values=u(2),
                    log_rhos=0.3 * u(3))
    z = jnp.zeros((T, B, 2))
    return TargetInputs(transitions=t, truncated=jnp.zeros((T, B), bool), log_mu_all=z,
                        log_pi_all=z, baseline=t.values, behaviour_values=u(4),
                        behaviour_next_values=u(2) + 1.0)


@pytest.mark.parametrize("name", FIELD_CRITICS)
def test_trainer_target_is_the_field_critic_target(name):
    """The registered trainer target on a small batch (terminations, no time-limit cuts)
    equals ``field_critic_target`` on the same arrays exactly; its advantages are the target
    minus the values it used (the actor's copy for cleanba_mixed / stale_gae)."""
    x, cfg = _inputs(), TrainConfig(**SMALL, critic=name, gae_lambda=0.9)
    t = x.transitions
    out = CRITIC_TARGETS[name](x, cfg, None)
    want = field_critic_target(name, t.rewards, t.discounts, x.behaviour_values, t.values,
                               x.behaviour_next_values[-1], t.next_values[-1], 0.9)
    np.testing.assert_array_equal(out.targets, want)
    used = x.behaviour_values if name in NEEDS_ACTOR_CRITIC else t.values
    np.testing.assert_array_equal(out.advantages, want - used)


def test_recompute_no_ratio_is_the_trainers_gae():
    assert CRITIC_TARGETS["recompute_no_ratio"] is CRITIC_TARGETS["gae"]
    assert set(NEEDS_ACTOR_CRITIC) == set(FIELD_CRITICS) - {"recompute_no_ratio"}


@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])  # both policy heads
def lagged_rollout(request):
    """A rollout under uniform:3 lags of a cleanba_mixed trainer whose critic ring holds three
    distinct versions, and the trainer (categorical and Gaussian actor)."""
    trainer = tr.Trainer(TrainConfig(**(SMALL | {"env": request.param}),
                                     total_timesteps=4 * 8 * 3, lag="uniform:3",
                                     critic="cleanba_mixed"))
    setup = trainer.setup
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    ring = state.critic_versions
    for i in (1, 2):  # versions 1, 2: the critic scaled, so every version differs
        ring = lag_lib.push(ring, jax.tree_util.tree_map(lambda p: p * (1 + 0.5 * i),
                                                         state.critic_params))
    versions = lag_lib.push(lag_lib.push(state.versions, state.actor_params), state.actor_params)
    values = tr.program_values(trainer.values)
    k_lag, k_roll = jax.random.split(jax.random.PRNGKey(1))
    _, traj = jax.jit(lambda: tr.rollout_step(setup, values, state.actor_params, versions,
                                              state.env, k_roll, 2, k_lag))()
    return trainer, state.replace(critic_versions=ring), traj


def test_the_logged_values_are_each_steps_behaviour_critic(lagged_rollout):
    trainer, state, traj = lagged_rollout
    setup = trainer.setup
    got = jax.jit(lambda: tr.with_behaviour_values(setup, state.critic_versions,
                                                   state.critic_params, traj))()
    lags = set(np.unique(np.asarray(traj.lag)).tolist())
    assert len(lags) >= 2 and lags <= {0, 1, 2}  # several versions in one rollout
    for lag in lags:
        params = jax.tree_util.tree_map(lambda p: p * (1 + 0.5 * (2 - lag)), state.critic_params)
        want = np.stack([setup.critic_values(params, traj.obs),
                         setup.critic_values(params, traj.final_obs)], -1)
        at = np.asarray(traj.lag) == lag
        np.testing.assert_allclose(np.asarray(got.behaviour_values)[at], want[at], rtol=1e-5,
                                   atol=1e-6)


def test_at_lag_0_every_field_critic_is_the_gae_target_bit_for_bit(lagged_rollout):
    """At lag 0 the actor's critic copy is the learner's critic: targets and advantages of
    all three equal ``gae``'s bit for bit (whatever the copy's logged numbers)."""
    trainer, state, traj = lagged_rollout
    traj = traj.replace(lag=jnp.zeros_like(traj.lag),
                        behaviour_values=jnp.full(traj.obs.shape[:2] + (2,), 123.0))
    values = tr.program_values(trainer.values)

    def prepared(critic):
        setup = tr.Trainer(TrainConfig(**(SMALL | {"env": trainer.setup.cfg.env}),
                                       total_timesteps=4 * 8 * 3, lag="uniform:3",
                                       critic=critic)).setup
        p = jax.jit(lambda: learner.prepare(setup, values, traj, state.critic_params))()
        return np.asarray(p.targets), np.asarray(p.advantages)

    want = prepared("gae")
    for name in FIELD_CRITICS:
        got = prepared(name)
        np.testing.assert_array_equal(got[0], want[0], err_msg=name)
        np.testing.assert_array_equal(got[1], want[1], err_msg=name)


def test_field_critics_train_under_async_and_refuse_replay(tmp_path):
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 3, critic="stale_gae")
    _, rows = run_async(cfg, ap.AsyncSpec(timeout=120.0, mode="latest"), tmp_path,
                        checkpoint_every=0)
    assert [r["update"] for r in rows] == [0, 1, 2]
    assert all(np.isfinite(r["critic_loss"]) for r in rows)
    with pytest.raises(ValueError, match="replay buffer does not keep"):
        tr.Trainer(TrainConfig(**SMALL, total_timesteps=4 * 8 * 3, critic="cleanba_mixed",
                               lag="uniform:3", replay_updates=1))
