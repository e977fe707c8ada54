"""Train-state checkpoints with orbax-checkpoint: async, keep-last-N, restorable onto any mesh.

Layout of a checkpoint directory (orbax ``CheckpointManager``)::

    <dir>/<step>/state/   the TrainState pytree (orbax StandardSave: OCDBT/zarr arrays,
                          written shard by shard by the processes that own them)
    <dir>/<step>/meta/    JSON: {"meta": user meta (config, update, metric rows...),
                          "leaves": [[path, shape, dtype], ...]}

A step directory appears only after its save has finished (orbax writes to a temporary
directory and renames it at commit), so a process killed during a save leaves the previous
steps intact and :func:`latest_step` never names a half-written checkpoint.

Restoring needs a *template* of the same structure (e.g. ``ShardedTrainer.abstract_state``
or ``Trainer(config).init()``): leaf paths, shapes and dtypes are checked against the
saved list (ValueError naming the first leaf that differs) and every array is read
directly into the template's target sharding — which may belong to a different mesh than
the one that saved it (save on (4, 2), restore on (8, 1)).

API (runs/train.py): :func:`manager`, :func:`save`, :func:`restore`, :func:`latest_step`,
:func:`wait`. The old directory-based calls ``save(dir, state, meta)``, ``load(dir,
template)``, ``read_meta(dir)``, ``exists(dir)`` still work (now on orbax; one step kept).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

ITEMS = ("state", "meta")


# --------------------------------------------------------------------------------------
# Manager-based API
# --------------------------------------------------------------------------------------


def manager(directory: str | os.PathLike, *, keep: Optional[int] = 3, every: int = 1,
            async_save: bool = True) -> ocp.CheckpointManager:
    """A CheckpointManager over ``directory``: keeps the last ``keep`` steps (None: all),
    saves steps that are multiples of ``every`` (:func:`save` with ``force`` saves any
    step, e.g. the last one at exit), asynchronously unless ``async_save`` is False."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    # the schedule is ours (orbax's interval also saves the first step it is offered)
    # cleanup_tmp_directories: a process killed during a save leaves its uncommitted
    # ``<step>.orbax-checkpoint-tmp-*`` directory; the next manager removes it
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=1, enable_async_checkpointing=async_save,
        create=True, cleanup_tmp_directories=True)
    mngr = ocp.CheckpointManager(Path(directory).absolute(), options=options, item_names=ITEMS)
    mngr.vccc_every = int(every)
    return mngr


def _leaf_list(tree: Any) -> list:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [[jax.tree_util.keystr(p), list(x.shape), str(x.dtype)] for p, x in flat]


def save(mngr: Any, step: Any, state: Any = None, meta: Optional[dict] = None, *,
         force: bool = False) -> bool:
    """Save ``state`` and JSON-able ``meta`` as ``step`` (asynchronously with an async
    manager: returns at once; the next save, :func:`wait` or ``close`` waits for it).

    Returns whether a save was started (steps off the ``every`` schedule are skipped
    unless ``force``). Legacy form: ``save(directory, state, meta)``.
    """
    if not isinstance(mngr, ocp.CheckpointManager):  # legacy: save(directory, state, meta)
        return _legacy_save(mngr, step, state)
    if not force and int(step) % getattr(mngr, "vccc_every", 1):
        return False
    # orbax serialises JsonSave items in its background commit thread, long after this
    # call returns: a live ``meta`` (e.g. the metric-row list the trainer keeps appending
    # to) would be written with whatever it holds by then. Snapshot it now (issue 19 s1).
    payload = snapshot({"meta": meta or {}, "leaves": _leaf_list(state)})
    return mngr.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(payload)), force=force)


def snapshot(obj: Any) -> Any:
    """``obj`` with every dict / list / tuple copied (as dict / list), leaves shared: later
    changes to those containers do not reach the copy. O(size) and cheap (no encoding):
    the metric-row list grows with the run and is saved at every checkpoint."""
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [snapshot(v) for v in obj]
    return obj


def latest_step(mngr: ocp.CheckpointManager) -> Optional[int]:
    """The newest finished step (None: no checkpoint yet)."""
    return mngr.latest_step()


def wait(mngr: ocp.CheckpointManager) -> None:
    """Block until the pending async save (if any) is committed."""
    mngr.wait_until_finished()


def _read_payload(mngr: ocp.CheckpointManager, step: int) -> dict:
    return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def read_meta(mngr: Any, step: Optional[int] = None) -> dict:
    """The user ``meta`` saved with ``step`` (default: latest). Legacy: ``read_meta(dir)``."""
    if not isinstance(mngr, ocp.CheckpointManager):
        with _legacy_manager(mngr) as m:
            return read_meta(m)
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {mngr.directory}")
    return _read_payload(mngr, step)["meta"]


def _check_leaves(saved: list, template: Any, where: str) -> None:
    want = _leaf_list(template)
    if len(saved) != len(want):
        raise ValueError(f"checkpoint {where} has {len(saved)} leaves but the template has "
                         f"{len(want)}")
    for i, (s, w) in enumerate(zip(saved, want)):
        if s != w:
            raise ValueError(f"checkpoint {where}: leaf {i} is {s[0]} {s[2]}{s[1]}, the "
                             f"template expects {w[0]} {w[2]}{w[1]}")


def _default_sharding(x: Any):
    s = getattr(x, "sharding", None)
    return s if s is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])


def restore(mngr: ocp.CheckpointManager, template: Any, shardings: Any = None,
            step: Optional[int] = None) -> tuple[Any, dict]:
    """(state, meta) of ``step`` (default: latest), each array placed with ``shardings``.

    ``template``: arrays or ShapeDtypeStructs of the expected structure. ``shardings``: a
    matching pytree of ``jax.sharding.Sharding`` (e.g. ``ShardedTrainer.shardings`` of the
    NEW mesh); None: the template's own shardings (or the first device).
    """
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {mngr.directory}")
    payload = _read_payload(mngr, step)
    _check_leaves(payload["leaves"], template, f"{mngr.directory}/{step}")
    if shardings is None:
        shardings = jax.tree_util.tree_map(_default_sharding, template)
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), template, shardings)
    out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    return out.state, payload["meta"]


# --------------------------------------------------------------------------------------
# Directory-based calls of the pre-orbax API (one step kept, synchronous)
# --------------------------------------------------------------------------------------


class _legacy_manager:
    def __init__(self, directory):
        self.m = manager(directory, keep=1, async_save=False)

    def __enter__(self):
        return self.m

    def __exit__(self, *exc):
        self.m.close()


def _legacy_save(directory, state, meta) -> bool:
    meta = dict(meta or {})
    with _legacy_manager(directory) as m:
        latest = m.latest_step()
        step = int(meta["update"]) if "update" in meta else (0 if latest is None else latest + 1)
        if step in m.all_steps():
            m.delete(step)
        return save(m, step, state, meta, force=True)


def exists(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a finished checkpoint."""
    if not Path(directory).is_dir():
        return False
    with _legacy_manager(directory) as m:
        return m.latest_step() is not None


def load(directory: str | os.PathLike, template: Any) -> Any:
    """The latest state in ``directory`` in the structure (and placement) of ``template``."""
    with _legacy_manager(directory) as m:
        return restore(m, template)[0]
