"""The write-up's exact examples: Sec 4.1 numbers, Eq 3 per state, V-trace reductions."""

import numpy as np
import pytest

from vccc_jax.analysis import examples as ex


def test_bandit_reproduces_the_sec_4_1_table():
    d = ex.bandit_example()
    assert d["b_star"] == pytest.approx(1.05)
    assert d["table"][0]["mean"] == pytest.approx(0.1)                # uncorrected -> V^mu
    stale, target, best = d["table"][1:]
    assert (stale["y_a1"], stale["y_a0"], stale["var"]) == pytest.approx((6.4, 0.0667, 3.61), abs=1e-4)
    assert (target["y_a1"], target["y_a0"], target["var"]) == pytest.approx((2.8, 0.4667, 0.49), abs=1e-4)
    assert best["var"] == pytest.approx(0.0, abs=1e-12)
    assert all(r["mean"] == pytest.approx(0.7) for r in (stale, target, best))
    i = int(np.argmin(d["curve"]["var"]))
    assert abs(d["curve"]["b"][i] - d["b_star"]) < 0.05


def test_eq3_operator_difference_is_the_covariance():
    d = ex.covariance_example(num_mdps=2, num_samples=200)
    diff = np.array([r["diff"] for r in d["rows"]])
    cov = np.array([r["cov_exact"] for r in d["rows"]])
    np.testing.assert_allclose(diff, cov, atol=1e-12)
    assert np.abs(diff).max() > 0.1                                   # not trivially zero


def test_vtrace_fixed_point_is_v_of_the_clipped_policy():
    d = ex.vtrace_example(ns=(1, 2), lams=(0.5, 1.0), rho_bars=(1.0, np.inf), c_bars=(1.0, np.inf))
    assert max(r["closed_form_err"] for r in d["rows"]) < 1e-10
    unclipped = [r for r in d["rows"] if r["rho_bar"] is None]
    assert max(r["bias_rms"] for r in unclipped) < 1e-10              # rho_bar = inf: V^pi
    assert min(r["bias_rms"] for r in d["rows"] if r["rho_bar"] == 1.0) > 1e-3
