"""Append-only, crash-safe result store: one JSON line per sweep cell.

Guarantees (what ``vccc sweep`` relies on to resume after Ctrl-C or SIGKILL):

* **Atomic rows.** A row is serialised first and then appended with a single
  ``os.write`` of one complete line (``O_APPEND``), followed by ``fsync``. A kill can only
  leave a *prefix* of the last line (without its trailing newline); :meth:`ResultStore.open`
  truncates such a partial tail before anything new is appended, and :func:`read_rows`
  ignores it. Complete lines are never rewritten.
* **Keyed by content.** Every row carries ``id = cell_id(cell)``, a stable hash of the
  cell's full configuration (canonical JSON, sorted keys). A rerun skips every id already
  present; a changed config gives new ids, so stale results are never reused by accident.
  Should a duplicate id ever appear, the first row wins.
* **One writer.** An exclusive ``flock`` on ``<store>.lock`` stops two sweeps from
  appending to the same file at once.

Each row: ``{"id", "cell": {...full config...}, "metrics": {...}, "meta": {git revision,
package versions, timings, ...}}`` (``runs.provenance``). :func:`table_rows` drops ``meta`` (timings differ run to
run) and sorts by id: two runs of the same sweep, interrupted or not, give equal tables.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import signal
from pathlib import Path
from typing import Any, Iterable, Iterator


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace, floats as shortest round-trip repr)."""
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def cell_id(cell: dict) -> str:
    """Stable 16-hex-digit id of a cell configuration (sha256 of its canonical JSON)."""
    return hashlib.sha256(canonical_json(cell).encode()).hexdigest()[:16]


def _jsonable(x: Any) -> Any:
    """Plain JSON types: numpy/jax scalars and arrays -> Python; non-finite floats -> None."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return _jsonable(x.tolist())
    if isinstance(x, bool) or x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    raise TypeError(f"cannot store value of type {type(x).__name__}: {x!r}")


def _valid_prefix(data: bytes) -> tuple[list[dict], int]:
    """Parse complete lines; return (rows, byte length of the complete-line prefix).

    The final segment without a trailing newline is a partial write and is ignored. A
    complete line that is not valid JSON can only come from outside tampering or disk
    corruption: it raises, naming the line.
    """
    rows: list[dict] = []
    end = data.rfind(b"\n") + 1  # 0 when there is no complete line
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"result store line {lineno} is not valid JSON: {e}") from e
    return rows, end


def read_rows(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a store file (first occurrence of each id), in file order."""
    p = Path(path)
    if not p.exists():
        return []
    rows, _ = _valid_prefix(p.read_bytes())
    seen: set[str] = set()
    out = []
    for r in rows:
        if r.get("id") in seen:
            continue
        seen.add(r.get("id"))
        out.append(r)
    return out


def table_rows(rows: Iterable[dict]) -> list[dict]:
    """The run-independent part of rows (id, cell, metrics), sorted by id."""
    return sorted(
        ({"id": r["id"], "cell": r["cell"], "metrics": r["metrics"]} for r in rows),
        key=lambda r: r["id"],
    )


class StoreLockedError(RuntimeError):
    pass


class ResultStore:
    """Append-only JSONL store; use as a context manager (holds the writer lock).

    >>> with ResultStore("results/tabular_default.jsonl") as store:
    ...     if not store.has(cid):
    ...         store.append({"id": cid, "cell": cell, "metrics": m, "meta": meta})
    """

    def __init__(self, path: str | os.PathLike, *, wait: bool = False):
        self.path = Path(path)
        self.wait = wait  # block until another writer releases the lock (else raise)
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._rows: dict[str, dict] = {}

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> "ResultStore":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock_fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError as e:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreLockedError(
                f"another process is writing to {self.path} (lock {lock_path} is held)"
            ) from e
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
        rows, end = _valid_prefix(data)
        if end != len(data):  # a kill left a partial last line: drop it before appending
            os.ftruncate(fd, end)
            os.fsync(fd)
        os.close(fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        for r in rows:
            self._rows.setdefault(r["id"], r)
        return self

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "ResultStore":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------
    def has(self, cid: str) -> bool:
        return cid in self._rows

    def row(self, cid: str) -> dict:
        return self._rows[cid]

    def rows(self) -> list[dict]:
        return list(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    # -- writes ----------------------------------------------------------------------
    def append(self, row: dict) -> bool:
        """Append one row durably (single write + fsync). Returns False if its id exists."""
        if self._fd is None:
            raise RuntimeError("ResultStore is not open (use it as a context manager)")
        if "id" not in row or "cell" not in row:
            raise ValueError("row must have 'id' and 'cell' keys")
        if row["id"] != cell_id(row["cell"]):
            raise ValueError(f"row id {row['id']!r} does not match cell_id(row['cell'])")
        if row["id"] in self._rows:
            return False
        line = (canonical_json(row) + "\n").encode()
        view = memoryview(line)
        while view:  # os.write on a regular file writes everything unless interrupted
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self._rows[row["id"]] = json.loads(line)
        return True


def iter_store_files(results_dir: str | os.PathLike) -> Iterator[Path]:
    """Every ``*.jsonl`` store under a results directory, sorted."""
    yield from sorted(Path(results_dir).glob("*.jsonl"))


def load_results(path: str | os.PathLike) -> list[dict]:
    """Rows from a store file or from every store in a directory."""
    p = Path(path)
    if p.is_dir():
        return [r for f in iter_store_files(p) for r in read_rows(f)]
    return read_rows(p)


class signals_deferred:
    """Hold SIGINT/SIGTERM while one row is written, so Ctrl-C lands between rows."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        try:
            self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        except (AttributeError, ValueError, OSError):
            self._old = None

    def __exit__(self, *exc):
        if self._old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
