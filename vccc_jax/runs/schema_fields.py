"""Type checking of experiment tables (``runs.schema``): one place for what a TOML value
may be and how a bad one is named.

* :func:`check_type` -- a value of the declared type, else :class:`ConfigError` naming the key;
* :func:`typed` / :func:`from_table` -- dataclass fields that carry their TOML type, and a
  dataclass instance from a table (unknown, missing, mistyped keys named);
* :func:`source_fields` / :func:`check_table` -- nested tables typed by the library classes
  (or generator functions) they become, read from the source without importing it;
* :func:`check_family` / :func:`train_fields` -- the two such tables several kinds share.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping, Sequence


class ConfigError(ValueError):
    """A config that does not fit the schema; the message names the key."""


_NUMBER = (int, float)
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean (true/false)",
               str: "a string", list: "a list", dict: "a table", tuple: "a list"}


def check_type(value: Any, kind, where: str) -> Any:
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


def unknown_key(key: str, where: str, known) -> ConfigError:
    """'unknown key where.key (did you mean ...? known: ...)'."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return ConfigError(f"unknown key {where}.{key} ({hint}known: {', '.join(known)})")


def from_table(cls, table: Mapping, where: str):
    """An instance of dataclass ``cls`` from a TOML table; unknown / missing keys and wrong
    types raise :class:`ConfigError` naming ``where.key``. Field types come from each
    field's ``metadata["type"]`` / ``["item"]`` (:func:`typed`)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise unknown_key(key, where, fields)
    kwargs = {}
    for name, f in fields.items():
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing key {where}.{name}")
            continue
        value = check_type(table[name], f.metadata.get("type", object), f"{where}.{name}")
        item = f.metadata.get("item")
        if item is not None:
            for i, v in enumerate(value):
                check_type(v, item, f"{where}.{name}[{i}]")
        kwargs[name] = value
    return cls(**kwargs)


def typed(kind, default=dataclasses.MISSING, item=None):
    """A dataclass field of TOML type ``kind`` (list items of type ``item``), read by
    :func:`from_table` and by ``runs.overrides.declared_type``."""
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
    check_type(table, dict, where)
    known = {k: v for k, v in fields.items() if k not in exclude}
    for key, value in table.items():
        if key not in known:
            raise unknown_key(key, where, known)
        check_type(value, known[key][0], f"{where}.{key}")
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
    check_type(table, dict, where)
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
