"""``vccc train``: one run (tidy table, config, figure, resume), config files with flag
overrides, summaries with t intervals, grids (resumable, tabulated) and the shipped
experiments."""

import csv
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vccc_jax import plotting
from vccc_jax.analysis.train import summarize
from vccc_jax.commands import train as cmd
from vccc_jax.runs import schema
from vccc_jax.runs import train as run_lib
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.tracking import read_events
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


def test_single_run_writes_tidy_table_config_and_figure(tmp_path, capsys, monkeypatch):
    """One real run; resuming after kills and Ctrl-C is tests/train/test_checkpoint_kill.py.
    Ground truth is on without --gt-every (4 updates: every update), so curves.png has the
    critic-error panel and the gt_* / eval_return columns are finite (issue 30 item 7)."""
    import matplotlib.pyplot as plt

    from vccc_jax.plotting import train as plot_train

    figures = []
    monkeypatch.setattr(plot_train.plt, "close", lambda fig=None: figures.append(fig))
    out = tmp_path / "run"
    argv = TINY + ["--out", str(out), "--checkpoint-every", "2", "--devices", "1",
                   "--track", "tensorboard"]
    assert cmd.main(argv) == 0
    monkeypatch.undo()
    titles = [ax.get_title() for ax in figures[0].axes if ax.get_visible()]
    plt.close(figures[0])
    assert titles == ["behaviour-policy return", "current-policy return",
                      r"critic error to $V^{\pi_k}$ (Monte Carlo)", "effective sample size"]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    for col in ("gt_mse", "gt_mae", "gt_value", "eval_return"):
        assert all(np.isfinite(float(r[col])) for r in rows), col
    # --track tensorboard: the mean over seeds of each metric at each update
    events = read_events(next((out / "tensorboard").glob("events.*")))
    logged = {step: v for step, tag, v, plugin in events if tag == "return" and not plugin}
    assert sorted(logged) == [128, 256, 384, 512]  # global step = env steps (issue 30)
    for u in range(4):
        want = np.mean([float(r["return"]) for r in rows if int(r["update"]) == u])
        np.testing.assert_allclose(logged[128 * (u + 1)], want, rtol=1e-6)
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
        num_steps=32, num_minibatches=2, update_epochs=1, hidden=16, gt_every=1).to_dict()
    prov = saved["provenance"]
    assert "packages" in prov and "git" in prov and prov["hostname"]
    assert prov["command"].startswith("vccc train --env CartPole-v1") and "--out" in prov["command"]
    assert prov["devices"]["count"] >= 1 and prov["devices"]["platform"] == "cpu"
    assert prov["packages"]["orbax-checkpoint"] is not None
    assert (out / "curves.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["final_return"]["per_seed"]) == 2
    printed = capsys.readouterr().out
    assert "final_return" in printed and "gt_mse" in printed
    # issue 45 row 8: each number names its window; 2 seeds are shown, not a "95% interval"
    assert "; behaviour return, mean over the last 1 of 4 updates" in printed
    assert ("; mean over the 2 evaluations in the second half of the run (updates 2-3 of 0-3)"
            in printed) and "(n = 2 seeds: " in printed and "95% percentile" not in printed
    assert summary["gt_mse"]["window"].startswith("mean over the 2 evaluations")
    # orbax checkpoints at updates 2 and 4; the meta carries config, update and metric rows
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["2", "4"]
    cfg = TrainConfig.from_dict(saved["config"])
    ref_leaves, meta = _final_state(out, cfg)
    assert meta["update"] == 4 and len(meta["rows"]) == 8 and meta["config"] == saved["config"]
    ref_table = (out / "metrics.csv").read_text()
    # the same command again: refused before any compute, the run untouched
    assert cmd.main(argv) == 2
    assert "already holds this run (checkpoint at update 4)" in capsys.readouterr().err
    # --resume from the final checkpoint: nothing left to do, table and state kept; the
    # provenance keeps the first command and adds the resume
    assert cmd.main(argv + ["--resume", "--no-figure"]) == 0
    assert (out / "metrics.csv").read_text() == ref_table
    got_leaves, _ = _final_state(out, cfg)
    for a, b in zip(got_leaves, ref_leaves):
        np.testing.assert_array_equal(a, b)
    again = json.loads((out / "config.json").read_text())
    assert again["provenance"] == prov and len(again["resumed"]) == 1
    assert again["resumed"][0]["update"] == 4 and "--resume" in again["resumed"][0]["command"]
    # more devices than there are: one line, exit 2 (checked once JAX is loaded)
    assert cmd.main(TINY + ["--out", str(tmp_path / "new"), "--devices", "64"]) == 2
    assert "64 devices" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # refused input creates nothing


def test_ground_truth_is_on_by_default_for_a_run_from_flags():
    """About GT_POINTS (10) evaluations over a run: the README's 5e5-step CartPole run (976
    updates of 4 x 128 steps) every 97 updates; a 4-update run every update; --gt-every 0 is
    kept."""
    assert run_lib.GT_POINTS == 10
    assert run_lib.default_gt_every({"total_timesteps": 500_000, "num_envs": 4, "num_steps": 128}) == 97
    assert run_lib.default_gt_every({"total_timesteps": 512, "num_envs": 4, "num_steps": 32}) == 1
    assert _fields(["--gt-every", "0"])["gt_every"] == 0
    assert _fields(["--timesteps", "512", "--num-steps", "32"])["gt_every"] == 1
    assert _fields(["--pi-old-route", "exact"])["gt_every"] == 0  # its actor may not allow it


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
    assert "exact_err_pi" not in s  # gymnax: no exact truth
    # tabular / token envs: the exact critic error, averaged over the second half's evaluations
    exact = [dict(r, exact_err_pi=float(r["update"] + r["seed"]) if (r["update"] + 1) % 5 == 0
                  else float("nan")) for r in _fake_rows()]
    got = summarize(exact)["exact_err_pi"]["per_seed"]  # updates 14 and 19 (10..19 is the half)
    np.testing.assert_allclose(got, [16.5, 17.5, 18.5])
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
    capsys.readouterr()
    assert cmd.main(argv + ["--dry-run"]) == 0 and not calls  # sizes the grid, runs nothing
    assert "4 cells, 0 already in" in capsys.readouterr().out
    assert cmd.main(argv) == 0
    assert len(calls) == 4 and all(c.gt_every == 5 for c in calls)
    assert [(c.lag, c.critic) for c in calls] == [("fixed:0", "gae"), ("fixed:0", "vccc"),
                                                  ("fixed:2", "gae"), ("fixed:2", "vccc")]
    table = capsys.readouterr().out
    cells = [line for line in table.splitlines() if line.startswith("| CartPole-v1 |")]
    assert len(cells) == 4 and all("± " not in c and " [" in c for c in cells)  # 3 seeds
    assert "fewer: mean [smallest, largest seed]). Eval return: the last 3 evaluations" in table
    assert (tmp_path / "g.png").stat().st_size > 1000
    assert cmd.main(argv + ["--no-figure"]) == 0  # every cell is in the store
    assert len(calls) == 4
    assert cmd.main(argv + ["--dry-run"]) == 0
    assert "4 cells, 4 already in" in capsys.readouterr().out


def test_no_new_grid_cell_starts_after_ctrl_c(tmp_path, monkeypatch, capsys):
    """Issue 45 row 3: a Ctrl-C during a cell's last update (the cell then ends normally and
    is stored) stops the grid before the next cell; the command says so and exits 130."""
    calls, stop = [], [False]

    def fake_run_one(cfg, out, **kw):  # Ctrl-C arrives while this cell runs
        calls.append(cfg)
        stop[0] = True
        return summarize(_fake_rows()), []

    monkeypatch.setattr(run_lib, "run_one", fake_run_one)
    exp = schema.parse({"name": "g", "kind": "train", "base": {"total_timesteps": 1024},
                        "grid": {"lag": ["fixed:0", "fixed:1", "fixed:2"]}}, "g")
    cells = run_lib.cells(exp)
    with pytest.raises(run_lib.GridStopped, match="stopped after 1 of 3 cells"):
        run_lib.run_grid("g", cells, tmp_path, stop=lambda: stop[0])
    assert len(calls) == 1 and len((tmp_path / "g.jsonl").read_text().splitlines()) == 1

    def stopped_grid(name, cells, out, **kw):
        raise run_lib.GridStopped(1, 3)

    monkeypatch.setattr(run_lib, "run_grid", stopped_grid)
    p = tmp_path / "g.toml"
    p.write_text(schema.dumps({"name": "g", "kind": "train", "base": {"total_timesteps": 1024},
                               "grid": {"lag": ["fixed:0", "fixed:1", "fixed:2"]}}))
    assert cmd.main(["--config", str(p), "--out", str(tmp_path), "--quiet"]) == 130
    assert ("vccc train: interrupted after 1 of 3 cells, before the next one started; "
            "finished cells are in the store") in capsys.readouterr().err


def test_a_grid_is_tracked_one_run_per_cell(tmp_path, monkeypatch, capsys):
    """Issue 45 row 2: ``vccc train --config <grid> --track ...`` was refused (and ``vccc
    sweep`` refuses train grids): each computed cell is now its own tracked run."""
    tracks = []

    def fake_run_one(cfg, out, **kw):
        tracks.append((Path(out).name, kw["track"]))
        return summarize(_fake_rows()), []

    monkeypatch.setattr(run_lib, "run_one", fake_run_one)
    p = tmp_path / "g.toml"
    p.write_text(schema.dumps({"name": "g", "kind": "train", "base": {"total_timesteps": 1024},
                               "grid": {"lag": ["fixed:0", "fixed:1"]}}))
    for track, want in (("tensorboard", lambda cid: "tensorboard"),
                        (f"tensorboard:{tmp_path}/tb",
                         lambda cid: f"tensorboard:{tmp_path}/tb/g/{cid}")):
        tracks.clear()
        rc = cmd.main(["--config", str(p), "--out", str(tmp_path / track[-2:]), "--quiet",
                       "--no-figure", "--track", track])
        assert rc == 0, capsys.readouterr().err
        ids = [c for c, _ in tracks]
        assert len(set(ids)) == 2 and [t for _, t in tracks] == [want(c) for c in ids]


def test_set_overrides_a_grid_base_in_dry_run(tmp_path, capsys):
    """Issue 30 break 1: ``--set base.FIELD=V`` with a train grid (it crashed in ``_given``).
    The store holds two cells of the overridden grid and one of the file's own: the dry run
    must count exactly the two (it would count the one if the override were dropped)."""
    from vccc_jax.runs.store import ResultStore, cell_id

    toml = ROOT / "experiments" / "train_lag_quick.toml"
    exp = schema.load(toml)
    three = run_lib.cell_fields(exp, {"num_seeds": 3})
    eight = run_lib.cell_fields(exp)
    assert {f["num_seeds"] for f in three} == {3} and {f["num_seeds"] for f in eight} == {8}
    with ResultStore(tmp_path / f"{exp.name}.jsonl") as store:
        for cell in (three[0], three[5], eight[1]):
            store.append({"id": cell_id(cell), "cell": cell, "metrics": {}, "meta": {}})
    capsys.readouterr()
    rc = cmd.main(["--config", str(toml), "--set", "base.num_seeds=3", "--out", str(tmp_path),
                   "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"{len(three)} cells, 2 already in" in out.out and len(three) == 32


def test_whole_updates_cover_99_percent_of_the_request():
    """50 updates of 128 steps = 6400 env steps: 6464 asked is 99.0% (runs), 6465 is not."""
    fields = {"num_envs": 4, "num_steps": 32}
    run_lib.check_whole_updates(dict(fields, total_timesteps=6464))
    with pytest.raises(ConfigError, match="would run 6400: use 6400 or 6528"):
        run_lib.check_whole_updates(dict(fields, total_timesteps=6465))
    run_lib.check_whole_updates(run_lib.resolve_fields({}))  # the default 500000 / 512


def test_every_train_flag_has_help_and_the_lag_syntax_matches_the_readme():
    """Issue 30: most --help entries showed only "(default X)", and --help documented
    trace:l0,l1,... where the README documented trace:@FILE."""
    from vccc_jax.commands.train_help import FIELD_HELP

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert sorted(FIELD_HELP) == sorted(names)
    entries = {a.dest: a.help for a in cmd.build_parser()._actions}
    for name in names:
        text = entries[name]
        assert len(text.split("(default")[0].strip()) >= 10, (name, text)
    text = cmd.build_parser(names=True).format_help()
    readme = (ROOT / "README.md").read_text()
    for form in ("trace:l0,l1,...", "trace:@FILE"):
        assert form in text and form in readme, form


def test_shipped_train_experiments_build_valid_configs():
    files = sorted((ROOT / "experiments").glob("train_*.toml"))
    assert len(files) >= 2
    for f in files:
        exp = schema.load(f)
        assert exp.kind == "train" and len(run_lib.cells(exp)) == 2 * 4 * 4


# ------------------------------------------------------- bad input: one line, exit 2, no run


def _fields(argv):
    """The resolved TrainConfig fields of ``vccc train ARGV`` (pure Python; ground truth on
    as for any run from flags)."""
    flags = cmd._overrides(cmd.build_parser().parse_args(argv))
    return run_lib.with_ground_truth(run_lib.resolve_fields(flags), flags)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Run directories and configs the bad-input table refers to by name."""
    d = tmp_path_factory.mktemp("bad")
    (d / "file").write_text("x")
    (d / "foo.txt").write_text("3 1\nfoo\n")
    same = _fields(TINY)
    for name, cfg, ckpt in (("other", _fields(TINY[:-1] + ["--hidden", "8"]), True),
                            ("same", same, True), ("same_nockpt", same, False)):
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps({"config": cfg}))
        if ckpt:
            (d / name / "checkpoint" / "2").mkdir(parents=True)
    (d / "foreign").mkdir()
    (d / "foreign" / "notes.txt").write_text("mine")
    tables = {"badtype": {"name": "t", "kind": "train", "base": {"num_envs": "four"}},
              "unknown": {"name": "t", "kind": "train", "base": {"critc": "vccc"}},
              "grid": {"name": "g", "kind": "train", "base": {},
                       "grid": {"lag": ["fixed:0", "fixed:1"]}}}
    for name, table in tables.items():
        (d / f"{name}.toml").write_text(schema.dumps(table))
    (d / "sweep.toml").write_text((ROOT / "experiments" / "tabular_default.toml").read_text())
    return d


# (argv with {d} = the fixture directory, what the one line must say, checked before JAX)
BAD = [
    (["--hidden", "five"], "argument --hidden: invalid int value", True),
    (["--seeds", "many"], "argument --num-seeds/--seeds: invalid int value: 'many'", True),
    (["--bogus"], "unrecognized arguments", True),
    (["--config", "{d}/badtype.toml"], "base.num_envs must be an integer, got 'four'", True),
    (["--config", "{d}/unknown.toml"], "unknown key base.critc (did you mean critic", True),
    (["--config", "{d}/missing.toml"], "not found", True),
    (["--config", "{d}/sweep.toml"], "runs with `vccc sweep`", True),
    (["--config", "{d}/grid.toml", "--resume"], "a grid resumes by itself", True),
    (["--config", "{d}/grid.toml"], "--lag fixed:1: lag is a grid axis of {d}/grid.toml "
     "(['fixed:0', 'fixed:1']), which sets it in every cell: use --set grid.lag=V1,V2", True),
    (["--env", "token:V=32,H=8,X=1"], "unknown key 'X' (known: V (num_tokens), H (horizon)", True),
    (["--env", "token:V=32,H=eight"], "H='eight' is not an int", True),
    (["--env", "token:V=32,H=8", "--gamma", "0.99"], "conflicts with gamma=1 of env", True),
    (["--env", "tabular:S=4,gamma=0.5", "--gamma", "0.9"], "conflicts with gamma=0.5", True),
    (["--env", "tabular:S=4,colour=red"], "unknown key 'colour'", True),
    (["--env", "tabular:S=1"], "need S >= 2", True),
    (["--out", "{d}/file/run"], "cannot be created: {d}/file is not a directory", True),
    (["--out", "{d}/file"], "is a file, not a directory", True),
    (["--out", "{d}/other"], "holds a run of another config (hidden 8 -> 16)", True),
    (["--out", "{d}/other", "--resume"], "--resume continues the run in {d}/other as its "
     "config.json records it; these flags change it: --hidden 16 (the run's: 8). Drop them "
     "to resume, or give a new --out", True),
    (["--out", "{d}/same"], "already holds this run (checkpoint at update 2): --resume", True),
    (["--out", "{d}/nothing_here", "--resume"], "holds no run to resume", True),
    (["--out", "{d}/foreign"], "is not a vccc train run (notes.txt)", True),
    (["--out", "{d}/foreign", "--overwrite"], "is not a vccc train run", True),
    (["--resume"], "--resume needs --out", True),
    (["--out", "{d}/same", "--resume", "--overwrite"], "not allowed with argument", True),
    (["--checkpoint-every", "5x"], "a wall time like 90s", True),
    (["--keep", "0"], "--keep must be >= 1", True),
    # issue 30: 1e3 steps ran one update silently; whole updates must cover 99% of the request
    (["--timesteps", "1e3"], "total_timesteps 1000 is 7.81 updates of 128 env steps (num_envs 4 "
     "x num_steps 32); a run does whole updates only, so it would run 896: use 896 or 1024",
     True),
    (["--timesteps", "100"], "it would run 0: use 128", True),
    # issue 45 row 6: no silent truncation, no traceback, no nonsense suggestion, no crash
    (["--num-envs", "4.9"], "argument --num-envs: expected a whole number, got '4.9'", True),
    (["--seeds", "1.7"], "argument --num-seeds/--seeds: expected a whole number, got '1.7'",
     True),
    (["--total-timesteps", "inf"], "expected a whole number, got 'inf'", True),
    (["--total-timesteps", "-512"], "train flags: total_timesteps must be >= 1, got -512", True),
    (["--hidden", "0"], "train flags: hidden must be >= 1, got 0", True),
    (["--gamma", "nan"], "argument --gamma: expected a finite number, got 'nan'", True),
    (["--chunk", "-1"], "--chunk must be >= 0", True),
    (["--hidden", "0", "--dry-run"], "hidden must be >= 1, got 0", True),
    *([(["--track", "wandb"], "--track wandb: the wandb package is not installed (pip install "
        "'vccc_jax[tracking]')", True)] if importlib.util.find_spec("wandb") is None else []),
    (["--lag", "geometic:8"], "lag", False),
    (["--critic", "nope"], "unknown critic 'nope'", False),
    (["--env", "Nope-v0"], "not a gymnax environment", False),
    # issue 30: no raw Python in these messages, and a near-miss env name gets a suggestion
    (["--env", "CartPol-v1"], "env 'CartPol-v1' is not a gymnax environment (did you mean "
     "'CartPole-v1'? `vccc list envs` lists them)", False),
    (["--lag", "trace:@{d}/missing.txt"], "lag 'trace:@{d}/missing.txt': cannot read the trace "
     "file {d}/missing.txt (No such file or directory)", False),
    (["--lag", "trace:@{d}/foo.txt"], "lag trace file {d}/foo.txt: 'foo' is not an integer lag",
     False),
    (["--lag", "trace:1,x"], "lag trace: 'x' is not an integer lag", False),
    (["--num-minibatches", "3"], "must divide", False),
]


def _argv(case, d):
    return [a.replace("{d}", str(d)) for a in case]


@pytest.mark.parametrize("argv, says, pure", BAD, ids=[" ".join(c[0])[:40] for c in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, says, pure, dirs, capsys):
    before = sorted(str(p) for p in dirs.rglob("*"))
    rc = cmd.main(TINY + _argv(argv, dirs))
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vccc train: "), err
    assert says.replace("{d}", str(dirs)) in lines[0], lines[0]
    assert sorted(str(p) for p in dirs.rglob("*")) == before  # nothing created or deleted


def test_dry_run_checks_one_run_and_computes_nothing(tmp_path, capsys):
    """Issue 45 row 6: ``--dry-run`` without ``--config`` validates the run (env, config,
    --out) and says what it would do; nothing is written."""
    out = tmp_path / "run"
    rc = cmd.main(TINY + ["--out", str(out), "--dry-run"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert ("one run: CartPole-v1, 4 updates of 128 env steps x 2 seeds, ground truth every "
            f"update; it would write --out {out} (start)") in got.out
    assert not out.exists()
    assert cmd.main(TINY + ["--critic", "nope", "--dry-run"]) == 2
    assert "unknown critic 'nope'" in capsys.readouterr().err


def test_resume_alone_continues_the_run_its_config_json_records(dirs, capsys):
    """Issue 45 row 1: after Ctrl-C, ``--out X --resume`` (as the message says) resumes the
    run X records, even one stopped before its first checkpoint (from update 0); no message
    on the way points a user who wants to resume at --overwrite."""
    for name in ("other", "same", "same_nockpt"):
        out = dirs / name
        rc = cmd.main(["--out", str(out), "--resume", "--dry-run"])
        got = capsys.readouterr()
        assert rc == 0, got.err
        assert f"2 seeds, ground truth every update; it would write --out {out} (resume)" \
            in got.out
    assert "--resume" in cmd._stopped(dirs / "same_nockpt", None)
    assert "--overwrite" not in cmd._stopped(dirs / "same_nockpt", None)
    rc = cmd.main(["--out", str(dirs / "other"), "--resume", "--hidden", "16"])
    assert rc == 2 and "--overwrite" not in capsys.readouterr().err


def test_bad_input_is_reported_before_jax_is_imported(dirs):
    cases = [TINY + _argv(a, dirs) for a, _, pure in BAD if pure]
    code = ("import json, sys\nfrom vccc_jax.commands import train\n"
            "rcs = [train.main(a) for a in json.loads(sys.argv[1])]\n"
            "print(json.dumps([rcs, sorted(m for m in ('jax', 'scipy', 'gymnax', 'orbax') "
            "if m in sys.modules)]))")
    got = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    rcs, loaded = json.loads(got.stdout.strip().splitlines()[-1])
    assert rcs == [2] * len(cases) and loaded == [], got.stderr


def test_a_run_directory_in_use_is_refused_with_exit_3(tmp_path, capsys):
    """Issue 30 break 3: two ``vccc train`` with the same ``--out`` both ran and mixed their
    checkpoints. A run holds an exclusive flock on its directory; here the test holds it (as
    a first run would), and the second run gets one line, exit 3, and writes nothing."""
    import fcntl
    import os

    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc = cmd.main(TINY + ["--out", str(out)])
    finally:
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1, err
    assert err[0] == (f"vccc train: --out {out}: another vccc train is running in this "
                      "directory; wait for it to end, or choose another --out")
    assert list(out.iterdir()) == []


def test_an_empty_directory_that_cannot_be_written_is_refused_before_jax(tmp_path, capsys,
                                                                         monkeypatch):
    """Issue 30 break 4: an existing, empty, non-writable ``--out`` gave orbax's
    PermissionError after the compile. Tests run as root, where chmod does not stop writes,
    so the directory's permission bits are what ``os.access`` reports for it here."""
    import os

    out = tmp_path / "ro"
    out.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: (
        False if Path(p) == out and mode & os.W_OK else real(p, mode, *a, **k)))
    built = []  # config_from builds the env (imports JAX): the refusal must come before it
    monkeypatch.setattr(run_lib, "config_from", lambda *a, **k: built.append(a))
    rc = cmd.main(TINY + ["--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"vccc train: --out {out} is not writable"], err
    assert built == [] and list(out.iterdir()) == []


def test_sweep_store_in_use_is_refused_with_exit_3(tmp_path, capsys):
    """The same contract for ``vccc sweep`` (a second writer of its store file)."""
    from vccc_jax.commands import sweep
    from vccc_jax.runs.store import ResultStore

    data = ROOT / "tests" / "data"
    (tmp_path / "async_ac_tiny.jsonl").write_bytes(
        (data / "results" / "async_ac_tiny.jsonl").read_bytes())
    with ResultStore(tmp_path / "async_ac_tiny.jsonl"):
        rc = sweep.main(["--config", str(data / "experiments" / "async_ac_tiny.toml"),
                         "--results", str(tmp_path), "--no-figures", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1 and err[0].startswith("vccc sweep: another process is "
                                                           "writing to "), err


def test_gamma_is_taken_from_the_env_spec():
    assert run_lib.resolve_fields({"env": "token:V=32,H=8"})["gamma"] == 1.0
    assert run_lib.resolve_fields({"env": "token:V=32,H=8,gamma=0.9"})["gamma"] == 0.9
    assert run_lib.resolve_fields({"env": "tabular:S=4", "gamma": 0.9})["gamma"] == 0.9
    assert run_lib.resolve_fields({"env": "CartPole-v1"})["gamma"] == TrainConfig().gamma
    fields = {"env": "CartPole-v1", "hidden": 8, "clip": 3}
    assert run_lib.config_from(fields).to_dict() == run_lib.resolve_fields(fields)


def test_first_ctrl_c_is_acknowledged_at_once_on_a_pipe_too(capsys):
    """Issue 30: with stderr not a terminal (a log, a harness) the first Ctrl-C was silent
    until the compile in flight ended (~46 s seen). The watcher thread says so at once: here
    while the main thread is still waiting, i.e. before the loop could have noticed."""
    import os
    import signal
    import threading

    assert not sys.stderr.isatty()  # capsys: a pipe, as in the report
    with cmd._SigintStops() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(6000):  # safety net only (60 s): the watcher answers in microseconds
            if stop():
                break
            threading.Event().wait(0.01)
        err = capsys.readouterr().err
    assert stop() and err.strip() == ("vccc train: stopping after the updates in flight (they "
                                      "are checkpointed); Ctrl-C again to quit now")


def test_sweep_acknowledges_the_first_ctrl_c_and_still_raises(capsys):
    """``vccc sweep``'s mode (``raise_first``): the watcher says it at once and the main thread
    gets KeyboardInterrupt when it next runs Python (the sweep then saves and exits 130)."""
    import os
    import signal
    import threading

    raised = False
    with cmd._SigintStops(command="sweep", ack="interrupting", raise_first=True) as stop:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(6000):  # safety net only (60 s): interrupted at the next bytecode
                threading.Event().wait(0.01)
        except KeyboardInterrupt:
            raised = True
        for _ in range(6000):  # the watcher thread prints, then sets the flag
            if stop():
                break
            threading.Event().wait(0.01)
    assert raised and stop()
    assert capsys.readouterr().err.strip() == "vccc sweep: interrupting"


def test_second_ctrl_c_quits_even_while_the_main_thread_is_busy(capsys):
    """Ctrl-C during a compile or a jitted call: Python signal handlers wait for the main thread,
    so the watcher thread reads the signal from the wakeup fd. The first Ctrl-C asks the loop to
    stop (and says so at once), the second calls ``on_force`` from the watcher thread."""
    import os
    import signal
    import threading

    forced, where = threading.Event(), []
    before = signal.getsignal(signal.SIGINT)

    def on_force():
        where.append(threading.current_thread() is threading.main_thread())
        forced.set()

    with cmd._SigintStops(on_force=on_force, announce=True) as stop:
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the loop stops itself
        for _ in range(6000):  # safety net only (60 s): the watcher answers in microseconds
            if stop():
                break
            threading.Event().wait(0.01)
        assert stop() and not forced.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert forced.wait(600)
    assert where == [False]  # called by the watcher, not by a Python handler of the main thread
    assert "Ctrl-C again to quit now" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # handler and wakeup fd restored
    assert signal.set_wakeup_fd(-1) == -1
