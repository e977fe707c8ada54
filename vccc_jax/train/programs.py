"""What a compiled training program is keyed by, what it takes as input, and its cache.

Grid cells (configs that differ only in learning rates, clips, the lag law's parameter, the
PPO-EWMA rate or the seed) run the SAME compiled program: the static part of a config is its
:func:`program_key` (a frozen ``TrainConfig`` with those fields at placeholders), and what
varies is :class:`GridValues`, an explicit pytree argument of the compiled init and step
(``train.trainer``). Every function that needs a grid value takes ``values``; nothing reads
one from the config while a program is traced.

:class:`ProgramCache` is the explicit cache of compiled programs. Whoever shares programs
between runs owns one and passes it (``runs.train.run_grid`` creates one per grid); a
``Trainer(cfg)`` without a cache compiles its own. Key: ``program_key(cfg)`` for a
``Trainer``; ``(program_key(cfg), mesh, fsdp, ring, split_learner)`` for a
``train.sharding.ShardedTrainer``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable, Optional

import chex
import jax
import numpy as np
from flax import struct

from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.train.config import TrainConfig

Array = chex.Array

__all__ = ["GridValues", "ProgramCache", "abstract_values", "grid_values", "program_key",
           "program_values"]

_LAG_PLACEHOLDER = {"fixed": "fixed:0", "uniform": "uniform:0", "geometric": "geometric:1",
                    "zipf": "zipf:1", "hist": "hist:1"}


def clip_is_traced(cfg: TrainConfig) -> bool:
    """``clip`` is a grid value unless the critic needs it as a Python number (``brace``)."""
    return cfg.critic != "brace"


@struct.dataclass
class GridValues:
    """The values that vary between the grid cells of one program: host numbers
    (:func:`grid_values`) or the compiled program's argument (:func:`program_values`:
    float32 / int32 scalars, the lag law's log pmf [K]). ``clip`` is None when static (critic ``brace``: read
    ``config.clip``); ``lag`` is set for ``fixed:L`` laws, ``lag_logits`` for ``uniform`` /
    ``geometric`` / ``zipf`` / ``hist``, neither for ``trace`` laws (static)."""

    actor_lr: Array
    critic_lr: Array
    baseline_lr: Array  # = critic_lr when the config leaves it None
    actor_clip: Array
    ewma_decay: Array  # resolved: from the lag law's mean when the config leaves it None
    clip: Optional[Array] = None
    lag: Optional[Array] = None
    lag_logits: Optional[Array] = None


def program_key(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every grid value at a placeholder and the ring size K pinned: two configs
    with equal ``program_key`` run the same compiled program (:func:`grid_values` carries what
    differs), so a grid over learning rates, clip thresholds or lags compiles once.

    Grid values: ``actor_lr``, ``critic_lr``, ``baseline_lr``, ``actor_clip``, ``clip`` (static
    for ``brace``, whose estimator needs a Python number), the lag law's parameter (``fixed`` /
    ``uniform`` / ``geometric`` / ``zipf`` / ``hist``; K = ``resolved_num_versions`` stays static, so lag
    cells share a program when they share K), the resolved ``ewma_decay`` and ``seed`` (it only
    makes the initial keys). Static: everything else, ``ppo_epsilon`` and ``rho_bar`` /
    ``c_bar`` included (``estimators.actor.policy_loss`` and ``vtrace`` validate them as Python
    numbers)."""
    changes = dict(actor_lr=1.0, critic_lr=1.0, baseline_lr=None, actor_clip=2.0,
                   ewma_decay=None, seed=0, num_versions=cfg.resolved_num_versions)
    if clip_is_traced(cfg):
        changes["clip"] = 2.0
    if cfg.lag_law.kind in _LAG_PLACEHOLDER:
        changes["lag"] = _LAG_PLACEHOLDER[cfg.lag_law.kind]
    return cfg.replace(**changes)


def grid_values(cfg: TrainConfig) -> GridValues:
    """The grid values of ``cfg`` as the config states them (Python numbers; the lag law's
    log pmf as float32 [K]): what host-side calls outside a compiled program use."""
    law, k = cfg.lag_law, cfg.resolved_num_versions
    out = dict(actor_lr=float(cfg.actor_lr), critic_lr=float(cfg.critic_lr),
               baseline_lr=float(cfg.critic_lr if cfg.baseline_lr is None else cfg.baseline_lr),
               actor_clip=float(cfg.actor_clip),
               ewma_decay=float(dec.trainer_ewma_decay(cfg.ewma_decay, law.mean(k))))
    if clip_is_traced(cfg):
        out["clip"] = float(cfg.clip)
    if law.kind == "fixed":
        out["lag"] = int(law.param)
    elif law.kind in _LAG_PLACEHOLDER:
        out["lag_logits"] = law.logits(k)
    return GridValues(**out)


def program_values(values: GridValues) -> GridValues:
    """``values`` as the compiled program takes them: NumPy float32 scalars (int32 ``lag``,
    float32 [K] ``lag_logits``). Passed as the program's argument they are traced; closed
    over (a program with this cell's values as constants) they stay concrete."""
    def cast(name, v):
        if v is None:
            return None
        return np.int32(v) if name == "lag" else np.asarray(v, np.float32)[()]

    return GridValues(**{f.name: cast(f.name, getattr(values, f.name))
                         for f in dataclasses.fields(values)})


def abstract_values(values: GridValues) -> GridValues:
    """ShapeDtypeStructs of ``values`` (to lower a program ahead of time)."""
    return jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), values)


class ProgramCache:
    """A least-recently-used map ``key -> compiled programs`` (at most ``max_size`` entries).

    ``get(key, build)`` returns the entry of ``key``, calling ``build()`` (and evicting the
    least recently used entry beyond ``max_size``) when there is none. Keys are documented
    by the users (module docstring)."""

    def __init__(self, max_size: int = 16):
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._entries: "collections.OrderedDict[Hashable, Any]" = collections.OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        entry = self._entries[key] = build()
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)
        return entry

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
