"""critic_targets.py against independent float64 NumPy references and the write-up's bandit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vccc_jax.estimators import critic_targets as ct

SHAPE = (6, 3, 2)  # time-major with trailing batch dims


def np_w(lr, kind, c):
    rho = np.exp(lr)
    if kind == "ratio":
        return rho
    if kind == "truncate":
        return np.minimum(rho, c)
    return np.where((rho >= 1 / c) & (rho <= c), rho, 0.0)


def np_targets(r, d, v, nv, lr, b, z, kind, c):
    """Plain NumPy, written from the equations, not from the library."""
    h = r + d * nv
    rho = np.exp(lr)
    w = np_w(lr, kind, c)
    return {
        "uncorrected": h,
        "vccc_b": h + (rho - 1) * (h - b),
        "iwtd": v + rho * (h - v),
        "clipped": v + w * (h - v),
        "naive": h + (w - 1) * (h - b),
        "centered": v + w * (h - v) - (w - z) * (b - v),
    }


def lib_targets(r, d, v, nv, lr, b, z, kind, c, stop=True):
    kw = dict(stop_target_gradients=stop)
    return {
        "uncorrected": ct.uncorrected_target(r, d, nv, **kw),
        "vccc_b": ct.vccc_target(r, d, v, nv, lr, b, **kw),
        "iwtd": ct.vccc_target(r, d, v, nv, lr, **kw),
        "clipped": ct.clipped_target(r, d, v, nv, lr, clip=c, kind=kind, **kw),
        "naive": ct.naive_clipped_target(r, d, v, nv, lr, b, clip=c, kind=kind, **kw),
        "centered": ct.centered_clipped_target(r, d, v, nv, lr, b, z, clip=c, kind=kind, **kw),
    }


def random_inputs(seed, shape=SHAPE):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=shape)
    d = rng.uniform(0, 1, size=shape) * (rng.uniform(size=shape) > 0.2)
    v, nv, b = rng.normal(size=(3,) + shape)
    lr = rng.normal(0, 0.7, size=shape)
    z = rng.uniform(0.5, 1.0, size=shape)
    return r, d, v, nv, lr, b, z


_lib_jit = jax.jit(lib_targets, static_argnames=("kind", "c", "stop"))


@pytest.mark.parametrize("kind,c", [("truncate", 1.3), ("mask", 2.0)])
def test_targets_match_numpy_under_jit_and_vmap(kind, c):
    with jax.enable_x64(True):
        args = random_inputs(0)
        want = np_targets(*args, kind, c)
        got = _lib_jit(*map(jnp.asarray, args), kind=kind, c=c)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12, err_msg=k)
        # vmap over the trailing batch axis (axis 1): same numbers.
        vm = jax.vmap(functools.partial(lib_targets, kind=kind, c=c), in_axes=1, out_axes=1)
        got_v = vm(*map(jnp.asarray, args))
        for k in want:
            np.testing.assert_allclose(got_v[k], want[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_gradients_stop_by_default_and_are_correct_when_enabled():
    with jax.enable_x64(True):
        r, d, v, nv, lr, b, z = map(jnp.asarray, random_inputs(1))

        def total(vals, stop):
            return sum(jnp.sum(t) for t in lib_targets(r, d, vals, nv, lr, b, z, "truncate", 1.2, stop).values())

        g0 = jax.grad(total)(v, True)
        assert np.all(np.asarray(g0) == 0.0)
        g1 = jax.grad(total)(v, False)
        # d/dv of each target (np): uncorrected 0, vccc_b 0, iwtd 1-rho, clipped 1-w,
        # naive 0, centered 1-w + (w - z).
        rho = np.exp(np.asarray(lr))
        w = np.minimum(rho, 1.2)
        want = (1 - rho) + (1 - w) + (1 - w + (w - np.asarray(z)))
        np.testing.assert_allclose(g1, want, rtol=1e-10)


def test_vccc_with_values_as_baseline_is_eq8():
    r, d, v, nv, lr, _, _ = map(jnp.asarray, random_inputs(2))
    np.testing.assert_allclose(ct.vccc_target(r, d, v, nv, lr, v), ct.vccc_target(r, d, v, nv, lr), rtol=1e-5, atol=1e-5)


# Sec 4.1 bandit: r(a0)=0, r(a1)=1, mu(a1)=0.1, pi(a1)=0.7, one step (discount 0).
MU = np.array([0.9, 0.1])
PI = np.array([0.3, 0.7])


def bandit_targets(b):
    lr = jnp.log(jnp.asarray(PI)) - jnp.log(jnp.asarray(MU))
    r = jnp.array([0.0, 1.0])
    zeros = jnp.zeros(2)
    return np.asarray(ct.vccc_target(r, zeros, jnp.full(2, b), zeros, lr, jnp.full(2, b)))


@pytest.mark.parametrize("b,y,var", [(0.1, (0.0667, 6.4), 3.61), (0.7, (0.4667, 2.8), 0.49), (1.05, (0.7, 0.7), 0.0)])
def test_bandit_table_of_section_4_1(b, y, var):
    with jax.enable_x64(True):
        got = bandit_targets(b)
        np.testing.assert_allclose(np.exp(np.log(PI) - np.log(MU)), [1 / 3, 7.0], rtol=1e-12)
        np.testing.assert_allclose(got, y, atol=5e-5)  # the write-up rounds to 4 digits
        mean = MU @ got
        np.testing.assert_allclose(mean, 0.7, atol=1e-12)  # unbiased for V^pi = 0.7
        np.testing.assert_allclose(MU @ (got - mean) ** 2, var, atol=1e-6)
        # Uncorrected converges to V^mu = 0.1.
        np.testing.assert_allclose(MU @ np.array([0.0, 1.0]), 0.1)


def test_empirical_optimal_baseline_reproduces_bandit_b_star():
    with jax.enable_x64(True):
        # Ten samples in exact mu proportions (1 x a1, 9 x a0) in state 0, plus state 1 on-policy.
        actions = np.array([1] + [0] * 9)
        lr0 = np.log(PI[actions]) - np.log(MU[actions])
        h0 = actions.astype(float)
        lr = jnp.asarray(np.concatenate([lr0, np.zeros(4)]))
        h = jnp.asarray(np.concatenate([h0, [1.0, 2.0, 3.0, 4.0]]))
        ids = jnp.asarray(np.concatenate([np.zeros(10, int), np.ones(4, int)]))
        b, identified = jax.jit(ct.optimal_baseline, static_argnums=3)(lr, h, ids, 3)
        np.testing.assert_allclose(b[0], 1.05, atol=1e-12)
        assert bool(identified[0]) and not bool(identified[1]) and not bool(identified[2])
        np.testing.assert_allclose(b[1], 2.5)  # rho == 1: falls back to mean(rho H)
        np.testing.assert_allclose(b[2], 0.0)  # unvisited
        y = bandit_targets(float(b[0]))
        np.testing.assert_allclose(MU @ (y - MU @ y) ** 2, 0.0, atol=1e-12)


def test_invalid_inputs_raise_naming_the_argument():
    r, d, v, nv, lr, b, z = map(jnp.asarray, random_inputs(3))
    with pytest.raises(ValueError, match="log_rhos"):
        ct.vccc_target(r, d, v, nv, lr[:2])
    with pytest.raises(ValueError, match="baseline"):
        ct.vccc_target(r, d, v, nv, lr, b[0])
    with pytest.raises(ValueError, match="discounts"):
        ct.vccc_target(r, d + 1.5, v, nv, lr)
    with pytest.raises(ValueError, match="discounts"):
        ct.uncorrected_target(r, -d - 0.1, nv)
    with pytest.raises(ValueError, match="z"):
        ct.centered_clipped_target(r, d, v, nv, lr, b, z[:1], clip=2.0)


_all_jit = jax.jit(lambda *a: lib_targets(*a, kind="mask", c=3.0))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=12, max_size=12))
def test_property_finite_log_ratios_give_finite_targets(xs):
    r, d, v, nv, _, b, z = map(lambda a: jnp.asarray(a, jnp.float32), random_inputs(4, shape=(12,)))
    out = _all_jit(r, d, v, nv, jnp.asarray(xs, jnp.float32), b, z)
    for k, y in out.items():
        assert np.all(np.isfinite(np.asarray(y))), k
