"""Schema kinds "pipeline" / "critic_free" and the GRPO vs PS-PPO runner (runs.critic_free):
bad keys are named; a tiny grid writes rows, resumes after an interruption without
duplicates, and summarises / plots."""

import dataclasses
import json

import pytest

from vccc_jax.runs import critic_free as rc
from vccc_jax.runs import schema, schema_kinds
from vccc_jax.runs.schema_fields import ConfigError

TINY = {
    "name": "tiny_cf", "kind": "critic_free",
    "base": {"env": "token:V=4,H=4,Q=2,C=2,P=2,accept=0.3,seed=0", "groups": 2,
             "group_size": 2, "hidden": 8, "updates": 2, "eval_every": 1, "cost_repeats": 0},
    "grid": {"laws": ["full"], "lags": ["fixed:0"], "seeds": [0, 1]},
}


def _pipeline(**parts):
    table = {"name": "p", "kind": "pipeline", "base": {"num_workers": 4}, "grid": {}}
    table.update(parts)
    return table


@pytest.mark.parametrize("table, named", [
    (_pipeline(base={"bogus": 1}), "base.bogus"),
    (_pipeline(base={"channels": [{"name": "judge", "delay": 3.0}]}), "base.channels[0].delay"),
    (_pipeline(base={"num_workers": "many"}), "base.num_workers"),
    (_pipeline(grid={"not_a_field": [1]}), "grid.not_a_field"),
    (_pipeline(grid={"schedule": []}), "grid.schedule"),
    (dict(TINY, base={"bogus": 1}), "base.bogus"),
    (dict(TINY, grid={"laws": ["full"], "cutoffs": [1]}), "grid.cutoffs"),
    (dict(TINY, grid={"seeds": ["zero"]}), "grid.seeds[0]"),
])
def test_new_kinds_reject_bad_keys_by_name(table, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        schema.parse(table, "x.toml")


def test_schema_mirrors_the_configs():
    """Schema defaults are the dataclasses' defaults (so a TOML without a key means the same)."""
    from vccc_jax.pipeline import PipelineConfig, RewardChannel
    from vccc_jax.train.critic_free import CFConfig

    def defaults(cls, skip=()):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in skip}

    kinds = schema_kinds
    assert defaults(kinds.PipelineBase, {"channels"}) == defaults(PipelineConfig, {"channels"})
    assert defaults(kinds.PipelineChannel) == defaults(RewardChannel)
    mine = {k: v for k, v in defaults(kinds.CriticFreeBase).items() if k not in rc._RUN_KEYS}
    assert mine == defaults(CFConfig, {"law", "lag", "seed"})
    exp = schema.load("experiments/pipeline_default.toml")
    cfg = schema.pipeline_config(exp)
    assert [c.name for c in cfg.channels] == ["rule", "judge", "human"]
    assert exp.grid.axes == (("schedule", ("sync", "one_step_off", "async")),)
    assert schema.pipeline_config(schema.parse(_pipeline())).channels == PipelineConfig().channels
    ps = schema.load("experiments/ps_ppo.toml")
    assert len(rc.validate(ps)) == 18 and rc.cf_config(rc.cells(ps)[0]) == CFConfig()


def test_validate_names_bad_laws():
    bad = schema.parse(dict(TINY, grid={"laws": ["halfway"]}), "x.toml")
    with pytest.raises(ValueError, match="grid.laws: 'halfway'"):
        rc.validate(bad)


def test_tiny_grid_writes_resumes_without_duplicates(tmp_path):
    exp = schema.parse(TINY, "tiny.toml")

    def stop_at_second(i, n, cell):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rc.run_grid(exp, tmp_path, progress=False, on_cell=stop_at_second)
    store = tmp_path / "tiny_cf.jsonl"
    first = store.read_text().splitlines()
    assert len(first) == 1
    computed = []
    path, rows = rc.run_grid(exp, tmp_path, progress=False,
                             on_cell=lambda i, n, cell: computed.append(i))
    lines = store.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert computed == [1] and len(lines) == 2 and len(set(ids)) == 2 and lines[0] == first[0]
    assert [r["cell"]["seed"] for r in rows] == [0, 1]
    hist = rows[0]["metrics"]["history"]
    assert [h["update"] for h in hist] == [1, 2] and hist[-1]["compute_rows"] == 2 * 16
    assert 0.0 <= hist[-1]["exact_return"] <= 1.0
    again, rows2 = rc.run_grid(exp, tmp_path, progress=False,
                               on_cell=lambda *a: pytest.fail("nothing left to compute"))
    assert rows2 == rows and len(store.read_text().splitlines()) == 2
    (summary,) = rc.summarize(rows)
    assert summary["seeds"] == 2 and summary["rows_per_update"] == 16
    assert "full (GRPO)" in rc.format_table([summary])

    from vccc_jax.plotting.comparators2 import fig_ps_ppo

    fig = fig_ps_ppo(rows)
    assert len(fig.axes) == 1 and "n = 2 seeds" in fig.legends[0].get_title().get_text()


def test_from_flags_builds_the_vccc_train_experiment():
    """``vccc train --critic-free`` flags -> a one-law critic_free experiment (the shared
    TrainConfig flags mapped onto CFConfig fields), or overrides of a config's grid / base."""
    from vccc_jax.train.critic_free import CFConfig

    env = TINY["base"]["env"]
    exp = rc.from_flags({"critic_free": "uniform", "env": env, "lag": "uniform:2", "seed": 3,
                         "num_seeds": 2, "actor_lr": 0.01, "ppo_epsilon": 0.1, "hidden": 8,
                         "updates": 4})
    assert (exp.name, exp.kind, exp.path) == ("critic_free", "critic_free", "")
    assert (exp.grid.laws, exp.grid.lags, exp.grid.seeds) == (["uniform"], ["uniform:2"], [3, 4])
    assert (exp.base.updates, exp.base.eval_every) == (4, 2)  # gcd(4, 2, 10): J at U and U // 2
    cells = rc.cells(exp)
    assert rc.cf_config(cells[1]) == CFConfig(env=env, law="uniform", lag="uniform:2", lr=0.01,
                                              clip_eps=0.1, hidden=8, seed=4)
    ps = schema.load("experiments/ps_ppo.toml")
    over = rc.from_flags({"groups": 3, "seed": 5}, ps)
    assert (over.name, over.path, over.grid.laws, over.grid.lags) == (
        ps.name, ps.path, ps.grid.laws, ps.grid.lags)
    assert over.base.groups == 3 and over.grid.seeds == [5] and over.base.eval_every == 10
    assert rc.from_flags({"updates": 10}, ps).base.eval_every == 5  # J at 5 and 10
    assert rc.wants({}, ps) and rc.wants({"slack": 2.0}, None) and not rc.wants({"lag": "x"}, None)
    with pytest.raises(ValueError, match="ps_ppo.toml: grid.lags: 'sometimes'"):
        rc.from_flags({"lag": "sometimes"}, ps)
    with pytest.raises(ValueError, match="^--slack must be > 0"):
        rc.from_flags({"critic_free": "full", "env": env, "slack": 0.0})


def test_laws_share_sampling_but_not_learning():
    """Configs differing in learner fields only share init / rollout / evaluate; others may
    not borrow them."""
    import types

    from vccc_jax.train.critic_free import CFConfig, CriticFree

    assert CFConfig(law="uniform", slack=2.0, clip_eps=0.1, seed=3).sampling() == CFConfig()
    assert CFConfig(lag="uniform:2").sampling() != CFConfig()
    with pytest.raises(ValueError, match="differ beyond the learner fields"):
        CriticFree(CFConfig(groups=3), like=types.SimpleNamespace(cfg=CFConfig()))
