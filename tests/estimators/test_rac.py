"""RAC estimator: identity kernel with no delay equals V-trace (exact, float64); queue ageing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related import rac
from vccc_jax.estimators.vtrace import vtrace


@jax.jit
def _identity_kernel_routes(key):
    """(RAC advantages at the identity kernel, V-trace's on the summed channels, the same via
    the queue at age 0), one compile."""
    k = jax.random.split(key, 6)
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
    q = rac.queue_push(rac.init_queue(1, T * B, jnp.float64), slow.reshape(-1), -lr.reshape(-1))
    inj = rac.queue_advantages(q, jnp.zeros((1, T * B), jnp.float64), (1.0,))
    return got, want, fast + inj.reshape(T, B)


def test_identity_kernel_no_delay_is_vtrace():
    with jax.enable_x64(True):
        got, want, queued = _identity_kernel_routes(jax.random.PRNGKey(0))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # the queue route gives the same reinjection at age 0
        np.testing.assert_allclose(queued, want, rtol=0, atol=1e-12)


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


def test_channel_residuals_are_exact_at_any_log_ratio():
    """Issue 19 §2: the residual r_t + gamma_t v_{t+1} - V(s_t) does not depend on log rho_t.
    Column j of the first row holds one edge log-ratio (-inf: the learner gives the token
    probability 0; -104: exp underflows in float32; 25: above the overflow guard; +inf; NaN);
    the old pg_advantages / exp(log rho) gave NaN, NaN, a residual scaled by e^-5, NaN, NaN.
    Checked against the residual with log rho_0 = 0 (same v_{t+1}) and a NumPy transcription
    of its definition, in float32; and the reinjection of a NaN / +inf ratio is 0."""
    edges = np.asarray([-np.inf, -104.0, 25.0, np.inf, np.nan], np.float32)
    rng = np.random.default_rng(3)
    T, B = 3, edges.size
    lr = rng.normal(0, 0.5, (T, B)).astype(np.float32)
    disc = np.float32(0.9) * (rng.random((T, B)) > 0.3).astype(np.float32)
    r, v = (rng.normal(size=(T, B)).astype(np.float32) for _ in range(2))
    boot = rng.normal(size=B).astype(np.float32)
    lr_edge = lr.copy()
    lr_edge[0] = edges
    lr_zero = lr.copy()
    lr_zero[0] = 0.0
    got = np.asarray(rac.channel_residuals(lr_edge, disc, r, v, boot))
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got, np.asarray(rac.channel_residuals(lr_zero, disc, r, v, boot)))
    vs = np.asarray(vtrace(lr_zero, disc, r, v, boot, clip_pg_rho_threshold=None).vs, np.float64)  # cached
    vs_next = np.concatenate([vs[1:], boot[None].astype(np.float64)])
    np.testing.assert_allclose(got, r + disc * vs_next - v, rtol=1e-5, atol=1e-5)
    inj = np.asarray(rac.inject(jnp.ones(4), jnp.asarray([np.nan, np.inf, -np.inf, 25.0]), 1.0,
                                clip_pg_rho_threshold=None))
    np.testing.assert_allclose(inj, [0.0, 0.0, 0.0, np.exp(20.0)], rtol=1e-6)
