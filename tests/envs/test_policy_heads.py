"""The actor's distribution heads (envs/policy_heads.py) and the Gaussian actor network against
NumPy / SciPy formulas written here: the diagonal-Gaussian log-density, entropy and KL; the
tanh-squashed log-density with its change of variables (and that it integrates to 1); the
behaviour law with a noise scale; Z(s) = E_mu[w(rho)] of a 1-d Gaussian pair against
quadrature in float64; the interpolated proximal policy's log-density."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from vccc_jax.envs.policy_heads import CategoricalHead, GaussianHead, gaussian_z
from vccc_jax.train.networks import GaussianActor

MEAN = np.array([[0.3, -0.5], [1.2, 0.0]], np.float32)
LOG_STD = np.array([[-0.2, 0.4], [0.1, -0.7]], np.float32)
ROWS = np.concatenate([MEAN, LOG_STD], -1)
HEAD = GaussianHead(low=(-2.0, -2.0), high=(2.0, 2.0))


def np_log_normal(x, m, s):
    return np.sum(-0.5 * ((x - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), -1)


def test_gaussian_log_prob_entropy_kl_and_behaviour_scale():
    a = np.array([[0.0, 0.1], [2.0, -1.0]], np.float32)
    np.testing.assert_allclose(HEAD.log_prob(ROWS, a), np_log_normal(a, MEAN, np.exp(LOG_STD)), rtol=1e-5)
    np.testing.assert_allclose(HEAD.dist(ROWS).log_prob(a), HEAD.log_prob(ROWS, a), rtol=1e-5)
    beh = GaussianHead((-2.0, -2.0), (2.0, 2.0), noise_scale=1.5).behaviour(ROWS)
    np.testing.assert_allclose(HEAD.log_prob(beh, a), np_log_normal(a, MEAN, 1.5 * np.exp(LOG_STD)), rtol=1e-5)
    np.testing.assert_allclose(HEAD.entropy(ROWS), np.sum(LOG_STD + 0.5 * np.log(2 * np.pi * np.e), -1), rtol=1e-5)
    sp, sq = np.exp(LOG_STD[0]), np.exp(LOG_STD[1])
    want = np.sum(np.log(sq / sp) + (sp ** 2 + (MEAN[0] - MEAN[1]) ** 2) / (2 * sq ** 2) - 0.5)
    np.testing.assert_allclose(HEAD.kl(ROWS[0], ROWS[1]), want, rtol=1e-5)
    many = jnp.broadcast_to(ROWS[0], (20000, 4))
    draws = HEAD.sample(many, HEAD.noise(jax.random.PRNGKey(0), jax.ShapeDtypeStruct(many.shape, jnp.float32)))
    np.testing.assert_allclose(np.std(np.asarray(draws), 0), sp, rtol=0.03)   # 4.2 s.e. at 1 %


def test_squashed_log_prob_has_the_log_det_and_integrates_to_one():
    low, high = (-2.0, 0.0), (2.0, 1.0)
    head = GaussianHead(low, high, squash=True)
    lo_, hi_ = np.array(low), np.array(high)
    a = np.array([[1.5, 0.2], [-0.3, 0.9]], np.float32)
    y = (2 * a - (hi_ + lo_)) / (hi_ - lo_)
    u = np.arctanh(y)
    want = np_log_normal(u, MEAN, np.exp(LOG_STD)) - np.sum(np.log((hi_ - lo_) / 2 * (1 - y ** 2)), -1)
    np.testing.assert_allclose(head.dist(ROWS).log_prob(a), want, rtol=1e-4)
    np.testing.assert_allclose(head.env_action(jnp.asarray(u, jnp.float32)), a, rtol=1e-5)
    # 1-d: the density over (low, high) integrates to 1 (a missing log-det would not)
    one = GaussianHead((-2.0,), (2.0,), squash=True)
    xs = np.linspace(-2, 2, 200_001)[1:-1]
    with jax.enable_x64(True):
        lp = one.dist(jnp.asarray([[0.4, -0.3]])).log_prob(jnp.asarray(xs)[:, None])
    assert abs(np.trapezoid(np.exp(np.asarray(lp)), xs) - 1.0) < 1e-4
    s = head.dist(ROWS).sample(seed=jax.random.PRNGKey(0))
    assert np.all((np.asarray(s) > lo_) & (np.asarray(s) < hi_))
    # unsquashed: the env gets u clipped to the box
    np.testing.assert_array_equal(HEAD.env_action(jnp.asarray([[3.0, -0.5]])), [[2.0, -0.5]])


@pytest.mark.parametrize("pair", [(0.3, 0.8, -0.2, 1.0), (0.3, 1.3, -0.2, 1.0), (0.5, 1.0, 0.0, 1.0),
                                  (-1.0, 0.5, 0.5, 2.0)])
def test_gaussian_z_is_the_expected_weight(pair):
    """Closed-form Z in float64 vs adaptive quadrature of E_mu[w(rho)] (both weight kinds, the
    convex, concave and linear cases of log rho; quadrature accurate to ~1e-8 here)."""
    mp, sp, mm, sm = pair
    for kind, c in (("truncate", 0.9), ("truncate", 1.5), ("truncate", 3.0), ("mask", 1.5), ("mask", 3.0)):
        def mu_w(u):  # mu(u) w(rho(u)) without forming 0 / 0 in the tails
            p, q = stats.norm.pdf(u, mp, sp), stats.norm.pdf(u, mm, sm)
            if kind == "truncate":
                return min(p, c * q)
            log_r = stats.norm.logpdf(u, mp, sp) - stats.norm.logpdf(u, mm, sm)
            return p if -np.log(c) <= log_r <= np.log(c) else 0.0

        # breakpoints of w: where log rho(u) = +-log c (np.roots of the quadratic in u)
        quad = [0.5 / sm ** 2 - 0.5 / sp ** 2, mp / sp ** 2 - mm / sm ** 2,
                0.5 * (mm / sm) ** 2 - 0.5 * (mp / sp) ** 2 + np.log(sm / sp)]
        cuts = [r.real for t in (np.log(c), -np.log(c))
                for r in np.roots([quad[0], quad[1], quad[2] - t]) if abs(r.imag) < 1e-12]
        ref = integrate.quad(mu_w, -40, 40, limit=800, points=[mm, mp] + cuts)[0]
        with jax.enable_x64(True):
            got = float(gaussian_z(jnp.asarray(mp), jnp.log(sp), jnp.asarray(mm), jnp.log(sm), kind, c))
        assert abs(got - ref) < 2e-8, (kind, c, got, ref)
    head = GaussianHead()
    rows = jnp.asarray([[mp, np.log(sp)]], jnp.float32)
    assert float(head.expected_weight(rows, rows, "truncate", 2.0)[0]) == 1.0   # lag 0: exactly 1


def test_interpolated_rows_are_the_geometric_mixture():
    """log N_geo(u) - [(1 - alpha) log mu(u) + alpha log pi(u)] is one constant in u."""
    head = GaussianHead()
    mu, pi = jnp.asarray([[0.2, -0.3]] * 7), jnp.asarray([[-0.4, 0.5]] * 7)
    mix = head.interpolate(mu, pi, jnp.full((7, 1), 0.3))
    us = jnp.linspace(-2, 2, 7)[:, None]
    gap = head.log_prob(mix, us) - 0.7 * head.log_prob(mu, us) - 0.3 * head.log_prob(pi, us)
    np.testing.assert_allclose(gap, gap[0], atol=2e-6)


def test_categorical_head_and_errors():
    logits = np.array([[0.0, 1.0, -1.0]], np.float32)
    head = CategoricalHead()
    rows = head.normalize(logits)
    np.testing.assert_allclose(head.log_prob(rows, np.array([1])), logits[0, 1] - np.log(np.exp(logits).sum()), rtol=1e-6)
    np.testing.assert_allclose(head.dist(rows).log_prob(np.array([1])), head.log_prob(rows, np.array([1])), rtol=1e-6)
    with pytest.raises(ValueError, match="finite action box"):
        GaussianHead((-np.inf,), (np.inf,), squash=True)
    with pytest.raises(ValueError, match="noise_scale"):
        GaussianHead(noise_scale=0.0)


def test_linear_gaussian_actor_is_linear_in_obs():
    net = GaussianActor(action_dim=1, hidden=(), log_std_init=-0.5)
    obs = jnp.asarray([[0.5, -1.0], [2.0, 0.3]])
    params = net.init(jax.random.PRNGKey(0), obs)
    out = net.apply(params, obs)
    k = np.asarray(params["params"]["Dense_0"]["kernel"])
    np.testing.assert_allclose(out[:, :1], np.asarray(obs) @ k, rtol=1e-6)
    np.testing.assert_allclose(out[:, 1:], np.full((2, 1), -0.5))
