"""Pin of ``Trajectory.discounts`` against NumPy: gamma (1 - terminated); a time-limit cut
(truncated, not terminated) keeps gamma so the target bootstraps from the final observation
(DESIGN.md section 3, "termination is not truncation"); the env's own discounts win."""
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs.rollout import Trajectory

GAMMA = 0.9


def _traj(terminated, truncated, discount=None):
    t = np.asarray(terminated)
    z = jnp.zeros(t.shape, jnp.float32)
    return Trajectory(obs=z[..., None], action=z.astype(jnp.int32), reward=z,
                      terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated),
                      final_obs=z[..., None], log_mu=z, log_mu_all=z[..., None],
                      log_pi_all=z[..., None], lag=z.astype(jnp.int32),
                      version=z.astype(jnp.int32), episode_return=z, episode_length=z,
                      episode_done=jnp.asarray(terminated), discount=discount)


def test_discounts_zero_only_at_termination():
    rng = np.random.default_rng(0)
    terminated = rng.random((7, 3)) < 0.3
    truncated = (rng.random((7, 3)) < 0.4) & ~terminated
    assert truncated.any() and terminated.any()
    got = np.asarray(_traj(terminated, truncated).discounts(GAMMA))
    want = np.where(terminated, 0.0, GAMMA)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert np.all(got[truncated] == np.float32(GAMMA))


def test_env_discounts_are_returned_as_logged():
    own = np.linspace(0.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
    got = _traj(np.ones((2, 3), bool), np.zeros((2, 3), bool), jnp.asarray(own)).discounts(GAMMA)
    np.testing.assert_array_equal(np.asarray(got), own)
