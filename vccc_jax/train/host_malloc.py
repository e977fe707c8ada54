"""Keep freed host memory in the process: glibc ``malloc`` settings for large CPU outputs.

By default glibc serves a buffer over its mmap threshold (dynamic, at most 32 MiB) with
``mmap`` and returns it with ``munmap`` when it is freed, and threads beyond the first get
their own arenas, whose heaps (64 MiB at most) also hand large buffers to ``mmap``. A jitted
XLA:CPU function that allocates a large output (``vtrace`` at (512, 65536): two 128 MiB
outputs) therefore page-faults every page of its outputs in again on every call: 65538
minor faults a call there, and the stream bound of ``vccc bench estimators`` runs at
13-17% of the bandwidth ceiling (docs/results.md, issue 46, "Session 3").

:func:`keep_freed_memory` sets, through ``mallopt``: one arena for all threads
(``M_ARENA_MAX = 1``), no ``mmap`` for large blocks (``M_MMAP_MAX = 0``) and no trimming of
the heap top (``M_TRIM_THRESHOLD`` at its maximum). Freed buffers then stay in the heap and
the next call reuses them without faults, once the heap has reached its steady state: XLA
allocates aligned blocks, and glibc reuses a freed one only after several have coalesced
(a jitted 64 MiB output: 16384 faults a call for ~8-11 calls, while the resident size grows
by ~7 outputs, +450 MiB; then 0 faults and no growth, tests/train/test_host_malloc.py).
The price: the process never returns freed memory to the operating system (its resident
size stays at its peak, plus those spare blocks) and all threads share one arena. It must run before JAX runs anything (XLA's threads keep the arenas they first
allocate from), so it raises once a JAX backend exists. :data:`ENV` is the same setting as
environment variables, for a process started from a shell or as a subprocess.

Nothing in vccc_jax calls it by default: ``vtrace`` and the trainer run under glibc's
defaults unless a user calls this first (``vccc bench estimators --tuned-malloc`` does).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_INT_MAX = 2**31 - 1

# The same setting for a new process (glibc reads these at start-up).
ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
       "MALLOC_TRIM_THRESHOLD_": str(_INT_MAX)}

_applied = False


def _libc():
    """glibc's ``mallopt``, or None (macOS, musl, no C library found)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    return lib if hasattr(lib, "mallopt") and hasattr(lib, "gnu_get_libc_version") else None


def _jax_running() -> bool:
    try:
        from jax._src import xla_bridge  # noqa: PLC0415  (only to refuse a late call)
    except ImportError:
        return False
    return bool(xla_bridge.backends_are_initialized())


def keep_freed_memory() -> bool:
    """Apply the setting (module docstring) to this process; True when glibc took all three.

    False (and nothing changed) where the C library is not glibc. Raises RuntimeError once
    a JAX backend is initialised: call it first thing, before any JAX computation.
    """
    global _applied
    if _jax_running():
        raise RuntimeError("keep_freed_memory() must run before JAX runs anything: XLA's "
                           "threads keep the malloc arenas they already use")
    lib = _libc()
    if lib is None:
        return False
    ok = all(lib.mallopt(key, value) == 1 for key, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))
    _applied = _applied or ok
    return ok


def describe() -> str:
    """Which host allocator setting this process runs under, in words."""
    if _libc() is None:
        return "not glibc: the C library's own allocator"
    if _applied:
        return "glibc, tuned by keep_freed_memory() (one arena, no mmap, no trim)"
    env = [k for k in ENV if k in os.environ]
    if env:
        return "glibc, tuned by the environment (" + ", ".join(
            f"{k}={os.environ[k]}" for k in env) + ")"
    return "glibc defaults (large outputs mmap'ed and page-faulted in on every call)"


__all__ = ["ENV", "describe", "keep_freed_memory"]
