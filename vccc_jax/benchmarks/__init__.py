"""``vccc bench NAME``: speed measured against a reference in the same process.

Each benchmark module prints its own table of ratios; none of this runs in the tests.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "estimators": "vccc_jax.benchmarks.estimators",
    "tabular": "vccc_jax.benchmarks.tabular",
    "train": "vccc_jax.benchmarks.train",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: vccc bench {{{'|'.join(BENCHMARKS)}}} [ARGS]", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0)
