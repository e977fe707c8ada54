"""The actor x critic correction map end to end (kind ``actor_map``, ``runs.actor_map``) on a
tiny grid: one shard computes only its cells, a rerun computes only the missing ones, a
stored cell recomputes to the same numbers, rows without a closed form are stored as n/a
(never sampled), the stored exact numbers satisfy the Sec 5.1 identity (exact ratio + VCCC
critic = Eq 12) and the exact decomposition, the stored AUC is the NumPy mean of the stored
return curve; the command prints the map and draws the heat map."""

import json

import numpy as np
import pytest

from vccc_jax.analysis import actor_map as AM
from vccc_jax.commands import sweep
from vccc_jax.runs import actor_map as RM
from vccc_jax.runs import schema
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import Shard, cell_id, read_rows, sharded

TASKS = [{"name": "tok", "kind": "token", "num_tokens": 3, "horizon": 3, "num_states": 3,
          "num_classes": 3, "num_prompts": 1, "tool_length": 1, "num_tool_states": 1,
          "gamma": 0.9, "history_step": 0.05, "train": False},
         {"name": "tab", "kind": "tabular", "num_states": 3, "num_actions": 2, "gamma": 0.9,
          "history_step": 0.05, "lr": 3.0}]


def _experiment(tmp_path, rows):
    table = {"name": "am_tiny", "kind": "actor_map",
             "base": {"seed": 0, "num_seeds": 2, "train_updates": 3, "tasks": TASKS},
             "grid": {"tasks": ["tok", "tab"], "rows": rows, "lags": [0, 2],
                      "samplers": ["temperature"], "studies": ["exact", "train"],
                      "train_rows": ["ratio"], "train_lags": [2]}}
    path = tmp_path / "am_tiny.toml"
    path.write_text(schema.dumps(table))
    return path, schema.load(path)


def test_tiny_map_shards_resumes_and_is_exact(tmp_path, capsys):
    res = tmp_path / "results"
    path, exp = _experiment(tmp_path, ["ratio", "seq_tis"])
    ids = [cell_id(c) for c in RM.validate(exp)]
    names = [("exact", "tok", "ratio"), ("exact", "tok", "seq_tis"), ("exact", "tab", "ratio"),
             ("exact", "tab", "seq_tis"), ("train", "tab", "ratio")]  # tok: train = false
    assert [(c["study"], c["task"]["name"], c["row"]) for c in RM.validate(exp)] == names
    computed = []
    on_cell = lambda i, n, c: computed.append((c["study"], c["task"]["name"], c["row"]))  # noqa: E731
    with sharded(Shard(0, 2)):  # one shard: only the cells it owns, into its own file
        RM.run_study(exp, res, progress=False, on_cell=on_cell)
    mine = [n for n, i in zip(names, ids) if Shard(0, 2).owns(i)]
    assert computed == mine and 0 < len(mine) < len(names)  # (these ids: both shards get cells)
    computed.clear()
    _, rows = RM.run_study(exp, res, progress=False, on_cell=on_cell)  # resumes: the rest only
    assert computed == [n for n in names if n not in mine]
    assert len(rows) == 5 and len(read_rows(res / "am_tiny.jsonl")) == 5
    by = {(r["cell"]["study"], r["cell"]["task"]["name"], r["cell"]["row"]): r for r in rows}
    assert "no closed form" in by[("exact", "tab", "seq_tis")]["metrics"]["na"]  # never sampled
    # a stored cell recomputes to the same numbers (JSON round trip included)
    cell = by[("exact", "tok", "seq_tis")]["cell"]
    again = json.loads(json.dumps(RM.run_cell(cell)))
    stored = by[("exact", "tok", "seq_tis")]["metrics"]
    assert again.keys() == stored.keys()
    for k in RM.EXACT_METRICS:
        assert np.all(np.isfinite(np.asarray(stored[k], np.float64))), k
        np.testing.assert_allclose(again[k], stored[k], rtol=1e-12, atol=0)
    # exact numbers: ratio + VCCC critic under a full-support sampler is Eq 12 (Sec 5.1), the
    # decomposition sums exactly, the stale critic is biased (on some instance: one can be
    # degenerate, its policy's choices not moving V^mu - V^pi)
    for task in ("tok", "tab"):
        m = by[("exact", task, "ratio")]["metrics"]
        rel = np.asarray(m["rel_eq12"])  # [seed, sampler, lag, critic]
        assert np.max(rel[..., m["critics"].index("vccc")]) < 1e-10
        assert np.max(rel[..., m["critics"].index("uncorrected")]) > 1e-3
        assert m["decomposition_max_err"] < 1e-13
    # the train study: its AUC is the NumPy mean of the stored curve's normalised gains
    t = by[("train", "tab", "ratio")]["metrics"]
    curve = np.asarray(t["curve"])  # [seed, sampler, lag, critic, points]: every update (N = 3)
    assert curve.shape == (2, 1, 1, 4, 4) and t["curve_updates"] == [0, 1, 2, 3]
    assert by[("train", "tab", "ratio")]["cell"]["lags"] == [2]  # grid.train_lags
    j0, js = np.asarray(t["j0"])[:, None, None, None], np.asarray(t["j_star"])[:, None, None, None]
    np.testing.assert_allclose(curve[..., 0], np.broadcast_to(j0, curve.shape[:-1]), rtol=1e-12)
    ref = np.mean(curve[..., 1:] - j0[..., None], axis=-1) / (js - j0)
    np.testing.assert_allclose(t["auc"], ref, rtol=1e-10)
    assert np.all(np.asarray(t["auc"]) > 0)  # exact ascent from a random start
    # the command: nothing left to compute; prints the map, draws the heat map
    figs = tmp_path / "figures"
    assert sweep.main(["--config", str(path), "--results", str(res), "--figures", str(figs),
                       "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| seq_tis | n/a |" in out and "Wilcoxon p" in out
    assert (figs / "am_tiny" / "actor_map_eq12.png").stat().st_size > 10_000
    assert len(read_rows(res / "am_tiny.jsonl")) == 5
    tol = AM.tolerance_records(rows)
    assert {r.get("lag_eq12_0.9") for r in tol if r.get("task") == "tok"} <= {None, 0, 2}


def test_config_errors_name_the_key(tmp_path):
    _, exp = _experiment(tmp_path, ["ratio"])
    bad = schema.parse({"name": "x", "kind": "actor_map",
                        "base": {"tasks": TASKS, "row_params": {"truncate": {"clip": -1.0}}},
                        "grid": {"tasks": ["tok"], "rows": ["truncate"]}})
    with pytest.raises(ValueError, match="base.row_params.truncate"):
        RM.validate(bad)
    with pytest.raises(ConfigError, match=r"base.tasks\[0\].num_tokenz"):
        schema.parse({"name": "x", "kind": "actor_map",
                      "base": {"tasks": [dict(TASKS[0], num_tokenz=3)]},
                      "grid": {"tasks": ["tok"], "rows": ["ratio"]}})
    bad = schema.parse({"name": "x", "kind": "actor_map", "base": {"tasks": TASKS},
                        "grid": {"tasks": ["tok", "nope"], "rows": ["ratio"]}})
    with pytest.raises(ValueError, match="grid.tasks"):
        RM.validate(bad)
