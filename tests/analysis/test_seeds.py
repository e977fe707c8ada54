"""IQM / stratified bootstrap / paired differences against hand-computed small cases."""

import numpy as np
import pytest

from vccc_jax.analysis import seeds


def test_iqm_is_the_mean_of_the_middle_half():
    assert seeds.iqm(np.arange(1, 9)) == pytest.approx(4.5)          # mean(3, 4, 5, 6)
    assert seeds.iqm([1, 2, 3, 100]) == pytest.approx(2.5)           # outlier trimmed
    np.testing.assert_allclose(seeds.iqm(np.array([[1, 2, 3, 4], [0, 0, 0, 8]]), axis=1), [2.5, 0.0])


def test_bootstrap_of_two_values_is_the_full_range():
    # Resamples of {0, 1} (n = 2): mean in {0, .5, 1} w.p. {1/4, 1/2, 1/4}: the 95% percentile
    # interval is [0, 1] exactly (fixed seed, 2000 resamples: P(no 0 or no 1 mean) ~ 1e-250).
    p, lo, hi = seeds.stratified_bootstrap_ci([0.0, 1.0], seeds.mean_stat)
    assert (p, lo, hi) == (0.5, 0.0, 1.0)


def test_bootstrap_is_stratified_by_task():
    # task A = [0, 0], task B = [1, 1]: resampling within tasks always gives {0,0,1,1} ->
    # IQM 0.5, a zero-width interval; pooling across tasks would not.
    assert seeds.stratified_bootstrap_ci([[0, 1], [0, 1]]) == (0.5, 0.5, 0.5)


def test_bootstrap_ci_covers_the_mean_at_the_stated_rate():
    # 200 normal samples of n = 20, 95% intervals of the mean: coverage within a 99% binomial
    # band of 0.95 (percentile bootstrap is a bit narrow at n = 20: allow down to 0.87).
    rng = np.random.default_rng(0)
    hits = sum(lo <= 0 <= hi for lo, hi in
               (seeds.stratified_bootstrap_ci(rng.normal(size=20), seeds.mean_stat, num_boot=500, seed=i)[1:]
                for i in range(200)))
    assert 0.87 <= hits / 200 <= 0.99


def test_paired_difference_and_profile():
    d = seeds.paired_difference([1, 2, 3, 4.0], [0, 1, 1, 5.0])
    assert d["n"] == 4 and d["point"] == pytest.approx(0.75) and d["frac_better"] == 0.75
    assert d["lo"] <= 0.75 <= d["hi"] and 0 < d["p_value"] <= 1
    with pytest.raises(ValueError, match="differ in length"):
        seeds.paired_difference([1, 2], [1])
    prof = seeds.performance_profile(np.array([[0.1, 0.9], [0.5, 0.7]]), [0.0, 0.6, 1.0], num_boot=200)
    np.testing.assert_allclose(prof["point"], [1.0, 0.5, 0.0])   # hand count over 4 runs
