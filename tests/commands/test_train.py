"""``vccc train``: one run (tidy table, config, figure, resume), config files with flag
overrides, summaries with t intervals, grids (resumable, tabulated) and the shipped
experiments."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vccc_jax import plotting
from vccc_jax.analysis.train import summarize
from vccc_jax.commands import train as cmd
from vccc_jax.runs import schema
from vccc_jax.runs import train as run_lib
from vccc_jax.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--env", "CartPole-v1", "--lag", "fixed:1", "--critic", "vccc", "--actor",
        "centered-mask", "--seeds", "2", "--timesteps", "512", "--num-steps", "32",
        "--num-minibatches", "2", "--update-epochs", "1", "--hidden", "16", "--quiet"]


def _final_state(out, cfg):
    """The TrainState of the latest orbax checkpoint in ``<out>/checkpoint`` (numpy)."""
    import jax

    from vccc_jax.train import checkpoint as ck
    from vccc_jax.train import sharding as sh
    from vccc_jax.train.trainer import Trainer

    st = sh.ShardedTrainer(Trainer(cfg), sh.make_mesh((1, 1)))
    mngr = ck.manager(out / "checkpoint", async_save=False)
    try:
        state, meta = ck.restore(mngr, st.abstract_state, st.shardings)
    finally:
        mngr.close()
    return jax.tree_util.tree_leaves(jax.device_get(state)), meta


def test_single_run_writes_tidy_table_config_and_figure(tmp_path, capsys):
    out = tmp_path / "run"
    assert cmd.main(TINY + ["--out", str(out), "--checkpoint-every", "2", "--devices", "1"]) == 0
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 4 * 2  # 4 updates x 2 seeds, one row each
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert [int(r["env_steps"]) for r in rows[::2]] == [128, 256, 384, 512]
    for col in ("return", "lag_mean", "ess", "clip_frac_lag1", "log_rho_q50", "kl_pi_mu",
                "gt_mse", "critic_loss"):
        assert col in rows[0], col
    assert [float(r["lag_mean"]) for r in rows[::2]] == [0.0, 1.0, 1.0, 1.0]
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"] == TrainConfig(
        lag="fixed:1", critic="vccc", actor="centered-mask", num_seeds=2, total_timesteps=512,
        num_steps=32, num_minibatches=2, update_epochs=1, hidden=16).to_dict()
    assert "packages" in saved["provenance"] and "git" in saved["provenance"]
    assert (out / "curves.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["final_return"]["per_seed"]) == 2
    assert "final_return" in capsys.readouterr().out
    # orbax checkpoints at updates 2 and 4; the meta carries config, update and metric rows
    assert sorted(p.name for p in (out / "checkpoint").iterdir() if p.name.isdigit()) == ["2", "4"]
    cfg = TrainConfig.from_dict(saved["config"])
    ref_leaves, meta = _final_state(out, cfg)
    assert meta["update"] == 4 and len(meta["rows"]) == 8 and meta["config"] == saved["config"]
    ref_table = (out / "metrics.csv").read_text()
    # a run killed after the checkpoint at 2: --resume redoes updates 2, 3 bit for bit
    shutil.rmtree(out / "checkpoint" / "4")
    (out / "metrics.csv").write_text("stale\n")
    assert cmd.main(TINY + ["--out", str(out), "--checkpoint-every", "2", "--resume",
                            "--no-figure"]) == 0
    assert (out / "metrics.csv").read_text() == ref_table
    got_leaves, meta = _final_state(out, cfg)
    assert meta["update"] == 4 and len(got_leaves) == len(ref_leaves)
    for a, b in zip(got_leaves, ref_leaves):
        np.testing.assert_array_equal(a, b)
    # --resume from the final checkpoint: nothing left to do, the table is kept
    assert cmd.main(TINY + ["--out", str(out), "--resume", "--no-figure"]) == 0
    assert (out / "metrics.csv").read_text() == ref_table
    # a different config may not resume from this checkpoint: one line, exit 2
    assert cmd.main(TINY[:-1] + ["--hidden", "8", "--out", str(out), "--resume"]) == 2
    assert "different config" in capsys.readouterr().err
    # more devices than there are, or envs the data axis does not divide: one line, exit 2
    assert cmd.main(TINY + ["--out", str(out), "--devices", "64"]) == 2
    assert "64 devices" in capsys.readouterr().err


def test_config_file_with_flag_override(tmp_path):
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(schema.dumps({"name": "one", "kind": "train", "base": {
        "critic": "truncated", "clip": 3.0, "lag": "geometric:2"}}))
    args = cmd.build_parser().parse_args(["--config", str(cfg_file), "--clip", "4",
                                          "--seeds", "3", "--polyak", "0.1"])
    exp = schema.load(cfg_file)
    cfg = run_lib.config_from(dict(exp.base, **cmd._overrides(args)))
    assert (cfg.critic, cfg.clip, cfg.num_seeds, cfg.polyak, cfg.lag) == (
        "truncated", 4.0, 3, 0.1, "geometric:2")
    with pytest.raises(ValueError, match="critc"):
        run_lib.config_from({"critc": "vccc"})


def _fake_rows(num_updates=20, seeds=3, gt_every=5, level=100.0):
    rows = []
    for u in range(num_updates):
        for s in range(seeds):
            gt = (u + 1) % gt_every == 0
            rows.append({"update": u, "seed": s, "env_steps": 512 * (u + 1),
                         "return": level * (u + 1) / num_updates + s, "lag_mean": 2.0,
                         "ess": 0.9, "clip_frac": 0.1, "kl_pi_mu": 0.01,
                         "eval_return": float(level + s) if gt else float("nan"),
                         "gt_mse": 4.0 if gt else float("nan"),
                         "gt_mae": 2.0 if gt else float("nan"),
                         "gt_value": 50.0 if gt else float("nan")})
    return rows


def test_summarize_means_and_t_intervals(tmp_path):
    s = summarize(_fake_rows())
    # last 10% = 2 updates: returns (95 + s, 100 + s) -> per-seed 97.5 + s
    np.testing.assert_allclose(s["final_return"]["per_seed"], [97.5, 98.5, 99.5])
    assert s["final_return"]["mean"] == pytest.approx(98.5)
    # t interval, 2 degrees of freedom: 4.303 * sd / sqrt(3), sd = 1
    assert s["final_return"]["ci95"] == pytest.approx(4.3027 / np.sqrt(3), rel=1e-3)
    assert s["final_eval_return"]["mean"] == pytest.approx(101.0)
    assert s["gt_mse"]["mean"] == pytest.approx(4.0)
    assert s["gt_rel_err"]["mean"] == pytest.approx(0.04)
    path = plotting.plot_learning_curves(_fake_rows(), tmp_path / "c.png", "t")
    assert path.stat().st_size > 1000


def test_grid_is_resumable_and_tabulated(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run_one(cfg, out, **kw):
        calls.append(cfg)
        lag = cfg.lag_law.mean(cfg.resolved_num_versions)
        return summarize(_fake_rows(level=100.0 - 10 * lag)), []

    monkeypatch.setattr(run_lib, "run_one", fake_run_one)
    p = tmp_path / "g.toml"
    p.write_text(schema.dumps({"name": "g", "kind": "train",
                               "base": {"total_timesteps": 1024, "num_seeds": 3},
                               "grid": {"lag": ["fixed:0", "fixed:2"], "critic": ["gae", "vccc"]}}))
    argv = ["--config", str(p), "--out", str(tmp_path), "--gt-every", "5", "--quiet"]
    assert cmd.main(argv) == 0
    assert len(calls) == 4 and all(c.gt_every == 5 for c in calls)
    assert [(c.lag, c.critic) for c in calls] == [("fixed:0", "gae"), ("fixed:0", "vccc"),
                                                  ("fixed:2", "gae"), ("fixed:2", "vccc")]
    table = capsys.readouterr().out
    assert table.count("| CartPole-v1 |") == 4 and "± " in table
    assert (tmp_path / "g.png").stat().st_size > 1000
    assert cmd.main(argv + ["--no-figure"]) == 0  # every cell is in the store
    assert len(calls) == 4


def test_shipped_train_experiments_build_valid_configs():
    files = sorted((ROOT / "experiments").glob("train_*.toml"))
    assert len(files) >= 2
    for f in files:
        exp = schema.load(f)
        assert exp.kind == "train" and len(run_lib.cells(exp)) == 2 * 4 * 4
