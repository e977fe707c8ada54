"""The Brax adapter (``envs.brax_env``, the optional ``brax`` extra): skipped when Brax is not
installed. Brax's tiny ``fast`` test env (vel += dt [a > 0], pos += dt vel, reward = pos,
obs = (pos, vel)) against a NumPy loop, the time limit as a truncation with the final
observation, and one update of the trainer (Gaussian head) on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax")

from vccc_jax.envs.make import make_env  # noqa: E402
from vccc_jax.envs.rollout import env_step_info  # noqa: E402
from vccc_jax.train.config import TrainConfig, continuous_actions  # noqa: E402
from vccc_jax.train.trainer import Trainer  # noqa: E402

DT = 0.02


def test_fast_rollout_matches_numpy_and_truncates():
    env, params = make_env("brax:fast,max_steps=3")
    assert env.action_space(params).shape == (1,) and env.observation_space(params).shape == (2,)
    _, st = env.reset(jax.random.PRNGKey(0), params)
    step = jax.jit(lambda k, s, a: env_step_info(env, k, s, a, params))
    actions = [1.0, -0.5, 1.0, 1.0, 0.3]
    pos = vel = 0.0
    for t, a in enumerate(actions):
        obs, st, r, term, trunc, final_obs, _ = step(jax.random.PRNGKey(t), st, jnp.asarray([a]))
        vel += DT * (a > 0)
        pos += DT * vel
        np.testing.assert_allclose(final_obs, [pos, vel], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(r, pos, rtol=1e-5, atol=1e-7)
        assert not bool(term) and bool(trunc) == (t == 2)     # time limit 3: cut after step 3
        if t == 2:
            np.testing.assert_array_equal(obs, [0.0, 0.0])     # auto-reset
            pos = vel = 0.0


def test_one_continuous_update_on_brax():
    assert continuous_actions("brax:fast")
    cfg = TrainConfig(env="brax:fast,max_steps=5", num_envs=2, num_steps=10, total_timesteps=20,
                      num_minibatches=2, update_epochs=1, hidden=8, num_layers=1, lag="uniform:3",
                      critic="vccc", gt_every=1, gt_states=2, gt_rollouts=2, gt_horizon=4,
                      eval_envs=0)
    tr = Trainer(cfg)
    st = tr.init()
    st2, m = tr.train(st)
    assert int(m["episodes"][0, 0]) == 4                    # 10 steps / time limit 5, per env
    assert float(m["lag_mean"][0, 0]) == 0.0                # one version: on-policy
    assert float(m["ess"][0, 0]) == 1.0
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), st.actor_params, st2.actor_params)
    assert max(jax.tree_util.tree_leaves(moved)) > 0        # the actor learned something
    assert np.isfinite(float(m["gt_mse"][0, 0])) and np.isfinite(float(m["gt_stderr"][0, 0]))


def test_unknown_brax_env_is_one_line():
    with pytest.raises(ValueError, match="Brax has no env 'nope'"):
        make_env("brax:nope")
