"""The ``vccc`` command: ``vccc verify | sweep | train | bench | figures | async-mc | simulate``.

Each sub-command is one module of ``vccc_jax.commands`` exposing ``main(argv) -> int``;
this file only dispatches, importing lazily so ``vccc --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "verify": ("vccc_jax.commands.verify", "exact and sampled checks of every identity"),
    "sweep": ("vccc_jax.commands.sweep", "tabular staleness sweeps and async actor-critic grids"),
    "train": ("vccc_jax.commands.train", "neural async actor-critic on gymnax with policy lag"),
    "bench": ("vccc_jax.commands.bench", "benchmarks: estimators | tabular | train | scale"),
    "figures": ("vccc_jax.commands.figures", "regenerate figures from a result store"),
    "async-mc": ("vccc_jax.commands.async_mc", "Sec 3.4 demo: mid-trajectory version switches"),
    "simulate": ("vccc_jax.commands.simulate", "asynchronous-pipeline simulator"),
}


def usage() -> str:
    rows = "\n".join(f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items())
    return (f"usage: vccc COMMAND [ARGS]\n\ncommands:\n{rows}\n\n"
            "Compiled programs are cached in $XDG_CACHE_HOME/vccc_jax/jax_cache (JAX's "
            "persistent\ncompilation cache; VCCC_COMPILE_CACHE=DIR or off; any command: "
            "--no-compile-cache).\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vccc: unknown command {name!r} (commands: {', '.join(COMMANDS)})",
              file=sys.stderr)
        return 2
    from vccc_jax.train.compile_cache import configure

    rest, _ = configure(rest)  # JAX's persistent compilation cache (--no-compile-cache: off)
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
