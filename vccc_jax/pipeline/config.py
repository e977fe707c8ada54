"""Descriptions of an asynchronous RL pipeline (DESIGN.md §6, "Asynchronous-pipeline simulator").

A :class:`PipelineConfig` is a frozen dataclass that says what the cluster looks like:
generation workers (speed spread, long-tailed episode lengths), weight-sync delay,
partial-rollout interruption, a trainer (update time, batch size), a schedule, and reward
channels (:class:`RewardChannel`) each with its own latency law and, optionally, a
finite number of reviewers with a FIFO queue. Every field is checked in ``__post_init__``
and a bad value raises ``ValueError`` naming the field.

Units: times in seconds, lengths in tokens, speeds in tokens per second.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

SCHEDULES = ("sync", "one_step_off", "async")


def _positive(name: str, value, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _count(name: str, value, *, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RewardChannel:
    """One source of reward for every finished episode.

    name: label (e.g. "rule", "judge", "human").
    latency: median seconds from episode end to reward (lognormal with log-sd ``latency_sigma``);
      with ``servers > 0`` this is the median *service* time of one reviewer.
    latency_sigma: log-standard deviation of the latency law (0: deterministic).
    servers: 0 = unlimited parallelism (no queue); k > 0 = k reviewers serving episodes
      first-come first-served, so rewards also wait in a queue (queued human review).
    blocking: True if the trainer waits for this channel before an episode may be consumed
      (a fast rule-based reward; or every channel for "wait-for-slow"). Non-blocking
      channels arrive after consumption, some optimiser steps late (what RAC corrects).
    """

    name: str = "rule"
    latency: float = 0.1
    latency_sigma: float = 0.0
    servers: int = 0
    blocking: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"channel name must be a non-empty string, got {self.name!r}")
        _positive(f"channel {self.name}: latency", self.latency, allow_zero=True)
        _positive(f"channel {self.name}: latency_sigma", self.latency_sigma, allow_zero=True)
        _count(f"channel {self.name}: servers", self.servers, minimum=0)
        if not isinstance(self.blocking, bool):
            raise ValueError(f"channel {self.name}: blocking must be a bool, got {self.blocking!r}")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """A described cluster and schedule (see the module docstring for units).

    num_workers: generation workers; each generates one episode at a time.
    tokens_per_second: median worker speed; worker w runs at this times exp(N(0, speed_sigma^2)).
    speed_sigma: log-sd of the worker speed spread (0: identical workers).
    length_median, length_sigma, max_length: episode length in tokens ~ lognormal(log median,
      sigma), rounded, clipped to [1, max_length] (the long tail of reasoning traces).
    batch_size: episodes per optimiser update.
    update_time: seconds per optimiser update.
    sync_time: seconds from the end of an update until the new weights reach the workers.
    partial_rollout: async only; True = in-flight episodes are interrupted when new weights
      arrive and continue with them (mid-trajectory version switches); False = a worker
      finishes its episode with the version it started with.
    max_ahead: async only; workers stop starting episodes while (ready + in-flight) episodes
      exceed (max_ahead + 1) * batch_size (the buffer bound that keeps staleness finite).
    schedule: "sync" (batch k generated with version k), "one_step_off" (batch k generated
      with version k - 1 while update k - 1 runs) or "async" (workers never wait for the
      trainer; the trainer takes the oldest ready episodes).
    num_updates: optimiser updates to simulate.
    channels: reward channels; at least one must be blocking.
    seed: NumPy seed; the simulation is a deterministic function of the config.
    """

    num_workers: int = 16
    tokens_per_second: float = 50.0
    speed_sigma: float = 0.3
    length_median: float = 400.0
    length_sigma: float = 0.8
    max_length: int = 4096
    batch_size: int = 32
    update_time: float = 20.0
    sync_time: float = 2.0
    partial_rollout: bool = False
    max_ahead: int = 2
    schedule: str = "async"
    num_updates: int = 50
    channels: tuple = (RewardChannel(),)
    seed: int = 0

    def __post_init__(self):
        _count("num_workers", self.num_workers)
        _positive("tokens_per_second", self.tokens_per_second)
        _positive("speed_sigma", self.speed_sigma, allow_zero=True)
        _positive("length_median", self.length_median)
        _positive("length_sigma", self.length_sigma, allow_zero=True)
        _count("max_length", self.max_length)
        _count("batch_size", self.batch_size)
        _positive("update_time", self.update_time, allow_zero=True)
        _positive("sync_time", self.sync_time, allow_zero=True)
        if not isinstance(self.partial_rollout, bool):
            raise ValueError(f"partial_rollout must be a bool, got {self.partial_rollout!r}")
        _count("max_ahead", self.max_ahead, minimum=0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        _count("num_updates", self.num_updates)
        _count("seed", self.seed, minimum=0)
        chans = tuple(self.channels)
        if not chans or not all(isinstance(c, RewardChannel) for c in chans):
            raise ValueError("channels must be a non-empty tuple of RewardChannel")
        names = [c.name for c in chans]
        if len(set(names)) != len(names):
            raise ValueError(f"channels: names must be unique, got {names}")
        if not any(c.blocking for c in chans):
            raise ValueError("channels: at least one channel must be blocking")
        object.__setattr__(self, "channels", chans)

    def replace(self, **changes) -> "PipelineConfig":
        return dataclasses.replace(self, **changes)

    def wait_for_slow(self) -> "PipelineConfig":
        """The same cluster where the trainer waits for every reward channel."""
        return self.replace(channels=tuple(dataclasses.replace(c, blocking=True)
                                           for c in self.channels))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["channels"] = [dataclasses.asdict(c) for c in self.channels]
        return d


def config_from_dict(data: Mapping[str, Any]) -> PipelineConfig:
    """Build a :class:`PipelineConfig` from a (TOML-shaped) mapping.

    Top-level keys are the fields of PipelineConfig; ``channels`` is a list of tables with
    the fields of RewardChannel. An unknown key raises ValueError naming it. Integers given
    for float fields are accepted.
    """
    data = dict(data)
    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"unknown pipeline key(s) {unknown}; known: {sorted(fields)}")
    chan_fields = {f.name for f in dataclasses.fields(RewardChannel)}
    if "channels" in data:
        chans = []
        raw = data["channels"]
        if not isinstance(raw, (list, tuple)):
            raise ValueError("channels must be a list of tables ([[channels]] in TOML)")
        for i, c in enumerate(raw):
            if not isinstance(c, Mapping):
                raise ValueError(f"channels[{i}] must be a table, got {c!r}")
            bad = sorted(set(c) - chan_fields)
            if bad:
                raise ValueError(f"channels[{i}]: unknown key(s) {bad}; known: {sorted(chan_fields)}")
            c = dict(c)
            for key in ("latency", "latency_sigma"):
                if isinstance(c.get(key), int) and not isinstance(c.get(key), bool):
                    c[key] = float(c[key])
            chans.append(RewardChannel(**c))
        data["channels"] = tuple(chans)
    for key in ("tokens_per_second", "speed_sigma", "length_median", "length_sigma",
                "update_time", "sync_time"):
        if isinstance(data.get(key), int) and not isinstance(data.get(key), bool):
            data[key] = float(data[key])
    return PipelineConfig(**data)


EXPERIMENT_KEYS = ("name", "kind", "description", "base", "grid")


def _read(path: str) -> dict:
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def load_experiment(path: str) -> tuple[PipelineConfig, dict]:
    """Read an experiment-schema pipeline file (runs/schema.py layout: ``name``, ``kind =
    "pipeline"``, ``description``, ``[base]`` = PipelineConfig fields, ``[grid]`` = axes over
    them) -> (base config, grid {field: [values]}). Older files with a ``[pipeline]`` table (or
    top-level fields) give an empty grid."""
    data = _read(path)
    if "kind" not in data:
        return config_from_dict(data.get("pipeline", data)), {}
    unknown = sorted(set(data) - set(EXPERIMENT_KEYS))
    if unknown:
        raise ValueError(f"unknown top-level key(s) {unknown}; known: {list(EXPERIMENT_KEYS)}")
    if data["kind"] != "pipeline":
        raise ValueError(f"kind must be 'pipeline' for a pipeline experiment, got {data['kind']!r}")
    base = config_from_dict(data.get("base", {}))
    grid = dict(data.get("grid", {}))
    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    for key, values in grid.items():
        if key not in fields or not isinstance(values, list) or not values:
            raise ValueError(f"grid.{key} must be a PipelineConfig field with a non-empty list")
    return base, grid


def grid_configs(base: PipelineConfig, grid: Mapping[str, list]) -> list[PipelineConfig]:
    """Every cell of the grid (product of the axes, in file order) applied to ``base``."""
    import itertools

    keys = list(grid)
    return [base.replace(**dict(zip(keys, combo))) for combo in itertools.product(*grid.values())]


def load_config(path: str) -> PipelineConfig:
    """The base config of a pipeline file (experiment schema, ``[pipeline]`` table, or
    top-level keys)."""
    return load_experiment(path)[0]
