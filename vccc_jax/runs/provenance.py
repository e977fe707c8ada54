"""What made a result: the command line, git revision, package versions, Python, platform,
host, devices, time (UTC).

Stored in every result row's ``meta`` (never in its ``cell``: provenance does not change a
cell's id, so rerunning at another commit resumes the same store).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable

PACKAGES = ("vccc_jax", "jax", "jaxlib", "numpy", "flax", "optax", "chex", "distrax", "gymnax",
            "orbax-checkpoint", "scipy", "matplotlib")


def git_revision(cwd: str | os.PathLike | None = None) -> dict:
    """{"rev": commit hash or None, "dirty": bool or None} of the repository at ``cwd``."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"rev": None, "dirty": None}
    return {
        "rev": rev.stdout.strip() if rev.returncode == 0 else None,
        "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None,
    }


def package_versions(packages: Iterable[str] = PACKAGES) -> dict:
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def devices() -> dict | None:
    """{"platform", "kind", "count", "local_count", "processes"} of the JAX backend, or None
    when JAX is not loaded (provenance never starts a backend by itself)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        devs = jax.devices()
        return {"platform": devs[0].platform, "kind": devs[0].device_kind, "count": len(devs),
                "local_count": jax.local_device_count(), "processes": jax.process_count()}
    except Exception as e:  # no backend: say why instead of failing the result
        return {"error": f"{type(e).__name__}: {e}"}


def provenance(command: Iterable[str] | None = None) -> dict:
    """What made a result: the command line (``command``, default ``sys.argv``), git
    revision, package versions, Python, platform, hostname, JAX devices, time (UTC)."""
    argv = list(sys.argv if command is None else command)
    return {
        "command": shlex.join(argv),
        "hostname": socket.gethostname(),
        "devices": devices(),
        "git": git_revision(),
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
