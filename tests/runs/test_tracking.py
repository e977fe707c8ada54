"""The TensorBoard tracking sink: what ``log`` / ``log_cell`` write is read back from the
event files (TFRecord framing, tensorboardX's own Event protobuf)."""

import math

import numpy as np
import pytest

from vccc_jax.runs import tracking
from vccc_jax.runs.tracking import read_events


def test_tensorboard_scalars_and_cells_round_trip(tmp_path):
    with tracking.open_tracker("tensorboard", logdir=tmp_path, config={"lr": 0.1}) as t:
        t.log(0, {"return": 1.5, "net": {"loss": np.float32(0.25)}, "name": "x",
                  "nan": float("nan"), "per_seed": [1, 2], "ok": True})
        t.log(7, {"return": 3.0})
        t.log_cell("cell_a", {"law": "fixed", "lag": 2, "clip": None}, {"err": 0.125})
    main = read_events(next(tmp_path.glob("events.*")))
    scalars = {(s, tag): v for s, tag, v, plugin in main if not plugin}
    assert scalars == {(0, "return"): 1.5, (0, "net/loss"): 0.25, (0, "ok"): 1.0,
                       (7, "return"): 3.0}  # strings, lists and NaN are skipped
    assert any(plugin == "text" and tag.startswith("config") for _, tag, _, plugin in main)
    cell = read_events(next((tmp_path / "cell_a").glob("events.*")))
    assert ("err", 0.125) in {(tag, v) for _, tag, v, plugin in cell if not plugin}
    assert {"hparams"} == {plugin for *_, plugin in cell if plugin}


def test_specs_and_the_null_tracker(tmp_path):
    assert tracking.parse_spec(None) == ("none", None)
    assert tracking.parse_spec("tensorboard:runs/x") == ("tensorboard", "runs/x")
    for bad in ("wandbx", "none:x", "tb"):
        with pytest.raises(ValueError, match="--track must be"):
            tracking.parse_spec(bad)
    with tracking.open_tracker("none", logdir=tmp_path / "tb") as t:
        t.log(0, {"a": 1.0})
        t.log_cell("c", {}, {"a": 1.0})
    assert not (tmp_path / "tb").exists()
    assert tracking.scalars({"a": {"b": np.int64(3)}, "c": math.inf}) == {"a/b": 3.0}


def test_log_rows_logs_the_mean_over_seeds_per_update(tmp_path):
    rows = [{"update": u, "seed": s, "env_steps": 512 * (u + 1), "return": 10.0 * u + s,
             "gt_mse": float("nan") if s else u} for u in (0, 1) for s in (0, 1, 2)]
    with tracking.open_tracker("tensorboard", logdir=tmp_path) as t:
        tracking.log_rows(t, rows)
    got = {(s, tag): v for s, tag, v, plugin in read_events(next(tmp_path.glob("events.*")))}
    # the step is the env steps so far (issue 30: CleanRL / PureJaxRL's global_step)
    assert got == {(512, "return"): 1.0, (512, "gt_mse"): 0.0, (1024, "return"): 11.0,
                   (1024, "gt_mse"): 1.0}  # NaN seeds left out; no seed / update / step tags


class _FakeWandb:
    """The three calls of ``wandb`` the tracker makes (init, Run.log / finish, Table)."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0
        self.Table = lambda columns, data: ("table", columns, data)
        self.Settings = lambda **kw: ("settings", kw)

    def init(self, **kw):
        self.inits.append(kw)
        return self

    def log(self, values, step=None):
        self.logged.append((step, values))

    def finish(self):
        self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch):
    import importlib.util
    import sys

    fake, real = _FakeWandb(), importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "wandb" else real(name, *a))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return fake


def test_wandb_runs_offline_by_default_and_steps_by_env_steps(tmp_path, fake_wandb,
                                                              monkeypatch):
    rows = [{"update": u, "seed": s, "env_steps": 128 * (u + 1), "return": 3.0 * u + 2 * s}
            for u in (0, 1, 2) for s in (0, 1)]
    assert tracking.parse_spec("wandb:proj") == ("wandb", "proj")
    with tracking.open_tracker("wandb:proj", logdir=tmp_path / "wandb", config={"lr": 0.1}) as t:
        tracking.log_rows(t, rows)
        t.log_cell("c1", {"law": "fixed", "lag": 2, "clip": None}, {"err": 0.5, "x": "s"})
    assert fake_wandb.inits == [{"project": "proj", "dir": str(tmp_path / "wandb"),
                                 "config": {"lr": 0.1}, "mode": "offline"}]
    want = [(128 * (u + 1), {"return": np.mean([3.0 * u + 2 * s for s in (0, 1)])})
            for u in (0, 1, 2)]
    assert fake_wandb.logged[:3] == want
    assert fake_wandb.logged[3] == (None, {"cells": ("table", ["id", "law", "lag", "clip", "err"],
                                                     [["c1", "fixed", 2, "None", 0.5]])})
    assert fake_wandb.finished == 1
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's choice wins
    tracking.open_tracker("wandb", logdir=tmp_path, config=None).close()
    assert fake_wandb.inits[1]["mode"] == "online" and fake_wandb.inits[1]["project"] == "vccc_jax"


def test_a_missing_tracker_package_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"^--track wandb: the wandb package is not installed "
                       r"\(pip install 'vccc_jax\[tracking\]'\)$"):
        tracking.parse_spec("wandb:proj")


def test_quiet_wandb_runs_print_nothing(tmp_path, fake_wandb):
    """Issue 45 row 11: ``--track wandb --quiet`` printed W&B's banner, history and sync hint
    (15 lines a run, checked with wandb 0.31.0 offline; none with these settings)."""
    tracking.open_tracker("wandb", logdir=tmp_path, quiet=True).close()
    tracking.open_tracker("wandb", logdir=tmp_path).close()
    assert fake_wandb.inits[0]["settings"] == ("settings", {"silent": True, "console": "off"})
    assert "settings" not in fake_wandb.inits[1]
