"""RAC estimator: identity kernel with no delay equals V-trace (exact, float64); queue ageing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related import rac
from vccc_jax.estimators.vtrace import vtrace


@pytest.mark.parametrize("clips", [(1.0, 1.0, 1.0), (1.3, 0.8, 1.1)])
def test_identity_kernel_no_delay_is_vtrace(clips):
    """Delay 0, identity kernel: fast + min(cbar, rho) residual = V-trace's pg advantage on the
    summed channels (rho_bar, c_bar, pg_rho_bar = clips; also rho_bar != c_bar)."""
    rbar, cbar, pgbar = clips
    kw = dict(clip_rho_threshold=rbar, clip_c_threshold=cbar)
    with jax.enable_x64(True):
        k = jax.random.split(jax.random.PRNGKey(0), 6)
        T, B = 7, 3
        lr = 0.7 * jax.random.normal(k[0], (T, B))
        disc = 0.9 * (jax.random.uniform(k[1], (T, B)) > 0.2)
        r_fast, r_slow = jax.random.normal(k[2], (T, B)), jax.random.normal(k[3], (T, B))
        v_fast, v_slow = jax.random.normal(k[4], (T, B)), jax.random.normal(k[5], (T, B))
        boot_f, boot_s = v_fast[0] * 0.5, v_slow[0] * -0.3
        fast = vtrace(lr, disc, r_fast, v_fast, boot_f, clip_pg_rho_threshold=pgbar, **kw).pg_advantages
        slow = rac.channel_residuals(lr, disc, r_slow, v_slow, boot_s, **kw)
        got = rac.rac_advantages(fast, slow, lr, kernel=(1.0,), delay=0, clip_pg_rho_threshold=pgbar)
        want = vtrace(lr, disc, r_fast + r_slow, v_fast + v_slow, boot_f + boot_s, clip_pg_rho_threshold=pgbar,
                      **kw).pg_advantages
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # the queue route gives the same reinjection at age 0
        q = rac.queue_push(rac.init_queue(1, T * B, jnp.float64), slow.reshape(-1), -lr.reshape(-1))
        inj = rac.queue_advantages(q, jnp.zeros((1, T * B), jnp.float64), (1.0,), clip_pg_rho_threshold=pgbar)
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


def test_residual_is_the_channel_vtrace_residual():
    """channel_residuals = r_t + gamma_t v_{t+1} - V(s_t) with v the channel's V-trace targets
    (v_T = the bootstrap), for rho_bar != c_bar."""
    with jax.enable_x64(True):
        k = jax.random.split(jax.random.PRNGKey(3), 5)
        lr = 0.7 * jax.random.normal(k[0], (6, 2))
        disc = 0.9 * (jax.random.uniform(k[1], (6, 2)) > 0.2)
        r, v, bv = jax.random.normal(k[2], (6, 2)), jax.random.normal(k[3], (6, 2)), jax.random.normal(k[4], (2,))
        kw = dict(clip_rho_threshold=1.4, clip_c_threshold=0.7)
        vs = vtrace(lr, disc, r, v, bv, **kw).vs
        want = r + disc * jnp.concatenate([vs[1:], bv[None]]) - v
        np.testing.assert_allclose(rac.channel_residuals(lr, disc, r, v, bv, **kw), want, rtol=0, atol=1e-12)


def test_delay_rule_and_clipped_injection():
    """The consuming step adds k(0) min(cbar, rho) a only at delay 0; any delay >= 1 waits."""
    fast, slow = jnp.array([1.0, -2.0]), jnp.array([3.0, 5.0])
    lr = jnp.log(jnp.array([0.5, 4.0]))
    got = rac.rac_advantages(fast, slow, lr, kernel=(0.6, 0.4), delay=0, clip_pg_rho_threshold=2.0)
    np.testing.assert_allclose(got, fast + 0.6 * jnp.array([0.5, 2.0]) * slow, rtol=1e-6)
    for delay in (1, 2):
        np.testing.assert_array_equal(rac.rac_advantages(fast, slow, lr, kernel=(0.6, 0.4), delay=delay), fast)
    np.testing.assert_allclose(rac.inject(slow, lr, 0.5, clip_pg_rho_threshold=None), 0.5 * jnp.array([0.5, 4.0]) * slow,
                               rtol=1e-6)


@pytest.mark.parametrize("bad", [(), (1.0, -0.1), (np.nan,), [[1.0]]])
def test_kernel_validation(bad):
    with pytest.raises(ValueError, match="kernel"):
        rac.validate_kernel(bad)
    assert rac.kernel_mass((0.5, 0.25)) == 0.75
