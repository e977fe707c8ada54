"""importance.py against independent float64 NumPy references."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vccc_jax.estimators import importance as imp


def np_weights(log_rhos, kind, clip):
    rho = np.exp(np.minimum(log_rhos, imp.MAX_LOG_RHO))
    if kind == "ratio":
        return rho
    if kind == "truncate":
        return np.minimum(rho, clip)
    return np.where((rho >= 1 / clip) & (rho <= clip), rho, 0.0)


@pytest.mark.parametrize("kind,clip", [("ratio", None), ("truncate", 2.0), ("mask", 3.0)])
def test_weights_match_numpy_under_jit_and_vmap(kind, clip):
    with jax.enable_x64(True):
        x = np.random.default_rng(0).normal(0, 1.5, size=(7, 3, 2))
        f = jax.jit(lambda lr: imp.importance_weights(lr, kind, clip))
        np.testing.assert_allclose(f(jnp.asarray(x)), np_weights(x, kind, clip), rtol=1e-12)
        vf = jax.vmap(f, in_axes=1, out_axes=1)
        np.testing.assert_allclose(vf(jnp.asarray(x)), np_weights(x, kind, clip), rtol=1e-12)


def test_mask_boundaries_are_inclusive():
    c = 2.0
    lr = jnp.log(jnp.array([0.5, 2.0, 0.49, 2.01, 1.0]))
    np.testing.assert_allclose(imp.importance_weights(lr, "mask", c), [0.5, 2.0, 0.0, 0.0, 1.0], rtol=1e-6)


@jax.jit
def _guard_numbers(lr):
    """safe_ratios, its gradient and the truncate-2 diagnostics (one compile)."""
    g = jax.grad(lambda x: jnp.sum(imp.safe_ratios(x)))(lr)
    return imp.safe_ratios(lr), g, imp.ratio_diagnostics(lr, kind="truncate", clip=2.0)


def test_overflow_guard_and_nonfinite_inputs():
    lr = jnp.array([100.0, -100.0, jnp.inf, -jnp.inf, jnp.nan, 0.0], jnp.float32)
    rho, g, d = _guard_numbers(lr)
    assert np.all(np.isfinite(rho))
    # +inf (behaviour prob 0 for a logged action) and NaN are invalid data: weight 0.
    np.testing.assert_allclose(rho, [np.exp(20.0), 0.0, 0.0, 0.0, 0.0, 1.0], rtol=1e-6, atol=1e-30)
    # rho**2 stays finite in float32, so variances downstream are finite too.
    assert np.isfinite(np.asarray(rho**2)).all()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(np.asarray(g)[[0, 2, 4]], 0.0)  # flat beyond the guard, 0 for NaN
    assert int(d.num_nonfinite) == 3
    np.testing.assert_allclose(d.guard_fraction, 1 / 6)  # finite log-ratios above the guard only


def test_ratio_diagnostics_against_numpy():
    rng = np.random.default_rng(1)
    n, num_versions, clip = 400, 4, 1.5
    lr = rng.normal(0, 0.8, size=(40, 10)).astype(np.float32)
    versions = rng.integers(0, num_versions, size=lr.shape)
    d = jax.jit(lambda x, v: imp.ratio_diagnostics(x, kind="truncate", clip=clip, versions=v, num_versions=num_versions))(lr, versions)
    rho = np.exp(lr.astype(np.float64)).ravel()
    w = np.minimum(rho, clip)
    np.testing.assert_allclose(d.ess_fraction, w.sum() ** 2 / (n * (w**2).sum()), rtol=1e-5)
    np.testing.assert_allclose(d.clip_fraction, np.mean(rho > clip), rtol=1e-6)
    srt = np.sort(lr.ravel())
    expect_q = [srt[int(round(q * (n - 1)))] for q in imp.QUANTILES]
    np.testing.assert_allclose(d.log_rho_quantiles, expect_q, rtol=1e-6)
    v = versions.ravel()
    for k in range(num_versions):
        sel = v == k
        assert d.count_by_version[k] == sel.sum()
        np.testing.assert_allclose(d.clip_fraction_by_version[k], np.mean(rho[sel] > clip), rtol=1e-5)
        wk = w[sel]
        np.testing.assert_allclose(d.ess_fraction_by_version[k], wk.sum() ** 2 / (sel.sum() * (wk**2).sum()), rtol=1e-5)
    # Mask: anything outside [1/c, c] is counted as masked.
    dm = jax.jit(lambda x: imp.ratio_diagnostics(x, kind="mask", clip=clip))(jnp.asarray(lr))
    np.testing.assert_allclose(dm.clip_fraction, np.mean((rho > clip) | (rho < 1 / clip)), rtol=1e-6)


def test_invalid_arguments_name_themselves():
    with pytest.raises(ValueError, match="kind"):
        imp.importance_weights(jnp.zeros(3), "clipped", 2.0)
    with pytest.raises(ValueError, match="clip"):
        imp.importance_weights(jnp.zeros(3), "truncate", None)
    with pytest.raises(ValueError, match="clip"):
        imp.importance_weights(jnp.zeros(3), "mask", 0.5)
    with pytest.raises(ValueError, match="behaviour_log_probs"):
        imp.log_ratios(jnp.log(jnp.array([0.5, 0.5])), jnp.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="behaviour_log_probs"):
        imp.log_ratios(jnp.zeros(3), jnp.zeros(2))


_weights_jit = jax.jit(lambda x: (imp.importance_weights(x, "ratio"), imp.importance_weights(x, "truncate", 2.0), imp.importance_weights(x, "mask", 2.0)))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=8, max_size=8))
def test_property_finite_weights_for_finite_log_ratios(xs):
    out = _weights_jit(jnp.asarray(xs, jnp.float32))
    for w in out:
        assert np.all(np.isfinite(np.asarray(w)))
        assert np.all(np.asarray(w) >= 0)


def _total_order(v: float):
    """An independent sort key: IEEE total order from exact rationals (no float compares)."""
    if np.isinf(v):
        return (2 if v > 0 else 0, 0, 0)
    return (1, Fraction(float(v)), int(np.copysign(1.0, v)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sort_floats_is_the_ieee_total_order(dtype):
    """The integer-key sort of the log-ratio quantiles, bits compared against an exact
    rational reference: -0.0 before +0.0, subnormals by value (XLA:CPU's float compares
    flush them, so ``jnp.sort`` ties them with 0), infinities, ties; vmapped rows too."""
    rng = np.random.default_rng(3)
    tiny = np.finfo(dtype).tiny
    special = np.array([0.0, -0.0, np.inf, -np.inf, tiny / 4, -tiny / 4, 1.0, 1.0, -1.0,
                        np.finfo(dtype).max, np.finfo(dtype).min], dtype)
    x = np.concatenate([special, rng.normal(0, 3, 53).astype(dtype)])
    rows = np.stack([rng.permutation(x) for _ in range(3)])
    with jax.enable_x64(dtype == np.float64):
        got = np.asarray(jax.jit(jax.vmap(imp.sort_floats))(jnp.asarray(rows)))
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    assert got.dtype == dtype
    for g, r in zip(got, rows):
        expect = np.array(sorted(r, key=_total_order), dtype)
        np.testing.assert_array_equal(g.view(uint), expect.view(uint))
