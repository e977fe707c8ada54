"""``vccc sweep|train`` scale-out flags (issue 22): ``--shard i/N`` writes only its own units
into its own store file and the union of all shards equals the unsharded run; flag errors
are one line and exit 2 before anything runs. (Launching with submitit:
tests/runs/test_launch.py; the whole ``--shards N`` command: the slow test below.)"""

import json

import pytest

from vccc_jax.commands import shards
from vccc_jax.commands import sweep as cmd
from vccc_jax.runs.schema import dumps
from vccc_jax.runs.store import read_rows, shard_files, shard_of, table_rows

TINY = {  # 1 family x 2 methods = 2 groups (the unit a shard owns), 2 cells each
    "name": "tiny_shards", "kind": "tabular_sweep",
    "base": {"seed": 1, "num_mdps": 2,
             "history": {"algorithm": "npg", "step_size": 0.4, "num_versions": 3},
             "families": [{"name": "c", "kind": "chain", "num_states": 3, "num_actions": 2,
                           "gamma": 0.9}],
             "train": {"num_updates": 20, "batch_size": 4, "num_checkpoints": 2}},
    "grid": {"laws": ["fixed"], "mean_lags": [0, 1], "clips": [2.0],
             "methods": ["uncorrected", "vccc"]},
}


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(dumps(TINY))
    return str(path)


def _sweep(config, results, *extra):
    return cmd.main(["--config", config, "--results", str(results), "--no-figures",
                     "--no-progress", *extra])


def test_shards_by_hand_union_equals_one_process(tmp_path, config, capsys):
    sharded, one = tmp_path / "sharded", tmp_path / "one"
    assert _sweep(config, sharded, "--shard", "0/2") == 0
    first = [json.loads(x) for x in
             (sharded / "tiny_shards" / "shard-0-of-2.jsonl").read_text().splitlines()]
    assert _sweep(config, sharded, "--shard", "1/2") == 0
    assert _sweep(config, one) == 0  # the same programs: compiled once, in this process
    rows, ref = read_rows(sharded / "tiny_shards.jsonl"), read_rows(one / "tiny_shards.jsonl")
    assert len(ref) == 4 and table_rows(rows) == table_rows(ref)
    assert not (sharded / "tiny_shards.jsonl").exists()  # only the two shard files
    assert [f.name for f in shard_files(sharded / "tiny_shards.jsonl")] == [
        "shard-0-of-2.jsonl", "shard-1-of-2.jsonl"]
    # Shard 0 wrote exactly the cells of the groups (family, method) whose first cell it owns.
    by_group = {}
    for r in ref:
        by_group.setdefault((r["cell"]["family"]["name"], r["cell"]["method"]), []).append(r)
    owned = {r["id"] for g in by_group.values() if shard_of(g[0]["id"], 2) == 0 for r in g}
    assert {r["id"] for r in first} == owned and len(owned) == 2  # (seed 1: one group each)
    assert "4/4 cells" in capsys.readouterr().out.splitlines()[-1]


def test_shard_flag_errors_are_one_line(tmp_path, config, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    for extra, msg in ((["--shard", "2/2"], "--shard must be i/N"),
                       (["--shard", "0/2", "--shards", "2"], "exclude each other"),
                       (["--shards", "0"], "--shards must be >= 1"),
                       (["--shards", "2", "--launcher-opt", "gpus"], "KEY=VALUE"),
                       (["--shards", "2", "--launcher", "k8s"], "invalid choice"),
                       (["--shards", "2", "--launcher", "slurm"], "no sbatch on PATH")):
        assert _sweep(config, tmp_path / "r", *extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("vccc sweep: ") and msg in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()  # nothing ran


def test_train_single_run_refuses_shards(capsys):
    from vccc_jax.commands import train

    assert train.main(["--shard", "0/2", "--timesteps", "1024"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vccc train: --shard/--shards split a grid") and err.count("\n") == 1


def test_launch_argv_drops_only_launch_flags():
    argv = ["--config", "x.toml", "--shards", "4", "--launcher=slurm", "--launcher-opt",
            "mem_gb=4", "--launch-dir", "d", "--no-figures", "--results", "r"]
    assert shards._strip(argv) == ["--config", "x.toml", "--no-figures", "--results", "r"]


@pytest.mark.slow
def test_shards_launched_locally_equal_one_process(tmp_path, config, capsys):
    pytest.importorskip("submitit")
    assert _sweep(config, tmp_path / "one") == 0
    assert _sweep(config, tmp_path / "many", "--shards", "2") == 0
    out = capsys.readouterr().out
    assert "4/4 cells" in out
    assert table_rows(read_rows(tmp_path / "many" / "tiny_shards.jsonl")) == table_rows(
        read_rows(tmp_path / "one" / "tiny_shards.jsonl"))
