"""Sweep configs: validation (errors name the key), expansion into cells and groups."""

import copy

import pytest

from vccc_jax.runs import schema
from vccc_jax.runs import tabular_config as grid
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import cell_id

BASE = {
    "name": "t",
    "num_mdps": 2,
    "history": {"num_versions": 5},
    "families": [{"name": "g", "kind": "garnet", "num_states": 4, "num_actions": 2,
                  "branching": 2}],
    "grid": {"laws": ["fixed", "geometric"], "mean_lags": [0, 1, 2],
             "clips": [1.0, 2.0], "methods": ["uncorrected", "truncated", "masked"],
             "method_clips": {"masked": [2.0]}},
}


def test_expand_counts_groups_and_ids():
    cfg = grid.validate_config(BASE)
    groups = grid.expand(cfg)
    assert [g.key for g in groups] == ["g/uncorrected", "g/truncated", "g/masked"]
    # 2 laws x 3 lags; truncated is crossed with 2 clips; masked has its own list.
    assert [len(g.cells) for g in groups] == [6, 12, 6]
    assert grid.num_cells(groups) == 24
    ids = [cid for g in groups for cid, _ in g.cells]
    assert len(set(ids)) == len(ids)
    assert all(cid == cell_id(c) for g in groups for cid, c in g.cells)
    cell = groups[1].cells[0][1]
    assert cell["clip"] == 1.0 and cell["history"]["algorithm"] == "npg"
    assert cell["train"]["num_updates"] >= 1 and groups[0].cells[0][1]["clip"] is None
    # Same config -> same ids (the resume key); a training change -> new ids.
    assert ids == [cid for g in grid.expand(grid.validate_config(BASE)) for cid, _ in g.cells]
    changed = copy.deepcopy(BASE)
    changed["train"] = {"num_updates": 7}
    assert not set(ids) & {cid for g in grid.expand(grid.validate_config(changed))
                           for cid, _ in g.cells}


@pytest.mark.parametrize("path, value, match", [
    (("grid", "laws"), ["fixed", "cauchy"], "grid.laws"),
    (("grid", "methods"), ["nope"], "grid.methods"),
    (("grid", "clips"), [0.5], "grid.clips"),
    (("grid", "mean_lags"), [0, 9], "max_lag"),
    (("num_mdps",), 0, "num_mdps"),
    (("history", "algorithm"), "sgd", "algorithm"),
    (("train", "learning_rate"), 2.0, "learning_rate"),
    (("methods", "vtrace"), {"lamda": 1.0}, "lamda"),
    (("grid", "method_clips"), {"uncorrected": [2.0]}, "method_clips.uncorrected"),
])
def test_bad_configs_name_the_key(path, value, match):
    cfg = copy.deepcopy(BASE)
    d = cfg
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value
    with pytest.raises(ValueError, match=match):
        grid.validate_config(cfg)


def test_unknown_and_missing_keys():
    exp = {"name": "t", "kind": "tabular_sweep", "base": {"num_mdps": 2, "families": []},
           "grid": {"laws": ["fixed"], "mean_lags": [0], "methods": ["vccc"]}}
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        schema.parse(dict(exp, colour="red"))
    with pytest.raises(ConfigError, match=r"unknown key base\.colour"):
        schema.parse(dict(exp, base=dict(exp["base"], colour="red")))
    with pytest.raises(ConfigError, match=r"base\.num_mdps must be an integer"):
        schema.parse(dict(exp, base=dict(exp["base"], num_mdps="2")))
    with pytest.raises(ConfigError, match=r"missing key grid\.laws"):
        schema.parse(dict(exp, grid={"mean_lags": [0], "methods": ["vccc"]}))
    cfg = copy.deepcopy(BASE)
    del cfg["families"][0]["kind"]
    with pytest.raises(ValueError, match=r"families\[0\]\.kind"):
        grid.validate_config(cfg)


def test_default_config_loads(tmp_path):
    cfg = grid.load_config(schema.default_path())
    assert cfg["name"] == "tabular_default"
    assert grid.num_cells(grid.expand(cfg)) > 100
    base = {k: v for k, v in BASE.items() if k not in ("name", "grid")}
    p = tmp_path / "c.toml"
    p.write_text(schema.dumps({"name": "t", "kind": "tabular_sweep", "base": base,
                               "grid": BASE["grid"]}))
    assert grid.load_config(p) == grid.validate_config(BASE)
    with pytest.raises(ValueError, match=".toml experiment"):
        q = tmp_path / "c.json"
        q.write_text("{}")
        grid.load_config(q)
    with pytest.raises(ValueError, match="not found"):
        grid.load_config(tmp_path / "missing.toml")
