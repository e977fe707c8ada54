"""A dependency-free progress bar: cells done / total, rate and ETA, on stderr.

On a TTY it redraws one line in place (``\\r``); otherwise (CI logs, pipes) it prints a
plain line at most every ``min_interval`` seconds plus a final one, so logs stay short.
The ETA uses only cells computed in *this* run (cells skipped on resume are excluded from
the rate).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """``Progress(total, done=already_done)``; call ``advance(n, note)``; ``close()`` at the end."""

    def __init__(
        self,
        total: int,
        *,
        done: int = 0,
        stream: Optional[TextIO] = None,
        width: int = 28,
        min_interval: float = 5.0,
        label: str = "cells",
        clock: Callable[[], float] = time.monotonic,
        tty: Optional[bool] = None,
    ):
        if total < 0 or done < 0 or done > total:
            raise ValueError(f"need 0 <= done <= total, got done={done}, total={total}")
        self.total = total
        self.done = done
        self._start_done = done
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval = min_interval
        self.label = label
        self._clock = clock
        self._t0 = clock()
        self._last_print = -float("inf")
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.note = ""
        self._closed = False
        self._last_line = ""
        self._render(force=True)

    def eta(self) -> Optional[float]:
        computed = self.done - self._start_done
        if computed <= 0:
            return None
        rate = computed / max(self._clock() - self._t0, 1e-9)
        return (self.total - self.done) / rate

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = self._clock() - self._t0
        text = (
            f"[{bar}] {self.done}/{self.total} {self.label} {100 * frac:5.1f}% "
            f"elapsed {format_seconds(elapsed)} eta {format_seconds(self.eta())}"
        )
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
        now = self._clock()
        if self.tty:
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
        elif force or now - self._last_print >= self.min_interval:
            self._last_line = self.line()
            self.stream.write(self._last_line + "\n")
            self.stream.flush()
            self._last_print = now

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tty:
            self.stream.write("\n")
        elif self._last_line.split(" elapsed")[0] != self.line().split(" elapsed")[0]:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
