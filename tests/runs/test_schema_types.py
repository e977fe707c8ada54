"""The schema types nested tables by the library classes they become, read from the source
(no import): the reading must equal the imported classes' own fields, types and defaults.
And ``--set`` overrides (``runs.overrides.apply_overrides``) land where they say, typed by
the schema."""

import dataclasses
import inspect
import typing

import pytest

from vccc_jax.runs import schema
from vccc_jax.runs.schema_fields import FAMILY_GENERATORS, ConfigError, source_fields

INT, FLOAT, BOOL, STR = int, float, bool, str


def _hint_type(hint):
    """int / float / bool / str / list of a type hint (Optional[X] -> X; tuple -> list)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        hint = args[0]
    return {tuple: list}.get(hint, hint) if hint in (int, float, bool, str, tuple, list,
                                                     dict) else None


def _classes():
    from vccc_jax.tabular.async_actor import ACConfig
    from vccc_jax.tabular.critic_sgd import CriticSGDConfig
    from vccc_jax.tabular.history import HistoryConfig
    from vccc_jax.train.config import TrainConfig

    return [("tabular/history", HistoryConfig), ("tabular/critic_sgd", CriticSGDConfig),
            ("tabular/async_actor", ACConfig), ("train/config", TrainConfig)]


def test_source_fields_equal_the_imported_dataclasses():
    for module, cls in _classes():
        got = source_fields(module, cls.__name__)
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        assert list(got) == [f.name for f in fields], cls
        for f in fields:
            required = (f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING)
            assert got[f.name] == (_hint_type(hints[f.name]), required), (cls, f.name)


def test_source_fields_equal_the_family_generators():
    from vccc_jax.tabular import mdp

    for kind, fn_name in FAMILY_GENERATORS.items():
        skip = ("key", "num_mdps", "dtype")
        got = source_fields("tabular/mdp", fn_name, skip)
        sig = inspect.signature(getattr(mdp, fn_name))
        hints = typing.get_type_hints(getattr(mdp, fn_name))
        params = [p for p in sig.parameters.values() if p.name not in skip]
        assert list(got) == [p.name for p in params], kind
        for p in params:
            assert got[p.name] == (_hint_type(hints[p.name]), p.default is p.empty), p.name


def test_overrides_are_typed_by_the_schema(tmp_path):
    exp = schema.load("experiments/tabular_smoke.toml", [
        "base.num_mdps=4", "grid.mean_lags=0,1,2", "grid.laws=fixed",
        "base.families[0].gamma=0.5", "base.history.num_versions=9", "name=mine",
        "description=a b", "grid.methods=[\"vccc\", \"vtrace\"]"])
    assert exp.name == "mine" and exp.description == "a b" and exp.base.num_mdps == 4
    assert exp.grid.mean_lags == [0, 1, 2] and exp.grid.laws == ["fixed"]
    assert exp.grid.methods == ["vccc", "vtrace"]
    assert exp.base.families[0]["gamma"] == 0.5 and exp.base.history["num_versions"] == 9
    assert exp.path.endswith("with --set")
    train = schema.load("experiments/train_lag_quick.toml", [
        "grid.env=[\"token:V=16,H=8\"]", "grid.critic=vccc,gae", "base.num_envs=8",
        "base.anneal_lr=false"])
    assert dict(train.grid.axes)["env"] == ("token:V=16,H=8",) and train.base["num_envs"] == 8
    assert train.base["anneal_lr"] is False
    assert dict(train.grid.axes)["critic"] == ("vccc", "gae")
    pipe = schema.load("experiments/pipeline_default.toml", ["grid.num_workers=4,8"])
    assert dict(pipe.grid.axes)["num_workers"] == (4, 8)
    # the file itself is untouched, and a plain load ignores nothing
    assert schema.load("experiments/tabular_smoke.toml").name == "tabular_smoke"


@pytest.mark.parametrize("item,match", [
    ("base.num_mdps=4.5", "base.num_mdps must be an integer, got 4.5"),
    ("grid.mean_lags=0,x", r"grid.mean_lags\[1\] must be a number"),
    ("base.history.colour=1", "unknown key base.history.colour"),
    ("base.families[9].gamma=1", r"base.families has no item 9"),
    ("base.families[x].gamma=1", "bad index"),
    ("base.seed", "expected KEY=VALUE"),
    ("=4", "expected KEY=VALUE"),
    ("base=4", "keys are name"),
    ("kind=rac", "the kind of an experiment"),
])
def test_bad_overrides_name_the_key(item, match):
    with pytest.raises(ConfigError, match=match):
        schema.load("experiments/tabular_smoke.toml", [item])


@pytest.mark.parametrize("item,match", [
    # issue 45 row 5: a base field that the grid also sets was silently ignored
    ("base.lag=geometric:8", r"--set base.lag: lag is a grid axis of this config \(grid.lag = "
     r".*\), which sets it in every cell: use --set grid.lag=geometric:8"),
    # a spec with commas was split into pieces that are no spec
    ("grid.env=tabular:family=garnet,S=8", r"the commas split it into \['tabular:family=garnet', "
     r"'S=8'\].*--set 'grid.env=\[\"tabular:family=garnet,S=8\"\]'"),
    ("grid.lag=trace:1,2,3", r"'2' is not a value of its own"),
])
def test_train_overrides_that_would_be_lost_are_refused(item, match):
    with pytest.raises(ConfigError, match=match):
        schema.load("experiments/train_lag_quick.toml", [item])


def test_the_list_syntax_keeps_commas_inside_a_spec():
    exp = schema.load("experiments/train_lag_quick.toml", [
        'grid.env=["tabular:family=garnet,S=8", "tabular:family=garnet,S=16"]',
        "grid.lag=fixed:0,geometric:4", "base.num_envs=8"])
    axes = dict(exp.grid.axes)
    assert axes["env"] == ("tabular:family=garnet,S=8", "tabular:family=garnet,S=16")
    assert axes["lag"] == ("fixed:0", "geometric:4")
