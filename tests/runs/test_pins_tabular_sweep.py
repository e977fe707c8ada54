"""Pins of ``runs.tabular_sweep.cell_metrics`` (the numbers every sweep row stores), each
against a reference written here: the standard error of a per-MDP scalar (sample standard
deviation, n - 1, over sqrt(n), by a loop) and the by-lag diagnostics indexed by lag (a
per-version array that IS the version mixture of the cell's law must read back as the
cell's lag weights, lag 0 = the newest version)."""

import math

import numpy as np
import pytest

from vccc_jax.runs.tabular_sweep import SCALARS, cell_metrics
from vccc_jax.tabular import history

N_MDPS, V = 5, 4
CELL = {"law": "geometric", "mean_lag": 1.0}


def _out(rng):
    out = {name: rng.normal(size=N_MDPS) for name in SCALARS}
    out["fp_err_max"] = np.abs(out["fp_err_max"])
    w_versions = history.version_weights(CELL["law"], CELL["mean_lag"], V)  # [V], oldest first
    out["ess_by_version"] = np.tile(w_versions, (N_MDPS, 1)) * rng.uniform(0.9, 1.1, (N_MDPS, 1))
    out["clip_by_version"] = np.tile(np.arange(V, dtype=float), (N_MDPS, 1))
    return out, w_versions


def test_standard_error_uses_the_sample_standard_deviation():
    out, _ = _out(np.random.default_rng(0))
    m = cell_metrics(out, CELL, np.zeros((N_MDPS, 3)))
    for name in SCALARS:
        x = [float(v) for v in out[name]]
        mean = sum(x) / len(x)
        sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
        assert m[name] == pytest.approx(mean, rel=1e-12, abs=1e-15)
        assert m[name + "_se"] == pytest.approx(sd / math.sqrt(len(x)), rel=1e-12), name
    assert m["fp_err_max_worst"] == max(out["fp_err_max"])


def test_by_lag_diagnostics_are_indexed_by_lag():
    rng = np.random.default_rng(1)
    out, _ = _out(rng)
    out["ess_by_version"] = np.tile(history.version_weights(CELL["law"], CELL["mean_lag"], V),
                                    (N_MDPS, 1))
    m = cell_metrics(out, CELL, np.zeros((N_MDPS, 3)))
    lag_w = history.lag_weights(CELL["law"], CELL["mean_lag"], V - 1)  # [V], lag 0 first
    assert lag_w[0] > lag_w[-1]  # geometric: the newest version is the most replayed
    np.testing.assert_allclose(m["ess_by_lag"], lag_w, rtol=1e-12)
    np.testing.assert_allclose(m["lag_weights"], lag_w, rtol=1e-12)
    # version i (0 = oldest) of V has lag V - 1 - i
    assert m["clip_rate_by_lag"] == [float(V - 1 - lag) for lag in range(V)]
