"""Result-store rows as a flat table (``vccc sweep --export csv``; the tracking sink's cells).

A store row is ``{"id", "cell": {...}, "metrics": {...}, "meta": {...}}`` (``runs.store``).
:func:`flat_row` turns it into one flat dict: ``id``, then ``cell.<key>`` and
``metrics.<key>`` with nested tables as dotted keys (``cell.family.num_states``) and lists as
JSON text (per-seed values stay in one cell of the table), then the few ``meta`` fields that
say when and by what a row was made (``meta.created_utc``, ``meta.git.rev``, ``meta.seconds``
/ ``meta.timings.cell_s``). :func:`write_csv` writes rows with the union of their columns.
"""

from __future__ import annotations

import csv
import json
from typing import Any, Iterable, Mapping, TextIO

META_KEYS = ("created_utc", "git.rev", "git.dirty", "seconds", "timings.cell_s")


def flatten(table: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": "[1, 2]"}`` (lists as JSON)."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def flat_row(row: Mapping) -> dict[str, Any]:
    """One store row as a flat dict (module docstring)."""
    out: dict[str, Any] = {"id": row.get("id")}
    cell = row.get("cell") or {}
    out.update(flatten({k: v for k, v in cell.items() if k != "grid"}, "cell."))
    out.update(flatten(row.get("metrics") or {}, "metrics."))
    meta = flatten(row.get("meta") or {})
    out.update({f"meta.{k}": meta[k] for k in META_KEYS if k in meta})
    return out


def write_csv(rows: Iterable[Mapping], stream: TextIO) -> int:
    """Write ``rows`` (store rows) as CSV to ``stream``; returns the number written.
    Columns: the union over rows, in first-seen order; a row without a column leaves it empty."""
    flat = [flat_row(r) for r in rows]
    columns: dict[str, None] = {}
    for r in flat:
        columns.update(dict.fromkeys(r))
    writer = csv.DictWriter(stream, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return len(flat)
