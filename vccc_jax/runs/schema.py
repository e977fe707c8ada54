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
the key. Semantic checks (known methods, lag laws, environment names) are the runners'
(``runs.tabular_sweep.validate``, ``runs.async_ac.validate``, ``runs.train.cells``), which
raise ``ValueError``; commands print either as one line.

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

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

KINDS = ("tabular_sweep", "async_ac", "train", "pipeline", "critic_free", "decoupled", "rac",
         "rac_wallclock")


class ConfigError(ValueError):
    """A config that does not fit the schema; the message names the key."""


_NUMBER = (int, float)


def _check_type(value: Any, kind, where: str) -> Any:
    """``value`` if it has type ``kind`` (bool is not a number; int is a float)."""
    if kind is float:
        kind = _NUMBER
    bad = isinstance(value, bool) and kind is not bool
    if bad or not isinstance(value, kind):
        name = "number" if kind is _NUMBER else getattr(kind, "__name__", str(kind))
        raise ConfigError(f"{where} must be a {name}, got {value!r}")
    return value


def from_table(cls, table: Mapping, where: str):
    """An instance of dataclass ``cls`` from a TOML table; unknown / missing keys and wrong
    types raise :class:`ConfigError` naming ``where.key``. Field types come from each
    field's ``metadata["type"]``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise ConfigError(f"unknown key {where}.{key} (known: {', '.join(sorted(fields))})")
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
}


def _axes(grid: Any, known, where: str) -> AxesGrid:
    """``[grid]`` as field = non-empty list, each field one of ``known`` (else ConfigError)."""
    axes = []
    for k, v in _check_type(grid, dict, f"{where}: grid").items():
        if known is not None and k not in known:
            raise ConfigError(f"{where}: unknown key grid.{k} (known: {', '.join(sorted(known))})")
        _check_type(v, list, f"{where}: grid.{k}")
        if not v:
            raise ConfigError(f"{where}: grid.{k} must be a non-empty list")
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
    if kind == "train":
        _check_type(base, dict, f"{where}: base")
        axes = _axes(grid, None, where).axes
        return Experiment(name, kind, dict(base), TrainGrid(axes), description, where)
    base_cls, grid_cls = _PARTS[kind]
    try:
        b = from_table(base_cls, base, "base")
        g = None if grid_cls is AxesGrid else from_table(grid_cls, grid, "grid")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if g is None:  # axes over the base's scalar fields
        g = _axes(grid, {f.name for f in dataclasses.fields(base_cls)} - {"channels"}, where)
    return Experiment(name, kind, b, g, description, where)


def load(path: str | Path) -> Experiment:
    """Read and parse an experiment TOML file (missing file, bad TOML: ConfigError)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    if p.suffix != ".toml":
        raise ConfigError(f"config must be a .toml experiment file, got {p.name}")
    try:
        table = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    return parse(table, str(p))


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
