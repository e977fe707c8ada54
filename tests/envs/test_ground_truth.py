"""Monte-Carlo ground truth V^pi(s) is unbiased with a calibrated standard error."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_envs import StopOrGo

from vccc_jax.envs import ground_truth as gt_lib
from vccc_jax.envs import rollout as rollout_lib

GAMMA, Q, P_GO = 0.9, 0.1, 0.3  # discount, per-step stop prob, P(action = 1 = reward)
S, N, H = 64, 64, 40


def _logits(p, obs):
    return jnp.broadcast_to(p, obs.shape[:-1] + (2,))


def _exact(horizon):
    x = GAMMA * (1 - Q)
    return P_GO * (1 - x**horizon) / (1 - x)


@pytest.fixture(scope="module")
def estimate():
    env = StopOrGo(deterministic_stop=False)
    params = env.default_params.replace(max_steps_in_episode=5, stop_prob=Q)
    carry = rollout_lib.reset(env, params, jax.random.PRNGKey(0), S)
    run = jax.jit(functools.partial(gt_lib.mc_values, env, params, _logits,
                                    num_rollouts=N, horizon=H, gamma=GAMMA),
                  static_argnames=("ignore_time_limit",))
    logits = jnp.log(jnp.array([1 - P_GO, P_GO]))
    lifted = run(logits, carry.env_state, carry.obs, jax.random.PRNGKey(1))
    kept = run(logits, carry.env_state, carry.obs, jax.random.PRNGKey(2), ignore_time_limit=False)
    return lifted, kept


def test_unbiased_at_999_confidence(estimate):
    """All states have the same value (memoryless env): pool them; |z| < 3.29 (99.9%)."""
    lifted, _ = estimate
    assert lifted.value.shape == (S,) and lifted.stderr.shape == (S,)
    truth = _exact(H)  # the horizon-H value, which the estimator targets exactly
    pooled_se = float(np.sqrt(np.sum(np.square(lifted.stderr)))) / S
    z = (float(np.mean(lifted.value)) - truth) / pooled_se
    assert abs(z) < 3.29, (float(np.mean(lifted.value)), truth, pooled_se)
    # power: the test resolves a 5% error
    assert 3.29 * pooled_se < 0.05 * truth
    # the tail bound covers the infinite-horizon value
    assert lifted.tail_discount == pytest.approx(GAMMA**H)
    assert _exact(10**6) - truth <= lifted.tail_discount * 1.0 / (1 - GAMMA)


def test_standard_error_is_calibrated(estimate):
    """The spread of per-state means across the S states matches the reported stderr.

    (S - 1) s^2 / se^2 ~ chi2(S - 1): accept within the central 99.8% interval.
    """
    lifted, _ = estimate
    spread = float(np.var(lifted.value, ddof=1))
    se2 = float(np.mean(np.square(lifted.stderr)))
    from scipy import stats

    lo, hi = stats.chi2.ppf([0.001, 0.999], S - 1) / (S - 1)
    assert lo < spread / se2 < hi


def test_time_limit_lifted_or_kept(estimate):
    """With the limit kept (5 steps, fresh states), the value is the 5-step one."""
    lifted, kept = estimate
    pooled_se = float(np.sqrt(np.sum(np.square(kept.stderr)))) / S
    assert abs(float(np.mean(kept.value)) - _exact(5)) < 3.29 * pooled_se
    assert float(np.mean(lifted.value)) > _exact(5) + 10 * pooled_se


def test_validation():
    env = StopOrGo()
    with pytest.raises(ValueError, match="num_rollouts"):
        gt_lib.mc_values(env, env.default_params, _logits, jnp.zeros(2), None, jnp.zeros((1, 2)),
                         jax.random.PRNGKey(0), num_rollouts=1, horizon=3, gamma=0.9)
    assert gt_lib.horizon_for(0.99, 0.01) == 459
    assert 0.99**459 <= 0.01 < 0.99**458
