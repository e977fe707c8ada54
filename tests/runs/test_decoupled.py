"""The decoupled-route study runner (runs/decoupled.py, kind "decoupled"): a tiny exact study
through `vccc sweep --config`, resumable, and the route identities it must show."""

import json

import numpy as np
import pytest

from vccc_jax.commands import sweep
from vccc_jax.runs import decoupled, schema
from vccc_jax.runs.schema_fields import ConfigError

TINY = {
    "name": "routes_tiny", "kind": "decoupled",
    "base": {"num_mdps": 1, "num_states": 3, "num_actions": 2, "num_versions": 5,
             "threshold_lags": [0], "threshold_clips": [1.1, 4.0], "threshold_epsilons": [0.2]},
    "grid": {"noises": [0.0, 0.5], "lags": [0, 2]},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    exp = schema.parse(TINY, "tiny")
    computed = []
    path, result = decoupled.run_study(exp, results, progress=False,
                                       on_cell=lambda i, n, c: computed.append(i))
    return exp, results, path, result, computed


def test_cells_rows_and_json(study):
    exp, results, path, result, computed = study
    assert computed == [0, 1, 2]  # 2 routes cells (noises) + 1 threshold cell
    assert json.loads(path.read_text()) == result
    assert (results / "routes_tiny.jsonl").is_file()
    assert len(result["rows"]) == 2 * 2 * 3  # noises x lags x routes
    assert set(result["threshold"]) == {"lag=0/exact", "lag=0/ewma", "lag=0/behaviour"}
    assert np.shape(result["threshold"]["lag=0/exact"]["ppo"]) == (2, 1)


def test_route_identities(study):
    result = study[3]
    by = {(r["noise"], r["lag"], r["route"]): r for r in result["rows"]}
    for (noise, lag, route), r in by.items():
        if route == "exact":  # the reference route has no bias against itself
            assert r["actor_bias_vs_exact"] == 0 and r["critic_bias_vs_exact"] == 0
    for lag in (0, 2):  # no inference noise, no rounding: mu = pi_{K-lag}, naive = exact
        assert by[(0.0, lag, "behaviour")]["actor_bias_vs_exact"] < 1e-12
    # with noise the naive route pi_old := mu is biased
    assert by[(0.5, 2, "behaviour")]["actor_bias_vs_exact"] > 1e-4
    # pi_old := mu: the discrepancy mask never fires; exact at lag 0: the PPO clip never does
    assert np.max(result["threshold"]["lag=0/behaviour"]["discrepancy"]) == 0
    assert np.max(result["threshold"]["lag=0/exact"]["ppo"]) == 0


def test_sweep_command_dispatches_and_resumes(study, tmp_path, capsys):
    results = study[1]
    cfg = tmp_path / "routes_tiny.toml"
    cfg.write_text(schema.dumps(TINY))
    before = (results / "routes_tiny.jsonl").read_bytes()
    assert sweep.main(["--config", str(cfg), "--results", str(results), "--no-progress",
                       "--figures", str(tmp_path)]) == 0
    assert (results / "routes_tiny.jsonl").read_bytes() == before  # nothing recomputed
    assert (tmp_path / "routes_tiny.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "bias vs exact route" in out and "lag 2" in out  # nearest noise to 0.3 in the grid: 0.5


def test_validation_names_the_key():
    bad = dict(TINY, grid={"noises": [0.3], "lags": [0, 5]})
    with pytest.raises(ValueError, match="grid.lags"):
        decoupled.validate(schema.parse(bad, "bad"))
    with pytest.raises(ConfigError, match="base.nope"):
        schema.parse(dict(TINY, base={"nope": 1}), "bad")
