"""JAX's persistent compilation cache for ``vccc`` commands (issue 22 section 4).

Every run and sweep cell used to pay the XLA compile again (9-40 s per trainer config on
a loaded 2-core machine). With the cache on, a compiled executable is written to disk and
the next process that compiles the same program on the same backend and versions loads
it instead (JAX keys entries by the program, the compile options, the backend and the
jax / jaxlib versions).

``vccc`` turns it on by default (:func:`configure`, called by ``cli.py``) with the
directory ``$XDG_CACHE_HOME/vccc_jax/jax_cache`` (``~/.cache/...`` without XDG); the
variable ``VCCC_COMPILE_CACHE`` names another directory, or ``off``; ``--no-compile-cache``
(any command) turns it off; a user's own ``JAX_COMPILATION_CACHE_DIR`` is kept. The setting
travels to subprocesses (shard jobs) through ``JAX_*`` variables.

This module imports jax only when jax is already imported (``vccc --help`` stays fast).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator, MutableMapping, Optional

FLAG = "--no-compile-cache"
ENV_VAR = "VCCC_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none")


def default_dir(environ: Optional[MutableMapping[str, str]] = None) -> Path:
    """``$XDG_CACHE_HOME/vccc_jax/jax_cache`` (``~/.cache/vccc_jax/jax_cache`` without it)."""
    env = os.environ if environ is None else environ
    home = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "vccc_jax" / "jax_cache"


def resolve(off: bool = False, environ: Optional[MutableMapping[str, str]] = None
            ) -> Optional[Path]:
    """The cache directory a command uses, or None when the cache is off (``off``: the
    flag; ``VCCC_COMPILE_CACHE``: a directory or ``off``; a user's
    ``JAX_COMPILATION_CACHE_DIR``; else :func:`default_dir`)."""
    env = os.environ if environ is None else environ
    setting = env.get(ENV_VAR, "").strip()
    if off or setting.lower() in OFF:
        return None
    if setting:
        return Path(setting).expanduser()
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(env["JAX_COMPILATION_CACHE_DIR"])
    return default_dir(env)


def apply(path: Optional[Path], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Point JAX at ``path`` (None: cache off), in the environment (read when jax is first
    imported, here or in a subprocess) and, if jax is already imported, in its config."""
    env = os.environ if environ is None else environ
    if path is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "true"
        env["JAX_COMPILATION_CACHE_DIR"] = str(path)
    if "jax" in sys.modules and environ is None:
        import jax

        jax.config.update("jax_enable_compilation_cache", path is not None)
        if path is not None:
            jax.config.update("jax_compilation_cache_dir", str(path))


def configure(argv: list[str], environ: Optional[MutableMapping[str, str]] = None
              ) -> tuple[list[str], Optional[Path]]:
    """``argv`` without ``--no-compile-cache``, and the cache directory now in effect
    (None: off), after :func:`apply`."""
    rest = [a for a in argv if a != FLAG]
    path = resolve(len(rest) != len(argv), environ)
    apply(path, environ)
    return rest, path


@contextlib.contextmanager
def using(path: Optional[str | os.PathLike], min_compile_time_s: float = 0.0
          ) -> Iterator[None]:
    """Within the block, JAX's persistent cache is ``path`` (None: off) and caches every
    executable that took at least ``min_compile_time_s`` to compile; the previous settings
    come back after it. For measuring cold vs warm compiles (``benchmarks.train``)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    keys = ("jax_enable_compilation_cache", "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs")
    old = {k: getattr(jax.config, k) for k in keys}
    new = {"jax_enable_compilation_cache": path is not None,
           "jax_compilation_cache_dir": None if path is None else str(path),
           "jax_persistent_cache_min_compile_time_secs": float(min_compile_time_s)}
    for k, v in new.items():
        jax.config.update(k, v)
    cc.reset_cache()  # the cache object binds its directory on first use
    try:
        yield
    finally:
        for k, v in old.items():
            jax.config.update(k, v)
        cc.reset_cache()
