"""``vccc train --async`` (issue 48): the real pipeline against the simulator, its faults, the
measured lag and its replay through the ``trace`` law. Small shapes; every wait bounded; no
assertion on a duration (the SIGINT test bounds its waits only to fail instead of hanging)."""

import csv
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs.lag import LagLaw
from vccc_jax.runs.train_async import run_async
from vccc_jax.train import async_lag as al
from vccc_jax.train import async_pipeline as ap
from vccc_jax.train import trainer as tr
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

SMALL = dict(env="CartPole-v1", num_envs=4, num_steps=8, update_epochs=1, num_minibatches=2,
             hidden=8, gt_every=0, eval_envs=0, seed=3)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])  # categorical / Gaussian head
def test_lag1_one_actor_thread_is_the_simulators_fixed1_run(env):
    """Same seeds: the random draws are the simulator's (the actor's key chain is the
    learner state's, split as ``trainer.update`` splits it), so actions, rewards, episodes and
    lags are equal exactly, and update 0 (lag 0) is bit for bit. From update 1 on log pi_k of
    the stale steps comes from a plain [steps x B] forward, where the simulator takes row 0 of
    its two-version batched forward ([2, B]): float32 rounding, so floats agree to 1e-4."""
    cfg = TrainConfig(**(SMALL | {"env": env}), total_timesteps=4 * 8 * 6, lag="fixed:1")
    trainer = Trainer(cfg)
    sim_state, sim = trainer.train(trainer.init())
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    pipe = ap.Pipeline(trainer, ap.AsyncSpec(timeout=120.0), state,
                       ap.initial_actor_keys(state.key, 1), 0)
    got = []
    try:
        for k, batch, state, m in pipe.drive(state, trainer.num_updates):
            got.append(jax.device_get(m) | {"version": np.asarray(batch.traj.version)})
    finally:
        assert pipe.close() == []
    assert [int(g["version"].max()) for g in got] == [0, 0, 1, 2, 3, 4]  # one stale, capped
    for name, column in sim.items():
        want = np.asarray(column)[:, 0]
        have = np.stack([np.asarray(g[name]) for g in got])
        np.testing.assert_array_equal(have[0], want[0], err_msg=name)
        if name in ("return", "episodes", "lag_mean", "count_by_lag", "nonfinite"):
            np.testing.assert_array_equal(have, want, err_msg=name)
        else:
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-6, err_msg=name)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a[0], b, atol=1e-5),
                           sim_state.actor_params, state.actor_params)


class _EveryOtherVersion(ap.Pipeline):
    """Drops on a fixed schedule: rollout j acts with version max(j // 2 - 1, 0), waiting
    for it, so under ``bounded:1`` the learner drops rollouts 2 and 3 (lag 2) at update 2
    and one (lag 2) at every later update, whatever the threads' timing."""

    def _params_for(self, i, j, c=0):
        version = max(j // 2 - 1, 0)
        return version, self.channel.wait_for(version, self.stop_event,
                                              self.spec.timeout)[self.actor_device[i]]


def test_dropped_rollouts_replay_exactly_in_the_simulator(tmp_path):
    """One actor thread, ``bounded:1``: the trace records every dropped rollout (``L/d1/d2``)
    and the simulator's ``trace`` law advances the envs through them with the actor's next
    keys before the learned rollout, so actions, rewards, episodes and returns equal the
    real run's exactly; floats to 1e-4 as in the lag1 test (its docstring says why)."""
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 6, num_versions=3)  # by-lag columns
    trainer = Trainer(cfg)
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    pipe = _EveryOtherVersion(trainer, ap.AsyncSpec(queue=2, mode="bounded:1", timeout=120.0),
                              state, ap.initial_actor_keys(state.key, 1), 0)
    got, trace = [], al.LagTrace()
    try:
        for k, batch, state, m in pipe.drive(state, trainer.num_updates):
            got.append(jax.device_get(m))
            trace.add(k - np.asarray(batch.traj.version)[0],
                      al.drop_lags(k, batch.drop_versions, cfg.num_envs))
            assert batch.drop_versions == [((),), ((),), ((0, 0),), ((1,),), ((2,),), ((3,),)][k]
    finally:
        assert pipe.close() == []
    path = trace.write(tmp_path)
    assert path.read_text().splitlines()[2] == "1/2/2 1/2/2 1/2/2 1/2/2"
    law = LagLaw.parse(f"trace:@{path}")
    assert law.max_lag() == 2 and law.mean(3) == pytest.approx(5 / 6)  # learned lags only
    sim = Trainer(cfg.replace(lag=f"trace:@{path}", num_versions=3))
    _, want = sim.train(sim.init())
    _, old = Trainer(cfg.replace(lag="fixed:1")).train(Trainer(cfg.replace(
        lag="fixed:1")).init())  # the same learned lags, the drops ignored: not the run
    assert not np.array_equal(np.asarray(old["return"])[:, 0],
                              np.stack([g["return"] for g in got]))
    for name, column in want.items():
        have = np.stack([np.asarray(g[name]) for g in got])
        if name in ("return", "episodes", "lag_mean", "count_by_lag", "nonfinite"):
            np.testing.assert_array_equal(have, np.asarray(column)[:, 0], err_msg=name)
        else:
            np.testing.assert_allclose(have, np.asarray(column)[:, 0], rtol=1e-4, atol=1e-6,
                                       err_msg=name)


def test_replay_drops_advances_each_env_through_its_own_drops_only():
    """Envs of one update with 1, 0, 2 and 0 dropped rollouts (two actor threads would give
    such counts): ``trainer.replay_drops`` leaves the envs without drops as they were and
    moves the others through exactly their own dropped rollouts, each pass one rollout of the
    actor's key chain at the recorded lags (its docstring): against those passes written out."""
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 2,
                      lag="trace:0/1,0,0/1/0,0,0,0,0,0", num_versions=3)
    trainer = Trainer(cfg)
    setup, values = trainer.setup, trainer.values
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    env, _ = jax.jit(lambda s: tr.replay_drops(setup, values, s, 0))(state)
    lags = np.array([[1, 0, 1, 0], [0, 0, 0, 0]])  # the law's drops_at(0): pass i, env b
    passes, carry, key = [], state.env, state.key
    for i in range(2):
        key, _, k_roll, _, _ = jax.random.split(key, 5)
        carry, _ = tr.rollout_step(setup, values, state.actor_params, state.versions, carry,
                                   k_roll, 0, lags=jnp.asarray(lags[i], jnp.int32))
        passes.append(carry)
    for b, want in enumerate((passes[0], state.env, passes[1], state.env)):
        for got_leaf, want_leaf in zip(jax.tree_util.tree_leaves(env),
                                       jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(np.asarray(got_leaf)[b], np.asarray(want_leaf)[b])
    assert not np.array_equal(np.asarray(passes[0].obs)[0], np.asarray(state.env.obs)[0])


def test_a_failing_actor_thread_stops_the_run_keeping_rows_and_checkpoint(tmp_path):
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 20)
    spec = ap.AsyncSpec(fail_at=(0, 3), timeout=120.0)
    with pytest.raises(ap.ActorFailed) as e:
        run_async(cfg, spec, tmp_path, checkpoint_every=0)
    assert str(e.value) == "actor-0 raised RuntimeError: injected failure before rollout 3"
    rows = _rows(tmp_path / "metrics.csv")
    assert [int(r["update"]) for r in rows] == [0, 1, 2]  # every rollout made was learned
    assert sorted(int(p.name) for p in (tmp_path / "checkpoint").iterdir()
                  if p.name.isdigit()) == [3]
    assert len((tmp_path / al.TRACE_FILE).read_text().splitlines()) == 3


def test_measured_lags_replay_through_the_trace_law(tmp_path):
    """latest mode, 2 actor threads, queue 2: whatever the timing, the lags.trace rows are the
    per-env lags of metrics.csv's histograms, and the simulator's ``trace`` law reads them
    back at the very (update, env) they were measured: its lag_mean is the trace's."""
    cfg = TrainConfig(**SMALL, total_timesteps=4 * 8 * 8)
    spec = ap.AsyncSpec(actors=2, queue=2, mode="latest", timeout=120.0)
    _, rows = run_async(cfg, spec, tmp_path)
    path = tmp_path / al.TRACE_FILE
    trace = np.loadtxt(path, dtype=np.int64, ndmin=2)
    assert trace.shape == (8, 4)
    for k, row in enumerate(rows):
        assert row["version_diff_max"] == trace[k].max() and row["version_diff_min"] == \
            trace[k].min()
        np.testing.assert_allclose([row[f"lag_hist{j}"] for j in range(al.HIST_BINS)],
                                   al.histogram(trace[k]))
        assert 0 <= trace[k].min() and trace[k].max() <= k  # no version before 0
    law = LagLaw.parse(f"trace:@{path}")
    K = int(trace.max()) + 1
    for k in range(8):
        drawn = law.sample(jax.random.PRNGKey(0), 4, K, available=k + 1, step=k)
        np.testing.assert_array_equal(np.asarray(drawn), trace[k])
    sim = Trainer(TrainConfig(**dict(SMALL, num_envs=4), total_timesteps=4 * 8 * 8,
                              lag=f"trace:@{path}", num_versions=K))
    _, m = sim.train(sim.init())
    np.testing.assert_allclose(np.asarray(m["lag_mean"])[:, 0], trace.mean(1), rtol=1e-6)


def test_the_trace_writes_drops_per_env_and_reads_old_rows():
    """Per actor slice (2 actors, 4 envs): drop_lags turns a batch's dropped versions into
    lags at the update; rows without drops are written as before (bare integers), and a
    checkpoint's rows without ``trace_drops`` (an older run) load with no drops."""
    assert al.drop_lags(5, ((3,), (2, 4)), 4) == [[2], [2], [3, 1], [3, 1]]
    assert al.drop_lags(5, (), 2) == [[], []]
    trace = al.LagTrace([[1, 1, 0, 0]])
    trace.add(np.array([4, 4, 4, 4]), al.drop_lags(5, ((3,), (2, 4)), 4))
    assert trace.lines() == ["1 1 0 0", "4/2 4/2 4/3/1 4/3/1"]
    again = al.LagTrace(trace.rows, trace.drops)
    assert again.lines() == trace.lines()
    law = LagLaw.parse("trace:" + " ".join(trace.lines()))
    assert law.trace == (1, 1, 0, 0, 4, 4, 4, 4) and law.drops[6] == (3, 1)


def test_trajectory_lags_span_rollouts():
    """Two envs, two batches: env 0's episode crosses the batches (versions 3 then 5), env 1's
    ends in the first; per-trajectory mean lag, oldest-step lag and the multi-version share."""
    tl = al.TrajectoryLags(2)
    v1, d1 = np.array([[3, 3], [3, 3]]), np.array([[0, 0], [0, 1]], bool)
    out1 = tl.update(v1, 4 - v1, d1)
    assert out1["trajectories"] == 1 and out1["traj_staleness_avg"] == 1.0
    assert out1["traj_multi_version_frac"] == 0.0
    v2, d2 = np.array([[5, 5], [5, 5]]), np.array([[1, 0], [0, 0]], bool)
    out2 = tl.update(v2, 6 - v2, d2)
    assert out2["trajectories"] == 1 and out2["traj_multi_version_frac"] == 1.0
    assert out2["traj_staleness_avg"] == pytest.approx((1 + 1 + 1) / 3)
    assert out2["traj_lag_hist1"] == 1.0 and np.isnan(out2["lag_len_corr"])


def _cli(out, extra=()):
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=2",
               PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "vccc_jax.cli", "train", "--async", "--env", "CartPole-v1",
           "--num-envs", "4", "--num-steps", "4", "--update-epochs", "1",
           "--num-minibatches", "1", "--hidden", "8", "--total-timesteps", str(16 * 100000),
           "--gt-every", "0", "--eval-envs", "0", "--actor-threads", "2",
           "--param-mode", "latest", "--actor-devices", "0", "--learner-devices", "1",
           "--checkpoint-every", "1", "--quiet", "--no-figure", "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _sigint_after_rows(proc, csv_path, more_than: int) -> tuple[int, str]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if csv_path.exists() and len(_rows(csv_path)) > more_than:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the async run did not stop within 60 s of SIGINT")
    return proc.returncode, err


def test_sigint_stops_every_thread_and_resume_continues(tmp_path):
    out = tmp_path / "run"
    rc, err = _sigint_after_rows(_cli(out), out / "metrics.csv", 2)
    assert rc == 130, err
    assert "interrupted after update" in err and "--resume" in err
    first = [int(r["update"]) for r in _rows(out / "metrics.csv")]
    assert first == list(range(len(first)))
    rc, err = _sigint_after_rows(_cli(out, ["--resume"]), out / "metrics.csv", len(first) + 2)
    assert rc == 130, err
    rows = _rows(out / "metrics.csv")
    assert [int(r["update"]) for r in rows] == list(range(len(rows))) and len(rows) > len(first)
    trace = (out / al.TRACE_FILE).read_text().splitlines()
    assert len(trace) == len(rows)


def test_the_console_summary_names_each_window():
    """Issue 45 row 8 in the async summary: every number states what it averages over, and
    fewer than 5 seeds print no 95% interval (a hand-made summary: nothing compiled)."""
    from vccc_jax.commands.train_async import summary_lines

    one = {"mean": 70.5, "n": 1, "interval": "n = 1: no interval", "per_seed": [70.5]}
    summary = {"final_return": dict(one, window="behaviour return, mean over the last 1 of 4 updates"),
               "lag_mean": dict(one, mean=0.75, window="mean over all 4 updates")}
    rows = [{"version_diff_avg": v, "version_diff_min": int(v), "version_diff_max": 1}
            for v in (0.0, 1.0, 1.0, 1.0)]
    lines = summary_lines(summary, rows)
    assert lines[0] == ("      final_return: 70.5 (n = 1: no interval); behaviour return, mean "
                        "over the last 1 of 4 updates")
    assert lines[1].endswith("0.75 (n = 1: no interval); mean over all 4 updates")
    assert lines[2] == ("  version_diff_avg: 0.750; mean over all 4 updates (the last: min 1, "
                        "max 1)")
    assert not any("95%" in line for line in lines)
