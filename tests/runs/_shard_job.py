"""A shard job for tests/runs/test_launch.py: ``main(argv)`` as a command's, without jax.

argv: STORE NUM_CELLS SLEEP_S PID_DIR [--shard i/N]. Cells {"i": k}; metrics are a pure
function of the cell; each cell sleeps SLEEP_S (so a test can kill a shard mid-way). The
job writes its pid to PID_DIR/<i>-of-<N>.pid first.
"""

import os
import time
from pathlib import Path

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.store import Shard, parse_shard, sharded


def cells(n: int) -> list[dict]:
    return [{"i": k, "name": "launch-test"} for k in range(n)]


def metrics(cell: dict, sleep_s: float = 0.0) -> dict:
    time.sleep(sleep_s)
    return {"square": cell["i"] ** 2, "half": cell["i"] / 2}


def main(argv: list[str]) -> int:
    store, n, sleep_s, pid_dir = argv[0], int(argv[1]), float(argv[2]), Path(argv[3])
    shard = parse_shard(argv[argv.index("--shard") + 1]) if "--shard" in argv else Shard()
    (pid_dir / f"{shard.index}-of-{shard.count}.pid").write_text(str(os.getpid()))
    with sharded(shard):
        run_cells(store, cells(n), lambda c: metrics(c, sleep_s), progress=False)
    return 0
