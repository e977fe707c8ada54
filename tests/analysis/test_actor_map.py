"""Tables of the actor x critic correction map (``analysis.actor_map``): the tolerance-lag
extraction against hand-computed examples, and the paired per-seed AUC comparison against
hand-computed numbers (no JAX)."""

import numpy as np
import pytest
from scipy import stats

from vccc_jax.analysis import actor_map as AM

LAGS = [0, 1, 4, 16, 64, 256]


@pytest.mark.parametrize("cos, thr, expected", [
    ([0.99, 0.95, 0.91, 0.85, 0.60, 0.30], 0.9, 4),      # first drop below 0.9 at lag 16
    ([0.99, 0.95, 0.91, 0.85, 0.60, 0.30], 0.5, 64),
    ([0.99, 0.95, 0.91, 0.85, 0.60, 0.30], 0.2, 256),    # holds over the whole grid
    ([0.80, 0.95, 0.99, 0.99, 0.99, 0.99], 0.9, None),   # fails already at lag 0
    ([0.95, 0.85, 0.95, 0.95, 0.95, 0.95], 0.9, 0),      # "stays": a later recovery is ignored
    ([0.95, 0.95, float("nan"), 0.95, 0.95, 0.95], 0.9, 1),  # NaN fails
    ([0.90, 0.90, 0.89, 0.90, 0.90, 0.90], 0.9, 1),      # the threshold itself passes
])
def test_tolerance_lag_hand_examples(cos, thr, expected):
    assert AM.tolerance_lag(LAGS, cos, thr) == expected


def test_format_lag():
    assert [AM.format_lag(x, 256) for x in (None, 0, 16, 256)] == ["-", "0", "16", "≥256"]


def _train_row(task, row, auc):
    """A stored train row: auc [seed][sampler][lag][critic]."""
    auc = np.asarray(auc, np.float64)
    return {"cell": {"study": "train", "task": {"name": task}, "row": row, "lags": [16],
                     "samplers": ["temperature"]},
            "metrics": {"auc": auc.tolist(), "final": auc.tolist(),
                        "critics": ["uncorrected", "vccc"]}}


def test_paired_records_hand_numbers():
    unc = np.array([0.50, 0.61, 0.55, 0.42, 0.58, 0.47])
    diff = np.array([0.10, 0.02, 0.05, -0.01, 0.07, 0.03])
    auc = np.stack([unc, unc + diff], -1)[:, None, None, :]  # [seed, sampler, lag, critic]
    rows = [_train_row("tok", "ratio", auc), {"cell": {"study": "train", "task": {"name": "tok"},
                                                       "row": "seq_tis"},
                                              "metrics": {"na": "n/a (no closed form)"}}]
    recs = AM.paired_records(rows)
    assert len(recs) == 1
    r = recs[0]
    assert (r["task"], r["row"], r["lag"], r["critic"], r["n"]) == ("tok", "ratio", 16, "vccc", 6)
    assert r["point"] == pytest.approx(diff.mean(), abs=1e-12)
    assert r["control_auc"] == pytest.approx(unc.mean(), abs=1e-12)
    assert r["relative"] == pytest.approx(diff.mean() / unc.mean(), abs=1e-12)
    assert r["frac_better"] == pytest.approx(5 / 6)
    assert r["p_value"] == pytest.approx(stats.wilcoxon(diff).pvalue, abs=1e-12)
    assert r["lo"] <= r["point"] <= r["hi"] and r["lo"] > -0.01 and r["hi"] < 0.08
    aucs = AM.auc_records(rows)
    assert any("na" in a for a in aucs)
    table = AM.auc_markdown(rows, "tok", "temperature", [16])
    assert "| seq_tis | n/a | n/a |" in table and "| ratio |" in table


def test_auc_records_iqm_leaves_out_degenerate_instances():
    """IQM = scipy's 25%-trimmed mean of the finite seeds (an instance with J* = J(pi_0) has
    AUC NaN); the paired control mean leaves the NaN pair out too."""
    x = np.array([0.31, np.nan, 0.52, 0.47, 0.12, 0.66, 0.40, 0.58, 0.25])
    auc = np.stack([x, x + 0.01], -1)[:, None, None, :]
    (unc, vccc) = AM.auc_records([_train_row("tok", "ratio", auc)])
    finite = x[np.isfinite(x)]
    assert unc["n"] == 8 and unc["iqm"] == pytest.approx(stats.trim_mean(finite, 0.25), abs=1e-12)
    assert unc["lo"] <= unc["iqm"] <= unc["hi"]
    assert unc["final"] == pytest.approx(finite.mean(), abs=1e-12)
    (r,) = AM.paired_records([_train_row("tok", "ratio", auc)])
    assert r["n"] == 8 and r["control_auc"] == pytest.approx(finite.mean(), abs=1e-12)
    assert r["point"] == pytest.approx(0.01, abs=1e-12) and r["frac_better"] == 1.0
