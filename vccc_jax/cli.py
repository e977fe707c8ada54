"""The ``vccc`` command: ``vccc verify | sweep | train | bench | figures``.

Each sub-command lives in the module that owns the concept and exposes ``main(argv)``;
this file only dispatches, importing lazily so ``vccc --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "verify": ("vccc_jax.tabular.verify", "exact and sampled checks of every identity"),
    "sweep": ("vccc_jax.sweeps.run", "staleness x clipping sweeps on tabular MDPs"),
    "train": ("vccc_jax.sweeps.train", "neural async actor-critic on gymnax with policy lag"),
    "bench": ("vccc_jax.benchmarks", "benchmarks: estimators | tabular | train"),
    "figures": ("vccc_jax.plotting", "regenerate figures from a result store"),
}


def _usage() -> str:
    rows = "\n".join(f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: vccc COMMAND [ARGS]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vccc: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
