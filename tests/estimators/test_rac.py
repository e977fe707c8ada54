"""RAC estimator: identity kernel with no delay equals V-trace (exact, float64); queue ageing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related import rac
from vccc_jax.estimators.vtrace import vtrace


def test_identity_kernel_no_delay_is_vtrace():
    with jax.enable_x64(True):
        k = jax.random.split(jax.random.PRNGKey(0), 6)
        T, B = 7, 3
        lr = 0.7 * jax.random.normal(k[0], (T, B))
        disc = 0.9 * (jax.random.uniform(k[1], (T, B)) > 0.2)
        r_fast, r_slow = jax.random.normal(k[2], (T, B)), jax.random.normal(k[3], (T, B))
        v_fast, v_slow = jax.random.normal(k[4], (T, B)), jax.random.normal(k[5], (T, B))
        boot_f, boot_s = v_fast[0] * 0.5, v_slow[0] * -0.3
        fast = vtrace(lr, disc, r_fast, v_fast, boot_f).pg_advantages
        slow = rac.channel_residuals(lr, disc, r_slow, v_slow, boot_s)
        got = rac.rac_advantages(fast, slow, lr, kernel=(1.0,), delay=0)
        want = vtrace(lr, disc, r_fast + r_slow, v_fast + v_slow, boot_f + boot_s).pg_advantages
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # the queue route gives the same reinjection at age 0
        q = rac.queue_push(rac.init_queue(1, T * B, jnp.float64), slow.reshape(-1), -lr.reshape(-1))
        inj = rac.queue_advantages(q, jnp.zeros((1, T * B), jnp.float64), (1.0,))
        np.testing.assert_allclose(fast + inj.reshape(T, B), want, rtol=0, atol=1e-12)


def test_queue_ages_and_kernel_weights():
    q = rac.init_queue(3, 2)
    q = rac.queue_push(q, jnp.array([1.0, 2.0]), jnp.zeros(2))
    q = rac.queue_push(q, jnp.array([3.0, 4.0]), jnp.zeros(2))
    out = rac.queue_advantages(q, jnp.zeros((3, 2)), (0.5, 0.25, 0.25))
    np.testing.assert_allclose(out, [[1.5, 2.0], [0.25, 0.5], [0.0, 0.0]])
    # clipped ratio: pi_now / mu = e > cbar = 1
    out = rac.queue_advantages(q, jnp.ones((3, 2)), (1.0, 1.0, 1.0), clip_pg_rho_threshold=1.0)
    np.testing.assert_allclose(out[0], [3.0, 4.0], rtol=1e-6)


@pytest.mark.parametrize("bad", [(), (1.0, -0.1), (np.nan,), [[1.0]]])
def test_kernel_validation(bad):
    with pytest.raises(ValueError, match="kernel"):
        rac.validate_kernel(bad)
    assert rac.kernel_mass((0.5, 0.25)) == 0.75
