"""Save / resume a train state: numpy ``.npz`` of the leaves + JSON of the pytree structure.

Layout of a checkpoint directory::

    state.npz    one array per leaf, named leaf_00000, leaf_00001, ... (flatten order)
    state.json   {"format": 1, "paths": [...], "shapes": [...], "dtypes": [...],
                  "treedef": str(treedef), "meta": {...}}  (meta: config, update, ...)

Restoring needs a *template* state of the same structure (e.g. ``Trainer(config).init()``):
leaf paths, shapes and dtypes are checked against it, so a checkpoint is never loaded into
a differently configured trainer by accident. Writes are atomic (temporary files, then
``os.replace``), so a kill during a save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

FORMAT = 1


def _flatten(tree: Any):
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [jax.tree_util.keystr(p) for p, _ in leaves_with_path]
    leaves = [np.asarray(jax.device_get(x)) for _, x in leaves_with_path]
    return paths, leaves, treedef


def save(directory: str | os.PathLike, state: Any, meta: dict | None = None) -> Path:
    """Write ``state`` (any pytree of arrays) and JSON-able ``meta`` to ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths, leaves, treedef = _flatten(state)
    arrays = {f"leaf_{i:05d}": x for i, x in enumerate(leaves)}
    index = {
        "format": FORMAT,
        "paths": paths,
        "shapes": [list(x.shape) for x in leaves],
        "dtypes": [str(x.dtype) for x in leaves],
        "treedef": str(treedef),
        "meta": meta or {},
    }
    tmp_npz = d / "state.npz.tmp"
    with open(tmp_npz, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    tmp_json = d / "state.json.tmp"
    tmp_json.write_text(json.dumps(index, indent=1, default=str))
    os.replace(tmp_npz, d / "state.npz")
    os.replace(tmp_json, d / "state.json")
    return d


def read_meta(directory: str | os.PathLike) -> dict:
    """The ``meta`` dict saved with a checkpoint."""
    return json.loads((Path(directory) / "state.json").read_text())["meta"]


def exists(directory: str | os.PathLike) -> bool:
    d = Path(directory)
    return (d / "state.json").exists() and (d / "state.npz").exists()


def load(directory: str | os.PathLike, template: Any) -> Any:
    """Restore a state saved by :func:`save` into the structure of ``template``.

    Raises ValueError naming the first leaf whose path, shape or dtype differs.
    """
    d = Path(directory)
    index = json.loads((d / "state.json").read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"checkpoint {d}: unknown format {index.get('format')!r}")
    paths, leaves, treedef = _flatten(template)
    if len(paths) != len(index["paths"]):
        raise ValueError(
            f"checkpoint {d} has {len(index['paths'])} leaves but the template has {len(paths)}"
        )
    with np.load(d / "state.npz") as data:
        restored = []
        for i, (path, ref) in enumerate(zip(paths, leaves)):
            saved_path = index["paths"][i]
            if saved_path != path:
                raise ValueError(f"checkpoint {d}: leaf {i} is {saved_path}, template has {path}")
            x = data[f"leaf_{i:05d}"]
            if x.shape != ref.shape or x.dtype != ref.dtype:
                raise ValueError(
                    f"checkpoint {d}: leaf {path} has {x.dtype}{list(x.shape)}, template "
                    f"expects {ref.dtype}{list(ref.shape)}"
                )
            restored.append(x)
    return jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(x) for x in restored])
