"""Progress of a long run (cells, updates) on stderr: a ``rich`` bar on a terminal, plain
throttled lines otherwise (CI logs, pipes).

On a TTY, ``rich.progress`` redraws one line in place; otherwise a plain line is printed at
most every ``min_interval`` seconds plus a final one, so logs stay short; ``show=False``
prints nothing at all (``--no-progress``).

The ETA is remaining items / rate, and the rate counts only compute of *this* run:

* items skipped on resume are excluded (a resumed sweep does not report an absurdly short
  ETA);
* compilation is excluded: a caller that knows it passes ``advance(n, compile_s=...)``
  (those seconds are taken off the clock); otherwise the first ``advance`` of a run -- the
  one that paid for the first compile -- is a warm-up whose items and time are left out,
  and the ETA stays unknown (``--:--``) until a second one lands.
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
        show: bool = True,
    ):
        if total < 0 or done < 0 or done > total:
            raise ValueError(f"need 0 <= done <= total, got done={done}, total={total}")
        self.total, self.done, self._start_done = total, done, done
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval, self.label, self._clock = min_interval, label, clock
        self._t0 = clock()
        self._rate_t0: Optional[float] = None   # rate clock: starts after the warm-up
        self._rate_done = done                  # items before the rate clock started
        self._compile_s = 0.0                   # compile seconds reported since then
        self._last_print = -float("inf")
        self.show = show
        self.tty = show and (bool(getattr(self.stream, "isatty", lambda: False)())
                             if tty is None else tty)
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
        """Seconds left at this run's compute rate (compile and resumed items excluded);
        None until there is a rate to go by."""
        if self.done >= self.total:
            return 0.0
        computed = self.done - self._rate_done
        if self._rate_t0 is None or computed <= 0:
            return None
        seconds = self._clock() - self._rate_t0 - self._compile_s
        return (self.total - self.done) * max(seconds, 1e-9) / computed

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        text = (f"{self.done}/{self.total} {self.label} {100 * frac:5.1f}% "
                f"elapsed {format_seconds(self._clock() - self._t0)} "
                f"eta {format_seconds(self.eta())}")
        return f"{text}  {self.note}" if self.note else text

    def advance(self, n: int = 1, note: str = "", *,
                compile_s: Optional[float] = None) -> None:
        """``n`` more items done. ``compile_s``: seconds of that work spent compiling (left
        out of the rate); None: unknown, and the first call of a run is then a warm-up."""
        if self._rate_t0 is None and compile_s is None:  # warm-up: the first compile
            self._rate_t0, self._rate_done = self._clock(), min(self.total, self.done + n)
        elif self._rate_t0 is None:  # compile time known: count from the start
            self._rate_t0, self._compile_s = self._t0, compile_s
        else:
            self._compile_s += compile_s or 0.0
        self.done = min(self.total, self.done + n)
        if note:
            self.note = note
        self._render(force=self.done == self.total)

    def set_note(self, note: str) -> None:
        self.note = note
        self._render(force=False)

    def _render(self, force: bool) -> None:
        if not self.show:
            return
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
        if not self.show:
            return
        if self._bar is not None:
            self._bar.stop()
        elif self._last_line.split(" elapsed")[0] != self.line().split(" elapsed")[0]:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
