"""TabularEnv: gymnax API over a TabularMDP (issue 11 §1).

Statistical checks use fixed keys; each chi-square / binomial test is at level 1e-3
(Bonferroni over the rows where several are tested), so a correct env fails with
probability < 1e-3 per key — and, with the keys fixed, never flakes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from vccc_jax.envs import rollout
from vccc_jax.envs.tabular_env import (
    EnvState,
    make_params,
    make_tabular_env,
    observation_table,
    params_mdp,
)
from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import chain_mdp, fold_time, random_mdp, with_horizon

ALPHA = 1e-3
S, A = 4, 2


def _expected(counts, p):
    p = np.asarray(p, np.float64)
    return counts.sum() * p / p.sum()


@pytest.fixture(scope="module")
def rand():
    mdp = random_mdp(jax.random.PRNGKey(0), 1, S, A, gamma=0.9)[0]
    return (mdp,) + make_tabular_env(mdp, "onehot")


def test_transitions_match_P_and_rewards_match_R(rand):
    mdp, env, params = rand
    n = 4000

    @jax.jit
    def sample(key):
        def one(s, a, k):
            st = EnvState(time=jnp.zeros((), jnp.int32), state=s, cut=jnp.zeros((), bool))
            _, new, r, term, _ = env.step_env(k, st, a, params)
            return new.state, r, term
        s, a = jnp.meshgrid(jnp.arange(S), jnp.arange(A), indexing="ij")
        keys = jax.random.split(key, (S, A, n))
        return jax.vmap(jax.vmap(jax.vmap(one, (None, None, 0)), (0, 0, 0)), (0, 0, 0))(s, a, keys)

    nxt, rew, term = jax.device_get(sample(jax.random.PRNGKey(1)))
    P, R = np.asarray(mdp.P), np.asarray(mdp.R)
    for s in range(S):
        for a in range(A):
            counts = np.bincount(nxt[s, a], minlength=S)
            p = stats.chisquare(counts, _expected(counts, P[s, a])).pvalue
            assert p > ALPHA / (S * A), (s, a, counts, n * P[s, a])
            np.testing.assert_allclose(rew[s, a], R[s, a, nxt[s, a]], rtol=1e-6)
    assert not term.any()


def test_api_spaces_jit_and_vmap_over_mdps():
    mdps = random_mdp(jax.random.PRNGKey(3), 3, S, A)
    env, _ = make_tabular_env(mdps[0], "features", feature_dim=2, key=jax.random.PRNGKey(4))
    assert env.observation_space().shape == (2,) and env.action_space().n == A
    batch = jax.tree_util.tree_map(
        lambda *x: jnp.stack(x),
        *[make_params(mdps[i], "features", feature_dim=2, key=jax.random.PRNGKey(4)) for i in range(3)])
    obs, st = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(5), 3), batch)
    assert obs.shape == (3, 2)
    out = jax.vmap(env.step)(jax.random.split(jax.random.PRNGKey(6), 3), st, jnp.ones(3, jnp.int32), batch)
    assert out[0].shape == (3, 2) and out[2].shape == (3,)
    # aliasing: 2 features for 4 states
    assert np.linalg.matrix_rank(np.asarray(batch.obs_table[0])) == 2


def test_terminal_state_terminates_and_resets():
    mdp = chain_mdp(2, slip=0.0, gamma=0.9)  # 0 -> 1 -> 2 (terminal) under action 1
    env, params = make_tabular_env(mdp, "onehot")
    obs, st = env.reset(jax.random.PRNGKey(0), params)
    assert int(st.state) == 0
    obs, st, r, term, trunc, _ = env.step(jax.random.PRNGKey(1), st, 1, params)
    assert not term and not trunc and float(r) == 0.0
    obs, st, r, term, trunc, info = env.step(jax.random.PRNGKey(2), st, 1, params)
    assert bool(term) and not bool(trunc) and float(r) == 1.0
    np.testing.assert_array_equal(info["final_observation"], np.eye(3)[2])
    assert int(st.state) == 0 and int(st.time) == 0  # auto-reset to init
    np.testing.assert_array_equal(obs, np.eye(3)[0])


def linear(theta, obs):
    return obs @ theta


@pytest.fixture(scope="module")
def roll(rand):
    """One compiled rollout (512 envs x 50 steps) shared by the tests below; the env
    params (time limit, cut probability) and the policy are traced inputs."""
    _, env, _ = rand

    @jax.jit
    def run(params, theta, key):
        k0, k1 = jax.random.split(key)
        carry = rollout.reset(env, params, k0, 512)
        return rollout.rollout(env, params, linear, theta, carry, k1, num_steps=50)

    return run


def test_time_limit_and_random_cuts_truncate(rand, roll):
    mdp, _, _ = rand
    _, traj = roll(make_params(mdp, "onehot", max_steps_in_episode=3), jnp.zeros((S, A)),
                   jax.random.PRNGKey(1))
    trunc = np.asarray(traj.truncated)
    np.testing.assert_array_equal(trunc[:7, 0], [0, 0, 1, 0, 0, 1, 0])
    assert not np.asarray(traj.terminated).any()
    np.testing.assert_allclose(traj.discounts(0.9), 0.9, rtol=1e-6)  # truncation keeps the discount
    # random cuts: Binomial(n, 0.3)
    _, traj = roll(make_params(mdp, "onehot", reset_prob=0.3), jnp.zeros((S, A)),
                   jax.random.PRNGKey(3))
    k, n = int(np.asarray(traj.truncated).sum()), traj.truncated.size
    assert stats.binomtest(k, n, 0.3).pvalue > ALPHA


def test_reset_prob_one_minus_gamma_gives_discounted_visitation(rand, roll):
    """The replay model of exact_truth: stationary state law = normalised visitation
    (states of 512 independent envs after 50 steps; mixing time ~ 1 / (1 - gamma) = 10)."""
    mdp, _, _ = rand
    params = make_params(mdp, "onehot", reset_prob=1 - 0.9)
    theta = jnp.array([[1.0, -1.0], [0.0, 0.5], [-1.0, 1.0], [0.3, 0.0]])
    carry, _ = roll(params, theta, jax.random.PRNGKey(4))
    counts = np.bincount(np.asarray(carry.env_state.state), minlength=S)
    d = np.asarray(exact.visitation(params_mdp(params), jax.nn.softmax(theta, -1)))
    assert stats.chisquare(counts, _expected(counts, d)).pvalue > ALPHA


def test_finite_horizon_is_folded_and_ends_by_termination():
    mdp = with_horizon(chain_mdp(3, slip=0.2, gamma=1.0), 4)  # S = 4 (3 + terminal), H = 4
    env, params = make_tabular_env(mdp, "onehot_time")
    assert params.obs_table.shape == (17, 17)
    folded = fold_time(mdp)
    np.testing.assert_array_equal(params.P, folded.P)
    carry = rollout.reset(env, params, jax.random.PRNGKey(0), 16)
    _, traj = rollout.rollout(env, params, lambda th, o: o @ th, jnp.zeros((17, 2)), carry,
                              jax.random.PRNGKey(1), num_steps=12, record_states=True)
    lengths = np.asarray(traj.episode_length)[np.asarray(traj.episode_done)]
    assert lengths.max() == 4 and not np.asarray(traj.truncated).any()
    # time-aliased one-hot: the same s at different times observes the same
    tab = observation_table(mdp, "onehot")
    np.testing.assert_array_equal(tab[1], tab[4 + 1])
    assert tab.shape == (17, 4) and not tab[-1].any()
    with pytest.raises(ValueError, match="finite-horizon"):
        observation_table(chain_mdp(3), "onehot_time")
