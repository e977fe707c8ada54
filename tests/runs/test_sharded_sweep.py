"""Sharded tabular sweeps (issue 10): the batch of cells split over 8 fake CPU devices gives
the same result rows as one device (a subprocess: XLA_FLAGS precede the jax import)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from _scale_common import suite_flags

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def test_sharded_sweep_rows_equal_one_device(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "VCCC_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = suite_flags()  # level-0 compiles, as in-process
    proc = subprocess.run([sys.executable, str(HERE / "_sweep_worker.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "rows.json").read_text())
    assert len(got["one"]) == 4  # 2 methods x 2 lags (one clip, one law)
    assert got["mesh"] == got["one"]  # same ids, cells and metrics, bit for bit
