"""tabular.exact against brute-force NumPy enumeration, iteration and Monte-Carlo on tiny MDPs.

All references here are written independently of the library (loops over states, actions
and next states in NumPy, float64).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import exact
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular import policies as pol

S, A = 4, 3


@pytest.fixture(scope="module")
def case():
    """A small MDP with a terminal state, a target pi and a behaviour mu (NumPy float64)."""
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(S), size=(S, A))
    P[S - 1] = 0.0
    P[S - 1, :, S - 1] = 1.0  # absorbing terminal
    R = rng.normal(size=(S, A, S))
    R[S - 1] = 0.0
    terminal = np.zeros(S)
    terminal[S - 1] = 1.0
    pi = rng.dirichlet(np.ones(A), size=S)
    mu = rng.dirichlet(np.ones(A), size=S)
    v = rng.normal(size=S) * 2
    init = rng.dirichlet(np.ones(S))
    return dict(P=P, R=R, terminal=terminal, pi=pi, mu=mu, v=v, init=init, gamma=0.9)


def mdp_of(c, gamma=None):
    return M.make_mdp(jnp.asarray(c["P"]), jnp.asarray(c["R"]), c["gamma"] if gamma is None else gamma,
                      init=jnp.asarray(c["init"]), terminal=jnp.asarray(c["terminal"]))


def np_disc(c, gamma=None):
    return (c["gamma"] if gamma is None else gamma) * (1 - c["terminal"])


def np_bellman(c, pol_, v, gamma=None):
    d = np_disc(c, gamma)
    out = np.zeros(S)
    for s in range(S):
        for a in range(A):
            for t in range(S):
                out[s] += pol_[s, a] * c["P"][s, a, t] * (c["R"][s, a, t] + d[t] * v[t])
    return out


def np_policy_evaluation(c, pol_, gamma=None, iters=3000):
    v = np.zeros(S)
    for _ in range(iters):
        v = np_bellman(c, pol_, v, gamma)
    return v


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_policy_value_q_and_bellman_vs_iteration(case, gamma):
    with jax.enable_x64(True):
        m = mdp_of(case, gamma)
        pi = jnp.asarray(case["pi"])
        want = np_policy_evaluation(case, case["pi"], gamma, iters=400 if gamma < 1 else 3000)
        np.testing.assert_allclose(exact.policy_value(m, pi), want, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(exact.bellman_operator(m, pi, jnp.asarray(case["v"])),
                                   np_bellman(case, case["pi"], case["v"], gamma), rtol=1e-12)
        q = exact.q_values(m, pi)
        d = np_disc(case, gamma)
        q_np = np.einsum("sat,sat->sa", case["P"], case["R"] + d[None, None] * want[None, None])
        np.testing.assert_allclose(q, q_np, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(exact.n_step_backup(m, pi, jnp.asarray(case["v"]), 3),
                                   np_bellman(case, case["pi"], np_bellman(case, case["pi"], np_bellman(
                                       case, case["pi"], case["v"], gamma), gamma), gamma), rtol=1e-12)


def test_policy_value_float32_close_to_float64(case):
    m32 = M.make_mdp(jnp.asarray(case["P"], jnp.float32), jnp.asarray(case["R"], jnp.float32), 0.9,
                     terminal=jnp.asarray(case["terminal"], jnp.float32))
    v32 = exact.policy_value(m32, jnp.asarray(case["pi"], jnp.float32))
    assert v32.dtype == jnp.float32
    np.testing.assert_allclose(v32, np_policy_evaluation(case, case["pi"], iters=400), rtol=1e-4, atol=1e-5)


def test_visitation_vs_power_series_and_monte_carlo(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        d = np.asarray(exact.visitation(m, jnp.asarray(case["pi"]), normalize=False))
        Ppi = np.einsum("sa,sat->st", case["pi"], case["P"]) * np_disc(case)[None, :]
        want, x = np.zeros(S), case["init"].copy()
        for _ in range(600):
            want += x
            x = x @ Ppi
        np.testing.assert_allclose(d, want, rtol=1e-10)
        dn = exact.visitation(m, jnp.asarray(case["pi"]))
        np.testing.assert_allclose(np.sum(dn), 1.0, rtol=1e-12)
        # Monte-Carlo: simulate episodes, discounted visit counts (99.9% level, 4 sigma).
        rng = np.random.default_rng(1)
        n = 4000
        counts = np.zeros((n, S))
        for i in range(n):
            s, w = rng.choice(S, p=case["init"]), 1.0
            for _ in range(200):
                counts[i, s] += w
                a = rng.choice(A, p=case["pi"][s])
                t = rng.choice(S, p=case["P"][s, a])
                w *= np_disc(case)[t]
                s = t
                if w < 1e-6:
                    break
        mean, se = counts.mean(0), counts.std(0) / np.sqrt(n)
        assert np.all(np.abs(mean - d) <= 4 * se + 1e-9)


def np_moments(c, mu, y):
    mean = np.zeros(S)
    for s in range(S):
        for a in range(A):
            for t in range(S):
                mean[s] += mu[s, a] * c["P"][s, a, t] * y[s, a, t]
    var = np.zeros(S)
    for s in range(S):
        for a in range(A):
            for t in range(S):
                var[s] += mu[s, a] * c["P"][s, a, t] * (y[s, a, t] - mean[s]) ** 2
    return mean, var


def test_target_moments_and_covariance_vs_enumeration(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        y = np.random.default_rng(2).normal(size=(S, A, S))
        x = np.random.default_rng(3).normal(size=(S, A, S))
        mean, var = exact.target_moments(m, jnp.asarray(case["mu"]), jnp.asarray(y))
        want_m, want_v = np_moments(case, case["mu"], y)
        np.testing.assert_allclose(mean, want_m, rtol=1e-12)
        np.testing.assert_allclose(var, want_v, rtol=1e-12)
        cov = exact.target_covariance(m, jnp.asarray(case["mu"]), jnp.asarray(x), jnp.asarray(y))
        mx, _ = np_moments(case, case["mu"], x)
        want_c, _ = np_moments(case, case["mu"], (x - mx[:, None, None]) * (y - want_m[:, None, None]))
        np.testing.assert_allclose(cov, want_c, rtol=1e-10, atol=1e-14)
        # Cells of probability zero are ignored even when they hold inf (support violations).
        mu0 = case["mu"].copy()
        mu0[:, 0] = 0.0
        mu0 /= mu0.sum(1, keepdims=True)
        y_inf = y.copy()
        y_inf[:, 0, :] = np.inf
        m0, v0 = exact.target_moments(m, jnp.asarray(mu0), jnp.asarray(y_inf))
        np.testing.assert_allclose(m0, np_moments(case, mu0, np.where(np.isinf(y_inf), 0, y))[0], rtol=1e-12)
        assert np.all(np.isfinite(v0))


def test_target_moments_vs_monte_carlo(case):
    """Sampled check at 99.9% confidence (|z| < 3.29 per state, fixed seed)."""
    with jax.enable_x64(True):
        m = mdp_of(case)
        y = np.random.default_rng(4).normal(size=(S, A, S)) * 3
        mean, var = (np.asarray(x) for x in exact.target_moments(m, jnp.asarray(case["mu"]), jnp.asarray(y)))
        rng = np.random.default_rng(5)
        n = 4000
        for s in range(S - 1):
            a = rng.choice(A, size=n, p=case["mu"][s])
            t = np.array([rng.choice(S, p=case["P"][s, ai]) for ai in a])
            samples = y[s, a, t]
            z = (samples.mean() - mean[s]) / np.sqrt(var[s] / samples.size)
            assert abs(z) < 3.29


def test_clipped_policy_and_fixed_points_vs_iteration(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi, mu = jnp.asarray(case["pi"]), jnp.asarray(case["mu"])
        c = 1.3
        z, pit = exact.z_and_clipped_policy(pi, mu, c, "truncate")
        mn = np.minimum(c * case["mu"], case["pi"])
        np.testing.assert_allclose(z, mn.sum(1), rtol=1e-12)
        np.testing.assert_allclose(pit, mn / mn.sum(1, keepdims=True), rtol=1e-12)
        zm, pim = exact.z_and_clipped_policy(pi, mu, 1.5, "mask")
        rho = case["pi"] / case["mu"]
        keep = (rho >= 1 / 1.5) & (rho <= 1.5)
        np.testing.assert_allclose(zm, np.sum(np.where(keep, case["pi"], 0), 1), rtol=1e-12)
        # Fixed point of the expected clipped update V <- V + 0.5 E_mu[w delta], iterated in NumPy.
        w = np.minimum(rho, c)
        d = np_disc(case)
        v = np.zeros(S)
        for _ in range(3000):
            delta = case["R"] + d[None, None] * v[None, None] - v[:, None, None]
            v = v + 0.5 * np.einsum("sa,sat,sat->s", case["mu"] * w, case["P"], delta)
        np.testing.assert_allclose(exact.clipped_fixed_point(m, pi, mu, c), v, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(exact.policy_value(m, pit), v, rtol=1e-9, atol=1e-10)
        # Naive clipped target with a fixed baseline b: iterate E[H + (w-1)(H-b)].
        b = np.linspace(-2, 3, S)
        v = np.zeros(S)
        for _ in range(3000):
            h = case["R"] + d[None, None] * v[None, None]
            y = h + (w[:, :, None] - 1) * (h - b[:, None, None])
            v = np.einsum("sa,sat,sat->s", case["mu"], case["P"], y)
        got = exact.naive_clipped_fixed_point(m, pi, mu, jnp.asarray(b), c)
        np.testing.assert_allclose(got, v, rtol=1e-9, atol=1e-10)
        assert np.max(np.abs(got - exact.policy_value(m, pit))) > 1e-3  # the baseline leaks


def test_replay_mixture_policies(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi = jnp.asarray(case["pi"])
        rng = np.random.default_rng(6)
        mus = jnp.asarray(rng.dirichlet(np.ones(A), size=(3, S)))
        q = jnp.asarray(rng.dirichlet(np.ones(3), size=S).T)  # [K, S]
        np.testing.assert_allclose(exact.replay_policy(mus, q), np.einsum("ks,ksa->sa", q, mus), rtol=1e-12)
        # Unclipped ratios: every mixture has fixed point V^pi (Eq 6).
        np.testing.assert_allclose(exact.clipped_fixed_point(m, pi, mus, None, "ratio", mix=q),
                                   exact.policy_value(m, pi), rtol=1e-10)
        zbar, pibar = exact.mixture_clipped_policy(pi, mus, q, 1.2, "truncate")
        mm = np.einsum("ks,ksa->sa", q, np.minimum(1.2 * np.asarray(mus), case["pi"][None]))
        np.testing.assert_allclose(zbar, mm.sum(1), rtol=1e-12)
        np.testing.assert_allclose(pibar, mm / mm.sum(1, keepdims=True), rtol=1e-12)
        with pytest.raises(ValueError, match="mix must have shape"):
            exact.replay_policy(mus, jnp.ones((2,)))


def test_optimal_baseline_minimises_brute_force_variance(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi, mu, v = (jnp.asarray(case[k]) for k in ("pi", "mu", "v"))
        b_star = np.asarray(exact.optimal_baseline(m, pi, mu, v))
        rho = case["pi"] / case["mu"]
        h = case["R"] + np_disc(case)[None, None] * case["v"][None, None]
        grid = np.linspace(-30, 30, 60001)
        for s in range(S - 1):
            p = case["mu"][s][:, None] * case["P"][s]
            ys = rho[s][None, :, None] * h[s][None] - (rho[s][None, :, None] - 1) * grid[:, None, None]
            means = np.sum(p[None] * ys, axis=(1, 2))
            var = np.sum(p[None] * (ys - means[:, None, None]) ** 2, axis=(1, 2))
            assert abs(grid[np.argmin(var)] - b_star[s]) <= 1.5e-3
        # Closed-form variance agrees with enumeration.
        bs = jnp.asarray(np.random.default_rng(7).normal(size=(5, S)))
        got = exact.baseline_variance(m, pi, mu, v, bs)
        for i in range(5):
            y = rho[:, :, None] * h - (rho[:, :, None] - 1) * np.asarray(bs[i])[:, None, None]
            np.testing.assert_allclose(got[i], np_moments(case, case["mu"], y)[1], rtol=1e-9, atol=1e-12)


def np_vtrace_expectation(c, pi, mu, v, n, lam, rbar, cbar):
    """E_mu[v_0 | s_0] of Eq 11 by enumerating every length-n trajectory (plain Python loops)."""
    d = np_disc(c)
    out = np.zeros(S)
    for s0 in range(S):
        for traj in itertools.product(range(A * S), repeat=n):
            s, prob, corr, trace = s0, 1.0, 0.0, 1.0
            for k, cell in enumerate(traj):
                a, t = divmod(cell, S)
                prob *= mu[s, a] * c["P"][s, a, t]
                rho = pi[s, a] / mu[s, a]
                delta = c["R"][s, a, t] + d[t] * v[t] - v[s]
                corr += trace * min(rbar, rho) * delta
                trace *= d[t] * lam * min(cbar, rho)
                s = t
            out[s0] += prob * (v[s0] + corr)
    return out


@pytest.mark.parametrize("lam,rbar,cbar", [(1.0, None, None), (0.8, 1.0, 1.0), (0.6, 2.0, 1.5)])
def test_expected_vtrace_operator_vs_trajectory_enumeration(case, lam, rbar, cbar):
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi, mu, v = (jnp.asarray(case[k]) for k in ("pi", "mu", "v"))
        n = 2
        got = exact.expected_vtrace_operator(m, pi, mu, v, n_steps=n, lambda_=lam,
                                             clip_rho_threshold=rbar, clip_c_threshold=cbar)
        inf = float("inf")
        want = np_vtrace_expectation(case, case["pi"], case["mu"], case["v"], n, lam,
                                     inf if rbar is None else rbar, inf if cbar is None else cbar)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_lambda_return_operator_limits(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi, v = jnp.asarray(case["pi"]), jnp.asarray(case["v"])
        t1 = exact.bellman_operator(m, pi, v)
        np.testing.assert_allclose(exact.lambda_return_operator(m, pi, v, 0.0, 4), t1, rtol=1e-12)
        np.testing.assert_allclose(exact.lambda_return_operator(m, pi, v, 1.0, 3),
                                   exact.n_step_backup(m, pi, v, 3), rtol=1e-12)
        np.testing.assert_allclose(exact.lambda_return_operator(m, pi, v, 0.5, 1), t1, rtol=1e-12)


def test_softmax_score_and_policy_gradient_vs_finite_differences(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        logits = jnp.asarray(np.random.default_rng(8).normal(size=(S, A)))
        T = 0.7
        pi = pol.softmax_policy(logits, T)
        u = exact.softmax_score(pi, T)
        jac = jax.jacobian(lambda th: jax.nn.log_softmax(th / T, axis=-1))(logits)  # [S, A, S, A]
        for s in range(S):
            np.testing.assert_allclose(u[s], jac[s, :, s, :], rtol=1e-12, atol=1e-14)
        J_jit = jax.jit(lambda th: jnp.dot(m.init, exact.policy_value(m, pol.softmax_policy(th, T))))
        J = lambda th: float(J_jit(th))
        g = np.asarray(exact.policy_gradient(m, pi, u))
        eps = 1e-6
        fd = np.zeros((S, A))
        for s in range(S):
            for a in range(A):
                e = jnp.zeros((S, A)).at[s, a].set(eps)
                fd[s, a] = (J(logits + e) - J(logits - e)) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_actor_identities_small(case):
    """Eq 1 decomposition and Eq 2 invariance, against explicit NumPy sums."""
    with jax.enable_x64(True):
        m = mdp_of(case)
        pi, mu = jnp.asarray(case["pi"]), jnp.asarray(case["mu"])
        u = np.asarray(exact.softmax_score(pi))
        b = np.linspace(-1, 2, S)
        g_b, cov, drift = exact.actor_drift_decomposition(m, pi, mu, jnp.asarray(b))
        q_mu = np.asarray(exact.q_values(m, mu))
        v_mu = np.sum(case["mu"] * q_mu, 1)
        want = np.einsum("sa,sab->sb", case["mu"] * (q_mu - b[:, None]), u)
        np.testing.assert_allclose(g_b, want, rtol=1e-12, atol=1e-14)
        m_mu = np.einsum("sa,sab->sb", case["mu"], u)
        np.testing.assert_allclose(drift, (v_mu - b)[:, None] * m_mu, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(cov) + np.asarray(drift), want, rtol=1e-10, atol=1e-13)
        w = np.minimum(case["pi"] / case["mu"], 1.2)
        rhs = exact.score_covariance(m, mu, jnp.asarray(u), jnp.asarray(w), jnp.asarray(q_mu))
        for bb in (b, -3 * b, np.zeros(S)):
            lhs = exact.centred_actor_update(m, mu, jnp.asarray(u), jnp.asarray(w), jnp.asarray(q_mu - bb[:, None]))
            np.testing.assert_allclose(lhs, rhs, rtol=1e-10, atol=1e-13)


def test_errors_name_the_argument(case):
    with jax.enable_x64(True):
        m = mdp_of(case)
        with pytest.raises(ValueError, match="pi must have shape"):
            exact.policy_value(m, jnp.ones((S, A + 1)) / (A + 1))
        with pytest.raises(ValueError, match="y must have shape"):
            exact.target_moments(m, jnp.asarray(case["mu"]), jnp.ones((S, A)))
        with pytest.raises(ValueError, match="single MDP"):
            exact.policy_value(M.random_mdp(jax.random.PRNGKey(0), 2, S, A), jnp.ones((S, A)) / A)
        with pytest.raises(ValueError, match="vbar must have shape"):
            exact.transition_grid(m, jnp.asarray(case["pi"]), jnp.asarray(case["mu"]), jnp.ones(S + 1))


def test_vmap_over_a_batch_of_mdps():
    with jax.enable_x64(True):
        mdps = M.random_mdp(jax.random.PRNGKey(0), 6, 3, 2, gamma=0.8)
        pis = pol.softmax_policy(jax.random.normal(jax.random.PRNGKey(1), (6, 3, 2)))
        batched = jax.jit(jax.vmap(exact.policy_value))(mdps, pis)
        single = jax.jit(exact.policy_value)
        for i in range(6):
            np.testing.assert_allclose(batched[i], single(mdps[i], pis[i]), rtol=1e-12)


def test_solve_dominant_matches_numpy_and_differentiates():
    with jax.enable_x64(True):
        rng = np.random.default_rng(9)
        M = rng.dirichlet(np.ones(6), size=6) * rng.uniform(0.5, 1.0, size=(6, 1))
        a = np.eye(6) - M
        b = rng.normal(size=6)
        np.testing.assert_allclose(exact.solve_dominant(jnp.asarray(a), jnp.asarray(b)), np.linalg.solve(a, b),
                                   rtol=1e-12)
        np.testing.assert_allclose(exact.solve_dominant(jnp.asarray(a.T), jnp.asarray(b)),
                                   np.linalg.solve(a.T, b), rtol=1e-12)
        # Implicit differentiation: d/da_ij of sum(x) = -(a^-T 1)_i x_j.
        g = jax.grad(lambda aa: jnp.sum(exact.solve_dominant(aa, jnp.asarray(b))))(jnp.asarray(a))
        x = np.linalg.solve(a, b)
        np.testing.assert_allclose(g, -np.outer(np.linalg.solve(a.T, np.ones(6)), x), rtol=1e-10)
        with pytest.raises(ValueError, match="solve_dominant takes"):
            exact.solve_dominant(jnp.ones((3, 3)), jnp.ones(2))


@pytest.mark.parametrize("method", ["auto", "lapack", "elimination", "krylov", "dominant"])
def test_batched_policy_value_methods_agree_with_vmap(method):
    with jax.enable_x64(True):
        mdps = M.random_mdp(jax.random.PRNGKey(2), 5, 4, 3, gamma=0.95)
        mdps = mdps.replace(terminal=mdps.terminal.at[:, 3].set(1.0))
        pis = pol.softmax_policy(jax.random.normal(jax.random.PRNGKey(3), (5, 4, 3)))
        want = jax.vmap(exact.policy_value)(mdps, pis)
        got = jax.jit(lambda m, p: exact.batched_policy_value(m, p, method=method))(mdps, pis)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)
        with pytest.raises(ValueError, match="method must be"):
            exact.batched_policy_value(mdps, pis, method="qr")


def test_krylov_falls_back_to_lu_on_slow_mixing_chains():
    """A long undiscounted chain mixes slowly: BiCGSTAB (capped at S iterations) may not
    converge, and the residual check must then route the batch to LU (exact either way)."""
    with jax.enable_x64(True):
        c = M.chain_mdp(60, gamma=0.999, slip=0.45)
        mdps = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), c)
        pis = jnp.stack([pol.uniform_policy(61, 2), jnp.zeros((61, 2)).at[:, 1].set(1.0)])
        want = jax.vmap(exact.policy_value)(mdps, pis)
        got = jax.jit(lambda m, p: exact.batched_policy_value(m, p, method="krylov"))(mdps, pis)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
