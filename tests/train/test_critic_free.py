"""Critic-free trainer (GRPO / PS-PPO) on a tiny token env: rollout layout, prefix packing,
staleness, learner memory, runs as one compiled scan. One trainer per law, shared by the
module (the mesh run: tests/train/test_sharding.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.train import critic_free as cf

ENV = "token:V=8,H=6,Q=4,C=4,P=3,accept=0.4,seed=1"


@pytest.fixture(scope="module")
def trainers():
    base = cf.CFConfig(env=ENV, groups=4, group_size=4, hidden=16, lr=1e-2)
    return {law: cf.CriticFree(base.replace(law=law, lag="uniform:2"))
            for law in ("full", "mixture:0.2")}


def test_rollout_groups_and_masks(trainers):
    tr = trainers["full"]
    st = tr.init(jax.random.PRNGKey(0))
    b = tr.rollout(st, jax.random.PRNGKey(1))
    H, B = 6, 16
    assert b.obs.shape[:2] == (H, B) and b.returns.shape == (B,)
    prompts = np.asarray(b.prompts).reshape(4, 4)
    assert np.all(prompts == prompts[:, :1])  # a group shares its prompt
    alive = np.asarray(b.alive)
    assert np.all(alive[0]) and np.all(np.diff(alive.astype(int), axis=0) <= 0)  # live prefix
    assert np.all(np.asarray(b.policy_step) <= alive)
    assert np.all(np.asarray(b.lags) == 0)  # only version 0 exists before the first update


def test_train_prefix_packing_and_staleness(trainers):
    full, ps = trainers["full"], trainers["mixture:0.2"]
    _, rows_ps = cf.train(ps.cfg, 6, trainer=ps, eval_every=3)
    _, rows_full = cf.train(full.cfg, 6, trainer=full, eval_every=3)
    assert all(r["kept_fraction"] == 1.0 and r["packed_rows"] == 6 * 16 for r in rows_full)
    kept = np.array([r["kept_fraction"] for r in rows_ps])
    assert np.all(kept < 1.0) and np.all(kept > 0.2)
    assert ps.capacity < full.capacity and rows_ps[-1]["compute_rows"] == 6 * ps.capacity
    assert max(r["mean_lag"] for r in rows_ps[2:]) > 0  # staleness once versions exist
    assert np.isfinite(rows_ps[2]["exact_return"]) and np.isnan(rows_ps[0]["exact_return"])
    # each run: two chunks of 3 updates, each ONE call of one compiled scan
    assert ps.run._cache_size() == 1 and full.run._cache_size() == 1


def test_learner_memory_is_smaller_with_prefix_sampling(trainers):
    costs = {}
    for law, tr in trainers.items():
        st = tr.init(jax.random.PRNGKey(0))
        key = jax.random.PRNGKey(2)
        costs[law] = cf.learner_cost(tr, st, tr.rollout(st, key), key, repeats=1)
    assert costs["mixture:0.2"]["temp_bytes"] < costs["full"]["temp_bytes"]


# -- the learner's numbers against a reference (issue 27) --------------------------------

EPS_MIX = 0.3


@pytest.fixture(scope="module")
def ps_uneven():
    """PS-PPO with groups != group_size (3 x 4), so a [group_size, groups] reshape would mix
    prompts; the token budget has room for every kept token (no overflow)."""
    return cf.CriticFree(cf.CFConfig(env=ENV, groups=3, group_size=4, hidden=16, lr=1e-2,
                                     law=f"mixture:{EPS_MIX}", slack=4.0, clip_eps=0.2))


def test_group_baselines_and_ps_ppo_normaliser_match_a_numpy_reference(ps_uneven):
    """One learner step on a logged batch (returns replaced by N(0, 1) draws, log mu shifted by
    0.2 N(0, 1) so ratios are off 1 and some are clipped), against a reference written here:
    GRPO advantages (R - mean_g R) / (std_g R + 1e-6) per group of the 4 consecutive episodes
    sharing a prompt; cutoffs T_b from the learner's key and the mixture survival S_b(t) =
    eps + (1 - eps)(L - t)^+ / L at the prompt's length scale L; token weights
    1[t < T_b] 1[policy step] / S_b(t) / (live policy steps of b) / B (the PS-PPO
    normaliser: a per-trajectory constant, not the random number of kept steps); loss
    -sum w min(r A, clip(r, 0.8, 1.2) A). The learner's loss and its gradient (Adam's first
    moment / (1 - b1) after one step) equal the reference's."""
    tr = ps_uneven
    cfg, H, B = tr.cfg, tr.task.horizon, tr.batch
    st = tr.init(jax.random.PRNGKey(0))
    batch = tr.rollout(st, jax.random.PRNGKey(1))
    k_ret, k_mu, k_learn = jax.random.split(jax.random.PRNGKey(2), 3)
    batch = batch._replace(returns=jax.random.normal(k_ret, (B,)),
                           log_mu=batch.log_mu + 0.2 * jax.random.normal(k_mu, batch.log_mu.shape))
    new, m = tr.learn(st, batch, k_learn)
    b = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), batch)
    prompts = np.asarray(batch.prompts)
    assert np.all(prompts.reshape(cfg.groups, cfg.group_size) == prompts[::cfg.group_size, None])
    # GRPO advantages, group by group
    adv = np.empty(B)
    for g in range(cfg.groups):
        r = b.returns[g * cfg.group_size:(g + 1) * cfg.group_size]
        adv[g * cfg.group_size:(g + 1) * cfg.group_size] = (r - r.mean()) / (r.std() + 1e-6)
    # survival and cutoffs (u ~ U(0, 1) from the learner's key), PS-PPO weights
    L = np.clip(np.ceil(np.asarray(st.lengths, np.float64)[prompts]), 1, H)  # [B]
    t = np.arange(H)[:, None]
    surv = EPS_MIX + (1 - EPS_MIX) * np.maximum(L[None, :] - t, 0) / L[None, :]  # [H, B]
    u = np.asarray(jax.random.uniform(k_learn, (B,), jnp.float32), np.float64)
    cutoffs = (surv.astype(np.float32) > u[None, :]).sum(0)
    pol = b.policy_step
    w = (t < cutoffs[None, :]) * pol / surv / np.maximum(pol.sum(0), 1)[None, :] / B
    assert 0 < (w > 0).sum() < pol.sum()  # some live tokens dropped, some kept
    logits = tr.actor.apply(st.params, batch.obs)
    log_pi = np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits), batch.actions[..., None], -1)[..., 0],
                        np.float64)
    ratio = np.exp(log_pi - b.log_mu)
    assert np.any(np.abs(ratio[w > 0] - 1) > 0.2)  # the clip is active somewhere
    surr = np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
    assert float(m["overflow"]) == 0.0
    np.testing.assert_allclose(float(m["loss"]), -np.sum(w * surr), rtol=1e-5, atol=1e-7)

    def ref_loss(params):  # the same loss in jnp, for its gradient
        lp = jax.nn.log_softmax(tr.actor.apply(params, batch.obs))
        lp = jnp.take_along_axis(lp, batch.actions[..., None], -1)[..., 0]
        r = jnp.exp(lp - batch.log_mu)
        a = jnp.asarray(adv, jnp.float32)[None, :]
        return -jnp.sum(jnp.asarray(w, jnp.float32) * jnp.minimum(r * a, jnp.clip(r, 0.8, 1.2) * a))

    grad_ref = jax.grad(ref_loss)(st.params)
    grad = jax.tree_util.tree_map(lambda mu: mu / 0.1, new.opt_state[0].mu)  # Adam b1 = 0.9
    for g_ref, g in zip(jax.tree_util.tree_leaves(grad_ref), jax.tree_util.tree_leaves(grad)):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(g_ref))))
