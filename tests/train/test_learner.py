"""The learner's minibatch layout (``train.learner.env_minibatches``) against its docstring,
rebuilt index by index in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.train.learner import env_minibatches

_split = jax.jit(env_minibatches, static_argnums=(2,))


@pytest.mark.parametrize("T, B, M", [(4, 3, 2), (6, 2, 3), (4, 3, 6), (6, 4, 4)])
def test_env_minibatches_follow_the_documented_layout(T, B, M):
    """Rows [T, B] -> [M, T B / M]: each env's steps permuted by argsort of its own random bits
    (``jax.random.bits(key, (B, T))``), laid out env-major (r = b T + j) and dealt round-robin
    (minibatch m takes r = m mod M, in order). When M divides T every minibatch holds T / M
    steps of EVERY env; every leaf (any trailing shape) is split the same way."""
    key = jax.random.PRNGKey(7)
    t_idx, b_idx = np.meshgrid(np.arange(T), np.arange(B), indexing="ij")
    batch = {"t": jnp.asarray(t_idx), "b": jnp.asarray(b_idx),
             "x": jnp.asarray(np.stack([t_idx, b_idx], -1) * np.array([10.0, 1.0]))}
    mbs = jax.device_get(_split(key, batch, M))
    perm = np.argsort(np.asarray(jax.random.bits(key, (B, T))), axis=1, kind="stable")  # [B, T]
    want_t, want_b = np.empty((M, T * B // M), int), np.empty((M, T * B // M), int)
    for b in range(B):
        for j in range(T):
            r = b * T + j
            want_t[r % M, r // M], want_b[r % M, r // M] = perm[b, j], b
    np.testing.assert_array_equal(mbs["t"], want_t)
    np.testing.assert_array_equal(mbs["b"], want_b)
    np.testing.assert_array_equal(mbs["x"], np.stack([want_t, want_b], -1) * np.array([10.0, 1.0]))
    pairs = sorted(zip(mbs["t"].ravel(), mbs["b"].ravel()))
    assert pairs == sorted(zip(t_idx.ravel(), b_idx.ravel()))  # every row exactly once
    if T % M == 0:
        for m in range(M):
            np.testing.assert_array_equal(np.bincount(mbs["b"][m], minlength=B), T // M)


def test_env_minibatches_shuffle_with_the_key_and_reject_bad_sizes():
    T, B = 8, 2
    batch = jnp.broadcast_to(jnp.arange(T)[:, None], (T, B))
    a, b = (np.asarray(_split(jax.random.PRNGKey(k), batch, 2)) for k in (0, 1))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(np.sort(a.ravel()), np.sort(b.ravel()))
    with pytest.raises(ValueError, match="num_minibatches=3 must divide"):
        env_minibatches(jax.random.PRNGKey(0), batch, 3)
