"""The trainer over a device mesh (issues 10, 22): mesh parsing and layouts in-process;
meshes (1,1), (8,1), (4,2) (data x seed) against one device, a checkpoint moved from (4,2)
to (8,1), a two-process run, and the collectives / per-device memory of the compiled (8,1)
step, in subprocesses with fake CPU devices (XLA_FLAGS must precede jax import). The
subprocesses run XLA:CPU with --xla_cpu_max_isa=SSE4_2 (see _scale_common.py)."""

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
from _scale_common import suite_flags
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
# Rollouts stay bitwise (first rollout, from equal params: nothing crosses devices there).
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-7


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "VCCC_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = suite_flags()  # level-0 compiles, as in-process (set_devices adds to it)
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
    assert sh.parse_mesh("data=4,seed=2", 8) == (4, 2)
    assert sh.parse_mesh("seed=2", 8) == (1, 2)
    assert sh.parse_mesh("2,4", 8) == (2, 4)
    for bad in ("data=16", "batch=2", "data=x", "data=0", "model=2"):
        with pytest.raises(ValueError):
            sh.parse_mesh(bad, 8)


def test_layouts_and_divisibility():
    tr = Trainer(TrainConfig(num_envs=6, num_steps=4, num_minibatches=2, hidden=16,
                             lag="fixed:1", num_versions=2, total_timesteps=6 * 4))
    abstract = jax.eval_shape(lambda: tr.init(tr.seed_keys()))
    specs = sh.state_specs(abstract, 2)  # the leading seed axis goes over "seed"
    assert specs.env.obs == P("seed", "data")
    assert specs.actor_params["params"]["Dense_0"]["kernel"] == P("seed")
    fsdp = sh.state_specs(abstract, 2, fsdp=True, ring="params")
    # [seed, 4, 16] kernel: the 16 goes over "data"; the ring shards the same dim
    assert fsdp.actor_params["params"]["Dense_0"]["kernel"] == P("seed", None, "data")
    assert fsdp.versions.params["params"]["Dense_0"]["kernel"] == P("seed", None, None, "data")
    assert sh.state_specs(abstract, 2, fsdp=True).versions.params["params"]["Dense_0"][
        "kernel"] == P("seed")  # auto: a small ring is not split over "data"
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1] * 1).reshape(1, 1), sh.AXES)
    sh.check_divisible(6, mesh)
    fake = type("M", (), {"shape": {"data": 4, "seed": 2}})()
    with pytest.raises(ValueError, match="num_envs=6.*data axis"):
        sh.check_divisible(6, fake)
    with pytest.raises(ValueError, match="num_seeds=3.*seed axis"):
        sh.check_divisible(8, fake, num_seeds=3)
    one = sh.state_specs(jax.eval_shape(lambda s: jax.tree_util.tree_map(lambda x: x[0], s),
                                        abstract), 2, seed_axis=False)  # one seed, unbatched
    assert one.env.obs == P("data") and one.key == P()


def test_sharded_grid_cells_share_a_program_through_the_cache():
    """Key (program_key, mesh, fsdp, ring, split_learner): cells that differ only in grid
    values share one sharded program when they share a cache, with their own values; a
    different layout or no cache builds its own (nothing compiles here)."""
    from vccc_jax.train.programs import ProgramCache

    cfg = TrainConfig(num_envs=4, num_steps=4, num_minibatches=2, hidden=8, lag="uniform:1",
                      num_versions=2, total_timesteps=4 * 4)
    mesh, cache = sh.make_mesh((1, 1)), ProgramCache()
    a = sh.ShardedTrainer(Trainer(cfg), mesh, cache=cache)
    b = sh.ShardedTrainer(Trainer(cfg.replace(actor_lr=1e-2, clip=1.5)), mesh, cache=cache)
    assert a._train is b._train and a._init is b._init and len(cache) == 1
    assert float(b.values.actor_lr) == np.float32(1e-2) and float(b.values.clip) == 1.5
    assert sh.ShardedTrainer(Trainer(cfg), mesh, fsdp=True, cache=cache)._train is not a._train
    assert sh.ShardedTrainer(Trainer(cfg), mesh)._train is not a._train
    assert len(cache) == 2


def test_initialize_distributed_reads_env():
    assert sh.initialize_distributed(environ={}) is False
    with pytest.raises(ValueError, match="process_id"):
        sh.initialize_distributed(environ={"VCCC_COORDINATOR": "127.0.0.1:1",
                                           "VCCC_NUM_PROCESSES": "2"})


def test_bench_scale_counts_executed_collectives_and_speed_ups():
    from vccc_jax.benchmarks import scale as b

    zero = dict.fromkeys(b.COLLECTIVES, 0)
    by_loop = {("_train_impl:2",): dict(zero, **{"all-reduce": 3}),
               ("_train_impl:2", "rollout:16"): dict(zero, **{"all-gather": 1}),
               ("_train_impl:2", "epochs:4", "minibatches:2"): dict(zero, **{"all-reduce": 1})}
    step, every = b.executed_collectives(by_loop, num_updates=2, num_steps=16)
    # per update: 1 all-gather x T = 16 steps; 3 + 1 x 4 epochs x 2 minibatches all-reduces
    assert step == dict(zero, **{"all-gather": 16}) and every["all-reduce"] == 11
    assert b.env_step_collectives(by_loop, 16)["all-gather"] == 1  # static
    row = lambda regime, n, speed: b.Row(regime, n, 4 * n, 0.0, 1.0, 1.0, speed, zero)  # noqa: E731
    rows = [row("weak", 1, 100.0), row("weak", 2, 150.0), row("strong", 2, 80.0),
            row("strong", 4, 240.0)]
    np.testing.assert_allclose(b.speed_ups(rows), [(1, 1), (1.5, 0.75), (1, 1), (3, 1.5)])
    args = type("A", (), dict(b.defaults(), devices="1,2,3,4", regimes="weak"))()
    todo, skipped = b.plan(args, avail=4, processes=2)  # every process takes part
    assert [n for _, n, _ in todo] == [2, 4] and len(skipped) == 2
    assert b.defaults()["envs_per_device"] >= 1024 and b.defaults()["steps"] == 128


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


def test_rollouts_are_bitwise_those_of_one_device(mesh_run):
    _assert_equal(_group(mesh_run, "1x1/rollout"), _group(mesh_run, "8x1/rollout"))


@pytest.mark.parametrize("mesh", ["8x1", "4x2"])
def test_learning_allclose(mesh_run, mesh):
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

    st = sh.ShardedTrainer(Trainer(tiny_config(num_seeds=2)), sh.make_mesh((1, 1)))
    mngr = ck.manager(out / "checkpoint", async_save=False)
    try:
        state, meta = ck.restore(mngr, st.abstract_state, st.shardings)
    finally:
        mngr.close()
    flat_state = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat_state}, meta


def test_two_processes_equal_one(mesh_run, tmp_path):
    # `vccc train` in two processes (VCCC_* variables, 4 devices each, a global (8,1) mesh,
    # 2 seeds)
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
    rows = list(csv.DictReader(open(out / "metrics.csv")))  # one per (update, seed)
    assert len(rows) == 8 and meta["update"] == 4 and len(meta["rows"]) == 8
    ref = _group(mesh_run, "8x1/metrics")
    for name in ("actor_loss", "critic_loss", "value_mean", "return", "kl_pi_mu"):
        got = np.array([float(r[name]) for r in rows])
        np.testing.assert_allclose(got, ref[f"['{name}']"].reshape(-1), rtol=LOSS_RTOL,
                                   atol=LOSS_ATOL, err_msg=name)  # rows: (update, seed)


@pytest.mark.slow
def test_bench_scale_runs_under_jax_distributed(tmp_path):
    # `vccc bench scale --small` in two processes (4 fake devices each): every device count
    # takes both processes; process 0 alone writes the JSON; nothing runs per env step
    sys.path.insert(0, str(HERE))
    from _scale_common import FLAGS

    coordinator = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "scale.json"
    argv = [PY, "-m", "vccc_jax.cli", "bench", "scale", "--small", "--devices", "2,4,8",
            "--regimes", "weak", "--json", str(out)]
    procs = [subprocess.Popen(argv, env=_env(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=4 {FLAGS}", JAX_PLATFORMS="cpu",
        VCCC_COORDINATOR=coordinator, VCCC_NUM_PROCESSES="2", VCCC_PROCESS_ID=str(pid)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for pid in range(2)]
    logs = [p.communicate(timeout=1200)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["processes"] == 2 and [r["devices"] for r in doc["rows"]] == [2, 4, 8]
    for r in doc["rows"]:
        assert sum(r["per_env_step"].values()) == 0, r
    assert "weak      8" in logs[0] and "vccc bench scale" not in logs[1]


# -- collectives of the compiled (8,1) step, by loop nest -------------------------------


def _loops(mesh_run) -> dict:
    import json

    return {tuple(k): v for k, v in json.loads(str(mesh_run["hlo/8x1"]))}


def test_learner_runs_one_gradient_all_reduce_per_minibatch(mesh_run):
    # tiny config: 2 updates per call, T = 4 steps, 1 epoch x 2 minibatches. The minibatch
    # loop (trip 2 inside the update loop) holds exactly ONE collective: the tuple
    # all-reduce of every gradient (and the loss scalars, which the combiner folds in):
    # minibatches keep each env's rows on its device and advantages are normalised per
    # minibatch before the loop (before issue 22: 3 all-reduces here, and the whole [T, B]
    # batch all-gathered 9 times per update for a global shuffle).
    loops = _loops(mesh_run)
    learner = [v for k, v in loops.items() if len(k) >= 2 and k[-1].endswith(":2")]
    assert len(learner) == 1, loops
    assert {k: v for k, v in learner[0].items() if v} == {"all-reduce": 1}, loops
    assert all(len(k) >= 1 for k in loops), loops  # nothing outside the update loop
    per_update = loops[next(k for k in loops if len(k) == 1)]
    # per update, outside every loop: metric means, the per-epoch advantage statistics and
    # the all-gather of the log-ratio quantiles' sort (one float per transition), no more
    assert per_update["all-gather"] <= 1 and per_update["all-to-all"] == 0, loops
    assert per_update["collective-permute"] == 0, loops


def test_nothing_runs_per_env_step(mesh_run):
    # the rollout runs the actor once per version on each device's envs and keeps every
    # per-env row with its env ([V, B] logits, no [2B] concatenation): no collective in
    # the env-step loop (before issue 22: 1 all-gather + 4 collective-permutes per step)
    from vccc_jax.benchmarks.scale import env_step_collectives

    assert sum(env_step_collectives(_loops(mesh_run), 4).values()) == 0, _loops(mesh_run)


def test_per_device_memory_is_constant_under_weak_scaling(mesh_run):
    # memory_analysis of the compiled step, per device: (8,1) with 16 envs vs (1,1) with 2
    # (2 envs per device both, 2 seeds). Only the log-ratio quantiles' all-gather (4 bytes
    # per transition, T * B = 64 per seed) may grow with the device count. Measured: 10848
    # -> 11120 bytes of temp (before issue 22: 12536 -> 16840, mostly the learner's
    # all-gathered batch)
    temp8, arg8, out8 = mesh_run["mem/8x1"]
    temp1, arg1, out1 = mesh_run["mem/1x1_weak"]
    assert arg8 == arg1 and out8 == out1
    assert 0 <= temp8 - temp1 <= 4 * 4 * 16 * 2, (temp8, temp1)  # x 2 seeds


def test_critic_free_runs_on_a_mesh_without_moving_tokens(mesh_run):
    # issue 22 §6: the critic-free trainer is one jitted scan on the same mesh code; each
    # device packs its own episodes' kept tokens, so nothing is gathered (the rollout's H = 6
    # step loop has no collective at all) and, with no overflow, (8,1) equals (1,1)
    loops = {tuple(k): v for k, v in json.loads(str(mesh_run["hlo/cf8x1"]))}
    from vccc_jax.benchmarks.scale import env_step_collectives

    assert sum(env_step_collectives(loops, 6).values()) == 0, loops
    moved = sum(v[k] for v in loops.values() for k in ("all-gather", "all-to-all",
                                                          "collective-permute"))
    assert moved == 0, loops
    for k in ("loss", "return", "kept_fraction", "overflow"):
        ref, got = mesh_run[f"cf/1x1/{k}"], mesh_run[f"cf/8x1/{k}"]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=k)
    assert np.all(mesh_run["cf/1x1/overflow"] == 0) and np.all(mesh_run["cf/1x1/kept_fraction"] < 1)
