"""RAC estimator: identity kernel with no delay equals V-trace (exact, float64); queue ageing."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related import rac
from vccc_jax.estimators.vtrace import vtrace


@functools.partial(jax.jit, static_argnums=1)
def _identity_kernel_routes(key, clips):
    """(RAC advantages at the identity kernel, V-trace's on the summed channels, the same via
    the queue at age 0), one compile per clip setting."""
    rbar, cbar, pgbar = clips
    kw = dict(clip_rho_threshold=rbar, clip_c_threshold=cbar)
    k = jax.random.split(key, 6)
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
    q = rac.queue_push(rac.init_queue(1, T * B, jnp.float64), slow.reshape(-1), -lr.reshape(-1))
    inj = rac.queue_advantages(q, jnp.zeros((1, T * B), jnp.float64), (1.0,), clip_pg_rho_threshold=pgbar)
    return got, want, fast + inj.reshape(T, B)


@pytest.mark.parametrize("clips", [(1.0, 1.0, 1.0), (1.3, 0.8, 1.1)])
def test_identity_kernel_no_delay_is_vtrace(clips):
    """Delay 0, identity kernel: fast + min(cbar, rho) residual = V-trace's pg advantage on the
    summed channels (rho_bar, c_bar, pg_rho_bar = clips; also rho_bar != c_bar)."""
    with jax.enable_x64(True):
        got, want, queued = _identity_kernel_routes(jax.random.PRNGKey(0), clips)
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
