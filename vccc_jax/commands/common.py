"""What every command shares: one-line errors with exit status 2, an argparse parser that
reports through the same channel, and the output-location checks commands run before any
compute."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import warnings
from pathlib import Path
from typing import Callable, NoReturn, Optional, Sequence

EXIT_BAD_INPUT = 2
EXIT_BUSY = 3  # a result store or run directory that another process is writing
# Errors that mean "the input is wrong": configs, flags, names, files.
BAD_INPUT = (ValueError, TypeError, KeyError, FileNotFoundError, IsADirectoryError,
             NotADirectoryError, PermissionError)


class UsageError(Exception):
    """Raised by :class:`Parser` instead of exiting, so ``guarded`` prints one line."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors become :class:`UsageError` (``--help`` still exits 0)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def fail(command: str, message: str) -> int:
    """Print ``vccc <command>: <message>`` (one line) on stderr; return exit status 2."""
    text = " ".join(str(message).split())
    print(f"vccc {command}: {text}", file=sys.stderr)
    return EXIT_BAD_INPUT


def guarded(command: str) -> Callable:
    """Decorate ``main(argv)``: bad input -> one line on stderr and exit status 2; a store or
    run directory that another process holds (``runs.store.StoreLockedError``) -> one line
    and exit status 3.

    ``main`` validates its input and returns either an exit status or a thunk that does the
    work: only the validation phase is guarded, so a bug inside a run still shows its
    traceback instead of a misleading one-line "bad input".
    """

    def wrap(main: Callable[[Optional[Sequence[str]]], int]):
        @functools.wraps(main)
        def run(argv: Optional[Sequence[str]] = None) -> int:
            from vccc_jax.runs.store import StoreLockedError

            with one_line_warnings(command):
                try:
                    result = main(None if argv is None else list(argv))
                    if not callable(result):
                        return int(result or 0)
                except UsageError as e:
                    return fail(command, e)
                except BAD_INPUT as e:
                    msg = e.args[0] if isinstance(e, KeyError) and e.args else e
                    return fail(command, msg)
                except StoreLockedError as e:  # validation took a lock another run holds
                    fail(command, e)
                    return EXIT_BUSY
                try:
                    return int(result() or 0)
                except StoreLockedError as e:  # a store or run directory another run holds
                    fail(command, e)
                    return EXIT_BUSY

        return run

    return wrap


@contextlib.contextmanager
def one_line_warnings(command: str):
    """Within the block, a ``runs.store.StoreWarning`` (skipped bad lines, a dropped partial
    line) is printed once, as ``vccc <command>: warning: <what>`` on stderr; other warnings
    as Python shows them."""
    from vccc_jax.runs.store import StoreWarning

    seen: set[str] = set()
    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, StoreWarning):
                return default(message, category, filename, lineno, file, line)
            text = " ".join(str(message).split())
            if text not in seen:
                seen.add(text)
                print(f"vccc {command}: warning: {text}", file=sys.stderr, flush=True)

        warnings.simplefilter("always", StoreWarning)
        warnings.showwarning = show
        yield


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """``path`` if it is a directory or could be made one, checked without creating
    anything (its nearest existing ancestor must be a writable directory); else
    ValueError naming ``flag``. :func:`output_dir` then makes it."""
    p = Path(path)
    probe = p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{flag} {p}: cannot create directory ({probe} is not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {p}: cannot create directory ({probe} is not writable)")
    return p


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """Create the output directory ``path`` (parents too) now, before any compute; one that
    cannot be created raises ValueError naming ``flag``."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {p}: cannot create directory ({e.strerror or e})") from None
    if not os.access(p, os.W_OK):
        raise ValueError(f"{flag} {p}: directory is not writable")
    return p


def output_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` whose directory exists or can be created (made now); else ValueError."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: is a directory, expected a file path")
    try:
        output_dir(p.parent, flag)
    except ValueError as e:
        raise ValueError(f"{flag} {p}: cannot create directory {p.parent} "
                         f"({str(e).rpartition('(')[2]}") from None
    return p


def cell_seconds(row: dict) -> Optional[float]:
    """Measured compute seconds of one stored cell, compile excluded where the row says
    how much it was (tabular groups); None if the row has no timing."""
    meta = row.get("meta") or {}
    t = meta.get("timings") or {}
    if t.get("group_cells") and "run_s" in t:  # tabular: a group's compute, per cell
        return t["run_s"] / t["group_cells"]
    for value in (t.get("cell_s"), meta.get("seconds")):
        if isinstance(value, (int, float)):
            return float(value)
    return None


def dry_run(exp, ids: list, store: Path) -> int:
    """Print the grid size, how many of its cells ``store`` already holds, and an ETA for
    the rest from the compute time the store measured (median per cell) plus its compile
    time; unknown when it holds no timed cell. (``vccc sweep --dry-run`` and ``vccc train --config X --dry-run``.)"""
    from vccc_jax.runs.progress import format_seconds
    from vccc_jax.runs.store import read_rows

    rows = read_rows(store)  # the union of its shard files; none yet: []
    have = {r.get("id") for r in rows}
    done = sum(i in have for i in ids)
    todo = len(ids) - done
    print(f"{exp.name} ({exp.kind}, {exp.path}): {len(ids)} cells, {done} already in {store}, "
          f"{todo} to compute")
    times = [t for t in map(cell_seconds, rows) if t is not None]
    if not todo:
        print("ETA 0 s: nothing to compute")
    elif times:
        per = statistics.median(times)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        groups = {(r["meta"]["timings"].get("group"), r["meta"].get("created_utc")):
                  r["meta"]["timings"]["compile_s"] for r in rows
                  if "compile_s" in (r.get("meta") or {}).get("timings", {})}
        compile_s = (f"{format_seconds(sum(groups.values()))} compile (as the stored run "
                     "measured it)" if groups else "compile (not measured)")
        print(f"ETA {format_seconds(todo * per)} compute + {compile_s}: {todo} cells x "
              f"{per:.3g} s, the median compute time of {len(times)} cells stored in "
              f"{store}; load average now {load}")
    else:
        print(f"ETA unknown: no timed cells in {store} yet (run it, or part of it, once)")
    return 0
