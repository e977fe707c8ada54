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


@pytest.fixture(scope="module")
def protocol_batch():
    """One CartPole rollout (episodes terminate inside it) through ``learner.prepare`` and
    ``learner_batch`` with the learned baseline and critic-first, as ``trainer.update`` does."""
    from vccc_jax.train import learner
    from vccc_jax.train.config import TrainConfig
    from vccc_jax.train.trainer import Trainer, rollout_step

    cfg = TrainConfig(env="CartPole-v1", num_envs=4, num_steps=32, total_timesteps=256,
                      num_minibatches=2, update_epochs=1, hidden=8, num_layers=1, critic="vccc",
                      baseline="learned", critic_first=True, critic_steps=2)
    tr = Trainer(cfg)
    st = jax.tree_util.tree_map(lambda x: x[0], tr.init())
    setup, values = tr.setup, tr.values
    _, traj = jax.jit(lambda s: rollout_step(setup, values, s.actor_params, s.versions, s.env,
                                             s.key, 0))(st)
    prep = learner.prepare(setup, values, traj, st.critic_params, st.baseline_params)
    lp, lp_all = learner.pi_old(setup, values, None, traj, prep)
    batch = learner.learner_batch(setup, values, traj, prep, None, lp, lp_all)
    params = learner.Learnable(st.actor_params, st.critic_params, st.actor_opt_state,
                               st.critic_opt_state, st.baseline_params, st.baseline_opt_state)
    return setup, values, traj, prep, batch, params


def test_bstar_h_is_the_one_step_backup_with_termination(protocol_batch):
    """H = r + gamma (1 - terminal) Vbar(s') (Eq 9's H): exactly r where an episode terminated."""
    setup, _, traj, prep, _, _ = protocol_batch
    t = prep.inputs.transitions
    term = np.asarray(traj.terminated)
    assert term.any() and not term.all()
    h, r = np.asarray(prep.bstar_h), np.asarray(traj.reward)
    np.testing.assert_array_equal(h[term], r[term])
    want = r + 0.99 * np.asarray(t.next_values)
    np.testing.assert_allclose(h[~term], want[~term], rtol=1e-6)


def test_critic_first_actor_phase_recomputes_its_advantages(protocol_batch):
    """Critic-first (issue 11 Sec 2): the actor's advantages come from the UPDATED critic, so
    the advantages in the batch it is handed are never read: garbage there changes nothing."""
    from vccc_jax.train import learner

    setup, values, traj, _, batch, params = protocol_batch
    run = jax.jit(lambda b: learner.learn_critic_first(setup, values, params, b, traj,
                                                       jax.random.PRNGKey(3))[0])
    clean = run(batch)
    garbage = run(batch._replace(advantages=batch.advantages * 0.0 + 5.0))
    for a, b in zip(jax.tree_util.tree_leaves(clean), jax.tree_util.tree_leaves(garbage)):
        np.testing.assert_array_equal(a, b)
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                   params.actor_params, clean.actor_params)
    assert max(jax.tree_util.tree_leaves(moved)) > 0   # the actor phase did learn
