"""``vccc train --async --learner-devices 0,1`` (issue 48): the learner's state and batch on a
mesh over two forced host devices (the sharded trainer's layout, ``train.sharding``) against
the learner on one device, ``lag1`` mode with two actor threads (deterministic), 4 updates, in
a subprocess (XLA_FLAGS must precede the jax import; tests/train/_async_mesh_worker.py); the
same run over two processes (``jax.distributed``, one device each:
tests/train/_async_multiproc_worker.py)."""

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sharding import LOSS_ATOL, LOSS_RTOL, PARAM_ATOL, PARAM_RTOL, _env, _free_port

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def mesh_npz(tmp_path_factory):
    out = tmp_path_factory.mktemp("async_mesh")
    proc = subprocess.run([sys.executable, str(HERE / "_async_mesh_worker.py"), str(out)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, np.load(out / "async_mesh.npz")


def test_a_learner_sharded_over_two_devices_equals_one_learner_device(mesh_npz):
    """Versions and actions equal exactly; params and losses to the sharded trainer's
    tolerances (test_sharding.py: rtol 1e-5, atol 1e-7 / 1e-6): the mesh splits every
    minibatch over "data", so the gradient sums are reduced in another order (float32
    rounding, not a different computation); the env-step loop runs on the actor device in
    both runs."""
    tmp_path, npz = mesh_npz
    one = {k[4:]: npz[k] for k in npz.files if k.startswith("one/")}
    mesh = {k[5:]: npz[k] for k in npz.files if k.startswith("mesh/")}
    assert one.keys() == mesh.keys()
    assert [int(v.max()) for v in one["version"]] == [0, 0, 1, 2]
    for k in one:
        if k in ("version", "action") or k.startswith(("metrics['return']", "metrics['episodes']",
                                                          "metrics['lag")):
            np.testing.assert_array_equal(mesh[k], one[k], err_msg=k)
        elif k.startswith(("actor", "critic")):
            np.testing.assert_allclose(mesh[k], one[k], rtol=PARAM_RTOL, atol=PARAM_ATOL,
                                       err_msg=k)
        else:
            np.testing.assert_allclose(mesh[k], one[k], rtol=LOSS_RTOL, atol=LOSS_ATOL,
                                       err_msg=k)
    assert not all(np.array_equal(mesh[k], one[k]) for k in one if k.startswith("actor"))
    # vccc's own loop (runs.train_async) on the mesh, stopped after update 1 (the sharded
    # state checkpointed) and resumed: update 1 is the pipeline's; the first rollout after the
    # resume acts with the resumed version (lag 0), as documented
    np.testing.assert_array_equal(npz["run_async/version_diff_avg"], [0, 0, 1, 1])
    for name in ("actor_loss", "critic_loss"):
        np.testing.assert_allclose(npz[f"run_async/{name}"][:1],
                                   mesh[f"metrics['{name}']"].reshape(-1)[:1], rtol=1e-6,
                                   err_msg=name)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint").iterdir()
                  if p.name.isdigit()) == ["1", "2", "4"]


def test_two_processes_equal_the_learner_mesh_in_one_process(mesh_npz, tmp_path):
    """``vccc train --async`` over two processes (jax.distributed on localhost, gloo): one
    actor thread each, the learner's mesh over both processes' devices, every update's batch
    assembled from the two processes' rollouts. Against the one-process run with two actor
    threads and the learner's mesh over two devices (same envs per actor, same key chains):
    lags and returns equal exactly, losses to the sharded trainer's tolerances (the same
    computation; measured equal in the CSV); process 0 writes the rows, both the checkpoints."""
    coordinator, out, procs = f"127.0.0.1:{_free_port()}", tmp_path / "run", []
    try:
        for pid in range(2):
            env = _env(VCCC_COORDINATOR=coordinator, VCCC_NUM_PROCESSES="2",
                       VCCC_PROCESS_ID=str(pid))
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "_async_multiproc_worker.py"), str(out)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    assert "results:" in logs[0] and "results:" not in logs[1]  # process 0 prints
    assert sorted(x.name for x in (out / "checkpoint").iterdir() if x.name.isdigit()) == [
        "2", "4"]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    mesh = {k[5:]: mesh_npz[1][k] for k in mesh_npz[1].files if k.startswith("mesh/")}
    assert [int(r["update"]) for r in rows] == [0, 1, 2, 3]
    for name in ("return", "episodes", "lag_mean"):
        np.testing.assert_array_equal([float(r[name]) for r in rows],
                                      mesh[f"metrics['{name}']"].reshape(-1), err_msg=name)
    for name in ("actor_loss", "critic_loss", "entropy", "value_mean"):
        np.testing.assert_allclose([float(r[name]) for r in rows],
                                   mesh[f"metrics['{name}']"].reshape(-1), rtol=LOSS_RTOL,
                                   atol=LOSS_ATOL, err_msg=name)
    assert [float(r["version_diff_avg"]) for r in rows] == [0, 1, 1, 1]
    trace = np.loadtxt(out / "lags.trace", dtype=np.int64, ndmin=2)
    np.testing.assert_array_equal(trace, [[0] * 4, [1] * 4, [1] * 4, [1] * 4])


@pytest.mark.parametrize("flag", [["--devices", "2"], ["--mesh", "data=2"]])
def test_async_refuses_the_sync_trainers_mesh_flags(flag):
    """Pure Python, before JAX starts: --devices / --mesh would be ignored by --async."""
    from vccc_jax.commands import train, train_async

    args = train.build_parser().parse_args(["--async", *flag])
    with pytest.raises(ValueError, match="--devices / --mesh shape the synchronous trainer"):
        train_async.check(args, None)
