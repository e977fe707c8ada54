"""Exact BRACE operator, closed-form bias and variance growth (vccc_jax.tabular.brace)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related.brace import brace_reference
from vccc_jax.tabular import brace as tb
from vccc_jax.tabular.history import HistoryConfig, policy_history
from vccc_jax.tabular.mdp import make_mdp, random_mdp, with_horizon

PI = [[0.7, 0.3], [0.2, 0.8]]
MU = [[0.4, 0.6], [0.5, 0.5]]


@pytest.fixture(scope="module")
def small():
    with jax.enable_x64(True):
        mdp = with_horizon(random_mdp(jax.random.PRNGKey(0), 1, 2, 2, gamma=0.9, dtype=jnp.float64)[0], 3)
        return mdp, jnp.asarray(PI, jnp.float64), jnp.asarray(MU, jnp.float64), jnp.asarray([0.3, -0.2])


def test_closed_form_bias_equals_brute_force(small):
    """Verify row (a): closed form = enumeration = operator fixed point = moment DP (float64)."""
    with jax.enable_x64(True):
        rows = tb.bias_rows(*small, ns=[0, 2])
        assert len(rows) == 2 * 3 * 2
        for row in rows:
            assert abs(row.computed - row.expected) <= row.atol, row
        assert max(abs(r.expected) for r in rows if "n=0" in r.name) > 0.1  # a real bias
        mdp, pi, mu, _ = small
        assert float(jnp.abs(tb.bias_closed_form(mdp, pi, mu, 3)).max()) == 0.0  # prefix covers H


@pytest.mark.parametrize("anchor,clips", [("prefix", (1.0, 1.0)), ("constant", (1.3, 0.7))])
def test_moments_and_operator_equal_enumeration(small, anchor, clips):
    mdp, pi, mu, vbar = small
    with jax.enable_x64(True):
        kw = dict(n=1, clip_rho_threshold=clips[0], clip_c_threshold=clips[1], tail_anchor=anchor)
        mean_e, var_e = tb.enumerate_targets(mdp, pi, mu, vbar, **kw)
        mean_d, var_d = tb.target_moments(mdp, pi, mu, vbar, **kw)
        fm, pf, mf, vf = tb.fold(mdp, pi, mu, vbar)
        op = tb.expected_brace_operator(fm, pf, mf, vf, **kw)
        np.testing.assert_allclose(mean_d[0], mean_e, atol=1e-12)
        np.testing.assert_allclose(var_d[0], var_e, atol=1e-12)
        np.testing.assert_allclose(op[:2], mean_e, atol=1e-12)
        assert np.all(var_e > 0)


def test_clipped_fixed_point_infinite_horizon():
    with jax.enable_x64(True):
        mdp = random_mdp(jax.random.PRNGKey(1), 1, 4, 2, gamma=0.9, dtype=jnp.float64)[0]
        pi = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(2), (4, 2), jnp.float64))
        mu = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(3), (4, 2), jnp.float64))
        kw = dict(n=2, clip_rho_threshold=1.0, clip_c_threshold=1.0, tail_anchor="prefix")
        v_star = tb.brace_fixed_point(mdp, pi, mu, **kw)
        np.testing.assert_allclose(tb.expected_brace_operator(mdp, pi, mu, v_star, **kw), v_star, atol=1e-10)
        free = tb.brace_fixed_point(mdp, pi, mu, n=2, clip_rho_threshold=None, clip_c_threshold=None)
        from vccc_jax.tabular import exact
        np.testing.assert_allclose(free - exact.policy_value(mdp, pi), tb.bias_closed_form(mdp, pi, mu, 2),
                                   atol=1e-10)


def test_variance_does_not_grow_exponentially():
    """Verify row (b), Sec 4.3: one state, r(a1) = 1, mu(a1) = 0.1, pi(a1) = 0.7, gamma = 1, H = 16."""
    with jax.enable_x64(True):
        one = make_mdp(jnp.ones((1, 2, 1)), jnp.asarray([[[0.0], [1.0]]]), 1.0, horizon=16)
        pi, mu = jnp.asarray([[0.3, 0.7]]), jnp.asarray([[0.9, 0.1]])
        rows = tb.variance_growth_rows(one, pi, mu, jnp.zeros(1), n=2)
        for row in rows:
            assert abs(row.computed - row.expected) <= row.atol, row
        assert rows[0].expected == pytest.approx(np.log(5.0))  # E_mu[rho^2] = 0.49/0.1 + 0.09/0.9
        var_b, var_f = tb.variance_by_horizon(one, pi, mu, jnp.zeros(1), n=2)
        assert var_f[-1, 0] > 1e8 * var_b[-1, 0]


def test_bias_by_lag_vanishes_at_lag_zero_and_full_prefix():
    with jax.enable_x64(True):
        mdp = with_horizon(random_mdp(jax.random.PRNGKey(5), 1, 3, 2, gamma=0.9, dtype=jnp.float64)[0], 4)
        hist = policy_history(with_horizon(mdp, None), jnp.zeros((3, 2), jnp.float64),
                              HistoryConfig(step_size=0.5, num_versions=4))
        table = tb.bias_by_lag(mdp, hist.probs, ns=[0, 4], lags=[0, 3])
        assert table.shape == (2, 2)
        np.testing.assert_allclose(table[:, 0], 0.0, atol=1e-12)
        np.testing.assert_allclose(table[1], 0.0, atol=1e-12)
        assert abs(table[0, 1]) > 1e-3


@pytest.fixture(scope="module")
def episodic():
    """S = 3 (state 2 terminal, absorbing), A = 2, gamma = 0.9; pi, mu and a critic."""
    with jax.enable_x64(True):
        k = jax.random.split(jax.random.PRNGKey(11), 4)
        mdp = random_mdp(k[0], 1, 3, 2, gamma=0.9, dtype=jnp.float64)[0]
        stay = jnp.broadcast_to(jax.nn.one_hot(2, 3, dtype=jnp.float64), (2, 3))
        mdp = mdp.replace(P=mdp.P.at[2].set(stay), R=mdp.R.at[2].set(0.0), terminal=jnp.asarray([0.0, 0.0, 1.0]))
        pi = jax.nn.softmax(jax.random.normal(k[1], (3, 2), jnp.float64))
        mu = jax.nn.softmax(jax.random.normal(k[2], (3, 2), jnp.float64))
        return mdp, pi, mu, jax.random.normal(k[3], (3,), jnp.float64)


def _brute_force_segment(mdp, pi, mu, v, T, act, n, rbar, cbar, pgbar, anchor):
    """E[vs_0], E[pg_0] per start state over every T-step trajectory, by the defining sum
    (``brace_reference``) and the pg definition (numpy)."""
    P, R, mu_, lr = (np.asarray(x) for x in (mdp.P, mdp.R, mu, jnp.log(pi) - jnp.log(mu)))
    gam, v = np.asarray(mdp.gamma) * (1 - np.asarray(mdp.terminal)), np.asarray(v)
    S, A = mu_.shape
    vs, pg = np.zeros(S), np.zeros(S)
    for s0 in range(S):
        for cells in itertools.product(range(A * S), repeat=T):
            states, prob, cols = [s0], 1.0, {k: [] for k in "lrdv"}
            for c in cells:
                s, a, s2 = states[-1], c // S, c % S
                prob *= mu_[s, a] * P[s, a, s2]
                cols["l"].append(lr[s, a]), cols["r"].append(R[s, a, s2]), cols["d"].append(gam[s2])
                cols["v"].append(v[s])
                states.append(s2)
            a_ = act[np.asarray(states[:-1])]
            ref = brace_reference(cols["l"], cols["d"], cols["r"], cols["v"], v[states[-1]], n=n,
                                  clip_rho_threshold=rbar, clip_c_threshold=cbar, is_action=a_, tail_anchor=anchor)
            rho0 = np.exp(cols["l"][0])
            w = (rho0 if pgbar is None else min(rho0, pgbar)) if a_[0] else 1.0
            nxt = ref[1] if T > 1 else v[states[-1]]
            vs[s0] += prob * ref[0]
            pg[s0] += prob * w * (cols["r"][0] + cols["d"][0] * nxt - v[s0])
    return vs, pg


@pytest.mark.parametrize("setting", [(1, 1.2, 0.8, 1.0, "prefix", 1), (2, 0.9, 1.3, None, "constant", None)])
def test_segment_operator_equals_brute_force(episodic, setting):
    """``expected_segment_targets`` (vs and pg, every segment length) = the enumerated mean of
    the defining sum, with rho_bar != c_bar, n < T, an episode end and (first setting) a tool
    state; without tool states also = n-step V-trace + K^n (T_mu^(T-n) Vbar - Vbar)."""
    mdp, pi, mu, v = episodic
    n, rbar, cbar, pgbar, anchor, tool = setting
    act = np.arange(3) != (-1 if tool is None else tool)
    kw = dict(n=n, clip_rho_threshold=rbar, clip_c_threshold=cbar, tail_anchor=anchor)
    with jax.enable_x64(True):
        vs, pg = (np.asarray(x) for x in tb.expected_segment_targets(
            mdp, pi, mu, v, n_steps=3, clip_pg_rho_threshold=pgbar, is_action=jnp.asarray(act), **kw))
        for T in (1, 2, 3):
            want_vs, want_pg = _brute_force_segment(mdp, pi, mu, v, T, act, n, rbar, cbar, pgbar, anchor)
            np.testing.assert_allclose(vs[T], want_vs, atol=1e-12)
            np.testing.assert_allclose(pg[T], want_pg, atol=1e-12)
        np.testing.assert_allclose(vs[0], v, atol=0)
        if tool is None:
            from vccc_jax.tabular import exact
            K = tb.trace_matrix(mdp, pi, mu, cbar) if anchor == "prefix" else exact.discounted_transition_matrix(mdp, mu)
            prefix = exact.expected_vtrace_operator(mdp, pi, mu, v, n_steps=n, lambda_=1.0, clip_rho_threshold=rbar,
                                                    clip_c_threshold=cbar)
            closed = prefix + np.linalg.matrix_power(np.asarray(K), n) @ (exact.n_step_backup(mdp, mu, v, 3 - n) - v)
            np.testing.assert_allclose(vs[3], closed, atol=1e-12)
    assert np.max(np.abs(vs[3] - np.asarray(v))) > 1e-2 and np.max(np.abs(pg[3])) > 1e-2
