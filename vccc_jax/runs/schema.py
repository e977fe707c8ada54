"""The ONE experiment schema: a TOML file with ``name``, ``kind``, ``base`` and ``grid``.

    # comments are welcome
    name = "tabular_default"          # results/<name>.jsonl, figures/<name>/
    kind = "tabular_sweep"            # one of KINDS (list below)
    description = "..."               # optional, free text
    [base]                            # what every cell shares (kind-specific tables below)
    ...
    [grid]                            # axes: name = [values, ...]; cells are their product
    ...

Parsed into frozen dataclasses (:class:`Experiment` and one ``base``/``grid`` pair per kind);
an unknown key, a missing key or a value of the wrong type raises :class:`ConfigError` naming
the key -- nested tables included: ``[base.history]``, ``[base.train]``, ``[[base.families]]``,
``[base.ac]``, ``[base.family]`` and the ``train`` kind's TrainConfig fields are typed by the
library classes they become (:func:`source_fields` reads those types from the source, so a
config is checked before JAX is imported). Semantic checks (known methods, lag laws,
environment names) are the runners' (``runs.tabular_sweep.validate``,
``runs.async_ac.validate``, ``runs.train.cells``), which raise ``ValueError``; commands print
either as one line.

``load(path, overrides=["base.num_mdps=4", "grid.mean_lags=0,1"])`` applies ``--set``
overrides (:func:`apply_overrides`) before parsing, so an override is checked exactly as the
file is.

Kinds:

* ``tabular_sweep`` -- base: seed, num_mdps, history{}, families[[]], methods{}, train{};
  grid: laws, mean_lags, clips, methods, method_clips{} (``runs.tabular_sweep``).
* ``async_ac`` -- base: seed, num_mdps, family{}, init_scale, ac{}, actor_clip, mask_clip,
  law, lanes_per_call; grid: modes, actor_kinds, critics, centerings, mean_lags
  (``runs.async_ac``).
* ``train`` -- base: any ``TrainConfig`` fields; grid: TrainConfig field = [values]
  (``runs.train``).
* ``pipeline`` -- base: ``pipeline.PipelineConfig`` fields with ``[[base.channels]]`` tables of
  ``pipeline.RewardChannel`` fields; grid: PipelineConfig field = [values]
  (``vccc simulate``; :func:`pipeline_config`).
* ``critic_free`` -- base: ``train.critic_free.CFConfig`` fields except law/lag/seed, plus
  updates, eval_every, cost_repeats; grid: laws, lags, seeds (``runs.critic_free``).
* ``decoupled`` -- exact pi_old-route study (issue 13): base: MDP family, policy history,
  inference noise quantum, thresholds; grid: noises, lags (``runs.decoupled``).
* ``rac`` -- exact bias cut drop / RAC with delayed reward channels (issue 14): base: MDP
  family, policy history, channel delays, slow-channel kernel, reward shares; grid: clips
  (0 = no clip), masses (slow kernel rescaled), lags (behaviour-lag laws) (``runs.rac``).
* ``rac_wallclock`` -- exact drop / wait / RAC training coupled to a simulated pipeline
  (issue 14): base: MDP family, kernel, lr, hours, fractions, ``[base.pipeline]`` (the
  ``pipeline`` kind's base; its num_updates is set from hours); grid: clips, masses,
  methods (``runs.rac_wallclock``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

KINDS = ("tabular_sweep", "async_ac", "train", "pipeline", "critic_free", "decoupled", "rac",
         "rac_wallclock", "actor_map")


class ConfigError(ValueError):
    """A config that does not fit the schema; the message names the key."""


_NUMBER = (int, float)
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean (true/false)",
               str: "a string", list: "a list", dict: "a table", tuple: "a list"}


def _check_type(value: Any, kind, where: str) -> Any:
    """``value`` if it has type ``kind`` (bool is not a number; int is a float; ``object``
    or None: anything)."""
    if kind is None or kind is object:
        return value
    if isinstance(kind, tuple):  # scalars of any of these types
        want, name = kind, "a number, string or boolean"
    else:
        want = _NUMBER if kind is float else (list, tuple) if kind in (list, tuple) else kind
        name = _TYPE_NAMES.get(kind, getattr(kind, "__name__", str(kind)))
    bad = isinstance(value, bool) and not (kind is bool or
                                           (isinstance(kind, tuple) and bool in kind))
    if bad or not isinstance(value, want):
        raise ConfigError(f"{where} must be {name}, got {value!r}")
    return value


def _unknown(key: str, where: str, known) -> ConfigError:
    """'unknown key where.key (did you mean ...? known: ...)'."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return ConfigError(f"unknown key {where}.{key} ({hint}known: {', '.join(known)})")


def from_table(cls, table: Mapping, where: str):
    """An instance of dataclass ``cls`` from a TOML table; unknown / missing keys and wrong
    types raise :class:`ConfigError` naming ``where.key``. Field types come from each
    field's ``metadata["type"]``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise _unknown(key, where, fields)
    kwargs = {}
    for name, f in fields.items():
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing key {where}.{name}")
            continue
        value = _check_type(table[name], f.metadata.get("type", object), f"{where}.{name}")
        item = f.metadata.get("item")
        if item is not None:
            for i, v in enumerate(value):
                _check_type(v, item, f"{where}.{name}[{i}]")
        kwargs[name] = value
    return cls(**kwargs)


def _f(kind, default=dataclasses.MISSING, item=None):
    """A field of type ``kind`` (list items of type ``item``)."""
    meta = {"type": kind, "item": item}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# ------------------------------------------------- tables typed by the library's own classes
# A nested table ([base.history], [[base.families]], the train kind's base ...) becomes a
# library config class (tabular.history.HistoryConfig, tabular.mdp.garnet_mdp's keywords,
# train.config.TrainConfig ...). Their field names and types are read from the source with
# ``ast`` -- not imported, as importing them imports JAX (seconds) -- so a bad config fails
# before any heavy import; tests/runs/test_schema_types.py checks the reading against the
# imported classes.

_PACKAGE = Path(__file__).resolve().parents[1]
_ANNOTATION = {"int": int, "float": float, "bool": bool, "str": str, "tuple": list,
               "list": list, "dict": dict}


def _annotation_type(node) -> Any:
    """int / float / bool / str / list / dict of an annotation; Optional[X] and X | None
    are X (TOML has no null); anything else: None (not checked)."""
    if node is None:
        return None
    text = ast.unparse(node).replace(" ", "")
    for wrap in ("Optional[", "typing.Optional["):
        if text.startswith(wrap) and text.endswith("]"):
            text = text[len(wrap):-1]
    text = text.removesuffix("|None").removeprefix("None|")
    return _ANNOTATION.get(text.split("[")[0])


@functools.lru_cache(maxsize=None)
def source_fields(module: str, name: str, skip: tuple = ()) -> dict:
    """``{field: (type, required)}`` of dataclass ``name`` -- or the parameters of function
    ``name`` -- in ``vccc_jax/<module>.py``, read from its source (not imported). ``skip``:
    names left out (e.g. a function's ``key``)."""
    tree = ast.parse((_PACKAGE / f"{module}.py").read_text())
    node = next((n for n in tree.body if getattr(n, "name", None) == name), None)
    if isinstance(node, ast.ClassDef):
        items = [(s.target.id, s.annotation, s.value is None) for s in node.body
                 if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    elif isinstance(node, ast.FunctionDef):
        a = node.args
        positional = a.posonlyargs + a.args
        required = len(positional) - len(a.defaults)
        items = [(x.arg, x.annotation, i < required) for i, x in enumerate(positional)]
        items += [(x.arg, x.annotation, d is None) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    else:
        raise LookupError(f"no class or function {name!r} in vccc_jax/{module}.py")
    return {n: (_annotation_type(ann), req) for n, ann, req in items if n not in skip}


def check_table(table: Any, fields: Mapping, where: str, exclude: Sequence[str] = ()) -> dict:
    """``table`` checked against ``fields`` (:func:`source_fields`): a TOML table, no
    unknown key (``exclude``: keys refused here, set elsewhere), every required key present,
    every value of its field's type. Returns it; raises :class:`ConfigError` naming the key."""
    _check_type(table, dict, where)
    known = {k: v for k, v in fields.items() if k not in exclude}
    for key, value in table.items():
        if key not in known:
            raise _unknown(key, where, known)
        _check_type(value, known[key][0], f"{where}.{key}")
    for key, (_, required) in known.items():
        if required and key not in table:
            raise ConfigError(f"missing key {where}.{key}")
    return table


# [[base.families]] kinds: the generator whose keywords a family table holds (tabular.mdp).
FAMILY_GENERATORS = {"garnet": "garnet_mdp", "random": "random_mdp", "chain": "chain_mdp"}


def check_family(table: Any, where: str, kinds: Sequence[str] = tuple(FAMILY_GENERATORS),
                 named: bool = True) -> dict:
    """A family table: ``kind`` (one of ``kinds``), ``name`` when ``named``, and the
    generator's keywords (``tabular.mdp.<kind>_mdp``, less key / num_mdps / dtype)."""
    _check_type(table, dict, where)
    kind = table.get("kind")
    if kind not in kinds:
        raise ConfigError(f"{where}.kind must be one of {', '.join(kinds)}, got {kind!r}")
    fields = {"kind": (str, True), "name": (str, named),
              **source_fields("tabular/mdp", FAMILY_GENERATORS[kind],
                              ("key", "num_mdps", "dtype"))}
    return check_table(table, fields, where)


def train_fields() -> dict:
    """The fields of ``train.config.TrainConfig`` (``train`` experiments' base and grid)."""
    return source_fields("train/config", "TrainConfig")


# ------------------------------------------------------------------------ tabular_sweep


@dataclass(frozen=True)
class TabularSweepBase:
    """What every cell of a tabular sweep shares (see ``runs.tabular_sweep``)."""

    num_mdps: int = _f(int)                 # MDPs per family = seeds, vmapped
    families: list = _f(list, item=dict)    # [[base.families]]: name, kind, generator options
    seed: int = _f(int, 0)
    history: dict = _f(dict, {})            # tabular.history.HistoryConfig fields
    methods: dict = _f(dict, {})            # [base.methods.<name>]: per-method options
    train: dict = _f(dict, {})              # stochastic semi-gradient TD config

    def __post_init__(self):
        check_table(self.history, source_fields("tabular/history", "HistoryConfig"),
                    "base.history")
        check_table(self.train, source_fields("tabular/critic_sgd", "CriticSGDConfig"),
                    "base.train")
        for i, fam in enumerate(self.families):
            check_family(fam, f"base.families[{i}]")
        for name, opts in self.methods.items():  # option names: the method's (runner)
            for k, v in _check_type(opts, dict, f"base.methods.{name}").items():
                _check_type(v, (int, float, str, bool), f"base.methods.{name}.{k}")


@dataclass(frozen=True)
class TabularSweepGrid:
    laws: list = _f(list, item=str)
    mean_lags: list = _f(list, item=float)
    methods: list = _f(list, item=str)
    clips: list = _f(list, [], item=float)
    method_clips: dict = _f(dict, {})       # per-method clip lists (else grid.clips)


# ----------------------------------------------------------------------------- async_ac


@dataclass(frozen=True)
class AsyncACBase:
    """What every cell of an async actor-critic grid shares (see ``runs.async_ac``)."""

    seed: int = _f(int, 0)
    num_mdps: int = _f(int, 64)
    family: dict = _f(dict, {"kind": "random", "num_states": 8, "num_actions": 4, "gamma": 0.9})
    init_scale: float = _f(float, 1.0)
    ac: dict = _f(dict, {})                 # tabular.async_ac.ACConfig fields
    actor_clip: float = _f(float, 1.0)
    mask_clip: float = _f(float, 2.0)
    law: str = _f(str, "geometric")
    lanes_per_call: int = _f(int, 1024)

    def __post_init__(self):
        check_family(self.family, "base.family", ("random", "garnet"), named=False)
        check_table(self.ac, source_fields("tabular/async_actor", "ACConfig"), "base.ac",
                    exclude=("critic_methods", "critic_options", "expected"))  # the grid's


@dataclass(frozen=True)
class AsyncACGrid:
    modes: list = _f(list, ["expected"], item=str)
    actor_kinds: list = _f(list, ["truncate"], item=str)
    critics: list = _f(list, ["uncorrected", "vccc"], item=str)
    centerings: list = _f(list, ["none", "exact"], item=str)
    mean_lags: list = _f(list, [0, 1, 2, 4, 8], item=float)


# ------------------------------------------------------------------------------ train


@dataclass(frozen=True)
class TrainGrid:
    """``field = [values]`` for TrainConfig fields (checked by ``runs.train.cells``)."""

    axes: tuple = ()                        # ((field, (values, ...)), ...) in file order


# ---------------------------------------------------------------------------- pipeline
# Mirrors of pipeline.PipelineConfig / RewardChannel (same names and defaults; tested), so the
# schema stays import-light. Values are checked by PipelineConfig itself (ValueError).


@dataclass(frozen=True)
class PipelineChannel:
    """One ``[[base.channels]]`` table: a reward channel (``pipeline.RewardChannel``)."""

    name: str = _f(str, "rule")
    latency: float = _f(float, 0.1)
    latency_sigma: float = _f(float, 0.0)
    servers: int = _f(int, 0)
    blocking: bool = _f(bool, True)


@dataclass(frozen=True)
class PipelineBase:
    """The described cluster (``pipeline.PipelineConfig``; units in its docstring)."""

    num_workers: int = _f(int, 16)
    tokens_per_second: float = _f(float, 50.0)
    speed_sigma: float = _f(float, 0.3)
    length_median: float = _f(float, 400.0)
    length_sigma: float = _f(float, 0.8)
    max_length: int = _f(int, 4096)
    batch_size: int = _f(int, 32)
    update_time: float = _f(float, 20.0)
    sync_time: float = _f(float, 2.0)
    partial_rollout: bool = _f(bool, False)
    max_ahead: int = _f(int, 2)
    schedule: str = _f(str, "async")
    num_updates: int = _f(int, 50)
    channels: list = _f(list, [], item=dict)  # [[base.channels]]; empty: the default channel
    seed: int = _f(int, 0)

    def __post_init__(self):
        for i, c in enumerate(self.channels):
            from_table(PipelineChannel, c, f"base.channels[{i}]")


@dataclass(frozen=True)
class AxesGrid:
    """``field = [values]`` axes (file order) over the fields of the kind's base."""

    axes: tuple = ()


def pipeline_config(exp: "Experiment", **changes):
    """The ``pipeline.PipelineConfig`` of a ``pipeline`` experiment's base (``changes``
    override fields); bad values raise ``ValueError`` naming the field."""
    from vccc_jax.pipeline import config_from_dict

    table = as_dict(exp.base)
    if not table["channels"]:
        del table["channels"]
    table.update(changes)
    return config_from_dict(table)


# -------------------------------------------------------------------------- critic_free


@dataclass(frozen=True)
class CriticFreeBase:
    """Shared by every cell of a GRPO / PS-PPO grid: ``train.critic_free.CFConfig`` fields
    (same defaults; tested) except the grid's law / lag / seed, and the run length."""

    env: str = _f(str, "token:V=16,H=12,Q=6,C=4,P=4,accept=0.3,seed=0")
    groups: int = _f(int, 8)
    group_size: int = _f(int, 8)
    slack: float = _f(float, 1.1)
    lr: float = _f(float, 3e-3)
    clip_eps: float = _f(float, 0.2)
    hidden: int = _f(int, 32)
    length_ema: float = _f(float, 0.8)
    updates: int = _f(int, 60)          # optimiser updates per run
    eval_every: int = _f(int, 10)       # exact return J every this many updates
    cost_repeats: int = _f(int, 20)     # timed learner calls per run (learner_cost); 0: skip


@dataclass(frozen=True)
class CriticFreeGrid:
    laws: list = _f(list, ["full", "mixture:0.2", "uniform"], item=str)  # "full" = GRPO
    lags: list = _f(list, ["fixed:0"], item=str)                          # envs.lag.LagLaw
    seeds: list = _f(list, [0, 1, 2], item=int)


# ---------------------------------------------------------------------------- decoupled


@dataclass(frozen=True)
class DecoupledBase:
    """The exact decoupled-correction route study (``runs.decoupled``; issue 13)."""

    seed: int = _f(int, 0)
    num_mdps: int = _f(int, 4)              # random MDPs (tabular.mdp.random_mdp)
    num_states: int = _f(int, 5)
    num_actions: int = _f(int, 3)
    gamma: float = _f(float, 0.9)
    algorithm: str = _f(str, "npg")         # policy history pi_0..pi_K (tabular.history)
    step_size: float = _f(float, 0.3)
    num_versions: int = _f(int, 17)
    init_scale: float = _f(float, 1.0)
    quantum: float = _f(float, 0.25)        # inference logits rounded to this grid (0: none)
    kind: str = _f(str, "truncate")         # discrepancy weight w(pi_old / mu)
    clip: float = _f(float, 2.0)
    ppo_epsilon: float = _f(float, 0.2)
    threshold_kind: str = _f(str, "mask")   # threshold-interaction grid
    threshold_noise: float = _f(float, 0.3)
    threshold_lags: list = _f(list, [0, 4], item=int)
    threshold_clips: list = _f(list, [1.1, 1.5, 2.0, 4.0], item=float)
    threshold_epsilons: list = _f(list, [0.1, 0.2, 0.3], item=float)


@dataclass(frozen=True)
class DecoupledGrid:
    noises: list = _f(list, [0.0, 0.3, 1.0], item=float)   # inference noise scale
    lags: list = _f(list, [0, 1, 2, 4, 8, 16], item=int)


# ---------------------------------------------------------------------------------- rac


@dataclass(frozen=True)
class RacBase:
    """The exact bias-cut study of RAC (``runs.rac``; issue 14). Channel c has delay
    ``delays[c]`` optimiser steps (0 = fast); slow channels share ``kernel``."""

    seed: int = _f(int, 0)
    num_mdps: int = _f(int, 16)             # random MDPs (tabular.mdp.random_mdp)
    num_states: int = _f(int, 5)
    num_actions: int = _f(int, 3)
    gamma: float = _f(float, 0.9)
    algorithm: str = _f(str, "npg")         # policy history pi_0..pi_K (tabular.history)
    step_size: float = _f(float, 0.3)
    num_versions: int = _f(int, 12)
    init_scale: float = _f(float, 1.0)
    delays: list = _f(list, [0, 2, 5], item=int)
    kernel: list = _f(list, [0.6, 0.3, 0.1], item=float)
    shares: list = _f(list, [], item=float)  # reward share per channel; empty: equal


@dataclass(frozen=True)
class RacGrid:
    clips: list = _f(list, [1.0], item=float)        # cbar at reinjection; 0 = no clip
    masses: list = _f(list, [1.0], item=float)       # slow kernel rescaled to this mass
    lags: list = _f(list, ["fixed:0"], item=str)     # behaviour-lag law "LAW:MEAN"


@dataclass(frozen=True)
class RacWallclockBase:
    """Exact drop / wait / RAC training coupled to a simulated cluster
    (``runs.rac_wallclock``). The MDP's reward channels are the pipeline's (blocking = fast)."""

    seed: int = _f(int, 0)
    num_mdps: int = _f(int, 16)
    num_states: int = _f(int, 5)
    num_actions: int = _f(int, 3)
    gamma: float = _f(float, 0.9)
    init_scale: float = _f(float, 1.0)
    shares: list = _f(list, [], item=float)
    kernel: list = _f(list, [0.6, 0.3, 0.1], item=float)
    lr: float = _f(float, 0.3)
    hours: float = _f(float, 3.0)           # simulated wall-clock budget of every run
    fractions: list = _f(list, [0.5, 0.9], item=float)  # time to J0 + f (J* - J0)
    pipeline: dict = _f(dict, {})           # [base.pipeline]: the pipeline kind's base fields

    def __post_init__(self):
        from_table(PipelineBase, self.pipeline, "base.pipeline")


@dataclass(frozen=True)
class RacWallclockGrid:
    clips: list = _f(list, [1.0], item=float)        # 0 = no clip
    masses: list = _f(list, [1.0], item=float)
    methods: list = _f(list, ["drop", "wait", "rac"], item=str)


# ---------------------------------------------------------------------------- actor_map

# [[base.tasks]] kinds: the generator whose keywords a task table holds, plus the map's own keys.
ACTOR_MAP_TASKS = {"tabular": ("tabular/mdp", "random_mdp", ("key", "num_mdps", "dtype")),
                   "token": ("tabular/token", "make_task", ("key", "dtype"))}
ACTOR_MAP_TASK_KEYS = {"kind": (str, True), "name": (str, True), "history_step": (float, False),
                       "init_scale": (float, False), "lr": (float, False), "train": (bool, False)}


def check_actor_map_task(table: Any, where: str) -> dict:
    """A ``[[base.tasks]]`` table: kind (tabular | token), name, the generator's keywords
    (``tabular.mdp.random_mdp`` / ``tabular.token.make_task``) and history_step, init_scale,
    lr, train (``runs.actor_map``)."""
    _check_type(table, dict, where)
    kind = table.get("kind")
    if kind not in ACTOR_MAP_TASKS:
        raise ConfigError(f"{where}.kind must be one of {', '.join(ACTOR_MAP_TASKS)}, got {kind!r}")
    return check_table(table, {**ACTOR_MAP_TASK_KEYS, **source_fields(*ACTOR_MAP_TASKS[kind])},
                       where)


@dataclass(frozen=True)
class ActorMapBase:
    """What every cell of the actor-correction map shares (see ``runs.actor_map``)."""

    tasks: list = _f(list, item=dict)       # [[base.tasks]]: name, kind, generator keywords
    seed: int = _f(int, 0)
    num_seeds: int = _f(int, 4)             # problem instances (random problem + init) per task
    temperature: float = _f(float, 0.7)     # the "temperature" sampler (top-p off)
    top_p: float = _f(float, 0.9)           # the "top_p" sampler (temperature 1)
    critic_clip: float = _f(float, 2.0)     # c of the truncated critic
    vtrace_rhobar: float = _f(float, 1.0)   # rhobar = cbar of the V-trace critic
    centred: bool = _f(bool, False)         # Eq 13 score centring of the per-state rows
    row_params: dict = _f(dict, {})         # [base.row_params.<row>]: the row's parameters
    train_updates: int = _f(int, 128)       # updates of every training run
    train_decomposition: bool = _f(bool, False)  # also the bias parts along every run (~2x cost)

    def __post_init__(self):
        for i, t in enumerate(self.tasks):
            check_actor_map_task(t, f"base.tasks[{i}]")
        for name, opts in self.row_params.items():  # names / values: the registry's (runner)
            for k, v in _check_type(opts, dict, f"base.row_params.{name}").items():
                _check_type(v, (int, float, str, bool), f"base.row_params.{name}.{k}")


@dataclass(frozen=True)
class ActorMapGrid:
    tasks: list = _f(list, item=str)                             # names of base.tasks
    rows: list = _f(list, item=str)                              # actor-registry rows
    lags: list = _f(list, [0, 1, 4, 16, 64, 256], item=int)
    samplers: list = _f(list, ["temperature", "top_p"], item=str)
    studies: list = _f(list, ["exact", "train"], item=str)
    train_rows: list = _f(list, [], item=str)   # rows of the train study ([]: grid.rows)
    train_lags: list = _f(list, [], item=int)   # lags of the train study ([]: grid.lags)


# ---------------------------------------------------------------------------- experiment


@dataclass(frozen=True)
class Experiment:
    """One experiment file. ``base`` / ``grid`` are the kind's dataclasses (train: base is the
    raw table of TrainConfig fields, validated when the cells are built)."""

    name: str
    kind: str
    base: Any
    grid: Any
    description: str = ""
    path: str = ""


_TOP = ("name", "kind", "description", "base", "grid")
_PARTS = {
    "tabular_sweep": (TabularSweepBase, TabularSweepGrid),
    "async_ac": (AsyncACBase, AsyncACGrid),
    "pipeline": (PipelineBase, AxesGrid),
    "critic_free": (CriticFreeBase, CriticFreeGrid),
    "decoupled": (DecoupledBase, DecoupledGrid),
    "rac": (RacBase, RacGrid),
    "rac_wallclock": (RacWallclockBase, RacWallclockGrid),
    "actor_map": (ActorMapBase, ActorMapGrid),
}


def _axes(grid: Any, known: Mapping, where: str) -> AxesGrid:
    """``[grid]`` as field = non-empty list, each field one of ``known`` ({name: type}) and
    each value of its type (else ConfigError)."""
    axes = []
    for k, v in _check_type(grid, dict, f"{where}: grid").items():
        if k not in known:
            raise ConfigError(f"{where}: {_unknown(k, 'grid', known)}")
        _check_type(v, list, f"{where}: grid.{k}")
        if not v:
            raise ConfigError(f"{where}: grid.{k} must be a non-empty list")
        for i, x in enumerate(v):
            _check_type(x, known[k], f"{where}: grid.{k}[{i}]")
        axes.append((k, tuple(v)))
    return AxesGrid(tuple(axes))


def parse(table: Mapping, where: str = "config") -> Experiment:
    """An :class:`Experiment` from a parsed TOML table (errors name the key)."""
    for key in table:
        if key not in _TOP:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(_TOP)})")
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}: missing key {key!r}")
    name = _check_type(table["name"], str, f"{where}: name")
    kind = _check_type(table["kind"], str, f"{where}: kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    description = _check_type(table.get("description", ""), str, f"{where}: description")
    base, grid = table.get("base", {}), table.get("grid", {})
    if kind == "train":  # TrainConfig fields (types read from train/config.py)
        fields = train_fields()
        try:
            check_table(base, fields, "base")
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        axes = _axes(grid, {k: t for k, (t, _) in fields.items()}, where).axes
        return Experiment(name, kind, dict(base), TrainGrid(axes), description, where)
    base_cls, grid_cls = _PARTS[kind]
    try:
        b = from_table(base_cls, base, "base")
        g = None if grid_cls is AxesGrid else from_table(grid_cls, grid, "grid")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if g is None:  # axes over the base's scalar fields
        g = _axes(grid, {f.name: f.metadata["type"] for f in dataclasses.fields(base_cls)
                         if f.name != "channels"}, where)
    return Experiment(name, kind, b, g, description, where)


def load(path: str | Path, overrides: Sequence[str] = ()) -> Experiment:
    """Read and parse an experiment TOML file (missing file, bad TOML: ConfigError), with
    ``--set`` ``overrides`` applied first (:func:`apply_overrides`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    if p.suffix != ".toml":
        raise ConfigError(f"config must be a .toml experiment file, got {p.name}")
    try:
        table = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {' '.join(str(e).split())}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config {p}: {e}") from None
    if overrides:
        return parse(apply_overrides(table, overrides), f"{p} with --set")
    return parse(table, str(p))


# ------------------------------------------------------------------------ --set overrides


def _path_of(key: str) -> list:
    """``"base.families[0].num_states"`` -> ["base", "families", 0, "num_states"]."""
    parts: list = []
    for seg in key.split("."):
        name, _, rest = seg.partition("[")
        if not name:
            raise ValueError("empty key segment")
        parts.append(name)
        while rest:
            index, close, rest = rest.partition("]")
            if not close or not index.isdigit() or (rest and not rest.startswith("[")):
                raise ValueError(f"bad index in {seg!r} (write name[0])")
            parts.append(int(index))
            rest = rest[1:]
    return parts


def declared_type(kind: str, path: Sequence) -> tuple:
    """(type, item type) the schema declares at ``path`` of a ``kind`` experiment; (None,
    None) where it does not say (free tables). ``grid`` axes of the train / pipeline kinds
    are lists of their base field's type."""
    head, rest = path[0], list(path[1:])
    if head in ("name", "kind", "description") and not rest:
        return str, None
    if head not in ("base", "grid") or not rest or not isinstance(rest[0], str):
        return None, None
    if kind == "train":
        t = train_fields().get(rest[0], (None,))[0]
        return (t, None) if head == "base" else (list, t) if len(rest) == 1 else (t, None)
    base_cls, grid_cls = _PARTS[kind]
    if head == "grid" and grid_cls is AxesGrid:
        grid_cls, base_fields = None, {f.name: f for f in dataclasses.fields(base_cls)}
        t = base_fields[rest[0]].metadata["type"] if rest[0] in base_fields else None
        return (list, t) if len(rest) == 1 else (t, None)
    cls = base_cls if head == "base" else grid_cls
    f = {f.name: f for f in dataclasses.fields(cls)}.get(rest[0])
    if f is None:
        return None, None
    kind_, item = f.metadata.get("type"), f.metadata.get("item")
    if len(rest) == 1:
        return kind_, item
    if kind_ is list and len(rest) == 2:
        return item, None
    nested = {("tabular_sweep", "history"): ("tabular/history", "HistoryConfig"),
              ("tabular_sweep", "train"): ("tabular/critic_sgd", "CriticSGDConfig"),
              ("async_ac", "ac"): ("tabular/async_actor", "ACConfig")}.get((kind, rest[0]))
    if nested and len(rest) == 2:
        return source_fields(*nested).get(rest[1], (None,))[0], None
    return None, None


def _toml_literal(text: str) -> Any:
    """``text`` as a TOML value (``4``, ``0.5``, ``true``, ``[0, 1]``, ``"x"``, ``{a = 1}``);
    text that is not one stays a string (``geometric``, ``token:V=16``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _typed(text: str, kind, item) -> Any:
    """``--set`` value text typed by the schema: a string field takes the text as is, a
    list field takes ``a,b,c`` (items typed), anything else parses as a TOML value."""
    if kind is str:
        value = _toml_literal(text)
        return value if isinstance(value, str) else text
    value = _toml_literal(text)
    if kind is list and not isinstance(value, list):
        value = [_typed(x.strip(), item, None) for x in text.split(",")]
    return value


def apply_overrides(table: Mapping, overrides: Sequence[str]) -> dict:
    """A deep copy of the TOML ``table`` with ``KEY=VALUE`` overrides applied: dotted keys
    into the experiment (``base.num_mdps=4``, ``base.history.num_versions=9``,
    ``base.families[0].gamma=0.95``, ``grid.mean_lags=0,1,2``, ``name=mine``), values typed
    by the schema (:func:`declared_type`). The result is checked by :func:`parse` like any
    file. A malformed override raises :class:`ConfigError` naming it."""
    import copy

    out = copy.deepcopy(dict(table))
    kind = out.get("kind")
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. base.num_mdps=4)")
        try:
            path = _path_of(key)
        except ValueError as e:
            raise ConfigError(f"--set {key}: {e}") from None
        if path[0] not in _TOP or (path[0] in ("base", "grid")) != (len(path) > 1):
            raise ConfigError(f"--set {key}: keys are name, description, base.FIELD... or "
                              "grid.AXIS (e.g. base.num_mdps=4)")
        if path == ["kind"]:
            raise ConfigError("--set kind: the kind of an experiment is its file's")
        kind_, item_t = declared_type(kind, path) if kind in KINDS else (None, None)
        node: Any = out
        for i, part in enumerate(path[:-1]):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:i])[1:]
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    raise ConfigError(f"--set {key}: {where} has no item {part}")
                node = node[part]
            else:
                if not isinstance(node, dict):
                    raise ConfigError(f"--set {key}: {where} is not a table")
                node = node.setdefault(part, {})
        last = path[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ConfigError(f"--set {key}: no item {last} to set")
        elif not isinstance(node, dict):
            raise ConfigError(f"--set {key}: its parent is not a table")
        node[last] = _typed(text.strip(), kind_, item_t)
    return out


def default_path(name: str = "tabular_default") -> Path:
    """experiments/<name>.toml of the repository this package was imported from."""
    return Path(__file__).resolve().parents[2] / "experiments" / f"{name}.toml"


def as_dict(obj) -> dict:
    """A dataclass part as a plain dict (deep copies of its lists and tables)."""
    import copy

    return {f.name: copy.deepcopy(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _toml_value(v: Any) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} as a TOML value")


def dumps(table: Mapping, prefix: str = "") -> str:
    """A TOML document of ``table`` (scalars, lists, tables, arrays of tables): what
    :func:`load` reads back. For writing experiment files from code (tests, notebooks)."""
    lines, subs = [], []
    for k, v in table.items():
        if isinstance(v, Mapping) or (isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v)):
            subs.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in subs:
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            lines += ["", f"[{name}]", dumps(v, name + ".")]
        else:
            for item in v:
                lines += ["", f"[[{name}]]", dumps(item, name + ".")]
    return "\n".join(x for x in lines if x != "") + "\n" if not prefix else "\n".join(lines)
