"""``vccc train``: CLI, tidy tables, summaries with CIs, grids and resume."""

import csv
import json

import numpy as np
import pytest

from vccc_jax import plotting
from vccc_jax.sweeps import train as run_lib
from vccc_jax.train.trainer import TrainConfig

TINY = ["--env", "CartPole-v1", "--lag", "fixed:1", "--critic", "vccc", "--actor",
        "centered-mask", "--seeds", "2", "--timesteps", "512", "--num-steps", "32",
        "--num-minibatches", "2", "--update-epochs", "1", "--hidden", "16", "--quiet"]


def test_cli_single_run_writes_tidy_table_config_and_figure(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_lib.main(TINY + ["--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 4 * 2  # 4 updates x 2 seeds, one row each
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert [int(r["env_steps"]) for r in rows[::2]] == [128, 256, 384, 512]
    for col in ("return", "lag_mean", "ess", "clip_frac_lag1", "log_rho_q50", "kl_pi_mu",
                "gt_mse", "critic_loss"):
        assert col in rows[0], col
    # lag 1 once a second version exists
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
    # --resume from the final checkpoint: nothing left to do, the table is kept
    assert run_lib.main(TINY + ["--out", str(out), "--resume", "--no-figure"]) == 0
    assert len(list(csv.DictReader(open(out / "metrics.csv")))) == 8
    # a different config may not resume from this checkpoint
    with pytest.raises(ValueError, match="different config"):
        run_lib.main(TINY[:-1] + ["--hidden", "8", "--out", str(out), "--resume"])


def test_config_file_with_cli_override(tmp_path):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"critic": "clipped", "clip": 3.0, "lag": "geometric:2"}))
    args = run_lib.build_parser().parse_args(["--config", str(cfg_file), "--clip", "4",
                                              "--seeds", "3", "--polyak", "0.1"])
    fields = json.loads(cfg_file.read_text())
    fields.update(run_lib._overrides(args))
    cfg = TrainConfig.from_dict(fields)
    assert (cfg.critic, cfg.clip, cfg.num_seeds, cfg.polyak, cfg.lag) == (
        "clipped", 4.0, 3, 0.1, "geometric:2")
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"critc": "vccc"})


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
    s = run_lib.summarize(_fake_rows())
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
        return run_lib.summarize(_fake_rows(level=100.0 - 10 * lag))

    monkeypatch.setattr(run_lib, "run_one", fake_run_one)
    spec = {"name": "g", "base": {"total_timesteps": 1024, "num_seeds": 3},
            "grid": {"lag": ["fixed:0", "fixed:2"], "critic": ["gae", "vccc"]}}
    run_lib.run_grid(spec, {"gt_every": 5}, tmp_path)
    assert len(calls) == 4 and all(c.gt_every == 5 for c in calls)
    table = capsys.readouterr().out
    assert table.count("| CartPole-v1 |") == 4 and "± " in table
    assert (tmp_path / "g.png").stat().st_size > 1000
    # rerun: every cell is in the store, nothing recomputed
    run_lib.run_grid(spec, {"gt_every": 5}, tmp_path, figure=False)
    assert len(calls) == 4


def test_experiment_configs_parse():
    """Every shipped experiments/train_*.json builds valid TrainConfigs."""
    from pathlib import Path

    files = sorted((Path(__file__).parents[2] / "experiments").glob("train_*.json"))
    assert files
    for f in files:
        spec = json.loads(f.read_text())
        cells = run_lib._grid_cells(spec, {}) if "grid" in spec else [TrainConfig.from_dict(spec)]
        assert cells, f
