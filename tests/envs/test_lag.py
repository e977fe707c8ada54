"""Lag laws, the version ring buffer and mid-rollout switches (vccc_jax.envs.lag)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.lag import LagLaw

# -- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["fixed:2", "uniform:4", "geometric:8", "zipf:1.5",
                                  "trace:0,3,1,8"])
def test_parse_round_trip(text):
    law = LagLaw.parse(text)
    assert str(law) == text
    assert LagLaw.parse(str(law)) == law


def test_parse_bare_int_and_trace_file(tmp_path):
    assert LagLaw.parse("3") == LagLaw("fixed", 3.0)
    f = tmp_path / "lags.txt"
    f.write_text("0 2\n5,1\n")
    assert LagLaw.parse(f"trace:@{f}").trace == (0, 2, 5, 1)


@pytest.mark.parametrize("text,match", [
    ("poisson:3", "lag kind"), ("fixed:1.5", "integer"), ("zipf:0", "exponent"),
    ("geometric:x", "not a number"), ("banana", "KIND:PARAM"), ("trace:", "at least one"),
])
def test_parse_errors_name_the_problem(text, match):
    with pytest.raises(ValueError, match=match):
        LagLaw.parse(text)


def test_check_needs_enough_versions():
    with pytest.raises(ValueError, match="num_versions"):
        LagLaw.parse("fixed:4").check(4)
    LagLaw.parse("fixed:4").check(5)


# -- laws ------------------------------------------------------------------------------


def test_pmf_and_mean_exact():
    k = 9
    np.testing.assert_allclose(LagLaw.parse("fixed:3").pmf(k), np.eye(k)[3])
    assert LagLaw.parse("uniform:4").mean(k) == pytest.approx(2.0, abs=1e-12)
    # geometric:m truncated at K-1: mean of q^l / Z on 0..K-1, q = m / (1 + m)
    q = 2.0 / 3.0
    w = q ** np.arange(k)
    assert LagLaw.parse("geometric:2").mean(k) == pytest.approx(np.dot(np.arange(k), w) / w.sum(),
                                                                abs=1e-12)
    # with a large K the truncation is negligible and the mean is m
    big = LagLaw.parse("geometric:8").default_num_versions()
    assert LagLaw.parse("geometric:8").mean(big) == pytest.approx(8.0, rel=0.02)
    z = LagLaw.parse("zipf:1.5").pmf(k)
    np.testing.assert_allclose(z[1] / z[0], 2.0 ** -1.5, rtol=1e-12)
    for text in ("uniform:3", "geometric:2", "zipf:1.5", "trace:0,1,1,7"):
        assert LagLaw.parse(text).pmf(k).sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("text", ["geometric:3", "zipf:1.2", "uniform:5"])
def test_sampling_matches_pmf(text):
    """Chi-square goodness of fit, 20000 draws, fixed key; reject at the 0.1% level."""
    k = 8
    law = LagLaw.parse(text)
    lags = np.asarray(law.sample(jax.random.PRNGKey(0), 20000, k))
    assert lags.dtype == np.int32 and lags.min() >= 0 and lags.max() <= k - 1
    p = law.pmf(k)
    keep = p > 0
    observed = np.bincount(lags, minlength=k)[keep]
    assert np.bincount(lags, minlength=k)[~keep].sum() == 0
    _, pvalue = stats.chisquare(observed, 20000 * p[keep])
    assert pvalue > 1e-3


def test_sampling_is_capped_by_available_versions():
    law = LagLaw.parse("fixed:6")
    lags = law.sample(jax.random.PRNGKey(1), 5, 8, available=jnp.int32(3))
    np.testing.assert_array_equal(lags, [2] * 5)
    lags = LagLaw.parse("uniform:7").sample(jax.random.PRNGKey(1), 1000, 8, available=jnp.int32(2))
    assert set(np.asarray(lags).tolist()) == {0, 1}


def test_trace_replays_in_order():
    law = LagLaw.parse("trace:0,3,1,8,2")
    got = [np.asarray(law.sample(jax.random.PRNGKey(0), 2, 9, step=jnp.int32(s))).tolist()
           for s in range(4)]
    assert got == [[0, 3], [1, 8], [2, 0], [3, 1]]


# -- ring buffer -----------------------------------------------------------------------


def _params(v):
    v = jnp.asarray(v, jnp.float32)
    return {"w": jnp.full((2, 3), v), "b": jnp.full((3,), v)}


def test_ring_buffer_returns_the_right_version_for_each_lag():
    k = 4
    buf = lag_lib.init_buffer(_params(0), k)
    push = jax.jit(lag_lib.push)
    get = jax.jit(lag_lib.get)
    for newest in range(0, 11):  # wraps around the ring more than twice
        if newest > 0:
            buf = push(buf, _params(newest))
        assert int(buf.version) == newest and int(buf.count) == newest + 1
        for lag in range(k + 2):
            expect = newest - min(lag, newest, k - 1)  # capped by pushed and by K
            got = get(buf, jnp.int32(lag))
            assert float(got["w"][0, 0]) == expect and float(got["b"][2]) == expect
            assert int(lag_lib.version_ids(buf, jnp.int32(lag))) == expect
        per_env = lag_lib.gather(buf, jnp.arange(k, dtype=jnp.int32))
        assert per_env["w"].shape == (k, 2, 3)
        np.testing.assert_array_equal(per_env["b"][:, 0],
                                      [newest - min(l, newest) for l in range(k)])


def test_buffer_is_vmappable_over_seeds():
    bufs = jax.vmap(lambda v: lag_lib.init_buffer(_params(0) | {"b": jnp.full((3,), v)}, 3))(
        jnp.arange(2.0))
    bufs = jax.vmap(lag_lib.push)(bufs, jax.vmap(lambda v: _params(v))(jnp.array([5.0, 6.0])))
    got = jax.vmap(lag_lib.get, in_axes=(0, None))(bufs, jnp.int32(1))
    np.testing.assert_array_equal(got["b"][:, 0], [0.0, 1.0])
    assert bufs.params["w"].shape == (2, 3, 2, 3)


def test_switch_lags_reproduces_mu3_mu5_mu8():
    """K = 9, newest version 8, a worker starts at lag 5 (mu_3); weights arrive every 4 steps.

    stride 2 -> mu_3, mu_5, mu_7, mu_8; the write-up's mu_3 -> mu_5 -> mu_8 is a trace with
    uneven jumps, which stride 2/3 brackets.
    """
    lags0 = jnp.array([5, 1], jnp.int32)
    versions = [8 - np.asarray(lag_lib.switch_lags(lags0, jnp.int32(t), every=4, stride=2))
                for t in range(16)]
    assert [int(v[0]) for v in versions[::4]] == [3, 5, 7, 8]
    assert [int(v[1]) for v in versions[::4]] == [7, 8, 8, 8]
    np.testing.assert_array_equal(lag_lib.switch_lags(lags0, jnp.int32(100), every=0), lags0)


def test_switch_times_off_the_multiples_match_a_step_by_step_loop():
    """Every step t (not only multiples of ``every``) against a brute-force loop: a worker at
    lag l receives weights ``stride`` versions newer at steps every, 2 every, ... (never
    before), and stays at lag 0 once there."""
    lags0 = jnp.arange(8, dtype=jnp.int32)
    for every in (1, 2, 3, 5):
        for stride in (1, 2, 3):
            ref = np.asarray(lags0).copy()
            for t in range(4 * every + 3):
                if t > 0 and t % every == 0:
                    ref = np.maximum(ref - stride, 0)
                got = lag_lib.switch_lags(lags0, jnp.int32(t), every=every, stride=stride)
                np.testing.assert_array_equal(got, ref, err_msg=f"every={every} stride={stride} t={t}")
