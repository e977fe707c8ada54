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
    for bad in ("wandb", "none:x", "tb"):
        with pytest.raises(ValueError, match="--track must be"):
            tracking.parse_spec(bad)
    with tracking.open_tracker("none", logdir=tmp_path / "tb") as t:
        t.log(0, {"a": 1.0})
        t.log_cell("c", {}, {"a": 1.0})
    assert not (tmp_path / "tb").exists()
    assert tracking.scalars({"a": {"b": np.int64(3)}, "c": math.inf}) == {"a/b": 3.0}


def test_log_rows_logs_the_mean_over_seeds_per_update(tmp_path):
    rows = [{"update": u, "seed": s, "return": 10.0 * u + s, "gt_mse": float("nan") if s else u}
            for u in (0, 1) for s in (0, 1, 2)]
    with tracking.open_tracker("tensorboard", logdir=tmp_path) as t:
        tracking.log_rows(t, rows)
    got = {(s, tag): v for s, tag, v, plugin in read_events(next(tmp_path.glob("events.*")))}
    assert got == {(0, "return"): 1.0, (0, "gt_mse"): 0.0, (1, "return"): 11.0,
                   (1, "gt_mse"): 1.0}  # NaN seeds left out; no "seed" or "update" tags
