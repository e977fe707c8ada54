"""analysis: the one mean_ci (scipy t intervals), its dict form, and async-AC tables."""

import numpy as np
import pytest
from scipy import stats

from vccc_jax.analysis import async_ac as A
from vccc_jax.analysis.stats import ci_dict, mean_ci


def test_mean_ci_is_the_student_t_interval():
    x = np.array([[1.0, 2.0, 4.0], [3.0, np.nan, 5.0]])
    mean, half = mean_ci(x, axis=-1)
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(x[0]), scale=stats.sem(x[0]))
    assert mean[0] == pytest.approx(7 / 3) and half[0] == pytest.approx((hi - lo) / 2)
    # NaN-aware: two finite values, one degree of freedom
    assert mean[1] == 4.0 and half[1] == pytest.approx(stats.t.ppf(0.975, 1) * np.sqrt(2) / np.sqrt(2))
    assert np.isnan(mean_ci(np.array([1.0]))[1])


def test_ci_dict_matches_mean_ci_and_one_value_has_zero_width():
    x = np.random.default_rng(0).normal(size=17)
    m, h = mean_ci(x)
    assert ci_dict(x) == {"mean": float(m), "ci": float(h)}
    assert ci_dict(np.array([3.0])) == {"mean": 3.0, "ci": 0.0}


def _row(crit, cen, lag, bias):
    per = list(bias)
    metrics = {k: dict(ci_dict(np.asarray(per)), per_mdp=per)
               for k in ("bias", "drift_part", "critic_part", "gap_auc", "gap", "weight_part",
                         "cos_true", "critic_err", "kl")}
    return {"cell": {"mode": "expected", "actor_kind": "truncate", "critic": crit,
                     "centering": cen, "mean_lag": float(lag)}, "metrics": metrics}


def test_reduction_ratios_and_tables():
    rows = [_row("uncorrected", "none", 2, [2.0, 4.0, 6.0]),
            _row("vccc", "none", 2, [1.0, 2.0, 3.0]),
            _row("uncorrected", "none", 0, [1.0, 1.0, 1.0])]
    assert A.default_reference(rows) == ("uncorrected", "none")
    r = [d for d in A.reduction_ratios(rows) if d["critic"] == "vccc"]
    assert len(r) == 1 and r[0]["ratio"] == pytest.approx(0.5)
    assert r[0]["lo"] == pytest.approx(0.5) and r[0]["hi"] == pytest.approx(0.5)  # exact pairs
    assert "VCCC critic" in A.ratio_table(rows) and "0.5 [0.5, 0.5]" in A.ratio_table(rows)
    assert A.summary_table(rows).count("\n") == 4  # header, rule, three rows
