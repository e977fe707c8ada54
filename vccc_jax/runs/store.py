"""Append-only, crash-safe result store: one JSON line per sweep cell, one file per writer.

Layout (DESIGN.md section 8). The store named ``results/<name>.jsonl`` (the name every
runner and reader uses) is a set of append-only files, one per writer: the unsharded
writer's ``results/<name>.jsonl`` (the single-file store of earlier versions, unchanged)
and the shard files ``results/<name>/shard-<i>-of-<N>.jsonl`` of ``--shard i/N`` writers.
A reader takes their union by cell id (:func:`read_rows`, :func:`find_stores`). A unit of
work (a cell, or a batch of cells computed by one program) belongs to shard
``stable_hash(unit id) % N`` (:func:`shard_of`: sha256, never Python's salted ``hash``),
so N writers own disjoint cells, each resumes alone, and the union is what one process
would have written. Nothing is ever merged or rewritten.

Guarantees (what ``vccc sweep`` relies on to resume after Ctrl-C or SIGKILL):

* **Atomic rows.** A row is serialised first and then appended with a single
  ``os.write`` of one complete line (``O_APPEND``), followed by ``fsync``. A kill can only
  leave a *prefix* of the last line (without its trailing newline); :meth:`ResultStore.open`
  truncates such a partial tail of its own file before anything new is appended (with a
  :class:`StoreWarning` naming the file and the bytes dropped: a store is never changed
  silently), and :func:`read_rows` ignores it (with a :class:`StoreWarning` too). Complete lines are never rewritten.
* **Bad lines are skipped, not fatal.** A complete line that is not a JSON row (outside
  edits, disk corruption) is skipped by every reader, with one :class:`StoreWarning` per
  file naming its line numbers; the file is left as it is.
* **Keyed by content.** Every row carries ``id = cell_id(cell)``, a stable hash of the
  cell's full configuration (canonical JSON, sorted keys). A rerun skips every id already
  present in any file of the store; a changed config gives new ids, so stale results are
  never reused by accident. Should a duplicate id ever appear, the first row wins (the
  unsharded file first, then shard files by (N, i)).
* **One writer per file.** An exclusive ``flock`` on its file stops two processes from
  appending to the same file at once; writers of different shards never wait. (On a file
  system without locks, e.g. Lustre mounted without ``flock``, the check is skipped: give
  each job its own ``--shard``.)

Each row: ``{"id", "cell": {...full config...}, "metrics": {...}, "meta": {git revision,
package versions, timings, ...}}`` (``runs.provenance``). :func:`table_rows` drops ``meta`` (timings differ run to
run) and sorts by id: two runs of the same sweep, interrupted or not, sharded or not, give
equal tables.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import signal
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple


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


# ------------------------------------------------------------------------------ shards

_SHARD_FILE = re.compile(r"^shard-(\d+)-of-(\d+)\.jsonl$")


def shard_of(key: str, count: int) -> int:
    """The shard (of ``count``) that owns the unit of work ``key``: the first 8 bytes of
    sha256(key) as a big-endian integer, mod ``count``. Stable across processes, machines
    and Python versions (unlike the salted built-in ``hash``)."""
    digest = hashlib.sha256(str(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") % int(count)


class Shard(NamedTuple):
    """Shard ``index`` of ``count``: the writer of ``<name>/shard-<index>-of-<count>.jsonl``
    (``Shard(0, 1)``, the default: the unsharded writer of ``<name>.jsonl``)."""

    index: int = 0
    count: int = 1

    @property
    def file_name(self) -> str:
        return f"shard-{self.index}-of-{self.count}.jsonl"

    def owns(self, key: str) -> bool:
        """Whether this shard computes the unit of work ``key`` (a cell id)."""
        return self.count == 1 or shard_of(key, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, flag: str = "--shard") -> Shard:
    """``"i/N"`` -> ``Shard(i, N)`` with 0 <= i < N; ValueError naming ``flag`` otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 0 <= int(m[1]) < int(m[2]):
        raise ValueError(f"{flag} must be i/N with 0 <= i < N (e.g. 2/8), got {text!r}")
    return Shard(int(m[1]), int(m[2]))


_ACTIVE: contextvars.ContextVar[Shard] = contextvars.ContextVar("vccc_shard", default=Shard())


def active_shard() -> Shard:
    """The shard that stores opened without an explicit ``shard`` write (default 0/1)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def sharded(shard: Shard) -> Iterator[Shard]:
    """Within the block, every store opened without ``shard=`` is this shard's writer and
    its runner computes only the units this shard owns (``vccc sweep|train --shard i/N``)."""
    token = _ACTIVE.set(Shard(*shard))
    try:
        yield shard
    finally:
        _ACTIVE.reset(token)


# ------------------------------------------------------------------------------ layout


def store_dir(path: str | os.PathLike) -> Path:
    """The shard directory of the store named ``path`` (``results/x.jsonl`` -> ``results/x``)."""
    p = Path(path)
    return p.with_name(p.name[: -len(".jsonl")]) if p.name.endswith(".jsonl") else p


def single_file(path: str | os.PathLike) -> Path:
    """The unsharded writer's file (``results/x.jsonl``; the whole store before sharding)."""
    d = store_dir(path)
    return d.with_name(d.name + ".jsonl")


def shard_file(path: str | os.PathLike, shard: Shard) -> Path:
    """The file that ``shard`` writes in the store named ``path``."""
    if shard.count == 1:
        return single_file(path)
    return store_dir(path) / shard.file_name


def shard_files(path: str | os.PathLike) -> list[Path]:
    """The files of the store's ``--shard i/N`` writers, sorted by (N, i)."""
    d = store_dir(path)
    if not d.is_dir():
        return []
    found = [(int(m[2]), int(m[1]), f) for f in d.iterdir()
             if (m := _SHARD_FILE.match(f.name)) and f.is_file()]
    return [f for _, _, f in sorted(found)]


def store_files(path: str | os.PathLike) -> list[Path]:
    """Every file of the store named ``path``: the unsharded file (if any) first, then the
    shard files. A path to a plain file that is not a store name reads as itself."""
    p = Path(path)
    if p.is_file() and not p.name.endswith(".jsonl"):
        return [p]
    single = single_file(p)
    return ([single] if single.is_file() else []) + shard_files(p)


def is_store(path: str | os.PathLike) -> bool:
    return bool(store_files(path))


def find_stores(results_dir: str | os.PathLike, pattern: str = "*") -> list[Path]:
    """The names (``<dir>/<name>.jsonl``) of every store directly under ``results_dir``
    whose ``<name>`` matches the glob ``pattern``: unsharded files and shard directories
    (use it where a loader globbed ``*.jsonl``: a purely sharded run has no such file)."""
    d = Path(results_dir)
    if not d.is_dir():
        return []
    names = {f.name[: -len(".jsonl")] for f in d.glob(pattern + ".jsonl") if f.is_file()}
    names |= {s.name for s in d.glob(pattern) if s.is_dir() and shard_files(s)}
    return [d / f"{n}.jsonl" for n in sorted(names)]


# ------------------------------------------------------------------------------ reading


class StoreWarning(UserWarning):
    """A store file was read around lines that are not result rows (skipped), or a writer
    dropped the partial last line a killed writer left. Commands print it as one line."""


def _valid_prefix(data: bytes) -> tuple[list[dict], int, list[int]]:
    """Parse complete lines; return (rows, byte length of the complete-line prefix, numbers
    of the complete lines that are not a result row).

    The final segment without a trailing newline is a partial write and is ignored. A
    complete line that is not a JSON object with an ``id`` can only come from outside
    tampering or disk corruption: it is skipped (and counted), the rest is read.
    """
    rows: list[dict] = []
    bad: list[int] = []
    end = data.rfind(b"\n") + 1  # 0 when there is no complete line
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None
        if isinstance(row, dict) and "id" in row:
            rows.append(row)
        else:
            bad.append(lineno)
    return rows, end, bad


def bad_lines_message(f: Path, bad: list[int]) -> str:
    """One line naming the file and its skipped line numbers (at most 5 shown)."""
    s, are = ("s", "are") if len(bad) > 1 else ("", "is")
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    return (f"{f}: skipped {len(bad)} line{s} that {are} not a result row (line{s} {shown}); "
            "the other rows are read, the file is left as it is")


def torn_tail_message(f: Path, size: int) -> str:
    """One line naming the file and the partial last line a reader ignored."""
    return (f"{f}: ignored a partial last line ({size} bytes without a newline: a write cut "
            "short, or one still in progress); the complete rows are read, the file is left "
            "as it is")


def _read_file(f: Path) -> list[dict]:
    data = f.read_bytes()
    rows, end, bad = _valid_prefix(data)
    if bad:
        warnings.warn(bad_lines_message(f, bad), StoreWarning, stacklevel=2)
    if end != len(data):
        warnings.warn(torn_tail_message(f, len(data) - end), StoreWarning, stacklevel=2)
    return rows


def _union(files: Iterable[Path]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in files:
        for r in _read_file(f):
            out.setdefault(r.get("id"), r)
    return out


def rows_by_id(path: str | os.PathLike) -> dict[str, dict]:
    """{id: row} of a store: the union of its files, first occurrence of each id."""
    return _union(store_files(path))


def read_rows(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a store (the union of its files, first occurrence of each id),
    in file order."""
    return list(rows_by_id(path).values())


def read_every_store(root: str | os.PathLike) -> int:
    """Read every store in the directory tree ``root`` (run checkpoints skipped) and return
    how many rows they hold: their :class:`StoreWarning` s then show in the caller's process
    (``vccc figures``, whose notebooks read the stores again inside a kernel)."""
    total = 0
    for d, subdirs, _ in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if s != "checkpoint"
                            and not shard_files(Path(d) / s))
        total += sum(len(read_rows(s)) for s in find_stores(d))
    return total


def table_rows(rows: Iterable[dict]) -> list[dict]:
    """The run-independent part of rows (id, cell, metrics), sorted by id."""
    return sorted(
        ({"id": r["id"], "cell": r["cell"], "metrics": r["metrics"]} for r in rows),
        key=lambda r: r["id"],
    )


def load_results(path: str | os.PathLike) -> list[dict]:
    """Rows of one store, or of every store directly under a directory that is not one."""
    p = Path(path)
    if p.is_dir() and not shard_files(p):
        return [r for s in find_stores(p) for r in read_rows(s)]
    return read_rows(p)


# ------------------------------------------------------------------------------ writing


class StoreLockedError(RuntimeError):
    """Another process holds the lock (a store file, a ``vccc train`` run directory): the
    commands exit 3 with this one line."""


def lock_exclusive(fd: int, busy: str, *, wait: bool = False) -> int:
    """Take an exclusive ``flock`` on the open file or directory ``fd`` (held until it is
    closed or the process ends) and return ``fd``. Held by another process: ``fd`` is closed
    and :class:`StoreLockedError` (``busy``) raised, unless ``wait``. On a file system
    without locks (Lustre mounted without ``flock``) the check is skipped."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError as e:
        os.close(fd)
        raise StoreLockedError(busy) from e
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            os.close(fd)
            raise
    return fd


class ResultStore:
    """One writer of a store: appends to its own file, sees the union of all files.

    >>> with ResultStore("results/tabular_default.jsonl") as store:
    ...     if store.owns(cid) and not store.has(cid):
    ...         store.append({"id": cid, "cell": cell, "metrics": m, "meta": meta})

    ``shard`` (default :func:`active_shard`, i.e. 0/1) names the file written
    (:func:`shard_file`); ``owns(key)`` says whether this writer computes a unit of work.
    ``wait``: block until another process writing the same file closes it (else
    :class:`StoreLockedError`).
    """

    def __init__(self, path: str | os.PathLike, *, shard: Shard | None = None,
                 wait: bool = False):
        self.path = Path(path)
        self.shard = active_shard() if shard is None else Shard(*shard)
        self.file = shard_file(self.path, self.shard)
        self.wait = wait
        self._fd: int | None = None
        self._rows: dict[str, dict] = {}

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> "ResultStore":
        self.file.parent.mkdir(parents=True, exist_ok=True)
        fd = lock_exclusive(
            os.open(self.file, os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o644),
            f"another process is writing to {self.file} (shard {self.shard} of the store "
            f"{self.path})", wait=self.wait)
        data = b""
        while chunk := os.pread(fd, 1 << 20, len(data)):
            data += chunk
        end = data.rfind(b"\n") + 1
        if end != len(data):  # a kill left a partial last line: drop it before appending
            os.ftruncate(fd, end)
            os.fsync(fd)
            warnings.warn(f"{self.file}: dropped a partial last line ({len(data) - end} bytes "
                          "without a newline, left by a writer that was killed) before "
                          "appending", StoreWarning, stacklevel=2)
        self._fd = fd
        self._rows = rows_by_id(self.path)
        return self

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def __enter__(self) -> "ResultStore":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------
    def owns(self, key: str) -> bool:
        """Whether this writer computes the unit of work ``key`` (see :class:`Shard`)."""
        return self.shard.owns(key)

    def has(self, cid: str) -> bool:
        """Whether any file of the store (as read at open, plus this writer's rows) has it."""
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
