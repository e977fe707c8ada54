"""``vccc train --async --learner-devices 0,1`` (issue 48): the learner's state and batch on a
mesh over two forced host devices (the sharded trainer's layout, ``train.sharding``) against
the learner on one device, ``lag1`` mode with one actor thread (deterministic), 4 updates, in a
subprocess (XLA_FLAGS must precede the jax import; tests/train/_async_mesh_worker.py)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sharding import LOSS_ATOL, LOSS_RTOL, PARAM_ATOL, PARAM_RTOL, _env

HERE = Path(__file__).parent


def test_a_learner_sharded_over_two_devices_equals_one_learner_device(tmp_path):
    """Versions and actions equal exactly; params and losses to the sharded trainer's
    tolerances (test_sharding.py: rtol 1e-5, atol 1e-7 / 1e-6): the mesh splits every
    minibatch over "data", so the gradient sums are reduced in another order (float32
    rounding, not a different computation); the env-step loop runs on the actor device in
    both runs."""
    proc = subprocess.run([sys.executable, str(HERE / "_async_mesh_worker.py"), str(tmp_path)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    npz = np.load(tmp_path / "async_mesh.npz")
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


@pytest.mark.parametrize("extra, env, match", [
    (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "0"], {},
     r"runs in one process \(jax.distributed start: explicit\)"),
    ([], {"VCCC_COORDINATOR": "h:1"}, r"start: explicit\).*make_array_from_process_local"),
    ([], {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "a,b", "SLURM_NTASKS": "2",
          "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, r"start: slurm"),
    (["--devices", "2"], {}, "--devices / --mesh shape the synchronous trainer's mesh"),
])
def test_async_refuses_multi_host_runs_and_the_sync_mesh_flags(monkeypatch, extra, env, match):
    """Pure Python, before JAX starts: what --async does not run, said in one message."""
    from vccc_jax.commands import train, train_async

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = train.build_parser().parse_args(["--async", *extra])
    with pytest.raises(ValueError, match=match):
        train_async.check(args, None)
