"""Rollouts: logged behaviour log-probs, versions, termination vs truncation."""

import functools

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_envs import LegacyStopOrGo, StopOrGo

from vccc_jax.envs import acting
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.train.networks import Actor

T, B, K = 16, 4, 4


@pytest.fixture(scope="module")
def acrobot_rollout():
    """Acrobot (3 actions), K = 4 distinct versions, lags 0..3, temperature 0.7, top-2."""
    env, env_params = gymnax.make("Acrobot-v1")
    net = Actor(3, (16,))
    keys = jax.random.split(jax.random.PRNGKey(0), K)
    versions = [net.init(k, jnp.zeros((1, 6))) for k in keys]
    # larger weights than the default 0.01 head, so versions differ visibly
    versions = [jax.tree_util.tree_map(lambda x: 30.0 * x, p) for p in versions]
    buf = lag_lib.init_buffer(versions[0], K)
    for p in versions[1:]:
        buf = lag_lib.push(buf, p)
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)
    lags = jnp.arange(B, dtype=jnp.int32)
    run = jax.jit(functools.partial(
        rollout_lib.rollout, env, env_params, net.apply, num_steps=T, temperature=0.7, top_k=2,
        record_states=True))
    _, traj = run(buf, carry, jax.random.PRNGKey(2), lags=lags)
    return net, versions, traj


def test_logged_log_probs_match_recomputation_under_behaviour_version(acrobot_rollout):
    net, versions, traj = acrobot_rollout
    assert traj.obs.shape == (T, B, 6) and traj.log_mu_all.shape == (T, B, 3)
    np.testing.assert_array_equal(traj.lag, np.broadcast_to(np.arange(B), (T, B)))
    np.testing.assert_array_equal(traj.version, K - 1 - traj.lag)
    for b in range(B):
        params = versions[int(traj.version[0, b])]
        logits = np.asarray(net.apply(params, traj.obs[:, b]), np.float64)
        scaled = logits / 0.7
        kth = np.sort(scaled, axis=-1)[:, -2:-1]
        masked = np.where(scaled >= kth, scaled, -np.inf)
        log_mu_all = masked - np.log(np.sum(np.exp(masked - masked.max(-1, keepdims=True)), -1,
                                            keepdims=True)) - masked.max(-1, keepdims=True)
        a = np.asarray(traj.action[:, b])
        np.testing.assert_allclose(traj.log_mu[:, b], log_mu_all[np.arange(T), a], atol=2e-5)
        finite = np.isfinite(log_mu_all)
        np.testing.assert_array_equal(np.isfinite(traj.log_mu_all[:, b]), finite)
        np.testing.assert_allclose(np.asarray(traj.log_mu_all[:, b])[finite], log_mu_all[finite],
                                   atol=2e-5)
        assert np.all(np.isfinite(traj.log_mu[:, b]))  # sampled actions are in the top-k
        # the target log-probs are the newest version's at temperature 1, no top-k
        newest = np.asarray(jax.nn.log_softmax(net.apply(versions[-1], traj.obs[:, b])))
        np.testing.assert_allclose(traj.log_pi_all[:, b], newest, atol=2e-5)
    # lag-0 env: behaviour = newest at temperature 0.7 -> log-ratio is not zero, as logged
    assert not np.allclose(traj.log_mu_all[:, 0], traj.log_pi_all[:, 0])


def test_recorded_states_reproduce_observations(acrobot_rollout):
    _, _, traj = acrobot_rollout
    env, params = gymnax.make("Acrobot-v1")
    obs = jax.vmap(jax.vmap(lambda s: env.get_obs(s, params)))(traj.env_state)
    np.testing.assert_allclose(obs, traj.obs, atol=1e-6)


def test_lag_zero_gives_exactly_zero_log_ratios():
    env, env_params = gymnax.make("CartPole-v1")
    net = Actor(2, (16,))
    p0 = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    p1 = jax.tree_util.tree_map(lambda x: 3.0 * x + 0.1, p0)
    buf = lag_lib.push(lag_lib.init_buffer(p0, 3), p1)
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)
    _, traj = jax.jit(functools.partial(rollout_lib.rollout, env, env_params, net.apply,
                                        num_steps=8))(buf, carry, jax.random.PRNGKey(2),
                                                      lags=jnp.array([0, 0, 1, 2], jnp.int32))
    log_pi = jnp.take_along_axis(traj.log_pi_all, traj.action[..., None], -1)[..., 0]
    log_rho = np.asarray(log_pi - traj.log_mu)
    assert np.all(log_rho[:, :2] == 0.0)  # bit-exact at lag 0
    assert np.all(np.abs(log_rho[:, 2:]) > 0)  # lags 1, 2 capped to 1 (only 2 versions)
    np.testing.assert_array_equal(traj.version[0], [1, 1, 0, 0])


def test_common_table_acts_with_one_version_for_every_env():
    """``acting.common_table``: two rows (the newest, the common lag L), 2 x B actor rows per
    step whatever K; at L = 0 the log-ratios are exactly 0, at L = 1 the behaviour matches
    the lag table's (K rows) to float32 rounding."""
    env, env_params = gymnax.make("CartPole-v1")
    net = Actor(2, (16,))
    p0 = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    buf = lag_lib.push(lag_lib.init_buffer(p0, 3), jax.tree_util.tree_map(
        lambda x: 3.0 * x + 0.1, p0))
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), B)
    roll = functools.partial(rollout_lib.rollout, env, env_params, net.apply, num_steps=8)
    common = jax.jit(lambda lag: roll(acting.common_table(buf, lag), carry,
                                      jax.random.PRNGKey(2), lags=jnp.full((B,), lag)))
    table = acting.common_table(buf, jnp.int32(1))
    assert acting.VersionTable is type(table) and table.num_rows == 2
    _, at0 = common(jnp.int32(0))
    log_pi = jnp.take_along_axis(at0.log_pi_all, at0.action[..., None], -1)[..., 0]
    assert np.all(np.asarray(log_pi - at0.log_mu) == 0.0)
    np.testing.assert_array_equal(at0.version, 1)
    _, at1 = common(jnp.int32(1))
    _, ref = jax.jit(roll)(buf, carry, jax.random.PRNGKey(2), lags=jnp.full((B,), 1))
    np.testing.assert_array_equal(at1.action, ref.action)
    np.testing.assert_array_equal(at1.version, 0)
    np.testing.assert_allclose(at1.log_mu, ref.log_mu, atol=1e-6)
    np.testing.assert_allclose(at1.log_pi_all, ref.log_pi_all, atol=1e-6)
    with pytest.raises(ValueError, match="complete lag table"):
        roll(table, carry, jax.random.PRNGKey(2), lags=jnp.ones((B,), jnp.int32),
             switch_every=2)


def _toy_rollout(env, steps=12, envs=3):
    params = env.default_params.replace(max_steps_in_episode=4)
    apply = lambda p, obs: jnp.broadcast_to(p, obs.shape[:-1] + (2,))  # noqa: E731
    logits = jnp.log(jnp.array([0.8, 0.2]))  # mostly "go"
    carry = rollout_lib.reset(env, params, jax.random.PRNGKey(0), envs)
    _, traj = rollout_lib.rollout(env, params, apply, logits, carry, jax.random.PRNGKey(3),
                                  num_steps=steps)
    return traj


@pytest.mark.parametrize("env", [StopOrGo(), LegacyStopOrGo()], ids=["gymnax1", "legacy"])
def test_termination_and_truncation_are_separate(env):
    traj = _toy_rollout(env)
    a = np.asarray(traj.action)
    time_after = np.asarray(traj.final_obs[..., 0])
    term = np.asarray(traj.terminated)
    trunc = np.asarray(traj.truncated)
    legacy = isinstance(env, LegacyStopOrGo)
    # terminated iff the agent stopped (legacy API: unless that happened at the time limit)
    expect_term = (a == 1) & ~((time_after >= 4) & legacy)
    np.testing.assert_array_equal(term, expect_term)
    # truncated iff the time limit was hit without terminating
    np.testing.assert_array_equal(trunc, (time_after >= 4) & ~term)
    assert trunc.any() and term.any()
    assert not np.any(term & trunc)
    # after any episode end the next observation is a reset one; otherwise it is final_obs
    done = term | trunc
    nxt = np.asarray(traj.obs[1:])
    fin = np.asarray(traj.final_obs[:-1])
    np.testing.assert_array_equal(nxt[~done[:-1]], fin[~done[:-1]])
    assert np.all(nxt[done[:-1]] == 0.0)
    # final_obs at a truncation is the pre-reset observation (time = 4)
    assert np.all(time_after[trunc] == 4)
    # discounts: 0 only at termination; truncation keeps gamma (it must bootstrap)
    d = np.asarray(traj.discounts(0.9))
    np.testing.assert_allclose(d, np.where(term, 0.0, 0.9))
    # episode bookkeeping
    np.testing.assert_array_equal(traj.episode_done, done)
    np.testing.assert_array_equal(np.asarray(traj.episode_length)[done], time_after[done])


def test_sampling_log_probs_validation_and_topk():
    logits = jnp.array([[1.0, 3.0, 2.0, 0.0]])
    lp = rollout_lib.sampling_log_probs(logits, 2.0, 2)
    assert np.isneginf(lp[0, 0]) and np.isneginf(lp[0, 3])
    np.testing.assert_allclose(jnp.exp(lp[0, 1:3]), jax.nn.softmax(jnp.array([1.5, 1.0])),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        rollout_lib.sampling_log_probs(logits, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        rollout_lib.sampling_log_probs(logits, 1.0, -1)


def test_step_draws_are_the_draws_of_the_loop():
    """rollout.step_draws makes before the loop the very bits a step-by-step loop draws:
    step t splits split(key, T)[t] into (action key, env key), the B env keys are
    split(env key, B), and argmax(log-probs + noise[t]) is jax.random.categorical's
    action, -inf (top-k) entries included."""
    key, (T, B, A) = jax.random.PRNGKey(3), (6, 3, 5)
    log_probs = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(4), (T, B, A)))
    log_probs = log_probs.at[:, 0, 1].set(-jnp.inf)
    steps, k_act, env_keys, noise = rollout_lib.step_draws(
        key, T, B, jax.ShapeDtypeStruct((B, A), jnp.float32))
    np.testing.assert_array_equal(steps, np.arange(T))
    assert noise.shape == (T, B, A) and noise.dtype == jnp.float32
    for t, step_key in enumerate(jax.random.split(key, T)):
        ka, ke = jax.random.split(step_key)
        np.testing.assert_array_equal(k_act[t], ka)
        np.testing.assert_array_equal(env_keys[t], jax.random.split(ke, B))
        np.testing.assert_array_equal(jnp.argmax(log_probs[t] + noise[t], axis=-1),
                                      jax.random.categorical(ka, log_probs[t], axis=-1))
    assert np.all(np.asarray(jnp.argmax(log_probs + noise, axis=-1))[:, 0] != 1)
    assert rollout_lib.step_draws(key, T, B, None)[3] is None  # a sampler draws its own


def test_mid_rollout_switches_act_with_newer_versions():
    """K = 9 versions 0..8; env 0 starts at lag 5 (mu_3) and receives weights 2 versions
    newer every 4 steps: mu_3 -> mu_5 -> mu_7 -> mu_8; every logged log-prob matches the
    version it was acting with at that step."""
    env, env_params = gymnax.make("CartPole-v1")
    net = Actor(2, (8,))
    versions = [jax.tree_util.tree_map(lambda x: 20.0 * x, net.init(k, jnp.zeros((1, 4))))
                for k in jax.random.split(jax.random.PRNGKey(3), 9)]
    buf = lag_lib.init_buffer(versions[0], 9)
    for p in versions[1:]:
        buf = lag_lib.push(buf, p)
    carry = rollout_lib.reset(env, env_params, jax.random.PRNGKey(1), 2)
    _, traj = jax.jit(functools.partial(
        rollout_lib.rollout, env, env_params, net.apply, num_steps=16, switch_every=4,
        switch_stride=2))(buf, carry, jax.random.PRNGKey(2), lags=jnp.array([5, 0], jnp.int32))
    np.testing.assert_array_equal(traj.version[::4, 0], [3, 5, 7, 8])
    lag_ref = [5]  # every step against a step-by-step loop: switches at t = 4, 8, 12 only
    for t in range(1, 16):
        lag_ref.append(max(lag_ref[-1] - 2, 0) if t % 4 == 0 else lag_ref[-1])
    np.testing.assert_array_equal(traj.lag[:, 0], lag_ref)
    np.testing.assert_array_equal(traj.version[:, 0], 8 - np.asarray(lag_ref))
    np.testing.assert_array_equal(traj.version[:, 1], 8)
    # every version's log-probs at every logged state, in one batched call
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *versions)
    lp = np.asarray(jax.nn.log_softmax(jax.vmap(net.apply, (0, None))(stacked, traj.obs)))
    t, b = np.meshgrid(np.arange(16), np.arange(2), indexing="ij")
    expect = lp[np.asarray(traj.version), t, b, np.asarray(traj.action)]
    np.testing.assert_allclose(traj.log_mu, expect, atol=2e-5)
