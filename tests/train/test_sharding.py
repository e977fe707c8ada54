"""The trainer over a device mesh (issue 10): mesh parsing and layouts in-process; meshes
(1,1), (8,1), (4,2) against one device, a checkpoint moved from (4,2) to (8,1) and a
two-process run in subprocesses with fake CPU devices (XLA_FLAGS must precede jax import).
The subprocesses run XLA:CPU with --xla_cpu_max_isa=SSE4_2 (see _scale_common.py)."""

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vccc_jax.train import sharding as sh
from vccc_jax.train.trainer import TrainConfig, Trainer

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
PY = sys.executable
# Tolerances held across meshes. The learner's minibatches are split over "data" (one
# gradient all-reduce per minibatch), so sums are reordered: measured after 4 updates on
# (8,1) and (4,2): params / Adam moments max abs diff 1.2e-7 (max rel
# 3.8e-6, on entries ~1e-3); losses max abs 2.6e-7 (the actor loss is a ~1e-4 mean of O(1)
# normalised-advantage terms, so its relative error is large); env means ~1 ulp.
# Rollouts stay bitwise (first rollout, from equal params).
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-7


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "VCCC_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _group(npz, prefix):
    return {k[len(prefix):]: npz[k] for k in npz.files if k.startswith(prefix)}


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# -- in-process: parsing, layouts, errors ----------------------------------------------


def test_parse_mesh():
    assert sh.parse_mesh(None, 8) == (8, 1)
    assert sh.parse_mesh("data=4,model=2", 8) == (4, 2)
    assert sh.parse_mesh("model=2", 8) == (1, 2)
    assert sh.parse_mesh("2,4", 8) == (2, 4)
    for bad in ("data=16", "batch=2", "data=x", "data=0"):
        with pytest.raises(ValueError):
            sh.parse_mesh(bad, 8)


def test_layouts_and_divisibility():
    tr = Trainer(TrainConfig(num_envs=6, num_steps=4, num_minibatches=2, hidden=16,
                             lag="fixed:1", num_versions=2, total_timesteps=6 * 4))
    abstract = jax.eval_shape(lambda: tr.init(tr.seed_keys()))
    specs = sh.state_specs(abstract, 2)
    assert specs.env.obs == P(None, "data")
    assert specs.actor_params["params"]["Dense_0"]["kernel"] == P()
    fsdp = sh.state_specs(abstract, 2, fsdp=True, ring="params")
    # [seed, 4, 16] kernel: the 16 goes over "data"; the ring shards the same dim
    assert fsdp.actor_params["params"]["Dense_0"]["kernel"] == P(None, None, "data")
    assert fsdp.versions.params["params"]["Dense_0"]["kernel"] == P(None, None, None, "data")
    assert sh.state_specs(abstract, 2, fsdp=True).versions.params["params"]["Dense_0"][
        "kernel"] == P()  # auto: a small ring stays replicated
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1] * 1).reshape(1, 1), sh.AXES)
    sh.check_divisible(6, mesh)
    fake = type("M", (), {"shape": {"data": 4, "model": 1}})()
    with pytest.raises(ValueError, match="num_envs=6.*data axis"):
        sh.check_divisible(6, fake)


def test_initialize_distributed_reads_env():
    assert sh.initialize_distributed(environ={}) is False
    with pytest.raises(ValueError, match="process_id"):
        sh.initialize_distributed(environ={"VCCC_COORDINATOR": "127.0.0.1:1",
                                           "VCCC_NUM_PROCESSES": "2"})


# -- subprocess: one device vs meshes, checkpoint across meshes ------------------------


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh")
    proc = subprocess.run([PY, str(HERE / "_mesh_worker.py"), str(out)], env=_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out / "mesh.npz")


def test_one_device_mesh_is_the_plain_trainer(mesh_run):
    for part in ("state", "metrics"):
        _assert_equal(_group(mesh_run, f"plain/{part}"), _group(mesh_run, f"1x1/{part}"))


@pytest.mark.parametrize("mesh", ["8x1", "4x2"])
def test_rollouts_bitwise_and_learning_allclose(mesh_run, mesh):
    _assert_equal(_group(mesh_run, "1x1/rollout"), _group(mesh_run, f"{mesh}/rollout"))
    ref, got = _group(mesh_run, "1x1/metrics"), _group(mesh_run, f"{mesh}/metrics")
    assert ref.keys() == got.keys()
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=LOSS_RTOL, atol=LOSS_ATOL, err_msg=k)
    ref_s, got_s = _group(mesh_run, "1x1/state"), _group(mesh_run, f"{mesh}/state")
    for k in ref_s:
        np.testing.assert_allclose(got_s[k], ref_s[k], rtol=PARAM_RTOL, atol=PARAM_ATOL,
                                   err_msg=k)


def test_checkpoint_saved_on_4x2_restores_on_8x1(mesh_run):
    # bit for bit: the orbax round trip onto another mesh changes nothing (the same
    # (8,1) program continues from the same bits)
    _assert_equal(_group(mesh_run, "resumed/"), _group(mesh_run, "moved/"))
    ref, got = _group(mesh_run, "1x1/state"), _group(mesh_run, "resumed/state")
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=PARAM_RTOL, atol=PARAM_ATOL, err_msg=k)


# -- two processes on localhost --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _restore_final(out: Path):
    """(numpy leaves by keystr, meta) of the latest checkpoint in ``out/checkpoint``, restored
    onto this process's single device (written by 8 devices of 2 processes)."""
    sys.path.insert(0, str(HERE))
    from _scale_common import tiny_config

    from vccc_jax.train import checkpoint as ck

    st = sh.ShardedTrainer(Trainer(tiny_config()), sh.make_mesh((1, 1)))
    mngr = ck.manager(out / "checkpoint", async_save=False)
    try:
        state, meta = ck.restore(mngr, st.abstract_state, st.shardings)
    finally:
        mngr.close()
    flat_state = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat_state}, meta


def test_two_processes_equal_one(mesh_run, tmp_path):
    # `vccc train` in two processes (VCCC_* variables, 4 devices each, a global (8,1) mesh)
    coordinator = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "run"
    procs = []
    try:
        for pid in range(2):
            env = _env(VCCC_COORDINATOR=coordinator, VCCC_NUM_PROCESSES="2",
                       VCCC_PROCESS_ID=str(pid))
            procs.append(subprocess.Popen(
                [PY, str(HERE / "_multiproc_worker.py"), str(out)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    # process 0 wrote the table once; both wrote their shards of checkpoints 2 and 4
    assert sorted(x.name for x in (out / "checkpoint").iterdir() if x.name.isdigit()) == [
        "2", "4"]
    config = json.loads((out / "config.json").read_text())
    assert config["devices"] == 8 and config["processes"] == 2
    state, meta = _restore_final(out)
    ref = _group(mesh_run, "8x1/state")  # cross-process reductions: measured 1.2e-10 abs
    assert state.keys() == ref.keys()
    for k, v in state.items():
        np.testing.assert_allclose(v, ref[k], rtol=PARAM_RTOL, atol=PARAM_ATOL, err_msg=k)
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 4 and meta["update"] == 4 and len(meta["rows"]) == 4
    ref = _group(mesh_run, "8x1/metrics")
    for name in ("actor_loss", "critic_loss", "value_mean", "return", "kl_pi_mu"):
        got = np.array([float(r[name]) for r in rows])
        np.testing.assert_allclose(got, ref[f"['{name}']"][:, 0], rtol=LOSS_RTOL,
                                   atol=LOSS_ATOL, err_msg=name)


# -- collectives of the compiled (8,1) step, by loop nest -------------------------------


def _loops(mesh_run) -> dict:
    import json

    return {tuple(k): v for k, v in json.loads(str(mesh_run["hlo/8x1"]))}


def test_learner_splits_minibatches_over_data(mesh_run):
    # tiny config: 2 updates per call, T = 4 steps, 1 epoch x 2 minibatches. The minibatch
    # loop (trip 2 inside the update loop) holds the gradient all-reduce (one tuple
    # all-reduce of all gradients, plus the advantage-normalisation mean / std).
    loops = _loops(mesh_run)
    learner = [v for k, v in loops.items() if len(k) >= 2 and k[-1].endswith(":2")]
    assert learner and 1 <= sum(v["all-reduce"] for v in learner) <= 4, loops
    assert all(len(k) >= 1 for k in loops), loops  # nothing outside the update loop


@pytest.mark.xfail(strict=False, reason="envs/rollout.py concatenates [B] with [B] rows along "
                   "the env axis at every step (collective-permute + all-to-all); interleaving "
                   "each env's two rows removes them (not landed: must be shown bitwise-neutral)")
def test_nothing_runs_per_env_step(mesh_run):
    from vccc_jax.benchmarks.scale import env_step_collectives

    assert sum(env_step_collectives(_loops(mesh_run), 4).values()) == 0, _loops(mesh_run)
