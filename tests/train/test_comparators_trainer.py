"""`vccc train --critic brace` (issue 13): the trainer runs it, and its targets on a rollout
are ``estimators.related.brace.brace`` of that rollout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators.related.brace import brace
from vccc_jax.train import learner, route_metrics
from vccc_jax.train.config import TrainConfig, check_comparators
from vccc_jax.train.targets import CRITIC_TARGETS
from vccc_jax.train.trainer import Trainer

CFG = TrainConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16, update_epochs=1,
                  num_minibatches=2, hidden=8, lag="fixed:1", num_versions=2, critic="brace",
                  brace_n=2, rho_bar=1.5, c_bar=1.2, eval_envs=0)


@pytest.fixture(scope="module")
def trainer():
    return Trainer(CFG)


def test_brace_trains(trainer):
    assert "brace" in CRITIC_TARGETS
    states, metrics = trainer.train(trainer.init(), 1)  # one update: compile time dominates
    assert not set(route_metrics.ROUTE_METRICS) & set(metrics)  # pi_old_route "": no new keys
    assert np.all(np.isfinite(np.asarray(metrics["target_mean"])))
    assert np.all(np.isfinite(np.asarray(metrics["v_loss"] if "v_loss" in metrics else metrics["target_std"])))


def test_brace_targets_equal_estimator_on_the_rollout(trainer):
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    newer = jax.tree_util.tree_map(lambda p: p + 0.5 * jnp.sign(p), state.actor_params)
    ring = lag_lib.push(state.versions, newer)  # lag 1 = the init params, lag 0 = newer
    _, traj = rollout_lib.rollout(trainer.setup.env, trainer.setup.env_params, trainer.setup.actor_logits, ring,
                                  state.env, jax.random.PRNGKey(3), num_steps=CFG.num_steps,
                                  lags=jnp.ones((CFG.num_envs,), jnp.int32))
    prep = jax.jit(functools.partial(learner.prepare, trainer.setup, trainer.values))(
        traj, state.critic_params)
    t = prep.inputs.transitions
    assert float(jnp.max(jnp.abs(t.log_rhos))) > 0.05  # really off-policy
    ref = brace(t.log_rhos, t.discounts, t.rewards, t.values, t.next_values[-1], n=2,
                clip_rho_threshold=1.5, clip_c_threshold=1.2, clip_pg_rho_threshold=1.5,
                truncations=traj.truncated, truncation_values=t.next_values)
    np.testing.assert_allclose(prep.targets, ref.vs, rtol=1e-5, atol=1e-5)


def test_comparator_fields_are_checked():
    for bad in (dict(brace_n=-1), dict(brace_tail_anchor="x"), dict(pi_old_route="snapshot"),
                dict(ewma_decay=1.0)):
        with pytest.raises(ValueError, match=list(bad)[0]):
            check_comparators(CFG.replace(**bad))
    check_comparators(CFG.replace(pi_old_route="ewma", ewma_decay=0.5))
