"""What every command shares: one-line errors with exit status 2, an argparse parser that
reports through the same channel, and the output-location checks commands run before any
compute."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional, Sequence

EXIT_BAD_INPUT = 2
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
    """Decorate ``main(argv)``: bad input -> one line on stderr and exit status 2.

    ``main`` validates its input and returns either an exit status or a thunk that does the
    work: only the validation phase is guarded, so a bug inside a run still shows its
    traceback instead of a misleading one-line "bad input".
    """

    def wrap(main: Callable[[Optional[Sequence[str]]], int]):
        @functools.wraps(main)
        def run(argv: Optional[Sequence[str]] = None) -> int:
            try:
                result = main(None if argv is None else list(argv))
            except UsageError as e:
                return fail(command, e)
            except BAD_INPUT as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else e
                return fail(command, msg)
            if callable(result):
                result = result()
            return int(result or 0)

        return run

    return wrap


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

