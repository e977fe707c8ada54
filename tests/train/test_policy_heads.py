"""The actor's distribution heads (train/policy_heads.py) and the Gaussian actor network
against NumPy formulas written here: the diagonal-Gaussian log-density, the tanh-squashed
log-density with its change of variables (and that it integrates to 1), and the behaviour
law with a noise scale."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.train.networks import GaussianActor
from vccc_jax.train.policy_heads import CategoricalHead, GaussianHead

MEAN = np.array([[0.3, -0.5], [1.2, 0.0]], np.float32)
LOG_STD = np.array([[-0.2, 0.4], [0.1, -0.7]], np.float32)


def np_log_normal(x, m, s):
    return np.sum(-0.5 * ((x - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), -1)


def test_gaussian_log_prob_and_behaviour_scale():
    a = np.array([[0.0, 0.1], [2.0, -1.0]], np.float32)
    got = GaussianHead().dist((MEAN, LOG_STD)).log_prob(a)
    np.testing.assert_allclose(got, np_log_normal(a, MEAN, np.exp(LOG_STD)), rtol=1e-5)
    beh = GaussianHead(noise_scale=1.5).behaviour((MEAN, LOG_STD)).log_prob(a)
    np.testing.assert_allclose(beh, np_log_normal(a, MEAN, 1.5 * np.exp(LOG_STD)), rtol=1e-5)


def test_squashed_log_prob_has_the_log_det_and_integrates_to_one():
    low, high = (-2.0, 0.0), (2.0, 1.0)
    head = GaussianHead(squash=True, low=low, high=high)
    lo_, hi_ = np.array(low), np.array(high)
    a = np.array([[1.5, 0.2], [-0.3, 0.9]], np.float32)
    y = (2 * a - (hi_ + lo_)) / (hi_ - lo_)
    u = np.arctanh(y)
    want = np_log_normal(u, MEAN, np.exp(LOG_STD)) - np.sum(np.log((hi_ - lo_) / 2 * (1 - y ** 2)), -1)
    np.testing.assert_allclose(head.dist((MEAN, LOG_STD)).log_prob(a), want, rtol=1e-4)
    # 1-d: the density over (low, high) integrates to 1 (a missing log-det would not)
    one = GaussianHead(squash=True, low=(-2.0,), high=(2.0,))
    xs = np.linspace(-2, 2, 200_001)[1:-1]
    with jax.enable_x64(True):
        lp = one.dist((jnp.asarray([[0.4]]), jnp.asarray([[-0.3]]))).log_prob(jnp.asarray(xs)[:, None])
    assert abs(np.trapezoid(np.exp(np.asarray(lp)), xs) - 1.0) < 1e-4
    s = head.dist((MEAN, LOG_STD)).sample(seed=jax.random.PRNGKey(0))
    assert np.all((np.asarray(s) > lo_) & (np.asarray(s) < hi_))


def test_categorical_head_and_errors():
    logits = np.array([[0.0, 1.0, -1.0]], np.float32)
    lp = CategoricalHead().dist(logits).log_prob(np.array([1]))
    np.testing.assert_allclose(lp, logits[0, 1] - np.log(np.exp(logits).sum()), rtol=1e-6)
    with pytest.raises(ValueError, match="low and high"):
        GaussianHead(squash=True)
    with pytest.raises(ValueError, match="noise_scale"):
        GaussianHead(noise_scale=0.0)


def test_linear_gaussian_actor_is_linear_in_obs():
    net = GaussianActor(action_dim=1, hidden=(), log_std_init=-0.5)
    obs = jnp.asarray([[0.5, -1.0], [2.0, 0.3]])
    params = net.init(jax.random.PRNGKey(0), obs)
    mean, log_std = net.apply(params, obs)
    k = np.asarray(params["params"]["Dense_0"]["kernel"])
    np.testing.assert_allclose(mean, np.asarray(obs) @ k, rtol=1e-6)
    np.testing.assert_allclose(log_std, np.full((2, 1), -0.5))
