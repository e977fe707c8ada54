"""Sweeps across machines (issue 22): shards launched by submitit's local executor write
disjoint store files whose union equals one process's rows; a shard killed mid-way resumes
alone. The jobs run a jax-free command (``_shard_job``) so the test costs process starts,
not compiles; the command wiring is checked in tests/commands/test_shards.py."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from vccc_jax.runs import launch
from vccc_jax.runs.store import Shard, read_rows, store_files, table_rows

pytest.importorskip("submitit")
HERE = Path(__file__).parent
ROOT = HERE.parent.parent
N_CELLS = 12


@pytest.fixture
def job(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    import _shard_job

    return _shard_job


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_local_shards_union_equals_one_process_and_a_killed_shard_resumes_alone(
        tmp_path, job):
    ref = tmp_path / "ref.jsonl"
    assert job.main([str(ref), str(N_CELLS), "0", str(tmp_path)]) == 0  # one process
    store = tmp_path / "runs" / "sweep.jsonl"
    shards = [Shard(0, 2), Shard(1, 2)]
    argv = [str(store), str(N_CELLS), "0.4", str(tmp_path)]
    jobs = launch.submit(job.main, [argv + ["--shard", str(s)] for s in shards], shards,
                         folder=tmp_path / "logs")
    victim = store.parent / "sweep" / "shard-1-of-2.jsonl"
    t0 = time.monotonic()
    while _lines(victim) < 1:  # kill shard 1 right after its first row
        assert time.monotonic() - t0 < 120, "shard 1 wrote nothing"
        assert jobs[1].state in ("RUNNING", "PENDING", "UNKNOWN"), jobs[1].state
        time.sleep(0.05)
    os.kill(int((tmp_path / "1-of-2.pid").read_text()), signal.SIGKILL)
    results = launch.wait(jobs, shards)
    assert [r.ok for r in results] == [True, False], results
    killed_at = _lines(victim)
    mine = sum(Shard(1, 2).owns(r["id"]) for r in read_rows(ref))
    assert 1 <= killed_at < mine  # really interrupted part-way
    first = (store.parent / "sweep" / "shard-0-of-2.jsonl").read_bytes()
    # Resume shard 1 alone (relaunching it); shard 0's file is not touched.
    again = launch.submit(job.main, [argv + ["--shard", "1/2"]], [shards[1]],
                          folder=tmp_path / "logs")
    assert launch.wait(again, [shards[1]])[0].ok
    assert (store.parent / "sweep" / "shard-0-of-2.jsonl").read_bytes() == first
    assert [f.name for f in store_files(store)] == ["shard-0-of-2.jsonl", "shard-1-of-2.jsonl"]
    assert table_rows(read_rows(store)) == table_rows(read_rows(ref))
    assert len(read_rows(store)) == N_CELLS


def test_launch_options_and_missing_submitit(monkeypatch):
    assert launch.parse_options(["timeout_min=90", "mem_gb=1.5", "slurm_partition=gpu"]) == {
        "timeout_min": 90, "mem_gb": 1.5, "slurm_partition": "gpu"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        launch.parse_options(["gpus"])
    with pytest.raises(ValueError, match="--launcher must be one of"):
        launch.submit(print, [[]], [Shard()], launcher="k8s", folder="x")
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    with pytest.raises(ImportError, match=r"vccc_jax\[launch\].*--shard i/N"):
        launch.submit(print, [[]], [Shard()], folder="x")
