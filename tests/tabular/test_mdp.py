"""tabular.mdp and tabular.policies: generators, validation, finite horizons, policy tables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import exact
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular import policies as pol


def test_random_mdp_is_valid_batched_and_reproducible():
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(3)
        a = M.random_mdp(key, 5, 4, 3, gamma=0.8)
        b = M.random_mdp(key, 5, 4, 3, gamma=0.8)
        assert a.P.shape == a.R.shape == (5, 4, 3, 4)
        assert a.gamma.shape == (5,) and a.init.shape == (5, 4) and a.terminal.shape == (5, 4)
        assert a.batch_shape == (5,) and a.num_states == 4 and a.num_actions == 3
        M.validate_mdp(a)
        np.testing.assert_allclose(a.P.sum(-1), 1.0, atol=1e-12)
        np.testing.assert_array_equal(a.P, b.P)
        np.testing.assert_array_equal(a.R, b.R)
        c = M.random_mdp(jax.random.PRNGKey(4), 5, 4, 3, gamma=0.8)
        assert not np.allclose(a.P, c.P)
        # Indexing the batch gives a single MDP.
        assert a[2].P.shape == (4, 3, 4) and a[2].gamma.shape == ()
        # A non-unit concentration goes through the gamma sampler and is still valid.
        M.validate_mdp(M.random_mdp(key, 2, 3, 2, concentration=0.3))


def test_random_mdp_defaults_to_float32():
    m = M.random_mdp(jax.random.PRNGKey(0), 2, 3, 2)
    assert m.P.dtype == jnp.float32 and m.gamma.dtype == jnp.float32


def test_garnet_has_exact_branching():
    with jax.enable_x64(True):
        g = M.garnet_mdp(jax.random.PRNGKey(1), 3, 7, 2, 3, gamma=0.9)
        M.validate_mdp(g)
        np.testing.assert_array_equal(np.sum(np.asarray(g.P) > 0, axis=-1), 3)
        # Rewards depend on (s, a) only.
        np.testing.assert_array_equal(g.R[..., 0], g.R[..., 5])
    with pytest.raises(ValueError, match="branching"):
        M.garnet_mdp(jax.random.PRNGKey(1), 1, 4, 2, 5)


def test_chain_sparse_terminal_reward():
    with jax.enable_x64(True):
        n, gamma = 6, 0.9
        c = M.chain_mdp(n, gamma=gamma, slip=0.0)
        right = jnp.zeros((n + 1, 2)).at[:, 1].set(1.0)
        v = exact.policy_value(c, right)
        # Reward 1 on the step n-1 -> n; from s the agent needs n - s steps.
        np.testing.assert_allclose(v[:n], gamma ** (n - 1 - np.arange(n)), rtol=1e-12)
        assert v[n] == 0.0
        # Undiscounted episodic chain with slip: value 1 from everywhere (it terminates a.s.).
        c1 = M.chain_mdp(n, gamma=1.0, slip=0.2)
        np.testing.assert_allclose(exact.policy_value(c1, pol.uniform_policy(n + 1, 2))[:n], 1.0, rtol=1e-10)


def test_bandit_values():
    with jax.enable_x64(True):
        b = M.bandit_mdp()
        mu = jnp.asarray([[0.9, 0.1], [0.5, 0.5]])
        assert float(exact.policy_value(b, mu)[0]) == pytest.approx(0.1, abs=1e-15)


@pytest.mark.parametrize(
    "field,mutate,match",
    [
        ("P", lambda m: m.replace(P=m.P.at[0, 0, 0].add(0.3)), "P rows must sum to 1"),
        ("P", lambda m: m.replace(P=m.P.at[0, 0, 0].set(-0.2).at[0, 0, 1].add(0.2 + m.P[0, 0, 0])), "P has negative"),
        ("gamma", lambda m: m.replace(gamma=jnp.asarray(1.5)), "gamma must lie in"),
        ("gamma", lambda m: m.replace(gamma=jnp.asarray(-0.1)), "gamma must lie in"),
        ("init", lambda m: m.replace(init=m.init * 2.0), "init"),
        ("terminal", lambda m: m.replace(terminal=m.terminal + 0.5), "terminal"),
        ("R", lambda m: m.replace(R=m.R[..., :2]), "R must have"),
        ("horizon", lambda m: m.replace(horizon=0), "horizon"),
    ],
)
def test_validation_names_the_field(field, mutate, match):
    with jax.enable_x64(True):
        m = M.random_mdp(jax.random.PRNGKey(0), 1, 3, 2)[0]
        M.validate_mdp(m)
        with pytest.raises(ValueError, match=match):
            M.validate_mdp(mutate(m))


def test_make_mdp_broadcasts_state_action_rewards_and_validates():
    with jax.enable_x64(True):
        P = np.full((2, 2, 2), 0.5)
        m = M.make_mdp(P, np.array([[1.0, 2.0], [3.0, 4.0]]), 0.5)
        assert m.R.shape == (2, 2, 2) and float(m.R[1, 0, 1]) == 3.0
        with pytest.raises(ValueError, match="P rows"):
            M.make_mdp(P * 0.9, np.zeros((2, 2)), 0.5)
        with pytest.raises(ValueError, match="gamma"):
            M.make_mdp(P, np.zeros((2, 2)), 2.0)


def numpy_backward_induction(P, R, gamma, terminal, pi, H):
    S = P.shape[0]
    disc = gamma * (1 - terminal)
    v = np.zeros(S)
    for _ in range(H):
        q = np.einsum("sat,sat->sa", P, R + disc[None, None, :] * v[None, None, :])
        v = np.sum(pi * q, axis=1)
    return v


def test_finite_horizon_backward_induction_and_time_folding():
    with jax.enable_x64(True):
        m = M.random_mdp(jax.random.PRNGKey(5), 1, 4, 3, gamma=1.0)[0]
        pi = pol.softmax_policy(jax.random.normal(jax.random.PRNGKey(6), (4, 3)))
        for H in (1, 4):
            mh = M.with_horizon(m, H)
            want = numpy_backward_induction(*(np.asarray(x) for x in (m.P, m.R, m.gamma, m.terminal, pi)), H)
            np.testing.assert_allclose(exact.policy_value(mh, pi), want, rtol=1e-12)
            vs = exact.policy_values_by_time(mh, pi)
            assert vs.shape == (H + 1, 4) and np.all(vs[-1] == 0)
            # Time folded into the state: an infinite-horizon MDP with an absorbing end state.
            folded = M.fold_time(mh)
            M.validate_mdp(folded)
            assert folded.num_states == H * 4 + 1 and folded.horizon is None
            v_fold = exact.policy_value(folded, M.fold_policy(pi, H))
            np.testing.assert_allclose(v_fold.reshape(-1)[:-1].reshape(H, 4), vs[:-1], rtol=1e-10, atol=1e-12)
        with pytest.raises(ValueError, match="horizon"):
            M.fold_time(m)


# ---------------------------------------------------------------------------- policies


def test_softmax_policy_temperature():
    logits = jnp.asarray([[0.0, 1.0, 2.0]])
    p1 = pol.softmax_policy(logits)
    p_hot = pol.softmax_policy(logits, temperature=0.1)
    p_cold = pol.softmax_policy(logits, temperature=100.0)
    np.testing.assert_allclose(p1[0], np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum(), rtol=1e-6)
    assert p_hot[0, 2] > 0.99 and np.allclose(p_cold, 1 / 3, atol=0.01)
    with pytest.raises(ValueError, match="temperature"):
        pol.softmax_policy(logits, temperature=0.0)


def test_top_k_and_top_p_truncate_support():
    probs = jnp.asarray([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
    k2 = pol.top_k_policy(probs, 2)
    np.testing.assert_allclose(k2, [[0.625, 0.375, 0, 0], [0, 0, 3 / 7, 4 / 7]], rtol=1e-6)
    p8 = pol.top_p_policy(probs, 0.8)
    # Row 0: 0.5 + 0.3 reaches 0.8 -> keep 2; row 1: 0.4 + 0.3 < 0.8 -> keep 3.
    np.testing.assert_allclose(p8, [[0.625, 0.375, 0, 0], [0, 2 / 9, 3 / 9, 4 / 9]], rtol=1e-6)
    np.testing.assert_allclose(pol.top_p_policy(probs, 1.0), probs, rtol=1e-6)
    # As a behaviour policy a truncated sampler violates the support of the original.
    viol = pol.support_violation(probs, k2)
    np.testing.assert_allclose(viol, [0.2, 0.3], rtol=1e-6)
    lr = pol.log_ratio_table(probs, k2)
    assert np.isposinf(lr[0, 2]) and np.isfinite(lr[0, 0])
    lr0 = pol.log_ratio_table(k2, probs)  # target 0 where behaviour > 0: ratio exactly 0
    assert np.isneginf(lr0[0, 3])
    with pytest.raises(ValueError, match="k must"):
        pol.top_k_policy(probs, 5)
    with pytest.raises(ValueError, match="p must"):
        pol.top_p_policy(probs, 0.0)


def test_validate_policy_names_argument():
    pol.validate_policy(pol.uniform_policy(3, 2), "mu")
    with pytest.raises(ValueError, match="mu rows must sum to 1"):
        pol.validate_policy(jnp.asarray([[0.5, 0.4]]), "mu")
    with pytest.raises(ValueError, match="pi has negative"):
        pol.validate_policy(jnp.asarray([[1.5, -0.5]]), "pi")
    with pytest.raises(ValueError, match="pi must be"):
        pol.validate_policy(jnp.asarray([0.5, 0.5]), "pi")
