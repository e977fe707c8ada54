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
                                  "trace:0,3,1,8", "trace:1/3/2,0,2/4", "hist:0.1,0,0.9"])
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
    ("trace:1/x", "not an integer"), ("trace:1/-2", ">= 0"), ("hist:0,0", "not all 0"),
    ("hist:1,-1", ">= 0"), ("hist:1,a", "numbers"), ("hist:1,nan", "finite"),
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


def test_an_old_trace_and_one_with_drops_read_back(tmp_path):
    """``L/d1/d2``: lag L after dropped rollouts at lags d1, d2; a trace without drops (the
    old format) parses as before, with no drops (the trainer's drop replay compiled out)."""
    f = tmp_path / "lags.trace"
    f.write_text("0 0\n1 2\n")
    assert LagLaw.parse(f"trace:@{f}") == LagLaw("trace", 0.0, (0, 0, 1, 2))
    f.write_text("1/3/3 1\n0 2/4\n")
    law = LagLaw.parse(f"trace:@{f}")
    assert law.trace == (1, 1, 0, 2) and law.drops == ((3, 3), (), (), (4,))
    assert law.max_lag() == 4 and law.mean(5) == 1.0  # the ring holds the dropped versions
    lags, counts, before = law.drop_tables(2)
    np.testing.assert_array_equal(lags, [[[3, 0], [3, 0]], [[0, 4], [0, 0]]])
    np.testing.assert_array_equal(counts, [[2, 0], [0, 1]])
    np.testing.assert_array_equal(before, [0, 2, 3])  # per update: the most drops of any env
    got = [law.drops_at(jnp.int32(s), 2) for s in range(4)]  # wraps after 2 updates
    assert [int(o) for _, _, o in got] == [0, 2, 3, 5]
    np.testing.assert_array_equal(got[3][0], lags[1])
    with pytest.raises(ValueError, match="whole updates"):
        law.drop_tables(3)


def test_hist_reads_a_trace_files_learned_lags_exactly(tmp_path):
    f = tmp_path / "lags.trace"
    f.write_text("4 4/6 3\n4 4/6/6 0\n")
    law = LagLaw.parse(f"hist:@{f}")
    assert law.weights == (1.0, 0.0, 0.0, 1.0, 4.0) and str(law) == "hist:1,0,0,1,4"
    np.testing.assert_array_equal(law.pmf(5), np.array([1, 0, 0, 1, 4]) / 6)
    assert law.mean(5) == pytest.approx(19 / 6, abs=1e-15) and law.default_num_versions() == 5
    with pytest.raises(ValueError, match="num_versions"):
        law.check(4)


def test_hist_draws_follow_the_measured_histogram():
    """The measured ``bounded:4`` shape (docs/async.md: .01 .01 .01 .04 .93), 20000 i.i.d.
    draws (fixed key). Chi-square goodness of fit at level 1e-3; its power against moving
    0.02 of the mass from lag 4 to lag 3 (noncentrality n sum (p1 - p0)^2 / p0 = 209) is
    > 0.999. The sample mean within 4 standard errors of the exact mean 3.87."""
    n, law = 20000, LagLaw.parse("hist:1,1,1,4,93")
    p = law.pmf(5)
    lags = np.asarray(law.sample(jax.random.PRNGKey(0), n, 5))
    assert lags.dtype == np.int32 and lags.min() >= 0 and lags.max() <= 4
    _, pvalue = stats.chisquare(np.bincount(lags, minlength=5), n * p)
    assert pvalue > 1e-3
    alt = p + np.array([0, 0, 0, 0.02, -0.02])
    power = stats.ncx2.sf(stats.chi2.ppf(1 - 1e-3, 4), 4, n * np.sum((alt - p) ** 2 / p))
    assert power > 0.999
    var = np.dot(np.arange(5) ** 2, p) - law.mean(5) ** 2
    assert abs(lags.mean() - law.mean(5)) < 4 * np.sqrt(var / n)
    assert law.mean(5) == pytest.approx(3.87, abs=1e-12)


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
