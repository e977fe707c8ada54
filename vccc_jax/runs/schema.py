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
library classes they become (``runs.schema_fields.source_fields`` reads those types from the
source, so a config is checked before JAX is imported). Semantic checks (known methods, lag laws,
environment names) are the runners' (``runs.tabular_sweep.validate``,
``runs.async_ac.validate``, ``runs.train.cells``), which raise ``ValueError``; commands print
either as one line.

``load(path, overrides=["base.num_mdps=4", "grid.mean_lags=0,1"])`` applies ``--set``
overrides (``runs.overrides.apply_overrides``) before parsing, so an override is checked
exactly as the file is.

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

This module reads (:func:`parse`, :func:`load`) and writes (:func:`dumps`) experiment files.
The pieces it stands on, each imported from where it lives:

* ``runs.schema_fields`` -- :class:`ConfigError` and the type checks of TOML values and
  nested tables;
* ``runs.schema_kinds`` -- every kind's base / grid dataclasses and the registry (``KINDS``);
* ``runs.overrides`` -- ``--set`` parsing and typing.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from vccc_jax.runs.overrides import apply_overrides
from vccc_jax.runs.schema_fields import (
    ConfigError,
    check_table,
    check_type,
    from_table,
    train_fields,
    unknown_key,
)
from vccc_jax.runs.schema_kinds import KINDS, PARTS, TOP_KEYS, AxesGrid, TrainGrid


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


def _axes(grid: Any, known: Mapping, where: str) -> AxesGrid:
    """``[grid]`` as field = non-empty list, each field one of ``known`` ({name: type}) and
    each value of its type (else ConfigError)."""
    axes = []
    for k, v in check_type(grid, dict, f"{where}: grid").items():
        if k not in known:
            raise ConfigError(f"{where}: {unknown_key(k, 'grid', known)}")
        check_type(v, list, f"{where}: grid.{k}")
        if not v:
            raise ConfigError(f"{where}: grid.{k} must be a non-empty list")
        for i, x in enumerate(v):
            check_type(x, known[k], f"{where}: grid.{k}[{i}]")
        axes.append((k, tuple(v)))
    return AxesGrid(tuple(axes))


def parse(table: Mapping, where: str = "config") -> Experiment:
    """An :class:`Experiment` from a parsed TOML table (errors name the key)."""
    for key in table:
        if key not in TOP_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}: missing key {key!r}")
    name = check_type(table["name"], str, f"{where}: name")
    kind = check_type(table["kind"], str, f"{where}: kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    description = check_type(table.get("description", ""), str, f"{where}: description")
    base, grid = table.get("base", {}), table.get("grid", {})
    if kind == "train":  # TrainConfig fields (types read from train/config.py)
        fields = train_fields()
        try:
            check_table(base, fields, "base")
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        axes = _axes(grid, {k: t for k, (t, _) in fields.items()}, where).axes
        return Experiment(name, kind, dict(base), TrainGrid(axes), description, where)
    base_cls, grid_cls = PARTS[kind]
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


def pipeline_config(exp: Experiment, **changes):
    """The ``pipeline.PipelineConfig`` of a ``pipeline`` experiment's base (``changes``
    override fields); bad values raise ``ValueError`` naming the field."""
    from vccc_jax.pipeline import config_from_dict

    table = as_dict(exp.base)
    if not table["channels"]:
        del table["channels"]
    table.update(changes)
    return config_from_dict(table)


def default_path(name: str = "tabular_default") -> Path:
    """experiments/<name>.toml of the repository this package was imported from."""
    return Path(__file__).resolve().parents[2] / "experiments" / f"{name}.toml"


def as_dict(obj) -> dict:
    """A dataclass part as a plain dict (deep copies of its lists and tables)."""
    return {f.name: copy.deepcopy(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _toml_value(v: Any) -> str:
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
        tables = isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v)
        if isinstance(v, Mapping) or tables:
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
