"""``--set KEY=VALUE`` overrides of an experiment table, applied before it is parsed
(``runs.schema.load``), so an override is checked exactly as the file is.

Keys are dotted paths into the experiment (``base.num_mdps``, ``base.families[0].gamma``,
``grid.mean_lags``, ``name``); values are typed by what the schema declares at that path
(:func:`declared_type`): a string field takes the text as is, a list field ``a,b,c``, or a
TOML list when its values hold commas (``grid.env=["tabular:S=8,gamma=0.9", "token:V=16"]``;
a comma split that leaves a piece that is no value is refused with that suggestion).
``base.X`` on a config whose grid has an axis ``X`` is refused (the grid sets X in every
cell): ``grid.X`` it is.
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from typing import Any, Mapping, Sequence

from vccc_jax.runs.schema_fields import ConfigError, source_fields, train_fields
from vccc_jax.runs.schema_kinds import KINDS, PARTS, TOP_KEYS, AxesGrid


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
    base_cls, grid_cls = PARTS[kind]
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


def _value_of(text: str, kind, item) -> Any:
    """``--set`` value text typed by the schema: a string field takes the text as is, a
    list field takes ``a,b,c`` (items typed), anything else parses as a TOML value."""
    if kind is str:
        value = _toml_literal(text)
        return value if isinstance(value, str) else text
    value = _toml_literal(text)
    if kind is list and not isinstance(value, list):
        value = [_value_of(x.strip(), item, None) for x in text.split(",")]
    return value


def apply_overrides(table: Mapping, overrides: Sequence[str]) -> dict:
    """A deep copy of the TOML ``table`` with ``KEY=VALUE`` overrides applied: dotted keys
    into the experiment (``base.num_mdps=4``, ``base.history.num_versions=9``,
    ``base.families[0].gamma=0.95``, ``grid.mean_lags=0,1,2``, ``name=mine``), values typed
    by the schema (:func:`declared_type`). The result is checked by ``runs.schema.parse``
    like any file. A malformed override raises :class:`ConfigError` naming it."""
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
        if path[0] not in TOP_KEYS or (path[0] in ("base", "grid")) != (len(path) > 1):
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
        node[last] = _value_of(text.strip(), kind_, item_t)
        if kind_ is list and item_t is str:
            _check_split(key, text.strip(), node[last])
    _check_shadowed(out, overrides)
    return out


def _check_split(key: str, text: str, items: list) -> None:
    """A list of specs split at commas into pieces that are no spec (``tabular:S=8,gamma=0.9``
    -> ``S=8`` / ``gamma=0.9``; ``trace:1,2`` -> ``2``): ConfigError suggesting the TOML list
    syntax, in which a spec keeps its commas."""
    specs = [str(x) for x in items]
    if not any(":" in x for x in specs):
        return
    pieces = [x for x in specs[1:] if ":" not in x and ("=" in x or x.strip().isdigit())]
    if pieces:
        raise ConfigError(
            f"--set {key}={text}: the commas split it into {specs}, and {pieces[0]!r} is not "
            f"a value of its own; for values with commas write the list in TOML: "
            f"--set '{key}=[\"{text}\"]' (one value), or --set '{key}=[\"a,b\", \"c,d\"]'")


def _check_shadowed(table: Mapping, overrides: Sequence[str]) -> None:
    """``--set base.X=V`` where the grid has an axis X: every cell would take the grid's
    values, and V none (silently); ConfigError naming ``grid.X`` instead."""
    grid = table.get("grid")
    if not isinstance(grid, Mapping) or table.get("kind") not in ("train", *(
            k for k, (_, g) in PARTS.items() if g is AxesGrid)):
        return
    for item in overrides:
        key, _, text = item.partition("=")
        path = key.strip().split(".")
        if len(path) == 2 and path[0] == "base" and path[1] in grid:
            raise ConfigError(
                f"--set {key.strip()}: {path[1]} is a grid axis of this config (grid.{path[1]} "
                f"= {grid[path[1]]!r}), which sets it in every cell: use --set "
                f"grid.{path[1]}={text.strip()} (a list: one cell per value)")
