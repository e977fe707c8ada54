"""Pins of ``train.learner.effective_advantages`` against a NumPy loop over minibatches:
advantages are normalised within each minibatch (rows of [M, mb]), plain or weighted by the
sample weights w, then scaled by w mb / sum(w) so the loss's plain mean is the w-weighted
mean."""
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.train.learner import effective_advantages

M, MB = 3, 5


def _adv():
    rng = np.random.default_rng(0)
    # minibatches with different means and scales: normalising over the wrong axis shows
    return (rng.normal(size=(M, MB)) * np.array([[1.0], [3.0], [0.5]])
            + np.array([[2.0], [-1.0], [0.3]]))


def test_normalised_within_each_minibatch():
    adv = _adv()
    got = np.asarray(effective_advantages(jnp.asarray(adv, jnp.float32), None, True))
    for m in range(M):
        row = adv[m]
        mean = sum(row) / MB
        std = (sum((x - mean) ** 2 for x in row) / MB) ** 0.5
        np.testing.assert_allclose(got[m], (row - mean) / (std + 1e-8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_weighted_minibatches(normalize):
    adv = _adv()
    w = np.array([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.float64)
    got = np.asarray(effective_advantages(jnp.asarray(adv, jnp.float32),
                                          jnp.asarray(w, jnp.float32), normalize))
    for m in range(M):
        a, wm = adv[m].copy(), w[m]
        total = sum(wm)
        if normalize:
            mean = sum(wm * a) / total
            sd = (sum(wm * (a - mean) ** 2) / total) ** 0.5
            a = (a - mean) / (sd + 1e-8)
        np.testing.assert_allclose(got[m], a * wm * MB / total, rtol=1e-5, atol=1e-5)
