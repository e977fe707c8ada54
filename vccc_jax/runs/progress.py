"""Progress of a long run (cells, updates) on stderr: a ``rich`` bar on a terminal, plain
throttled lines otherwise (CI logs, pipes).

On a TTY, ``rich.progress`` redraws one line in place; otherwise a plain line is printed at
most every ``min_interval`` seconds plus a final one, so logs stay short. The ETA counts only
items computed in *this* run: items skipped on resume are excluded from the rate, so a resumed
sweep does not report an absurdly short ETA.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskProgressColumn, TextColumn
from rich.progress import Progress as _RichProgress


def format_seconds(seconds: Optional[float]) -> str:
    """``mm:ss`` or ``h:mm:ss``; ``--:--`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """``Progress(total, done=already_done)``; ``advance(n, note)``; ``close()`` at the end."""

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        stream: Optional[TextIO] = None,
        min_interval: float = 5.0,
        label: str = "cells",
        clock: Callable[[], float] = time.monotonic,
        tty: Optional[bool] = None,
    ):
        if total < 0 or done < 0 or done > total:
            raise ValueError(f"need 0 <= done <= total, got done={done}, total={total}")
        self.total, self.done, self._start_done = total, done, done
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval, self.label, self._clock = min_interval, label, clock
        self._t0 = clock()
        self._last_print = -float("inf")
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.note = ""
        self._closed = False
        self._last_line = ""
        self._bar = None
        if self.tty:
            console = Console(file=self.stream, force_terminal=True)
            self._bar = _RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn(label), TaskProgressColumn(), TextColumn("eta {task.fields[eta]}"),
                TextColumn("{task.fields[note]}"), console=console, transient=False,
                auto_refresh=False)
            self._task = self._bar.add_task("", total=total, completed=done, eta="--:--", note="")
            self._bar.start()
        self._render(force=True)

    def eta(self) -> Optional[float]:
        computed = self.done - self._start_done
        if computed <= 0:
            return None
        rate = computed / max(self._clock() - self._t0, 1e-9)
        return (self.total - self.done) / rate

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        text = (f"{self.done}/{self.total} {self.label} {100 * frac:5.1f}% "
                f"elapsed {format_seconds(self._clock() - self._t0)} "
                f"eta {format_seconds(self.eta())}")
        return f"{text}  {self.note}" if self.note else text

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        if note:
            self.note = note
        self._render(force=self.done == self.total)

    def set_note(self, note: str) -> None:
        self.note = note
        self._render(force=False)

    def _render(self, force: bool) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, note=self.note,
                             eta=format_seconds(self.eta()))
            self._bar.refresh()
            return
        now = self._clock()
        if force or now - self._last_print >= self.min_interval:
            self._last_line = self.line()
            self.stream.write(self._last_line + "\n")
            self.stream.flush()
            self._last_print = now

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.stop()
        elif self._last_line.split(" elapsed")[0] != self.line().split(" elapsed")[0]:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
