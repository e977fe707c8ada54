"""The RAC runners (runs/rac.py, runs/rac_wallclock.py; kinds "rac", "rac_wallclock") through
`vccc sweep`: tiny exact studies, resumable (a rerun computes nothing), bad configs name the key."""

import pytest

from vccc_jax.commands import sweep
from vccc_jax.runs import rac, rac_wallclock, schema
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import read_rows

BIAS = {
    "name": "rac_tiny", "kind": "rac",
    "base": {"num_mdps": 2, "num_states": 3, "num_actions": 2, "num_versions": 7,
             "delays": [0, 2, 3], "kernel": [0.6, 0.3, 0.1]},
    "grid": {"clips": [1.0], "masses": [1.0], "lags": ["fixed:0"]},
}
WALL = {
    "name": "rac_wall_tiny", "kind": "rac_wallclock",
    "base": {"num_mdps": 1, "num_states": 3, "num_actions": 2, "lr": 0.5, "hours": 0.1,
             "fractions": [0.5],
             "pipeline": {"num_workers": 4, "batch_size": 4, "length_median": 200.0,
                          "update_time": 20.0, "sync_time": 1.0, "channels": [
                              {"name": "rule", "latency": 0.5, "blocking": True},
                              {"name": "judge", "latency": 60.0, "blocking": False}]}},
    "grid": {"clips": [1.0], "masses": [1.0], "methods": ["drop", "wait", "rac"]},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    computed = {}
    for cfg, run in ((BIAS, rac.run_bias_cut), (WALL, rac_wallclock.run_wallclock)):
        exp = schema.parse(cfg, "tiny")
        computed[cfg["name"]] = []
        run(exp, out, progress=False, on_cell=lambda i, n, c, k=cfg["name"]: computed[k].append(i))
    return out, computed


def test_bias_cut_rows(results):
    out, computed = results
    rows = read_rows(out / "rac_tiny.jsonl")
    assert computed["rac_tiny"] == [0, 1] and [r["cell"]["mdp"] for r in rows] == [0, 1]
    for r in rows:
        x = r["metrics"]
        assert x["wait"] < 1e-10  # lag 0: waiting for every channel is on-policy
        assert x["drop"] > x["rac"] > 0 and x["ratio"] == pytest.approx(x["drop"] / x["rac"])
        assert 0 <= x["p_bind"] <= 1
    assert "bias cut drop/rac over 2 MDPs" in rac.bias_cut_table(rows)


def test_wallclock_rows(results):
    out, computed = results
    rows = {r["cell"]["method"]: r["metrics"] for r in read_rows(out / "rac_wall_tiny.jsonl")}
    assert computed["rac_wall_tiny"] == [0, 1, 2] and set(rows) == {"drop", "wait", "rac"}
    for x in rows.values():
        assert len(x["times"]) == len(x["returns"]) == x["updates"] + 1
        assert x["times"][0] == 0 and x["times"][-1] <= 0.1 * 3600
        assert x["returns"][-1] <= x["jstar"] + 1e-9
    # waiting for the judge: slower updates, so fewer of them in the same budget
    assert rows["wait"]["trace"]["s_per_update"] > rows["rac"]["trace"]["s_per_update"]
    assert rows["wait"]["updates"] < rows["rac"]["updates"]
    # the judge's signal: RAC reinjects what drop loses
    assert rows["rac"]["schedule"]["judge"]["mass_mean"] > rows["drop"]["schedule"]["judge"]["mass_mean"]
    assert rows["rac"]["trace"]["reward_delay"]["judge"]["mean"] > 0
    assert "wait / rac time to" in rac_wallclock.wallclock_table(read_rows(out / "rac_wall_tiny.jsonl"))


@pytest.mark.parametrize("cfg", [BIAS, WALL], ids=["rac", "rac_wallclock"])
def test_sweep_command_resumes_without_recomputing(results, cfg, tmp_path, capsys):
    out = results[0]
    path = tmp_path / f"{cfg['name']}.toml"
    path.write_text(schema.dumps(cfg))
    before = (out / f"{cfg['name']}.jsonl").read_bytes()
    assert sweep.main(["--config", str(path), "--results", str(out), "--no-progress",
                       "--figures", str(tmp_path)]) == 0
    assert (out / f"{cfg['name']}.jsonl").read_bytes() == before
    assert (tmp_path / f"{cfg['name']}.png").read_bytes()[:4] == b"\x89PNG"
    assert ("bias cut" if cfg is BIAS else "wait / rac") in capsys.readouterr().out


def test_bad_configs_name_the_key(tmp_path, capsys):
    def bad(cfg, part, **changes):
        return dict(cfg, **{part: dict(cfg[part], **changes)})

    with pytest.raises(ValueError, match="grid.lags"):
        rac.validate_bias_cut(schema.parse(bad(BIAS, "grid", lags=["often:1"]), "bad"))
    with pytest.raises(ValueError, match="grid.lags"):  # lag 3 + delay 3 + 2 kernel ages > 6
        rac.validate_bias_cut(schema.parse(bad(BIAS, "grid", lags=["fixed:3"]), "bad"))
    with pytest.raises(ValueError, match="base.delays"):
        rac.validate_bias_cut(schema.parse(bad(BIAS, "base", delays=[0, 0]), "bad"))
    with pytest.raises(ValueError, match="grid.methods"):
        rac_wallclock.validate_wallclock(schema.parse(bad(WALL, "grid", methods=["rac", "nope"]), "bad"))
    with pytest.raises(ConfigError, match="base.pipeline.nope"):
        schema.parse(bad(WALL, "base", pipeline={"nope": 1}), "bad")
    path = tmp_path / "bad.toml"
    path.write_text(schema.dumps(bad(WALL, "base", shares=[1.0])))
    assert sweep.main(["--config", str(path), "--results", str(tmp_path)]) == 2
    assert "base.shares" in capsys.readouterr().err
    assert not (tmp_path / "rac_wall_tiny.jsonl").exists()
