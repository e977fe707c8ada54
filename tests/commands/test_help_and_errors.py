"""Every ``vccc`` command: ``--help`` works, and bad input gives exactly one line
``vccc <command>: <what is wrong>`` on stderr with exit status 2 (in-process ``cli.main``)."""

import pytest

from vccc_jax import cli
from vccc_jax.runs.schema import dumps

SWEEP = {"name": "t", "kind": "tabular_sweep",
         "base": {"num_mdps": 2, "families": [{"name": "g", "kind": "garnet", "num_states": 4,
                                               "num_actions": 2}],
                  "history": {"num_versions": 4}},
         "grid": {"laws": ["fixed"], "mean_lags": [0, 1], "methods": ["vccc"]}}


def _one_line_error(capsys, argv, command, match):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vccc {command}: "), err
    assert match in lines[0], lines[0]
    assert "Traceback" not in err


def test_top_level_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    assert cli.main(["nope"]) == 2 and "unknown command" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_help_works(name, capsys):
    try:
        rc = cli.main([name, "--help"])  # bench answers itself; argparse exits
    except SystemExit as e:
        rc = e.code
    assert rc in (0, None)
    assert "usage" in capsys.readouterr().out.lower()


def test_sweep_bad_inputs(tmp_path, capsys):
    _one_line_error(capsys, ["sweep", "--config", str(tmp_path / "missing.toml")], "sweep",
                    "not found")
    cases = [
        (dict(SWEEP, colour="red"), "unknown key 'colour'"),
        (dict(SWEEP, base=dict(SWEEP["base"], nmdps=2)), "unknown key base.nmdps"),
        (dict(SWEEP, base=dict(SWEEP["base"], num_mdps="two")), "base.num_mdps must be a int"),
        (dict(SWEEP, grid=dict(SWEEP["grid"], laws=["cauchy"])), "grid.laws has 'cauchy'"),
        (dict(SWEEP, kind="train"), "runs with `vccc train`"),
    ]
    for i, (table, match) in enumerate(cases):
        p = tmp_path / f"c{i}.toml"
        p.write_text(dumps(table))
        _one_line_error(capsys, ["sweep", "--config", str(p)], "sweep", match)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("name = ")
    _one_line_error(capsys, ["sweep", "--config", str(bad_toml)], "sweep", "not valid TOML")
    _one_line_error(capsys, ["sweep", "--bogus"], "sweep", "unrecognized arguments")


def test_train_bad_inputs(tmp_path, capsys):
    _one_line_error(capsys, ["train", "--env", "Nope-v0"], "train", "env 'Nope-v0' is not a gymnax environment")
    _one_line_error(capsys, ["train", "--lag", "cauchy:3"], "train", "lag")
    _one_line_error(capsys, ["train", "--critic", "clipped"], "train", "clipped")
    _one_line_error(capsys, ["train", "--config", str(tmp_path / "x.toml")], "train", "not found")
    p = tmp_path / "t.toml"
    p.write_text(dumps({"name": "t", "kind": "train", "base": {"colour": 1},
                        "grid": {"lag": ["fixed:0"]}}))
    _one_line_error(capsys, ["train", "--config", str(p)], "train", "colour")
    p.write_text(dumps({"name": "t", "kind": "train", "base": {}, "grid": {"lag": "fixed:0"}}))
    _one_line_error(capsys, ["train", "--config", str(p)], "train", "grid.lag must be a list")
    _one_line_error(capsys, ["train", "--seeds", "many"], "train", "--seeds")


def test_figures_bench_and_async_mc_bad_inputs(tmp_path, capsys):
    _one_line_error(capsys, ["figures", "--results", str(tmp_path / "none")], "figures",
                    "no results directory")
    _one_line_error(capsys, ["figures", "--store", str(tmp_path / "none.jsonl")], "figures",
                    "no result store")
    _one_line_error(capsys, ["bench", "nope"], "bench", "expected one of")
    _one_line_error(capsys, ["async-mc", "--starts", "0,x"], "async-mc", "--starts")
    _one_line_error(capsys, ["async-mc", "--starts", "2,5"], "async-mc", "starts")
