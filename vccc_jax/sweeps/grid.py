"""Sweep configs (a small TOML/JSON file) and their expansion into cells and groups.

A sweep is the grid

    staleness law x mean lag x clip threshold x method x MDP family   (x seeds, vmapped)

A **cell** is one point of that grid (seeds are *inside* a cell: every cell is evaluated
on ``num_mdps`` MDPs of its family at once and its row stores per-MDP and mean metrics).
Methods without a clip threshold (``uncorrected``, ``vccc``, ...) are not crossed with the
clip axis. The cell dict holds everything that affects its numbers (family, history,
training and method options), so its hash is a safe resume key.

A **group** is the set of cells sharing (family, method): one vmapped call evaluates them
all (law, lag and clip are data, not compile-time constants). Groups also share compiled
programs: families of equal array shapes reuse them, and all one-step methods run through
one program with the method as a traced index (``sweeps.run.bank_of``), so a sweep
compiles a handful of times, not once per cell.

Config file (``experiments/tabular_default.toml`` is the default)::

    name = "tabular_default"     # results/<name>.jsonl, figures/<name>/
    seed = 0
    num_mdps = 8                 # MDPs per family = seeds, vmapped
    [history]                    # see vccc_jax.tabular.history.policy_history
    algorithm = "npg"; step_size = 0.2; num_versions = 17; init_scale = 1.0
    [[families]]                 # kind: garnet | random | chain (+ generator options)
    name = "garnet"; kind = "garnet"; num_states = 8; num_actions = 3; branching = 3; gamma = 0.9
    [grid]
    laws = ["fixed", "uniform", "geometric", "zipf"]
    mean_lags = [0, 1, 2, 4, 8]
    clips = [1.0, 2.0, 4.0]
    methods = ["uncorrected", "vccc", ...]   # names from vccc_jax.tabular.critic.METHODS
    [grid.method_clips]          # optional per-method clip lists (else grid.clips)
    masked = [2.0, 4.0]
    [methods.vtrace]             # per-method options, e.g. lambda_ and n_steps
    [train]                      # stochastic semi-gradient TD (critic.TrainConfig fields)
"""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vccc_jax.sweeps.store import cell_id
from vccc_jax.tabular import critic, history

DEFAULT_CONFIG_NAME = "tabular_default.toml"

_TOP_KEYS = {"name", "seed", "num_mdps", "history", "families", "grid", "methods", "train",
             "figures", "description"}
_GRID_KEYS = {"laws", "mean_lags", "clips", "methods", "method_clips"}
_FAMILY_KINDS = ("garnet", "random", "chain")


def default_config_path() -> Path:
    """experiments/tabular_default.toml of the repository this package was imported from."""
    return Path(__file__).resolve().parents[2] / "experiments" / DEFAULT_CONFIG_NAME


def load_config(path: str | Path) -> dict:
    """Read a sweep config (.toml or .json) and validate it (errors name the key)."""
    return validate_config(read_config(path))


def read_config(path: str | Path) -> dict:
    """Read a sweep config (.toml or .json) without validating it."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"sweep config not found: {p}")
    if p.suffix == ".toml":
        cfg = tomllib.loads(p.read_text())
    elif p.suffix == ".json":
        cfg = json.loads(p.read_text())
    else:
        raise ValueError(f"sweep config must be .toml or .json, got {p.name}")
    return cfg


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
    unknown = set(cfg) - _TOP_KEYS
    if unknown:
        raise ValueError(f"sweep config: unknown top-level keys {sorted(unknown)}")
    _require(cfg, "name", "", str)
    cfg.setdefault("seed", 0)
    num_mdps = _require(cfg, "num_mdps", "", int)
    if num_mdps < 1:
        raise ValueError(f"sweep config: num_mdps must be >= 1, got {num_mdps}")
    cfg["history"] = history.HistoryConfig(**cfg.get("history", {})).to_dict()
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
    unknown = set(grid) - _GRID_KEYS
    if unknown:
        raise ValueError(f"sweep config: unknown grid keys {sorted(unknown)}")
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
    cfg["train"] = critic.TrainConfig(**cfg.get("train", {})).to_dict()
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
            for law in grid["laws"]:
                for lag in grid["mean_lags"]:
                    for clip in clips:
                        cell = {
                            "family": dict(fam),
                            "history": dict(cfg["history"]),
                            "num_mdps": cfg["num_mdps"],
                            "seed": cfg["seed"],
                            "law": law,
                            "mean_lag": float(lag),
                            "method": method,
                            "method_options": opts,
                            "clip": clip,
                            "train": dict(cfg["train"]),
                        }
                        cells.append((cell_id(cell), cell))
            groups.append(Group(family=dict(fam), method=method, cells=tuple(cells)))
    return groups


def num_cells(groups: list[Group]) -> int:
    return sum(len(g.cells) for g in groups)
