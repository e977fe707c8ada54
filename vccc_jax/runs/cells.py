"""Run the missing cells of a grid into a resumable store (one loop for every runner).

Each cell is computed, then appended to the append-only :class:`~vccc_jax.runs.store.ResultStore`
with its provenance while SIGINT / SIGTERM are deferred, so an interrupted run loses at most
the cell in progress and a rerun computes only what is missing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from vccc_jax.runs.progress import Progress
from vccc_jax.runs.provenance import provenance
from vccc_jax.runs.store import ResultStore, cell_id, signals_deferred


def run_cells(path: str | Path, cells: list[dict], run_cell: Callable[[dict], dict], *,
              label: str = "cells", note: Optional[Callable[[dict, dict], str]] = None,
              progress: bool = True, min_interval: float = 5.0,
              on_cell: Optional[Callable[[int, int, dict], None]] = None) -> list[dict]:
    """Compute ``run_cell(cell) -> metrics`` for every cell not yet in the store at ``path``
    and owned by this writer's shard (``runs.store.sharded``); return the stored rows (of
    every shard) in cell order. ``note(cell, metrics)`` labels the progress bar;
    ``on_cell(i, n, cell)`` is called before a cell is computed."""
    with ResultStore(path) as store:
        ids = [cell_id(c) for c in cells]
        mine = [store.owns(i) for i in ids]
        done = sum(store.has(i) for i, m in zip(ids, mine) if m)
        bar = (Progress(sum(mine), done=done, label=label, min_interval=min_interval)
               if progress else None)
        try:
            for i, (cell, cid, m) in enumerate(zip(cells, ids, mine)):
                if store.has(cid) or not m:
                    continue
                if on_cell is not None:
                    on_cell(i, len(ids), cell)
                t0 = time.time()
                metrics = run_cell(cell)
                with signals_deferred():
                    store.append({"id": cid, "cell": cell, "metrics": metrics,
                                  "meta": {"seconds": time.time() - t0, **provenance()}})
                if bar is not None:
                    bar.advance(1, note=note(cell, metrics) if note else "")
        finally:
            if bar is not None:
                bar.close()
        return [store.row(cid) for cid in ids if store.has(cid)]
