"""What every command shares: one-line errors with exit status 2, and an argparse parser
that reports through the same channel."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn, Optional, Sequence

EXIT_BAD_INPUT = 2
# Errors that mean "the input is wrong": configs, flags, names, files.
BAD_INPUT = (ValueError, TypeError, KeyError, FileNotFoundError, IsADirectoryError)


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
