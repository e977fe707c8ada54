"""orbax checkpoints (issue 10): template checks in-process, and a real training subprocess
SIGKILLed during an async save and at a random time, whose resumed run equals an
uninterrupted run with the same checkpoint schedule bit for bit (state and metric rows)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.train import checkpoint as ck

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TOTAL, EVERY = 6, 2
RNG = random.Random(10)  # fixed: which save is hit and when the timed kill falls


def test_manager_keeps_last_n_and_checks_the_template(tmp_path):
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": {"c": jnp.zeros((), jnp.int32)}}
    m = ck.manager(tmp_path, keep=2, every=2)
    for step in range(1, 6):
        ck.save(m, step, jax.tree_util.tree_map(lambda x: x + step, tree), {"step": step})
    assert ck.save(m, 7, tree, force=True)
    ck.wait(m)
    assert m.all_steps() == [4, 7] and ck.latest_step(m) == 7
    got, meta = ck.restore(m, tree, step=4)
    np.testing.assert_array_equal(got["a"], tree["a"] + 4)
    assert meta == {"step": 4}
    with pytest.raises(ValueError, match="leaf 0"):
        ck.restore(m, {"a": jnp.zeros((3, 2)), "b": {"c": tree["b"]["c"]}})
    m.close()


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "VCCC_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _driver(out: Path, kill_when=None, timeout=600, ref=False):
    """Run the driver; ``kill_when(line, t)`` -> True: SIGKILL it right there. Returns lines."""
    proc = subprocess.Popen([sys.executable, str(HERE / "_ckpt_driver.py"), str(out),
                             str(TOTAL), str(EVERY)] + (["ref"] if ref else []), env=_env(),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    lines, t0 = [], time.time()
    try:
        for line in proc.stdout:
            lines.append(line.split())
            if kill_when is not None and kill_when(lines[-1], time.time() - t0):
                os.kill(proc.pid, signal.SIGKILL)
                break
            assert time.time() - t0 < timeout, lines
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return lines, proc.returncode


def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    out = tmp_path / "killed"
    # 1. SIGKILL right after an async save started (its files are being written)
    target = str(RNG.choice(range(EVERY, TOTAL + 1, EVERY)))
    lines, rc = _driver(out, lambda w, t: w == ["saved", target])
    assert rc == -signal.SIGKILL
    # 2. restart, SIGKILL at a random time after start-up (anywhere in compile/train/save)
    delay = RNG.uniform(0.0, 3.0)
    lines, rc = _driver(out, lambda w, t: w[0] == "start" and not time.sleep(delay))
    started = [int(w[1]) for w in lines if w[0] == "start"]
    assert started and started[0] <= int(target)  # loses at most the uncommitted chunk
    assert started[0] >= int(target) - EVERY
    # 3. run to the end from the latest finished checkpoint; the same process then runs the
    #    uninterrupted schedule from scratch as the reference (same compiled programs)
    lines, rc = _driver(out, ref=True)
    assert rc == 0 and lines[-1] == ["done"], lines
    ref, got = np.load(out / "ref.npz"), np.load(out / "final.npz")
    assert ref.files == got.files
    for k in ref.files:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
