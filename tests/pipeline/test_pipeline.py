"""Pipeline simulator: determinism, schedule lags, partial rollouts, wall-clock order,
trace round-trip through envs.lag, config validation, and the `vccc simulate` command."""
import dataclasses

import numpy as np
import pytest

from vccc_jax.commands import simulate as cmd
from vccc_jax.envs.lag import LagLaw
from vccc_jax.pipeline import (
    PipelineConfig,
    RewardChannel,
    config_from_dict,
    lag_pmf,
    lag_stats,
    simulate,
    wallclock_stats,
    write_lag_trace,
)

CHANNELS = (RewardChannel("rule", 0.5, 0.2, 0, True), RewardChannel("judge", 30.0, 0.5, 0, False),
            RewardChannel("human", 60.0, 0.5, 8, False))
BASE = PipelineConfig(num_workers=8, batch_size=16, num_updates=20, channels=CHANNELS, seed=3)


@pytest.fixture(scope="module")
def traces():
    out = {s: simulate(BASE.replace(schedule=s)) for s in ("sync", "one_step_off", "async")}
    out["partial"] = simulate(BASE.replace(schedule="async", partial_rollout=True))
    return out


def test_deterministic_under_seed(traces):
    again = simulate(BASE.replace(schedule="async"))
    for f in dataclasses.fields(again):
        a, b = getattr(again, f.name), getattr(traces["async"], f.name)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f.name)
    other = simulate(BASE.replace(schedule="async", seed=4))
    assert not np.array_equal(other.update_end, again.update_end)


def test_sync_lag_zero_and_one_step_off_lag_one(traces):
    assert traces["sync"].transition_lags().max() == 0
    lags = traces["one_step_off"].segment_lags()
    consumed = traces["one_step_off"].seg_consumed
    assert np.all(lags[consumed >= 1] == 1) and np.all(lags[consumed == 0] == 0)
    for name in ("sync", "one_step_off", "async", "partial"):
        tr = traces[name]
        assert len(tr.update_end) == BASE.num_updates
        assert np.bincount(tr.ep_consumed).tolist() == [BASE.batch_size] * BASE.num_updates
        assert tr.transition_lags().min() >= 0


def test_partial_rollout_switches_versions(traces):
    assert traces["async"].version_switches().max() == 0
    sw = traces["partial"].version_switches()
    assert sw.max() >= 1
    tr = traces["partial"]
    multi = np.flatnonzero(sw > 0)
    assert np.all(tr.ep_last_version[multi] > tr.ep_first_version[multi])
    # interruption makes data fresher on average than finishing with the old weights
    assert lag_stats(tr)["mean"] < lag_stats(traces["async"])["mean"]


def test_wallclock_order(traces):
    t = [wallclock_stats(traces[s])["total"] for s in ("sync", "one_step_off", "async")]
    assert t[0] >= t[1] >= t[2]
    waiting = simulate(BASE.replace(schedule="async").wait_for_slow())
    assert wallclock_stats(waiting)["total"] > t[2]
    # the slow channels then arrive before consumption: no late rewards
    assert waiting.reward_delay_steps("judge").max() == 0


def test_trace_round_trip_and_pmf(traces, tmp_path):
    path = tmp_path / "lags.txt"
    n = write_lag_trace(str(path), traces["async"], "episode")
    law = LagLaw.parse(f"trace:@{path}")
    assert law.trace == tuple(traces["async"].episode_lags().tolist()) and n == len(law.trace)
    K = law.max_lag() + 1
    np.testing.assert_allclose(law.pmf(K), lag_pmf(traces["async"], K - 1, "episode"), atol=1e-15)
    pmf = lag_pmf(traces["async"])
    assert pmf.dtype == np.float64 and abs(pmf.sum() - 1) < 1e-12
    assert abs(np.dot(np.arange(len(pmf)), pmf) - lag_stats(traces["async"])["mean"]) < 1e-9


@pytest.mark.parametrize("field,value", [("num_workers", 0), ("update_time", -1.0),
                                         ("schedule", "later"), ("length_sigma", float("nan"))])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        BASE.replace(**{field: value})


def test_config_channels_validation():
    with pytest.raises(ValueError, match="blocking"):
        PipelineConfig(channels=(RewardChannel("judge", blocking=False),))
    with pytest.raises(ValueError, match="latency"):
        RewardChannel("judge", latency=-1.0)
    with pytest.raises(ValueError, match="bogus"):
        config_from_dict({"bogus": 1})


def test_command(tmp_path, capsys):
    out = tmp_path / "t.txt"
    rc = cmd.main(["--config", "experiments/pipeline_default.toml", "--num-updates", "5",
                   "--compare", "--trace-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "one_step_off" in text and "s/update" in text
    assert len(LagLaw.parse(f"trace:@{out}").trace) == 5 * 32
    assert cmd.main(["--config", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vccc simulate: ")
    assert cmd.main(["--config", "experiments/pipeline_default.toml", "--seed", "-1"]) == 2
    assert "seed" in capsys.readouterr().err


def test_default_experiment_follows_the_schema(tmp_path):
    """experiments/pipeline_default.toml: name/kind/description/base/grid; grid cells expand."""
    import tomllib

    from vccc_jax.pipeline import grid_configs, load_experiment

    with open("experiments/pipeline_default.toml", "rb") as f:
        raw = tomllib.load(f)
    assert set(raw) == {"name", "kind", "description", "base", "grid"} and raw["kind"] == "pipeline"
    base, grid = load_experiment("experiments/pipeline_default.toml")
    assert [c.schedule for c in grid_configs(base, grid)] == ["sync", "one_step_off", "async"]
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nkind = "pipeline"\n[base]\n[grid]\nnot_a_field = [1]\n')
    with pytest.raises(ValueError, match="grid.not_a_field"):
        load_experiment(str(bad))
