"""The ``vccc`` command: ``vccc verify | sweep | train | bench | figures | async-mc | simulate
| list``, and ``vccc --version``.

Each sub-command is one module of ``vccc_jax.commands`` exposing ``main(argv) -> int``;
this file only dispatches, importing lazily so ``vccc --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {
    "verify": ("vccc_jax.commands.verify", "exact and sampled checks of every identity"),
    "sweep": ("vccc_jax.commands.sweep", "tabular staleness sweeps and async actor-critic grids"),
    "train": ("vccc_jax.commands.train", "neural async actor-critic on gymnax with policy lag"),
    "bench": ("vccc_jax.commands.bench", "benchmarks: estimators | tabular | train | scale | routes | commands"),
    "figures": ("vccc_jax.commands.figures", "regenerate figures from a result store"),
    "async-mc": ("vccc_jax.commands.async_mc", "Sec 3.4 demo: mid-trajectory version switches"),
    "simulate": ("vccc_jax.commands.simulate", "asynchronous-pipeline simulator"),
    "list": ("vccc_jax.commands.listing", "list envs | critics | actors | experiments"),
}


def version() -> str:
    """``vccc 0.1.0 (git 1a2b3c4d, dirty; jax 0.10.0)`` without importing JAX."""
    from importlib import metadata

    from vccc_jax import __version__
    from vccc_jax.runs.provenance import git_revision

    git = git_revision()
    rev = (git["rev"] or "")[:12]
    where = f"git {rev}{', dirty' if git['dirty'] else ''}" if rev else "no git checkout"
    try:
        jax_version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        jax_version = "not installed"
    return f"vccc {__version__} ({where}; jax {jax_version})"


def usage() -> str:
    rows = "\n".join(f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items())
    return (f"usage: vccc COMMAND [ARGS]   (vccc COMMAND --help; vccc --version)\n\n"
            f"commands:\n{rows}\n\n"
            "Compiled programs are cached in $XDG_CACHE_HOME/vccc_jax/jax_cache (JAX's "
            "persistent\ncompilation cache; VCCC_COMPILE_CACHE=DIR or off; any command: "
            "--no-compile-cache).\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vccc: unknown command {name!r} (commands: {', '.join(COMMANDS)})",
              file=sys.stderr)
        return 2
    from vccc_jax.train.compile_cache import configure

    rest, _ = configure(rest)  # JAX's persistent compilation cache (--no-compile-cache: off)
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except BrokenPipeError:  # `vccc ... | head`: the reader has had enough; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
