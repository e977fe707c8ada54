"""The LQR testbed's exact truth (tabular/lqr.py, tabular/lqr_offpolicy.py) against
references written here: scipy's discrete Lyapunov solver, value iteration on the quadratic
coefficients, the classic closed-form LQR gradient (Fazel et al. 2018), finite differences,
dense brute-force integration and Monte Carlo.

Statistical tests: |z| <= 4 (two-sided level 6.3e-5 each). Power: each MC test also asserts
that a named wrong answer (the bug it targets) sits >= 8 standard errors from the estimate,
so such a bug fails with probability > 0.97.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sl
from scipy import integrate, optimize

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.actor import policy_loss
from vccc_jax.tabular import lqr as lq
from vccc_jax.tabular import lqr_offpolicy as lo

Z = 4.0


@pytest.fixture(scope="module", autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def f64(x):
    return jnp.asarray(x, jnp.float64)


@pytest.fixture(scope="module")
def prob(x64):
    lqr = lq.LQR(a=f64([[0.9, 0.2], [0.0, 0.7]]), b=f64([[0.0], [0.5]]),
                 w=f64([[0.05, 0.01], [0.01, 0.08]]), q=f64([[1.0, 0.0], [0.0, 0.5]]),
                 r=f64([[0.3]]), gamma=f64(0.9), s0_mean=f64([0.5, -0.3]), s0_cov=0.2 * jnp.eye(2))
    pi = lq.GaussianPolicy(f64([[-0.4, -0.6]]), f64([0.2]), f64([np.log(0.5)]))
    mu = lq.GaussianPolicy(f64([[-0.2, -0.3]]), f64([-0.1]), f64([np.log(0.6)]))
    lq.check(lqr, pi, mu)
    assert float(lq.closed_loop_radius(lqr, pi)) < 0.95
    vbar = lq.Quadratic(f64([[-2.0, 0.3], [0.3, -1.0]]), f64([0.2, -0.1]), f64(-1.5))
    return lqr, pi, mu, vbar


STATES = np.array([[0.5, -1.0], [1.0, 0.3], [0.0, 0.0]])


def test_value_is_lyapunov_solution_and_fixed_point_of_bellman(prob):
    lqr, pi, _, _ = prob
    v = lq.value(lqr, pi)
    f = np.asarray(lqr.a + lqr.b @ pi.gain)
    p_ref = sl.solve_discrete_lyapunov(np.sqrt(0.9) * f.T, -np.asarray(lqr.q + pi.gain.T @ lqr.r @ pi.gain))
    np.testing.assert_allclose(v.mat, p_ref, atol=1e-11)
    # value iteration on the coefficients from Vbar = 0 (0.9^400 ~ 5e-19): an independent route
    # to the linear and constant parts.
    it = lq.Quadratic(jnp.zeros((2, 2)), jnp.zeros(2), f64(0.0))
    for _ in range(400):
        it = lq.bellman(lqr, pi, it)
    for got, want in zip(v, it):
        np.testing.assert_allclose(got, want, atol=1e-9)


def test_bellman_and_value_vs_monte_carlo(prob):
    lqr, pi, _, vbar = prob
    s = f64([0.4, -0.8])
    n = 200_000
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    a = lq.distribution(pi, jnp.broadcast_to(s, (n, 2))).sample(seed=k1)
    h = lq.reward(lqr, s, a) + lqr.gamma * vbar(lq.step(lqr, jnp.broadcast_to(s, (n, 2)), a, k2))
    se = float(jnp.std(h)) / np.sqrt(n)
    want = float(lq.bellman(lqr, pi, vbar)(s))
    assert abs(float(jnp.mean(h)) - want) <= Z * se
    # power: forgetting the noise term gamma tr(Vbar W) of E Vbar(s') is >= 8 SE away
    assert abs(0.9 * float(jnp.trace(vbar.mat @ lqr.w))) >= 8 * se

    # V^pi(s0) against discounted Monte-Carlo returns (H = 250: 0.9^250 ~ 4e-12)
    @jax.jit
    def returns(key):
        def body(carry, k):
            st, disc, ret = carry
            ka, kw = jax.random.split(k)
            act = lq.distribution(pi, st).sample(seed=ka)
            return (lq.step(lqr, st, act, kw), disc * lqr.gamma, ret + disc * lq.reward(lqr, st, act)), None
        n0 = 4000
        s0 = jnp.broadcast_to(s, (n0, 2))
        (_, _, ret), _ = jax.lax.scan(body, (s0, f64(1.0), jnp.zeros(n0)), jax.random.split(key, 250))
        return ret
    ret = returns(jax.random.PRNGKey(4))
    se = float(jnp.std(ret)) / np.sqrt(ret.size)
    v = lq.value(lqr, pi)
    assert abs(float(jnp.mean(ret)) - float(v(s))) <= Z * se
    # power: dropping the action-noise cost tr(R Sigma) / (1 - gamma) is >= 8 SE away
    assert float(lqr.r[0, 0] * pi.cov[0, 0]) / 0.1 >= 8 * se


def test_discounted_state_moments_vs_sum(prob):
    lqr, pi, _, _ = prob
    m, x = lq.discounted_state_moments(lqr, pi)
    f, f0 = np.asarray(lqr.a + lqr.b @ pi.gain), np.asarray(lqr.b @ pi.offset)
    wpi = np.asarray(lqr.b @ pi.cov @ lqr.b.T + lqr.w)
    mt, xt = np.asarray(lqr.s0_mean), np.asarray(lqr.s0_cov + jnp.outer(lqr.s0_mean, lqr.s0_mean))
    sm, sx = np.zeros(2), np.zeros((2, 2))
    for t in range(500):      # the moment recursion, summed
        sm += 0.9 ** t * mt
        sx += 0.9 ** t * xt
        xt = f @ xt @ f.T + np.outer(f @ mt, f0) + np.outer(f0, f @ mt) + np.outer(f0, f0) + wpi
        mt = f @ mt + f0
    np.testing.assert_allclose(m, 0.1 * sm, atol=1e-11)
    np.testing.assert_allclose(x, 0.1 * sx, atol=1e-11)


def test_true_gradient_matches_fazel_and_finite_differences(prob):
    lqr, pi, _, _ = prob
    grad = jax.grad(lq.objective, argnums=1)(lqr, pi)
    # Fazel et al.: with k0 = 0 and a centred start, grad_K cost = 2 E_K Sigma_gamma with
    # E_K = (R + gamma B'PB) K + gamma B'PA, P the cost-to-go matrix, Sigma_gamma =
    # sum_t gamma^t E s_t s_t' (noise from W and B Sigma B'); J = -cost.
    lq0 = lqr._replace(s0_mean=jnp.zeros(2))
    pi0 = pi._replace(offset=jnp.zeros(1))
    g0 = jax.grad(lq.objective, argnums=1)(lq0, pi0).gain
    p = -np.asarray(lq.value(lq0, pi0).mat)
    a, b, r, k = (np.asarray(x) for x in (lqr.a, lqr.b, lqr.r, pi.gain))
    f = a + b @ k
    noise = np.asarray(lqr.w + lqr.b @ pi.cov @ lqr.b.T)
    sig = sl.solve_discrete_lyapunov(np.sqrt(0.9) * f, np.asarray(lqr.s0_cov) + 0.9 / 0.1 * noise)
    fazel = 2 * ((r + 0.9 * b.T @ p @ b) @ k + 0.9 * b.T @ p @ a) @ sig
    np.testing.assert_allclose(g0, -fazel, rtol=1e-9)
    # central differences for every parameter of the general (offset, shifted start) case
    eps = 1e-6
    for name in ("gain", "offset", "log_std"):
        x = np.asarray(getattr(pi, name))
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            d = np.zeros_like(x)
            d[idx] = eps
            up = float(lq.objective(lqr, pi._replace(**{name: f64(x + d)})))
            dn = float(lq.objective(lqr, pi._replace(**{name: f64(x - d)})))
            fd[idx] = (up - dn) / (2 * eps)
        np.testing.assert_allclose(getattr(grad, name), fd, rtol=1e-6, atol=1e-7)


def test_expected_is_actor_update_is_the_true_gradient(prob):
    lqr, pi, mu, _ = prob
    upd = lo.expected_actor_update(lqr, pi, mu, jax.jit(policy_loss))
    grad = jax.grad(lq.objective, argnums=1)(lqr, pi)
    for name in ("gain", "offset", "log_std"):
        np.testing.assert_allclose(getattr(upd, name), getattr(grad, name), rtol=1e-8, atol=1e-9)


@pytest.fixture(scope="module")
def grid(prob):
    lqr, pi, mu, vbar = prob
    return lo.transition_grid(lqr, pi, mu, vbar, STATES)


def test_grid_vccc_moments_equal_closed_forms(prob, grid):
    lqr, pi, mu, vbar = prob
    y = ct.vccc_target(grid.rewards, grid.discounts, grid.values, grid.next_values, grid.log_rhos)
    mean, var = lo.grid_moments(grid, y)
    np.testing.assert_allclose(mean, lq.bellman(lqr, pi, vbar)(f64(STATES)), atol=1e-10)
    np.testing.assert_allclose(var, lo.vccc_variance(lqr, pi, mu, vbar, f64(STATES)), rtol=1e-9)
    # and the uncorrected target's mean is the stale backup T_mu Vbar
    h = ct.uncorrected_target(grid.rewards, grid.discounts, grid.next_values)
    np.testing.assert_allclose(lo.grid_moments(grid, h)[0], lq.bellman(lqr, mu, vbar)(f64(STATES)),
                               atol=1e-10)


def test_vccc_moments_vs_monte_carlo(prob):
    lqr, pi, mu, vbar = prob
    s = f64(STATES[0])
    n = 400_000
    k1, k2 = jax.random.split(jax.random.PRNGKey(5))
    sb = jnp.broadcast_to(s, (n, 2))
    a = lq.distribution(mu, sb).sample(seed=k1)
    y = ct.vccc_target(lq.reward(lqr, sb, a), jnp.full(n, lqr.gamma), vbar(sb),
                       vbar(lq.step(lqr, sb, a, k2)), lo.log_ratio(pi, mu, sb, a))
    mean, var = float(jnp.mean(y)), float(jnp.var(y))
    se = float(jnp.std(y)) / np.sqrt(n)
    assert abs(mean - float(lq.bellman(lqr, pi, vbar)(s))) <= Z * se
    assert abs(float(lq.bellman(lqr, mu, vbar)(s)) - float(lq.bellman(lqr, pi, vbar)(s))) >= 8 * se
    se_var = float(jnp.std((y - mean) ** 2)) / np.sqrt(n)   # delta method for the sample variance
    want = float(lo.vccc_variance(lqr, pi, mu, vbar, s[None])[0])
    assert abs(var - want) <= Z * se_var
    # power: the variance with the ratio dropped (that of the uncorrected target) is >= 8 SE away
    h = y - vbar(sb)
    h = vbar(sb) + h * jnp.exp(-lo.log_ratio(pi, mu, sb, a))
    assert abs(float(jnp.var(h)) - want) >= 8 * se_var


def test_variance_infinite_for_heavy_tailed_ratio(prob):
    lqr, pi, mu, vbar = prob
    wide = pi._replace(log_std=mu.log_std + 0.5 * np.log(2.0) + 0.01)   # v_pi > 2 v_mu
    assert np.isinf(lo.vccc_variance(lqr, wide, mu, vbar, f64(STATES))).all()
    narrow = pi._replace(log_std=mu.log_std + 0.5 * np.log(2.0) - 0.01)
    assert np.isfinite(lo.vccc_variance(lqr, narrow, mu, vbar, f64(STATES))).all()


def _brute_law(pi, mu, clip, kind):
    """Z, mean, var of mu w / Z by adaptive quadrature (scipy.integrate.quad) on the pieces
    between the crossings rho = c, rho = 1/c, found by bisection from sign changes on a grid."""
    mp, mm = float(pi.offset[0]), float(mu.offset[0])
    sp, sm = float(np.exp(pi.log_std[0])), float(np.exp(mu.log_std[0]))
    lo_, hi_ = min(mm - 30 * sm, mp - 30 * sp), max(mm + 30 * sm, mp + 30 * sp)
    npdf = lambda x, m, s: np.exp(-0.5 * ((x - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))  # noqa: E731
    log_rho = lambda x: np.log(npdf(x, mp, sp) / npdf(x, mm, sm))  # noqa: E731
    e = np.linspace(mm - 10 * sm, mm + 10 * sm, 20_001)
    cuts = [lo_, hi_]
    for lvl in (np.log(clip), -np.log(clip)):
        d = log_rho(e) - lvl
        for i in np.nonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0]:
            cuts.append(optimize.brentq(lambda x: log_rho(x) - lvl, e[i], e[i + 1], xtol=1e-15))
    cuts = sorted(cuts)

    def dens(x):
        p_pi, p_mu = npdf(x, mp, sp), npdf(x, mm, sm)
        if kind == "truncate":      # mu min(rho, c) = min(pi, c mu)
            return min(p_pi, clip * p_mu)
        return p_pi if p_mu / clip <= p_pi <= clip * p_mu else 0.0

    mom = [sum(integrate.quad(lambda x: dens(x) * x ** k, a, b, epsabs=1e-14, epsrel=1e-13,
                              limit=200)[0] for a, b in zip(cuts[:-1], cuts[1:])) for k in range(3)]
    z, mean = mom[0], mom[1] / mom[0]
    return z, mean, mom[2] / z - mean ** 2


@pytest.mark.parametrize("log_std_pi", [np.log(0.5), np.log(0.8)])   # pi narrower / wider than mu
@pytest.mark.parametrize("kind", ["truncate", "mask"])
def test_clipped_law_vs_brute_force(prob, kind, log_std_pi):
    _, pi, mu, _ = prob
    pi = pi._replace(gain=mu.gain, log_std=f64([log_std_pi]))
    law = lo.clipped_noise_law(pi, mu, 1.5, kind)
    ref = _brute_law(pi, mu, 1.5, kind)
    np.testing.assert_allclose(law, ref, rtol=1e-8, atol=1e-9)
    assert law.z < 0.98        # the clip is active


def test_clipped_fixed_point_and_expected_target(prob):
    lqr, pi, mu, vbar = prob
    mu = mu._replace(gain=pi.gain)
    g = lo.transition_grid(lqr, pi, mu, vbar, STATES, clips=(1.5,))
    for kind in ("truncate", "mask"):
        y = ct.clipped_target(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos,
                              clip=1.5, kind=kind)
        mean, _ = lo.grid_moments(g, y)
        np.testing.assert_allclose(
            mean, lo.clipped_expected_target(lqr, pi, mu, vbar, 1.5, kind)(f64(STATES)), atol=1e-9)
        fp = lo.clipped_fixed_point(lqr, pi, mu, 1.5, kind)
        # a fixed point of the expected update, and not V^pi (the clip's bias is there)
        np.testing.assert_allclose(lo.clipped_expected_target(lqr, pi, mu, fp, 1.5, kind)(f64(STATES)),
                                   fp(f64(STATES)), atol=1e-10)
        assert np.max(np.abs(fp(f64(STATES)) - lq.value(lqr, pi)(f64(STATES)))) > 1e-2
    with pytest.raises(ValueError, match="share the gain"):
        lo.clipped_noise_law(pi, mu._replace(gain=pi.gain + 0.1), 1.5)


def test_clipped_target_vs_monte_carlo_at_fixed_point(prob):
    lqr, pi, mu, _ = prob
    mu = mu._replace(gain=pi.gain, offset=f64([-0.7]))       # a larger shift: the clip bites
    fp = lo.clipped_fixed_point(lqr, pi, mu, 1.2, "truncate")
    s = f64(STATES[1])
    n = 400_000
    k1, k2 = jax.random.split(jax.random.PRNGKey(6))
    sb = jnp.broadcast_to(s, (n, 2))
    a = lq.distribution(mu, sb).sample(seed=k1)
    y = ct.clipped_target(lq.reward(lqr, sb, a), jnp.full(n, lqr.gamma), fp(sb),
                          fp(lq.step(lqr, sb, a, k2)), lo.log_ratio(pi, mu, sb, a), clip=1.2)
    se = float(jnp.std(y)) / np.sqrt(n)
    assert abs(float(jnp.mean(y)) - float(fp(s))) <= Z * se
    # power: at Vbar = V^pi (the unclipped answer) the clipped target's mean moves >= 8 SE
    v_pi = lq.value(lqr, pi)
    off = lo.clipped_expected_target(lqr, pi, mu, v_pi, 1.2)(s) - v_pi(s)
    assert abs(float(off)) >= 8 * se
