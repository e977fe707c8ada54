"""Continuous actions: the lqr: env spec and env (against NumPy), and the Gaussian-actor
trainer (train/continuous.py): the log mu it logs is the density of the action under the
behaviour version actually used (NumPy reference), lag 0 is on-policy, the update compiles
once, and unsupported options are refused. Tiny sizes, one trainer per module."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.lqr_env import env_lqr, make_lqr_env
from vccc_jax.envs.spec import env_gamma, parse_lqr_spec
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.continuous import ContinuousTrainer, check_config, wants_continuous
from vccc_jax.train.policy_heads import GaussianHead

ENV = "lqr:dim=2,act=1,gamma=0.8,seed=3,max_steps=5"


def test_lqr_spec_and_errors():
    assert parse_lqr_spec(ENV) == dict(dim=2, act=1, gamma=0.8, seed=3, radius=0.8, max_steps=5)
    assert env_gamma(ENV) == 0.8 and wants_continuous(ENV) and wants_continuous("Pendulum-v1")
    assert not wants_continuous("CartPole-v1")
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


CFG = TrainConfig(env=ENV, num_envs=4, num_steps=6, total_timesteps=48, num_minibatches=2,
                  update_epochs=1, hidden=8, num_layers=1, lag="uniform:2", critic="vccc",
                  gamma=0.8)


@pytest.fixture(scope="module")
def trainer():
    return ContinuousTrainer(CFG, head=GaussianHead(noise_scale=1.3))


def _np_log_normal(x, m, s):
    return np.sum(-0.5 * ((x - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), -1)


def test_logged_log_mu_is_the_sampled_versions_density(trainer):
    st = trainer.init(jax.random.PRNGKey(0))
    # a second, different version in the ring: envs at lag 1 act with the first
    newer = jax.tree_util.tree_map(lambda x: x + 0.3, st.actor_params)
    st = st._replace(ring=lag_lib.push(st.ring, newer))
    lags = jnp.asarray([0, 1, 1, 0], jnp.int32)
    _, traj = jax.jit(trainer.rollout)(st, lags, jax.random.PRNGKey(2))
    versions = [newer, st.actor_params]
    for b, lag in enumerate([0, 1, 1, 0]):
        p = versions[lag]["params"]
        obs, u = np.asarray(traj["obs"][:, b]), np.asarray(traj["u"][:, b])
        # lqr: env -> linear actor mean (the family whose V^pi is exact)
        mean = obs @ np.asarray(p["Dense_0"]["kernel"]) + np.asarray(p["Dense_0"]["bias"])
        std = np.exp(np.asarray(p["log_std"]))
        np.testing.assert_allclose(traj["log_mu"][:, b], _np_log_normal(u, mean, 1.3 * std), rtol=1e-4, atol=1e-4)
        p0 = newer["params"]      # pi_k = the newest version, unscaled
        m0 = obs @ np.asarray(p0["Dense_0"]["kernel"]) + np.asarray(p0["Dense_0"]["bias"])
        np.testing.assert_allclose(traj["log_pi_old"][:, b],
                                   _np_log_normal(u, m0, np.exp(np.asarray(p0["log_std"]))), rtol=1e-4, atol=1e-4)


def test_updates_compile_once_and_first_update_is_on_policy(trainer):
    st = trainer.init(jax.random.PRNGKey(1))
    st, m1 = trainer.update(st)        # one version only: every env at lag 0
    st, m2 = trainer.update(st)
    assert trainer.update._cache_size() == 1
    assert float(m1["mean_lag"]) == 0.0
    # lag 0 with noise_scale 1.3: rho = N(u; m, s) / N(u; m, 1.3 s) -- not 1; on-policy data is
    # checked with noise_scale 1 in test_on_policy_ratios_are_one
    assert np.isfinite(float(m2["rho_max"]))


def test_on_policy_ratios_are_one():
    tr = ContinuousTrainer(CFG.replace(lag="fixed:0"))
    st = tr.init(jax.random.PRNGKey(0))
    _, traj = jax.jit(tr.rollout)(st, jnp.zeros(4, jnp.int32), jax.random.PRNGKey(3))
    np.testing.assert_allclose(traj["log_mu"], traj["log_pi_old"], atol=1e-6)


def test_unsupported_options_are_refused():
    for change, msg in ((dict(sampler="temp=0.5"), "sampler"), (dict(actor="centered-ratio"), "actor must"),
                        (dict(critic="centered_baseline"), "categorical")):
        with pytest.raises(ValueError, match=msg):
            check_config(CFG.replace(**change))


def test_vccc_train_runs_lqr_end_to_end(tmp_path, capsys):
    import json

    from vccc_jax.commands import train as cmd

    out = tmp_path / "run"
    argv = ["--env", ENV, "--lag", "uniform:7", "--critic", "vccc", "--num-envs", "4", "--num-steps", "6",
            "--total-timesteps", "72", "--num-minibatches", "2", "--update-epochs", "1", "--hidden", "8",
            "--num-layers", "1", "--gt-every", "2", "--num-seeds", "2", "--out", str(out), "--no-figure"]
    assert cmd.main(argv) == 0
    rows = [json.loads(line) for line in (out / "continuous.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["update"]) for r in rows] == [(s, u) for s in (0, 1) for u in (1, 2, 3)]
    assert [("critic_error" in r) for r in rows] == [False, True, True] * 2   # every 2nd and the last
    assert all(np.isfinite(r["critic_error"]) and r["critic_error"] > 0 for r in rows if "critic_error" in r)
    assert rows[0]["mean_lag"] == 0.0 and rows[0]["rho_max"] == pytest.approx(1.0, abs=1e-5)
    assert "critic_error" in capsys.readouterr().out


def test_vccc_train_refuses_unsupported_options_before_writing(tmp_path, capsys):
    from vccc_jax.commands import train as cmd

    out = tmp_path / "run"
    assert cmd.main(["--env", "Pendulum-v1", "--sampler", "temp=0.5", "--out", str(out)]) == 2
    assert "sampler is not supported with continuous actions" in capsys.readouterr().err
    assert not out.exists()


def test_mc_critic_error_matches_the_exact_lqr_value():
    """The Monte-Carlo critic error (the Pendulum path: ``mc_values_policy`` with the newest
    Gaussian actor) on an lqr: env, where V^{pi_k} is exact: |RMS(V - V_mc) - RMS(V - V^pi)|
    <= RMS(V_mc - V^pi), which is ~ the MC standard error; we allow 5 s.e. plus the horizon
    cut's bound (level < 1e-4 per the CLT; a dropped discount, the behaviour's noise scale or
    an unscaled-noise bug moves V_mc by many s.e.)."""
    from vccc_jax.tabular import lqr as lq

    cfg = CFG.replace(gt_states=4, gt_rollouts=256, gt_horizon=60, gt_every=1)
    tr = ContinuousTrainer(cfg, head=GaussianHead(noise_scale=1.3))
    st = tr.init(jax.random.PRNGKey(4))
    p = st.actor_params["params"]
    gain = np.array([[-0.3, 0.2]], np.float32)     # a stable, non-trivial linear-Gaussian pi_k
    actor = {"params": {**p, "Dense_0": {"kernel": jnp.asarray(gain.T), "bias": jnp.asarray([0.1])},
                        "log_std": jnp.asarray([-0.2])}}
    st = st._replace(actor_params=actor)
    err, se = tr.mc_critic_error(st, jax.random.PRNGKey(5))
    with jax.enable_x64(True):
        prob = env_lqr(ENV)
        pol = lq.GaussianPolicy(jnp.asarray(gain, jnp.float64), jnp.asarray([0.1]), jnp.asarray([-0.2]))
        assert float(lq.closed_loop_radius(prob, pol)) < 1.0
        v_true = np.asarray(lq.value(prob, pol)(jnp.asarray(np.asarray(st.obs), jnp.float64)))
    v = np.asarray(tr.critic_net.apply(st.critic_params, st.obs))
    exact = np.sqrt(np.mean((v - v_true) ** 2))
    tail = 0.8 ** 60 * np.abs(v_true).max() * 10
    assert abs(float(err) - exact) <= 5 * float(se) + tail, (float(err), exact, float(se))
    assert float(se) < 0.05 * exact       # the check has power: s.e. small against the value
