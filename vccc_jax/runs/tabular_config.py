"""Tabular sweep configs: validation (errors name the key) and expansion into cells and groups.

A sweep (``kind = "tabular_sweep"``, e.g. ``experiments/tabular_default.toml``) is the grid

    staleness law x mean lag x clip threshold x method x MDP family   (x seeds, vmapped)

A **cell** is one point of that grid (seeds are *inside* a cell: every cell is evaluated
on ``num_mdps`` MDPs of its family at once and its row stores per-MDP and mean metrics).
Methods without a clip threshold (``uncorrected``, ``vccc``, ...) are not crossed with the
clip axis. The cell dict holds everything that affects its numbers (family, history,
training and method options), so its hash is a safe resume key.

A **group** is the set of cells sharing (family, method): one vmapped call evaluates them
all (law, lag and clip are data, not compile-time constants); see ``runs.tabular_sweep``.

The experiment's ``[base]`` (seed, num_mdps, history, families, methods, train) and
``[grid]`` (laws, mean_lags, clips, methods, method_clips) become one flat config dict
(:func:`config_of`) whose layout is the one the cell ids were always computed from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from vccc_jax.runs.grid import product
from vccc_jax.runs.schema import Experiment, as_dict
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import cell_id
from vccc_jax.tabular import critic, history
from vccc_jax.tabular.critic_sgd import CriticSGDConfig

_FAMILY_KINDS = ("garnet", "random", "chain")


def config_of(exp: Experiment) -> dict:
    """The validated flat config dict of a ``tabular_sweep`` experiment."""
    if exp.kind != "tabular_sweep":
        raise ConfigError(f"{exp.path}: kind {exp.kind!r} is not a tabular sweep")
    cfg = {"name": exp.name, **as_dict(exp.base), "grid": as_dict(exp.grid)}
    if exp.description:
        cfg["description"] = exp.description
    return validate_config(cfg)


def _construct(cls, table: dict, where: str):
    """``cls(**table)``; an unknown field becomes a ConfigError naming ``where``."""
    try:
        return cls(**table)
    except TypeError as e:
        raise ConfigError(f"sweep config: [{where}]: {e}") from None


def _require(cfg: dict, key: str, where: str, kind=None) -> Any:
    if key not in cfg:
        raise ValueError(f"sweep config: missing key {where}{key}")
    v = cfg[key]
    if kind is not None and not isinstance(v, kind):
        raise ValueError(f"sweep config: {where}{key} must be {kind}, got {v!r}")
    return v


def validate_config(cfg: dict) -> dict:
    """Check a config dict; fill defaults; return a normalised deep copy."""
    cfg = copy.deepcopy(cfg)
    _require(cfg, "name", "", str)
    cfg.setdefault("seed", 0)
    num_mdps = _require(cfg, "num_mdps", "", int)
    if num_mdps < 1:
        raise ValueError(f"sweep config: num_mdps must be >= 1, got {num_mdps}")
    cfg["history"] = _construct(history.HistoryConfig, cfg.get("history", {}), "history").to_dict()
    fams = _require(cfg, "families", "", list)
    if not fams:
        raise ValueError("sweep config: families must be a non-empty list")
    names = set()
    for i, f in enumerate(fams):
        name = _require(f, "name", f"families[{i}].", str)
        kind = _require(f, "kind", f"families[{i}].", str)
        if kind not in _FAMILY_KINDS:
            raise ValueError(f"sweep config: families[{i}].kind must be one of {_FAMILY_KINDS}, got {kind!r}")
        if name in names:
            raise ValueError(f"sweep config: duplicate family name {name!r}")
        names.add(name)
    grid = _require(cfg, "grid", "", dict)
    for key in ("laws", "mean_lags", "methods"):
        if not _require(grid, key, "grid.", list):
            raise ValueError(f"sweep config: grid.{key} must be a non-empty list")
    grid.setdefault("clips", [])
    for law in grid["laws"]:
        if law not in history.STALENESS_LAWS:
            raise ValueError(f"sweep config: grid.laws has {law!r}; known: {history.STALENESS_LAWS}")
    max_lag = cfg["history"]["num_versions"] - 1
    for law in grid["laws"]:  # validates every (law, lag) pair up front
        for m in grid["mean_lags"]:
            history.lag_weights(law, m, max_lag)
    methods_opts = cfg.setdefault("methods", {})
    for m in grid["methods"]:
        if m not in critic.METHODS:
            raise ValueError(f"sweep config: grid.methods has {m!r}; known: {sorted(critic.METHODS)}")
        if critic.METHODS[m].uses_clip and not grid["clips"]:
            raise ValueError(f"sweep config: method {m!r} needs grid.clips")
    for m, opts in methods_opts.items():
        if m not in critic.METHODS:
            raise ValueError(f"sweep config: [methods.{m}] names an unknown method")
        critic.METHODS[m].options(opts)  # raises on unknown options
    method_clips = grid.setdefault("method_clips", {})
    for m, cs in method_clips.items():
        if m not in critic.METHODS or not critic.METHODS[m].uses_clip:
            raise ValueError(f"sweep config: grid.method_clips.{m} names no clipped method")
        if not isinstance(cs, list) or not cs:
            raise ValueError(f"sweep config: grid.method_clips.{m} must be a non-empty list")
    for where, cs in [("grid.clips", grid["clips"])] + [
        (f"grid.method_clips.{m}", cs) for m, cs in method_clips.items()
    ]:
        for c in cs:
            if not (isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 1):
                raise ValueError(f"sweep config: {where} must be numbers >= 1, got {c!r}")
    cfg["train"] = _construct(CriticSGDConfig, cfg.get("train", {}), "train").to_dict()
    return cfg


@dataclass(frozen=True)
class Group:
    """Cells sharing (family, method): one compiled, vmapped evaluation."""

    family: dict
    method: str
    cells: tuple = field(default_factory=tuple)  # tuple of (cell_id, cell dict)

    @property
    def key(self) -> str:
        return f"{self.family['name']}/{self.method}"


def expand(cfg: dict) -> list[Group]:
    """All groups of a validated config, each with its cells in a fixed order."""
    grid = cfg["grid"]
    groups = []
    for fam in cfg["families"]:
        for method in grid["methods"]:
            spec = critic.METHODS[method]
            clips = (
                [float(c) for c in grid["method_clips"].get(method, grid["clips"])]
                if spec.uses_clip else [None]
            )
            opts = spec.options(cfg["methods"].get(method, {}))
            cells = []
            for point in product([("law", grid["laws"]), ("mean_lag", grid["mean_lags"]),
                                  ("clip", clips)]):
                cell = {
                    "family": dict(fam),
                    "history": dict(cfg["history"]),
                    "num_mdps": cfg["num_mdps"],
                    "seed": cfg["seed"],
                    "law": point["law"],
                    "mean_lag": float(point["mean_lag"]),
                    "method": method,
                    "method_options": opts,
                    "clip": point["clip"],
                    "train": dict(cfg["train"]),
                }
                cells.append((cell_id(cell), cell))
            groups.append(Group(family=dict(fam), method=method, cells=tuple(cells)))
    return groups


def num_cells(groups: list[Group]) -> int:
    return sum(len(g.cells) for g in groups)


def load_config(path) -> dict:
    """The validated flat config dict of a ``tabular_sweep`` experiment file."""
    from vccc_jax.runs.schema import load

    return config_of(load(path))
