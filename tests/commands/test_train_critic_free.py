"""``vccc train --critic-free LAW`` (issue 14: GRPO / PS-PPO selectable from ``vccc train``):
a tiny PS-PPO run backpropagates a fraction < 1 of the live tokens and GRPO (law full) all of
them, a rerun reuses the stored run, ``vccc train --config`` runs a ``critic_free`` grid with
the table of ``vccc sweep``, and flags that do not fit give one line and exit status 2.
Every run shares one compiled rollout / evaluate (``runs.critic_free._trainer``)."""

import json
import math

import pytest

from vccc_jax import cli
from vccc_jax.runs import critic_free as rc
from vccc_jax.runs.schema import dumps

ENV = "token:V=8,H=4,Q=3,C=2,P=2,seed=0"
TINY = ["--env", ENV, "--groups", "2", "--group-size", "4", "--updates", "3", "--no-figure"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _kept(row) -> float:
    return sum(h["kept_fraction"] for h in row["metrics"]["history"]) / len(
        row["metrics"]["history"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """PS-PPO mixture:0.2 then GRPO into one store; the first run times its learner."""
    out = tmp_path_factory.mktemp("cf")
    outputs = {}
    for law, extra in (("mixture:0.2", ["--cost-repeats", "2"]), ("full", ["--quiet", "--cost-repeats", "0"])):
        outputs[law] = cli.main(["train", "--critic-free", law, "--out", str(out)] + TINY + extra)
    return out, outputs


def test_ps_ppo_keeps_a_prefix_and_grpo_every_token(runs, capsys):
    out, codes = runs
    assert codes == {"mixture:0.2": 0, "full": 0}
    mix, full = _rows(out / "critic_free.jsonl")
    assert (mix["cell"]["law"], full["cell"]["law"]) == ("mixture:0.2", "full")
    assert mix["cell"]["eval_every"] == 1 and mix["cell"]["lag"] == "fixed:0"  # gcd(3, 1, 10)
    j = mix["metrics"]["history"][-1]["exact_return"]
    assert math.isfinite(j) and 0.0 <= j <= 1.0
    assert _kept(mix) < 1.0 and _kept(full) == 1.0
    assert mix["metrics"]["temp_bytes"] > 0 and "temp_bytes" not in full["metrics"]
    # one compiled rollout / evaluate for both laws; the learner is the law's own
    cfg = rc.cf_config(mix["cell"]).replace(seed=0)
    a, b = rc._trainer(cfg), rc._trainer(cfg.replace(law="full"))
    assert a.rollout is b.rollout and a.evaluate is b.evaluate and a.learn is not b.learn
    # a rerun reuses the stored run: same table, no new row, nothing trained
    assert cli.main(["train", "--critic-free", "mixture:0.2", "--out", str(out), "--cost-repeats",
                     "2"] + TINY) == 0
    captured = capsys.readouterr()
    assert len(_rows(out / "critic_free.jsonl")) == 2 and "update" not in captured.err
    table = captured.out
    assert "| fixed:0 | mixture:0.2 | " in table and "kept / live" in table and "learn ms" in table
    assert f"| {_kept(mix):.2f} | " in table and "1/1 runs in" in table


def test_config_runs_the_critic_free_grid_as_the_sweep(runs, tmp_path, capsys):
    toml = tmp_path / "tiny_cf.toml"
    toml.write_text(dumps({
        "name": "tiny_cf", "kind": "critic_free",
        "base": {"env": ENV, "groups": 2, "group_size": 4, "updates": 3, "eval_every": 1,
                 "cost_repeats": 0},
        "grid": {"laws": ["full", "mixture:0.2"], "lags": ["fixed:0"], "seeds": [0]}}))
    out = tmp_path / "results"
    assert cli.main(["train", "--config", str(toml), "--out", str(out)]) == 0
    train_out = capsys.readouterr().out
    grid = _rows(out / "tiny_cf.jsonl")
    assert [r["cell"]["law"] for r in grid] == ["full", "mixture:0.2"]
    # the same numbers as the flag runs (same cells but cost_repeats)
    flag_rows = {r["cell"]["law"]: r for r in _rows(runs[0] / "critic_free.jsonl")}
    for r in grid:
        assert [h["exact_return"] for h in r["metrics"]["history"]] == [
            h["exact_return"] for h in flag_rows[r["cell"]["law"]]["metrics"]["history"]]
    assert (out / "tiny_cf.png").exists() and "figures: " in train_out
    # vccc sweep reads the same store (nothing to compute) and prints the same table
    assert cli.main(["sweep", "--config", str(toml), "--results", str(out), "--no-figures",
                     "--no-progress"]) == 0
    sweep_out = capsys.readouterr().out
    assert sweep_out.split("\n\n")[0] == train_out.split("\n\n")[0]
    assert "| fixed:0 | full (GRPO) |" in sweep_out
    # flags override the config's grid: one law
    assert cli.main(["train", "--config", str(toml), "--out", str(out), "--critic-free",
                     "full", "--no-figure", "--quiet"]) == 0
    assert "mixture" not in capsys.readouterr().out.split("\n\n")[0]


@pytest.mark.parametrize("argv, match", [
    (["--critic-free", "full", "--env", "CartPole-v1"], "--env: critic-free runs"),
    (["--critic-free", "full", "--env", "token:V=8,bogus=1"], "--env: 'token:V=8,bogus=1'"),
    (["--critic-free", "full", "--critic", "vccc"], "drop --critic"),
    (["--critic-free", "halfway"], "--critic-free: 'halfway'"),
    (["--critic-free", "full", "--num-envs", "4", "--resume"],
     "do not use "),
    (["--critic-free", "full", "--groups", "0"], "--groups must be >= 1"),
    (["--critic-free", "full", "--ppo-epsilon", "none"], "--ppo-epsilon"),
    (["--groups", "2"], "--groups: critic-free flags; add --critic-free LAW"),
    (["--critic-free", "full", "--config", "experiments/train_lag_quick.toml"],
     "is a kind 'train' experiment"),
])
def test_flags_that_do_not_fit_give_one_line(argv, match, capsys):
    if "--env" not in argv:
        argv = argv + ["--env", ENV]  # a tiny env: cheap to build while validating
    rc_ = cli.main(["train"] + argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc_ == 2 and len(lines) == 1 and lines[0].startswith("vccc train: "), err
    assert match in lines[0], lines[0]


def test_help_names_the_critic_free_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--critic-free LAW", "mixture:EPS", "--groups", "--group-size", "--updates",
                 "--slack", "--eval-every", "--cost-repeats", "kind \"critic_free\""):
        assert flag in text, flag
