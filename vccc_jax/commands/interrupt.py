"""Ctrl-C in ``vccc train`` and ``vccc sweep``: the first one is acknowledged at once (even
mid-compile) and stops the run where it can save (train: after the chunk in flight; sweep:
when the computation in flight returns), the second quits at once; both exit 130 with one
line naming what was saved (``commands.train``, ``commands.sweep``)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Optional

EXIT_INTERRUPTED = 130


def exit_interrupted(message: str, command: str = "train"):
    """One line on stderr and exit 130 at once, as ``vccc sweep`` does: interpreter teardown
    after an interrupted XLA compile can crash. Pending saves were waited for already."""
    print(f"\nvccc {command}: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def interruptible(body, *args_) -> int:
    """Run ``body``; a Ctrl-C that reaches here (outside the training loop, or a second one
    in a grid) prints one line and exits 130. ``runs.train.run_one`` has waited for its
    pending saves by then (its ``finally``)."""
    try:
        return body(*args_)
    except KeyboardInterrupt as e:
        exit_interrupted(str(e) or "interrupted")


class SigintStops:
    """While active, the first Ctrl-C (SIGINT) sets a flag (``stop()`` is True) and says so at
    once on stderr (``ack``), even mid-compile; the training loop checkpoints after the chunk
    in flight and stops. With ``raise_first`` (``vccc sweep``) the first Ctrl-C also raises
    KeyboardInterrupt in the main thread as soon as it runs Python again (the default handler;
    after a compile, when the compile returns), so the acknowledgement is what the user sees
    meanwhile. A second Ctrl-C quits at once: ``on_force()`` (default: exit 130 with
    ``message()``). Both work while the main thread is inside a compile or a jitted call,
    where Python signal handlers cannot run: a watcher thread reads the signal from
    ``signal.set_wakeup_fd``, which the C-level handler writes as the signal arrives.
    Quitting between saves is safe: a save is a rename of a finished temporary directory (kill
    -9 at random times is tested to resume bitwise); a store row is one write. Outside the
    main thread it does nothing (signals go there)."""

    def __init__(self, message: Callable[[], str] = lambda: "interrupted",
                 on_force: Optional[Callable[[], None]] = None,
                 announce: Optional[bool] = None, *, command: str = "train",
                 ack: str = "stopping after the updates in flight (they are checkpointed); "
                 "Ctrl-C again to quit now", raise_first: bool = False):
        self.requested, self.old, self.count = False, None, 0
        self.message, self.command, self.ack = message, command, ack
        self.raise_first = raise_first
        # the first Ctrl-C is acknowledged at once (a chunk or a compile can take minutes,
        # and a log or a harness reading a pipe must see it was received, as a terminal does)
        self.announce = True if announce is None else announce
        self.on_force = on_force or (lambda: exit_interrupted(self.message(), self.command))

    def __call__(self) -> bool:
        return self.requested

    def _handler(self, signum, frame):
        """The Python-level handler: a no-op, so SIGINT raises nothing (the watcher counts)."""

    def _watch(self, fd: int) -> None:
        # signals go to the main thread (its handler raises KeyboardInterrupt there)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:  # the write end was closed by __exit__
                return
            for signum in data:
                if signum != signal.SIGINT:
                    continue
                self.count += 1
                if self.count == 1:
                    if self.announce:  # before the flag: the stop line follows this one
                        print(f"\nvccc {self.command}: {self.ack}", file=sys.stderr,
                              flush=True)
                    self.requested = True
                else:
                    self.on_force()
                    return

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._r, self._w = os.pipe()
            os.set_blocking(self._w, False)
            self.old = signal.signal(signal.SIGINT, signal.default_int_handler
                                     if self.raise_first else self._handler)
            self.old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
            self._thread = threading.Thread(target=self._watch, args=(self._r,), daemon=True,
                                            name="vccc-sigint")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.set_wakeup_fd(self.old_fd)
            signal.signal(signal.SIGINT, self.old)
            os.close(self._w)  # the watcher reads EOF and ends
            self._thread.join()
            os.close(self._r)
