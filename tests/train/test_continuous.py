"""Continuous actions in the one trainer (issue 44): the lqr: env spec and env (against NumPy);
the Gaussian head chosen from the Box action space; the log mu the rollout logs is the
density of the action under the behaviour version really used, noise scale included (NumPy
reference); lag 0 is exactly on-policy (log-ratios bit-for-bit 0) on the plain and the
tanh-squashed head; what cannot work is refused when the config is parsed, with its reason;
Polyak, replay, the decoupled pi_old routes, the learned baseline, critic-first and the
Z-centred target run; Monte-Carlo truth matches the exact LQR value; ``vccc train`` writes the
run directory of every other run and resumes byte for byte. Tiny sizes."""

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.envs.lqr_env import env_lqr, make_lqr_env
from vccc_jax.envs.policy_heads import GaussianHead
from vccc_jax.envs.spec import env_gamma, parse_lqr_spec
from vccc_jax.train import learner
from vccc_jax.train.config import TrainConfig, continuous_actions
from vccc_jax.train.programs import grid_values
from vccc_jax.train.setup import make_setup
from vccc_jax.train.trainer import Trainer

ENV = "lqr:dim=2,act=1,gamma=0.8,seed=3,max_steps=5"
CFG = TrainConfig(env=ENV, num_envs=4, num_steps=6, total_timesteps=48, num_minibatches=2,
                  update_epochs=1, hidden=8, num_layers=1, lag="uniform:2", critic="vccc",
                  gamma=0.8)


def test_lqr_spec_and_errors():
    assert parse_lqr_spec(ENV) == dict(dim=2, act=1, gamma=0.8, seed=3, radius=0.8, max_steps=5)
    assert env_gamma(ENV) == 0.8 and continuous_actions(ENV) and continuous_actions("Pendulum-v1")
    assert continuous_actions("brax:fast") and not continuous_actions("CartPole-v1")
    for bad, msg in (("lqr:dim=0", "must be >= 1"), ("lqr:foo=1", "unknown key"),
                     ("lqr:gamma=1.5", "gamma must lie"), ("lqr:dim=x", "is not an int")):
        with pytest.raises(ValueError, match=msg):
            parse_lqr_spec(bad)


def test_lqr_env_step_is_the_problem():
    env, params = make_lqr_env(ENV)
    p = env_lqr(ENV)
    _, st = env.reset(jax.random.PRNGKey(0), params)
    s, a = np.asarray(st.s, np.float64), np.array([0.7])
    key = jax.random.PRNGKey(1)
    obs, new, r, term, _ = env.step_env(key, st, jnp.asarray(a, jnp.float32), params)
    w = np.linalg.cholesky(np.asarray(p.w)) @ np.asarray(jax.random.normal(key, (2,)), np.float64)
    want = np.asarray(p.a) @ s + np.asarray(p.b) @ a + w
    np.testing.assert_allclose(obs, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r, -(s @ np.asarray(p.q) @ s + a @ np.asarray(p.r) @ a), rtol=1e-5)
    assert not bool(term)
    for _ in range(5):   # the time limit truncates (max_steps = 5), never terminates
        _, st, _, term, trunc, _ = env.step(key, st, jnp.zeros(1), params)
    assert bool(trunc) and not bool(term)


def _np_log_normal(x, m, s):
    return np.sum(-0.5 * ((x - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), -1)


def _rollout(setup, versions, lags, key):
    carry = rollout_lib.reset(setup.env, setup.env_params, jax.random.PRNGKey(9), 4)
    return jax.jit(lambda v, c, k: rollout_lib.rollout(
        setup.env, setup.env_params, setup.actor_logits, v, c, k, num_steps=6,
        lags=jnp.asarray(lags, jnp.int32), head=setup.head))(versions, carry, key)[1]


def test_head_follows_the_action_space_and_logged_log_mu_is_the_sampled_density():
    setup = make_setup(CFG.replace(noise_scale=1.3))
    assert isinstance(setup.head, GaussianHead) and setup.head.noise_scale == 1.3
    assert setup.num_actions == 2 and make_setup(CFG.replace(env="CartPole-v1", gamma=0.99,
                                                             critic="gae")).num_actions == 2
    old = setup.actor_net.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
    newer = jax.tree_util.tree_map(lambda x: x + 0.3, old)
    ring = lag_lib.push(lag_lib.init_buffer(old, 2), newer)
    lags = [0, 1, 1, 0]
    traj = _rollout(setup, ring, lags, jax.random.PRNGKey(2))
    assert traj.action.shape == (6, 4, 1) and traj.log_mu_all.shape == (6, 4, 2)
    for b, lag in enumerate(lags):
        p = (newer, old)[lag]["params"]
        obs, u = np.asarray(traj.obs[:, b]), np.asarray(traj.action[:, b])
        # lqr: env -> linear actor mean (the family whose V^pi is exact)
        mean = obs @ np.asarray(p["Dense_0"]["kernel"]) + np.asarray(p["Dense_0"]["bias"])
        std = np.exp(np.asarray(p["log_std"]))
        np.testing.assert_allclose(traj.log_mu[:, b], _np_log_normal(u, mean, 1.3 * std),
                                   rtol=1e-4, atol=1e-4)
        p0 = newer["params"]      # pi_k = the newest version, unscaled
        m0 = obs @ np.asarray(p0["Dense_0"]["kernel"]) + np.asarray(p0["Dense_0"]["bias"])
        log_pi = setup.head.log_prob(traj.log_pi_all[:, b], traj.action[:, b])
        np.testing.assert_allclose(log_pi, _np_log_normal(u, m0, np.exp(np.asarray(p0["log_std"]))),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("squash", [False, True])
def test_lag_zero_is_exactly_on_policy(squash):
    """Every env at lag 0 of a two-version ring: log rho == 0 bit for bit, so Z == 1 and the
    Z-centred target is its uncorrected form; the env got the clipped / squashed action."""
    cfg = CFG.replace(env="Pendulum-v1", gamma=0.99, squash=squash, critic="centered_baseline")
    setup = make_setup(cfg)
    params = setup.actor_net.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    ring = lag_lib.push(lag_lib.init_buffer(params, 2), jax.tree_util.tree_map(lambda x: x - 0.2, params))
    traj = _rollout(setup, ring, [0, 0, 0, 0], jax.random.PRNGKey(3))
    critic = setup.critic_net.init(jax.random.PRNGKey(1), jnp.zeros((1, 3)))
    prep = learner.prepare(setup, grid_values(cfg), traj, critic)
    assert np.all(np.asarray(prep.inputs.transitions.log_rhos) == 0.0)
    z = setup.head.expected_weight(prep.inputs.log_pi_all, prep.inputs.log_mu_all, "truncate", 2.0)
    assert np.all(np.asarray(z) == 1.0)
    assert np.all(np.abs(np.asarray(setup.head.env_action(traj.action))) <= 2.0)


@pytest.mark.parametrize("change, says", [
    (dict(sampler="temp=0.5"), "finite action set"),
    (dict(top_k=2), "finite action set"),
    (dict(actor="centered-ratio"), "no closed"),
    (dict(critic="vccc_bstar"), "finite state set"),
    (dict(critic="centered_baseline", env="lqr:dim=2,act=2,gamma=0.8"), "1-d Gaussian actions only"),
    (dict(env="CartPole-v1", noise_scale=2.0, gamma=0.99), "discrete actions"),
])
def test_what_cannot_work_is_refused_when_parsed(change, says):
    with pytest.raises(ValueError, match=says):
        CFG.replace(**change)


@pytest.mark.parametrize("extra", [
    dict(polyak=0.5, replay_updates=1, critic_first=True, baseline="learned",
         critic="centered_baseline", pi_old_route="ewma", gt_every=2, gt_states=2,
         gt_rollouts=2, gt_horizon=4, eval_envs=0),
    dict(pi_old_route="interpolated", squash=True, critic="truncated"),
    dict(pi_old_route="exact", noise_scale=1.5, critic="vtrace", gt_every=1, gt_states=2,
         gt_rollouts=2, gt_horizon=4, eval_envs=0),
])
def test_discrete_features_run_on_continuous_actions(extra):
    """What runs on a discrete env runs here (finite losses, lags drawn, the route's KL)."""
    cfg = CFG.replace(env="Pendulum-v1", gamma=0.99, num_steps=8, total_timesteps=96, **extra)
    tr = Trainer(cfg)
    _, m = tr.train(tr.init())
    for name in ("actor_loss", "critic_loss", "entropy", "kl_pi_mu", "ess", "pi_old_kl"):
        assert np.all(np.isfinite(np.asarray(m[name]))), name
    assert float(np.asarray(m["lag_mean"])[-1].mean()) > 0.0
    if cfg.gt_every:
        assert np.isfinite(np.asarray(m["gt_mse"])[cfg.gt_every - 1]).all()


def test_monte_carlo_truth_matches_the_exact_lqr_value():
    """Monte-Carlo V^pi through the trainer's policy (``Setup.act``) on an lqr: env, where
    V^pi is exact: |V_mc - V^pi| <= 5 s.e. + the horizon cut's bound at every state (level
    < 1e-4 per state by the CLT; a dropped discount or the behaviour's noise scale in the
    evaluated policy move V_mc by many s.e.)."""
    from vccc_jax.envs import ground_truth as gt_lib
    from vccc_jax.tabular import lqr as lq

    setup = make_setup(CFG.replace(noise_scale=1.3))
    p = setup.actor_net.init(jax.random.PRNGKey(4), jnp.zeros((1, 2)))["params"]
    gain = np.array([[-0.3, 0.2]], np.float32)     # a stable, non-trivial linear-Gaussian pi_k
    actor = {"params": {**p, "Dense_0": {"kernel": jnp.asarray(gain.T), "bias": jnp.asarray([0.1])},
                        "log_std": jnp.asarray([-0.2])}}
    carry = rollout_lib.reset(setup.env, setup.env_params, jax.random.PRNGKey(6), 4)
    gt = gt_lib.mc_values_policy(setup.env, setup.env_params, setup.act, actor, carry.env_state,
                                 carry.obs, jax.random.PRNGKey(5), num_rollouts=256, horizon=60,
                                 gamma=0.8)
    with jax.enable_x64(True):
        pol = lq.GaussianPolicy(jnp.asarray(gain, jnp.float64), jnp.asarray([0.1]), jnp.asarray([-0.2]))
        v_true = np.asarray(lq.value(env_lqr(ENV), pol)(jnp.asarray(np.asarray(carry.obs), jnp.float64)))
    tail = 0.8 ** 60 * np.abs(v_true).max() * 10
    assert np.all(np.abs(np.asarray(gt.value) - v_true) <= 5 * np.asarray(gt.stderr) + tail)
    assert np.all(np.asarray(gt.stderr) < 0.05 * np.abs(v_true))   # power


def test_lqr_exact_truth_is_the_closed_form():
    """The trainer's exact metrics on an lqr: env (``exact_metrics.lqr_metrics``) against a
    float64 reference written here: V^pi, V^{mu_l} (noise scale 1.3) by ``tabular.lqr.value``
    from hand-built policies, and the replay mixture's V by value iteration of
    sum_l q_l T_{mu_l} (0.8^400: converged), RMS errors under equal state weights."""
    from vccc_jax.tabular import lqr as lq
    from vccc_jax.train import exact_metrics

    setup = make_setup(CFG.replace(noise_scale=1.3))
    p = setup.actor_net.init(jax.random.PRNGKey(4), jnp.zeros((1, 2)))["params"]
    gains, biases, log_stds = ([[-0.3, 0.2]], [[-0.1, 0.1]]), ([0.1], [-0.2]), ([-0.2], [0.1])
    versions = [{"params": {**p, "Dense_0": {"kernel": jnp.asarray(np.array(g, np.float32).T),
                                             "bias": jnp.asarray(b, jnp.float32)},
                            "log_std": jnp.asarray(s, jnp.float32)}}
                for g, b, s in zip(gains, biases, log_stds)]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *versions)
    critic = setup.critic_net.init(jax.random.PRNGKey(5), jnp.zeros((1, 2)))
    obs = jax.random.normal(jax.random.PRNGKey(6), (3, 4, 2))
    q = jnp.asarray([0.4, 0.6])
    got = exact_metrics.lqr_metrics(env_lqr(ENV), setup.critic_values, versions[0], critic, stacked,
                                    float(np.log(1.3)), q, obs, jnp.ones((3, 4)))
    with jax.enable_x64(True):
        prob = env_lqr(ENV)
        f = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731
        pols = [lq.GaussianPolicy(f(g), f(b), f(s) + np.log(1.3)) for g, b, s in zip(gains, biases, log_stds)]
        states = f(np.asarray(obs).reshape(-1, 2))
        v = np.asarray(setup.critic_values(critic, obs.reshape(-1, 2)), np.float64)
        v_pi = lq.value(prob, lq.GaussianPolicy(f(gains[0]), f(biases[0]), f(log_stds[0])))(states)
        vbar = lq.Quadratic(jnp.zeros((2, 2)), jnp.zeros(2), f(0.0))
        for _ in range(400):
            vbar = jax.tree_util.tree_map(lambda a, b: 0.4 * a + 0.6 * b, lq.bellman(prob, pols[0], vbar),
                                          lq.bellman(prob, pols[1], vbar))
        rms = lambda x: float(np.sqrt(np.mean(np.square(np.asarray(x)))))  # noqa: E731
        want = {"exact_err_pi": rms(v - v_pi), "exact_err_mix": rms(v - vbar(states)),
                "exact_v_pi": float(np.mean(v_pi)),
                "exact_err_mu": [rms(v - lq.value(prob, m)(states)) for m in pols]}
    for k, val in want.items():
        np.testing.assert_allclose(got[k], val, rtol=2e-4, err_msg=k)
    assert np.isnan(float(got["exact_grad_bias"]))


def test_vccc_train_run_directory_and_byte_identical_resume(tmp_path, capsys):
    """``vccc train`` on an lqr: env writes config.json, summary.json, metrics.csv and
    checkpoints like any run; dropping the last checkpoint and ``--resume`` reproduce
    metrics.csv byte for byte; the same command again is refused, ``--overwrite`` reruns."""
    import shutil

    from vccc_jax.commands import train as cmd

    out = tmp_path / "run"
    argv = ["--env", ENV, "--gamma", "0.8", "--lag", "uniform:2", "--critic", "vccc",
            "--num-envs", "4", "--num-steps", "6", "--timesteps", "96", "--num-minibatches",
            "2", "--update-epochs", "1", "--hidden", "8", "--num-layers", "1", "--gt-every",
            "2", "--seeds", "2", "--out", str(out), "--no-figure", "--quiet",
            "--checkpoint-every", "2"]
    assert cmd.main(argv) == 0
    assert {p.name for p in out.iterdir()} >= {"config.json", "summary.json", "metrics.csv", "checkpoint"}
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 4 * 2 and rows[0]["lag_mean"] == "0.0"
    assert all(np.isfinite(float(r["exact_err_pi"])) for r in rows if int(r["update"]) % 2 == 1)
    assert json.loads((out / "config.json").read_text())["config"]["env"] == ENV
    table = (out / "metrics.csv").read_text()
    shutil.rmtree(out / "checkpoint" / "4")
    assert cmd.main(argv + ["--resume"]) == 0
    assert (out / "metrics.csv").read_text() == table
    assert cmd.main(argv) == 2
    assert "already holds this run" in capsys.readouterr().err
    assert cmd.main(argv + ["--overwrite"]) == 0
    assert (out / "metrics.csv").read_text() == table
