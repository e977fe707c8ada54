"""Runs over several processes (issue 10): every process computes, process 0 writes.

A multi-host run (``jax.distributed``, started by the command layer before any array
exists) executes the same sweep / training code on every process; the sharded programs
need all of them. Only process 0 opens the resumable result store for writing; the others
read a snapshot of it, and the set of cells still to compute is process 0's
(:func:`agree`), so all processes run the same programs in the same order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from vccc_jax.runs.store import ResultStore, read_rows


def process_index() -> int:
    import jax

    return jax.process_index()


def is_main() -> bool:
    """Whether this process writes results (process 0; always True on one process)."""
    return process_index() == 0


def agree(flags: Sequence[bool]) -> list[bool]:
    """Process 0's ``flags`` on every process (identity on one process)."""
    import jax

    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    from jax.experimental import multihost_utils

    got = multihost_utils.broadcast_one_to_all(np.asarray(flags, dtype=np.int32))
    return [bool(f) for f in np.asarray(got)]


class SnapshotStore:
    """The read side of a :class:`ResultStore` for processes other than 0: rows read once
    at open; ``append`` only remembers the row in memory (process 0 writes it)."""

    def __init__(self, path: str | Path, **_):
        self.path = Path(path)
        self._rows: dict = {}

    def __enter__(self) -> "SnapshotStore":
        for r in (read_rows(self.path) if self.path.exists() else []):
            self._rows.setdefault(r["id"], r)
        return self

    def __exit__(self, *exc) -> None:
        return None

    def has(self, cid: str) -> bool:
        return cid in self._rows

    def row(self, cid: str) -> dict:
        return self._rows[cid]

    def append(self, row: dict) -> bool:
        if row["id"] in self._rows:
            return False
        self._rows[row["id"]] = row
        return True


def open_store(path: str | Path, *, wait: bool = False):
    """A :class:`ResultStore` on process 0, a :class:`SnapshotStore` elsewhere."""
    return ResultStore(path, wait=wait) if is_main() else SnapshotStore(path)
