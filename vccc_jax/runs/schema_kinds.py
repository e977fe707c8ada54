"""Every experiment kind's ``[base]`` / ``[grid]`` dataclasses and the kind registry
(:data:`KINDS`, :data:`PARTS`) that ``runs.schema.parse`` and ``runs.overrides`` read.

Each field is :func:`~vccc_jax.runs.schema_fields.typed`: its TOML type travels with it, so
``from_table`` checks a table and ``--set`` types an override from the same declaration.
The kinds (base and grid tables, runner) are listed in ``runs.schema``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vccc_jax.runs.schema_fields import (
    ConfigError,
    check_family,
    check_table,
    check_type,
    from_table,
    source_fields,
    typed,
)

KINDS = ("tabular_sweep", "async_ac", "train", "pipeline", "critic_free", "decoupled", "rac",
         "rac_wallclock", "actor_map")

#: The top-level keys of an experiment file.
TOP_KEYS = ("name", "kind", "description", "base", "grid")


# ------------------------------------------------------------------------ tabular_sweep


@dataclass(frozen=True)
class TabularSweepBase:
    """What every cell of a tabular sweep shares (see ``runs.tabular_sweep``)."""

    num_mdps: int = typed(int)                 # MDPs per family = seeds, vmapped
    families: list = typed(list, item=dict)    # [[base.families]]: name, kind, generator options
    seed: int = typed(int, 0)
    history: dict = typed(dict, {})            # tabular.history.HistoryConfig fields
    methods: dict = typed(dict, {})            # [base.methods.<name>]: per-method options
    train: dict = typed(dict, {})              # stochastic semi-gradient TD config

    def __post_init__(self):
        check_table(self.history, source_fields("tabular/history", "HistoryConfig"),
                    "base.history")
        check_table(self.train, source_fields("tabular/critic_sgd", "CriticSGDConfig"),
                    "base.train")
        for i, fam in enumerate(self.families):
            check_family(fam, f"base.families[{i}]")
        for name, opts in self.methods.items():  # option names: the method's (runner)
            for k, v in check_type(opts, dict, f"base.methods.{name}").items():
                check_type(v, (int, float, str, bool), f"base.methods.{name}.{k}")


@dataclass(frozen=True)
class TabularSweepGrid:
    laws: list = typed(list, item=str)
    mean_lags: list = typed(list, item=float)
    methods: list = typed(list, item=str)
    clips: list = typed(list, [], item=float)
    method_clips: dict = typed(dict, {})       # per-method clip lists (else grid.clips)


# ----------------------------------------------------------------------------- async_ac


@dataclass(frozen=True)
class AsyncACBase:
    """What every cell of an async actor-critic grid shares (see ``runs.async_ac``)."""

    seed: int = typed(int, 0)
    num_mdps: int = typed(int, 64)
    family: dict = typed(dict, {"kind": "random", "num_states": 8, "num_actions": 4, "gamma": 0.9})
    init_scale: float = typed(float, 1.0)
    ac: dict = typed(dict, {})                 # tabular.async_ac.ACConfig fields
    actor_clip: float = typed(float, 1.0)
    mask_clip: float = typed(float, 2.0)
    law: str = typed(str, "geometric")
    lanes_per_call: int = typed(int, 1024)

    def __post_init__(self):
        check_family(self.family, "base.family", ("random", "garnet"), named=False)
        check_table(self.ac, source_fields("tabular/async_actor", "ACConfig"), "base.ac",
                    exclude=("critic_methods", "critic_options", "expected"))  # the grid's


@dataclass(frozen=True)
class AsyncACGrid:
    modes: list = typed(list, ["expected"], item=str)
    actor_kinds: list = typed(list, ["truncate"], item=str)
    critics: list = typed(list, ["uncorrected", "vccc"], item=str)
    centerings: list = typed(list, ["none", "exact"], item=str)
    mean_lags: list = typed(list, [0, 1, 2, 4, 8], item=float)


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

    name: str = typed(str, "rule")
    latency: float = typed(float, 0.1)
    latency_sigma: float = typed(float, 0.0)
    servers: int = typed(int, 0)
    blocking: bool = typed(bool, True)


@dataclass(frozen=True)
class PipelineBase:
    """The described cluster (``pipeline.PipelineConfig``; units in its docstring)."""

    num_workers: int = typed(int, 16)
    tokens_per_second: float = typed(float, 50.0)
    speed_sigma: float = typed(float, 0.3)
    length_median: float = typed(float, 400.0)
    length_sigma: float = typed(float, 0.8)
    max_length: int = typed(int, 4096)
    batch_size: int = typed(int, 32)
    update_time: float = typed(float, 20.0)
    sync_time: float = typed(float, 2.0)
    partial_rollout: bool = typed(bool, False)
    max_ahead: int = typed(int, 2)
    schedule: str = typed(str, "async")
    num_updates: int = typed(int, 50)
    channels: list = typed(list, [], item=dict)  # [[base.channels]]; empty: the default channel
    seed: int = typed(int, 0)

    def __post_init__(self):
        for i, c in enumerate(self.channels):
            from_table(PipelineChannel, c, f"base.channels[{i}]")


@dataclass(frozen=True)
class AxesGrid:
    """``field = [values]`` axes (file order) over the fields of the kind's base."""

    axes: tuple = ()


# -------------------------------------------------------------------------- critic_free


@dataclass(frozen=True)
class CriticFreeBase:
    """Shared by every cell of a GRPO / PS-PPO grid: ``train.critic_free.CFConfig`` fields
    (same defaults; tested) except the grid's law / lag / seed, and the run length."""

    env: str = typed(str, "token:V=16,H=12,Q=6,C=4,P=4,accept=0.3,seed=0")
    groups: int = typed(int, 8)
    group_size: int = typed(int, 8)
    slack: float = typed(float, 1.1)
    lr: float = typed(float, 3e-3)
    clip_eps: float = typed(float, 0.2)
    hidden: int = typed(int, 32)
    length_ema: float = typed(float, 0.8)
    updates: int = typed(int, 60)          # optimiser updates per run
    eval_every: int = typed(int, 10)       # exact return J every this many updates
    cost_repeats: int = typed(int, 20)     # timed learner calls per run (learner_cost); 0: skip


@dataclass(frozen=True)
class CriticFreeGrid:
    laws: list = typed(list, ["full", "mixture:0.2", "uniform"], item=str)  # "full" = GRPO
    lags: list = typed(list, ["fixed:0"], item=str)                          # envs.lag.LagLaw
    seeds: list = typed(list, [0, 1, 2], item=int)


# ---------------------------------------------------------------------------- decoupled


@dataclass(frozen=True)
class DecoupledBase:
    """The exact decoupled-correction route study (``runs.decoupled``; issue 13)."""

    seed: int = typed(int, 0)
    num_mdps: int = typed(int, 4)              # random MDPs (tabular.mdp.random_mdp)
    num_states: int = typed(int, 5)
    num_actions: int = typed(int, 3)
    gamma: float = typed(float, 0.9)
    algorithm: str = typed(str, "npg")         # policy history pi_0..pi_K (tabular.history)
    step_size: float = typed(float, 0.3)
    num_versions: int = typed(int, 17)
    init_scale: float = typed(float, 1.0)
    quantum: float = typed(float, 0.25)        # inference logits rounded to this grid (0: none)
    kind: str = typed(str, "truncate")         # discrepancy weight w(pi_old / mu)
    clip: float = typed(float, 2.0)
    ppo_epsilon: float = typed(float, 0.2)
    threshold_kind: str = typed(str, "mask")   # threshold-interaction grid
    threshold_noise: float = typed(float, 0.3)
    threshold_lags: list = typed(list, [0, 4], item=int)
    threshold_clips: list = typed(list, [1.1, 1.5, 2.0, 4.0], item=float)
    threshold_epsilons: list = typed(list, [0.1, 0.2, 0.3], item=float)


@dataclass(frozen=True)
class DecoupledGrid:
    noises: list = typed(list, [0.0, 0.3, 1.0], item=float)   # inference noise scale
    lags: list = typed(list, [0, 1, 2, 4, 8, 16], item=int)


# ---------------------------------------------------------------------------------- rac


@dataclass(frozen=True)
class RacBase:
    """The exact bias-cut study of RAC (``runs.rac``; issue 14). Channel c has delay
    ``delays[c]`` optimiser steps (0 = fast); slow channels share ``kernel``."""

    seed: int = typed(int, 0)
    num_mdps: int = typed(int, 16)             # random MDPs (tabular.mdp.random_mdp)
    num_states: int = typed(int, 5)
    num_actions: int = typed(int, 3)
    gamma: float = typed(float, 0.9)
    algorithm: str = typed(str, "npg")         # policy history pi_0..pi_K (tabular.history)
    step_size: float = typed(float, 0.3)
    num_versions: int = typed(int, 12)
    init_scale: float = typed(float, 1.0)
    delays: list = typed(list, [0, 2, 5], item=int)
    kernel: list = typed(list, [0.6, 0.3, 0.1], item=float)
    shares: list = typed(list, [], item=float)  # reward share per channel; empty: equal


@dataclass(frozen=True)
class RacGrid:
    clips: list = typed(list, [1.0], item=float)        # cbar at reinjection; 0 = no clip
    masses: list = typed(list, [1.0], item=float)       # slow kernel rescaled to this mass
    lags: list = typed(list, ["fixed:0"], item=str)     # behaviour-lag law "LAW:MEAN"


@dataclass(frozen=True)
class RacWallclockBase:
    """Exact drop / wait / RAC training coupled to a simulated cluster
    (``runs.rac_wallclock``). The MDP's reward channels are the pipeline's (blocking = fast)."""

    seed: int = typed(int, 0)
    num_mdps: int = typed(int, 16)
    num_states: int = typed(int, 5)
    num_actions: int = typed(int, 3)
    gamma: float = typed(float, 0.9)
    init_scale: float = typed(float, 1.0)
    shares: list = typed(list, [], item=float)
    kernel: list = typed(list, [0.6, 0.3, 0.1], item=float)
    lr: float = typed(float, 0.3)
    hours: float = typed(float, 3.0)           # simulated wall-clock budget of every run
    fractions: list = typed(list, [0.5, 0.9], item=float)  # time to J0 + f (J* - J0)
    pipeline: dict = typed(dict, {})           # [base.pipeline]: the pipeline kind's base fields

    def __post_init__(self):
        from_table(PipelineBase, self.pipeline, "base.pipeline")


@dataclass(frozen=True)
class RacWallclockGrid:
    clips: list = typed(list, [1.0], item=float)        # 0 = no clip
    masses: list = typed(list, [1.0], item=float)
    methods: list = typed(list, ["drop", "wait", "rac"], item=str)


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
    check_type(table, dict, where)
    kind = table.get("kind")
    if kind not in ACTOR_MAP_TASKS:
        raise ConfigError(f"{where}.kind must be one of {', '.join(ACTOR_MAP_TASKS)}, got {kind!r}")
    return check_table(table, {**ACTOR_MAP_TASK_KEYS, **source_fields(*ACTOR_MAP_TASKS[kind])},
                       where)


@dataclass(frozen=True)
class ActorMapBase:
    """What every cell of the actor-correction map shares (see ``runs.actor_map``)."""

    tasks: list = typed(list, item=dict)       # [[base.tasks]]: name, kind, generator keywords
    seed: int = typed(int, 0)
    num_seeds: int = typed(int, 4)             # problem instances (random problem + init) per task
    temperature: float = typed(float, 0.7)     # the "temperature" sampler (top-p off)
    top_p: float = typed(float, 0.9)           # the "top_p" sampler (temperature 1)
    critic_clip: float = typed(float, 2.0)     # c of the truncated critic
    vtrace_rhobar: float = typed(float, 1.0)   # rhobar = cbar of the V-trace critic
    centred: bool = typed(bool, False)         # Eq 13 score centring of the per-state rows
    row_params: dict = typed(dict, {})         # [base.row_params.<row>]: the row's parameters
    train_updates: int = typed(int, 128)       # updates of every training run
    train_decomposition: bool = typed(bool, False)  # also the bias parts along every run (~2x cost)

    def __post_init__(self):
        for i, t in enumerate(self.tasks):
            check_actor_map_task(t, f"base.tasks[{i}]")
        for name, opts in self.row_params.items():  # names / values: the registry's (runner)
            for k, v in check_type(opts, dict, f"base.row_params.{name}").items():
                check_type(v, (int, float, str, bool), f"base.row_params.{name}.{k}")


@dataclass(frozen=True)
class ActorMapGrid:
    tasks: list = typed(list, item=str)                             # names of base.tasks
    rows: list = typed(list, item=str)                              # actor-registry rows
    lags: list = typed(list, [0, 1, 4, 16, 64, 256], item=int)
    samplers: list = typed(list, ["temperature", "top_p"], item=str)
    studies: list = typed(list, ["exact", "train"], item=str)
    train_rows: list = typed(list, [], item=str)   # rows of the train study ([]: grid.rows)
    train_lags: list = typed(list, [], item=int)   # lags of the train study ([]: grid.lags)


# ---------------------------------------------------------------------------- registry

#: (base, grid) dataclasses of every kind but ``train`` (whose base is TrainConfig's fields,
#: read from the source, and whose grid is a :class:`TrainGrid` of axes). A grid of
#: :class:`AxesGrid` is axes over the base's scalar fields.
PARTS = {
    "tabular_sweep": (TabularSweepBase, TabularSweepGrid),
    "async_ac": (AsyncACBase, AsyncACGrid),
    "pipeline": (PipelineBase, AxesGrid),
    "critic_free": (CriticFreeBase, CriticFreeGrid),
    "decoupled": (DecoupledBase, DecoupledGrid),
    "rac": (RacBase, RacGrid),
    "rac_wallclock": (RacWallclockBase, RacWallclockGrid),
    "actor_map": (ActorMapBase, ActorMapGrid),
}
