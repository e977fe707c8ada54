"""Trainer on the tabular and token envs: make_env specs, samplers, tool steps, exact truth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import samplers, tabular_env
from vccc_jax.envs.make import make_env
from vccc_jax.train import exact_metrics, losses
from vccc_jax.train import trainer as trainer_lib
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.learner import Batch as _Batch
from vccc_jax.train.learner import effective_advantages
from vccc_jax.train.trainer import Trainer

TOKEN = "token:V=8,H=5,Q=3,C=3,P=2,m=1,tools=1,gamma=1,seed=1"
TAB = "tabular:family=garnet,S=5,A=3,gamma=0.9,seed=2"
SMALL = dict(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, hidden=8, num_layers=1)


@pytest.mark.parametrize("spec, msg", [
    ("tabular:S=x", "S='x'"), ("tabular:foo=1", "unknown key 'foo'"),
    ("tabular:family=zz", "family must be"), ("tabular:obs=nope", "obs must be"),
    ("token:foo", "name=value"), ("token:V=abc", "abc"),
])
def test_bad_specs_one_line(spec, msg):
    with pytest.raises(ValueError, match=msg) as err:
        make_env(spec)
    assert "\n" not in str(err.value) and spec in str(err.value)


def test_config_errors():
    with pytest.raises(ValueError, match="sampler"):
        TrainConfig(sampler="temp=0.5", temperature=0.7)
    with pytest.raises(ValueError, match="unknown sampler field"):
        TrainConfig(sampler="bogus=1")
    with pytest.raises(ValueError, match="gamma"):
        Trainer(TrainConfig(env=TAB, gamma=0.99, **SMALL, total_timesteps=32))
    with pytest.raises(ValueError, match="gt_kind='exact'"):
        Trainer(TrainConfig(gt_kind="exact", gt_every=1, **SMALL, total_timesteps=32))


@pytest.fixture(scope="module")
def token_run():
    cfg = TrainConfig(env=TOKEN, gamma=1.0, lag="fixed:1", sampler="temp=0.8,k=4",
                      critic="vccc", actor="centered-truncate", gt_every=1,
                      total_timesteps=32 * 3, **SMALL)
    tr = Trainer(cfg)
    state = tr.init()
    one = jax.tree_util.tree_map(lambda x: x[0], state)
    _, traj = jax.jit(lambda s: trainer_lib.rollout_step(tr.setup, tr.values, s.actor_params,
                                                         s.versions, s.env, s.key, 0))(one)
    final, metrics = tr.train(state)
    return tr, one, traj, final, jax.device_get(metrics)


def test_token_tool_steps_have_ratio_one_and_own_discount(token_run):
    tr, _, traj, _, _ = token_run
    tool = ~np.asarray(traj.is_action)
    assert tool.any() and (~tool).any()
    log_pi = np.take_along_axis(np.asarray(traj.log_pi_all), np.asarray(traj.action)[..., None], -1)[..., 0]
    np.testing.assert_array_equal(log_pi[tool], np.asarray(traj.log_mu)[tool])  # log rho = 0 exactly
    disc = np.asarray(traj.discounts(0.5))  # the env's discounts win over the gamma argument
    live = tool & ~np.asarray(traj.terminated)
    np.testing.assert_array_equal(disc[live], float(tr.setup.env.task.tool_discount))
    # sampler: top-4 of V=8 -> the behaviour row has exactly 4 finite entries on policy steps
    finite = np.isfinite(np.asarray(traj.log_mu_all)).sum(-1)
    assert (finite[~tool] <= 4).all() and (finite[tool] == 8).all()


def test_tool_steps_get_no_actor_gradient(token_run):
    tr, one, _, _, _ = token_run
    n, v = 6, tr.setup.num_actions
    key = jax.random.PRNGKey(0)
    obs = jax.random.normal(key, (n,) + tr.setup.obs_shape)
    log_all = jax.nn.log_softmax(jax.random.normal(key, (n, v)), -1)
    act = jnp.arange(n) % v
    lp = jnp.take_along_axis(log_all, act[:, None], -1)[:, 0]
    w = jnp.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    mb = _Batch(obs=obs, action=act, log_mu=lp, log_pi_old=lp, log_mu_all=log_all,
                log_pi_old_all=log_all, advantages=jnp.linspace(-1, 1, n), targets=jnp.zeros(n),
                critic_w=jnp.ones(n), actor_w=w)
    def loss(p, b):  # advantages as the learner feeds them (normalised, masked, rescaled)
        adv = effective_advantages(b.advantages[None], b.actor_w[None],
                                   tr.config.normalize_advantages)[0]
        return losses.actor_loss(tr.setup, tr.values, p, b._replace(advantages=adv))[0]

    grad = jax.jit(jax.grad(loss))
    flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g)])  # noqa: E731
    g0 = flat(grad(one.actor_params, mb))
    masked = jnp.asarray(w == 0)
    other = mb._replace(obs=jnp.where(masked[:, None], 3.0, obs),
                        advantages=jnp.where(masked, 50.0, mb.advantages))
    np.testing.assert_array_equal(flat(grad(one.actor_params, other)), g0)
    live = mb._replace(advantages=mb.advantages.at[0].set(5.0))
    assert np.abs(flat(grad(one.actor_params, live)) - g0).max() > 1e-6


def test_token_exact_metrics_finite(token_run):
    tr, _, _, _, m = token_run
    for k in ("exact_err_pi", "exact_err_mix", "exact_gap", "exact_v_pi"):
        assert np.all(np.isfinite(m[k])), k
    assert m["exact_err_mu"].shape == (3, 1, 2)
    # exact actor-gradient bias (envs.token_actor_truth): centred truncated actor, top-4
    # sampler, lag 1 -> finite and nonzero against Eq 12
    rel, cos = m["exact_grad_rel_bias"], m["exact_grad_cos"]
    assert np.all(np.isfinite(rel) & (rel > 0)) and np.all(np.isfinite(m["exact_grad_bias"]))
    assert np.all(np.abs(cos) <= 1 + 1e-5)
    assert "gt_mse" not in m
    # top-4 sampler of V=8: pi_k has mass off the behaviour support on policy steps
    assert np.all((m["support_violation"] > 0) & (m["support_violation"] < 1))


def test_tabular_metrics_equal_direct_exact_truth():
    """exact_metrics.tabular_metrics == direct exact_truth calls (same state weighting)."""
    tr = Trainer(TrainConfig(env=TAB, gamma=0.9, lag="fixed:1", gt_every=1, total_timesteps=32,
                             actor="truncate", **SMALL))
    s = jax.tree_util.tree_map(lambda x: x[0], tr.init())
    params = tr.setup.env_params
    ids = jnp.array([0, 1, 1, 3, 4, 4, 4, 2])
    weights = jnp.array([0.25, 0.75])

    @jax.jit  # one compile for both sides (eager op-by-op is slow)
    def both(s):
        stacked = exact_metrics.ring_params(s.actor_params, s.versions, tr.setup.ring_size)
        m = exact_metrics.tabular_metrics(
            params, tr.setup.actor_logits, tr.setup.critic_values, s.actor_params, s.critic_params, stacked,
            tr.setup.log_mu_fn, weights, ids, jnp.ones(8), kind="truncate", clip=2.0, centred=False)
        table = params.obs_table
        mdp = tabular_env.params_mdp(params)
        truth = et.version_truth(mdp, et.policy_log_probs(tr.setup.actor_logits, s.actor_params, table),
                                 et.ring_log_probs(tr.setup.actor_logits, s.versions, table), weights)
        d = et.empirical_state_weights(ids, table.shape[0])
        v = tr.setup.critic_values(s.critic_params, table)
        errs = et.critic_errors(v, truth, d)
        grads = et.actor_update_truth(tr.setup.actor_logits, s.actor_params, table, mdp, truth, v,
                                      kind="truncate", clip=2.0)
        return m, errs, et.gradient_bias(grads.expected, grads.eq12).bias_norm

    m, errs, bias = both(s)
    np.testing.assert_allclose(m["exact_err_pi"], errs.rmse_pi, rtol=1e-6)
    np.testing.assert_allclose(m["exact_err_mix"], errs.rmse_mix, rtol=1e-6)
    np.testing.assert_allclose(m["exact_gap"], errs.gap, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m["exact_grad_bias"], bias, rtol=1e-6)


def test_sampler_spec_log_probs_match_samplers():
    tr = Trainer(TrainConfig(env=TAB, gamma=0.9, sampler="temp=0.5,k=2", total_timesteps=32, **SMALL))
    z = jnp.array([[0.3, -1.0, 2.0]])
    np.testing.assert_array_equal(tr.setup.log_mu_fn(z), samplers.sampler_log_probs(z, tr.setup.sampler))


def test_actor_table_rows_in_the_learner(token_run):
    """Rows of the actor table in the learner's loss (issue 21): its gradient is that of
    -(1/sum m) sum_i w_i A_i log pi(a_i|s_i) (A normalised over the mask m) with w the NumPy
    formula of the row: CISPO reads the CURRENT policy (no trust region), IcePop pi_old (x the
    PPO ratio pi_theta / pi_old, inside its clip here), a per-update row (GSPO) the batch's
    precomputed ``actor_weight``."""
    import dataclasses

    from vccc_jax.train import actor_weights

    tr, one, _, _, _ = token_run
    n, v = 8, tr.setup.num_actions
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(3), 4)
    obs = jax.random.normal(k1, (n,) + tr.setup.obs_shape)
    act = jnp.arange(n) % v
    log_all = jax.nn.log_softmax(tr.setup.actor_logits(one.actor_params, obs), -1)
    lp = jnp.take_along_axis(log_all, act[:, None], -1)[:, 0]
    lp_old = jnp.minimum(lp + 0.05 * jax.random.normal(k2, (n,)), 0.0)  # r = pi / pi_old in the clip
    lmu = jnp.minimum(lp + 0.8 * jax.random.normal(k3, (n,)), 0.0)
    m = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    adv = jax.random.normal(k4, (n,))
    pre = jnp.linspace(0.2, 1.6, n)
    mb = _Batch(obs=obs, action=act, log_mu=lmu, log_pi_old=lp_old, log_mu_all=log_all,
                log_pi_old_all=log_all, advantages=adv, targets=jnp.zeros(n),
                critic_w=jnp.ones(n), actor_w=m)

    def learner(name, params):
        row, row_params = actor_weights.resolve(name, params, 2.0)
        return dataclasses.replace(tr.setup, actor_row=row, row_params=row_params,
                                   actor_kind=row.name, centered=False)

    rows = {"cispo": (learner("cispo", "eps_low=0.2,eps_high=0.3"), mb),
            "icepop": (learner("icepop", "alpha=0.7,beta=1.4"), mb),
            "gspo": (learner("gspo", ""), mb._replace(actor_weight=pre))}
    mn, an = np.asarray(m), np.asarray(adv)
    mean = np.sum(mn * an) / mn.sum()
    a_n = (an - mean) / (np.sqrt(np.sum(mn * (an - mean) ** 2) / mn.sum()) + 1e-8)
    rho_cur = np.exp(np.asarray(lp) - np.asarray(lmu))
    rho_old = np.exp(np.asarray(lp_old) - np.asarray(lmu))
    w = {"cispo": np.clip(rho_cur, 0.8, 1.3),
         "icepop": np.where((rho_old >= 0.7) & (rho_old <= 1.4), rho_old, 0.0),
         "gspo": np.asarray(pre)}
    assert (w["icepop"] == 0).any() and (w["icepop"] > 0).any() and (w["cispo"] != rho_cur).any()

    def reference(p, name):  # d/dp of -(1/sum m) sum w A_n m (pi_p / pi_old or log pi_p)
        lpp = jnp.take_along_axis(jax.nn.log_softmax(tr.setup.actor_logits(p, obs), -1),
                                  act[:, None], -1)[:, 0]
        ratio = jnp.exp(lpp - lp_old) if name == "icepop" else lpp
        return -jnp.sum(jnp.asarray(w[name]) * ratio * a_n * mn) / mn.sum()

    def loss(p, t, b):  # advantages as the learner feeds them (normalised, masked, rescaled)
        eff = effective_advantages(b.advantages[None], b.actor_w[None], True)[0]
        return losses.actor_loss(t, tr.values, p, b._replace(advantages=eff))[0]

    grads = jax.jit(lambda p: {k: (jax.grad(loss)(p, t, b), jax.grad(reference)(p, k))
                               for k, (t, b) in rows.items()})(one.actor_params)
    flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g)])  # noqa: E731
    for name, (got, ref) in grads.items():
        np.testing.assert_allclose(flat(got), flat(ref), rtol=2e-4, atol=1e-7, err_msg=name)


def test_per_update_actor_weights_follow_episodes():
    """``train.actor_weights.update_weights``: sequences are the episodes of each column (cut
    at terminated / truncated steps), tool steps (mask 0) do not enter R, TOPR reads the sign
    of the update-normalised advantage, AReaL the per-token lags; NumPy reference."""
    from vccc_jax.train import actor_weights

    rng = np.random.default_rng(0)
    T_, B_ = 6, 3
    lr = 0.5 * rng.normal(size=(T_, B_))
    adv = rng.normal(size=(T_, B_)) + 0.3
    mask = rng.uniform(size=(T_, B_)) > 0.25
    term = np.zeros((T_, B_), bool)
    trunc = np.zeros((T_, B_), bool)
    term[2, 0], trunc[3, 1], term[0, 2], term[4, 2] = True, True, True, True
    lags = rng.integers(0, 3, size=(T_, B_))
    starts = np.asarray(actor_weights.sequence_starts(jnp.asarray(term), jnp.asarray(trunc)))
    a_n = (adv - np.sum(mask * adv) / mask.sum())
    a_n = a_n / (np.sqrt(np.sum(mask * a_n ** 2) / mask.sum()) + 1e-8)
    ref_tis, ref_topr = np.zeros((T_, B_)), np.zeros((T_, B_))
    for b in range(B_):
        cuts = [0] + [t + 1 for t in range(T_ - 1) if term[t, b] or trunc[t, b]] + [T_]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            r = np.exp(np.sum(np.where(mask[lo:hi, b], lr[lo:hi, b], 0.0)))
            ref_tis[lo:hi, b] = np.minimum(r, 1.2)
            ref_topr[lo:hi, b] = np.where(a_n[lo:hi, b] >= 0, 1.0, min(r, 1.0))
    ref_areal = np.where(lags <= 1, np.exp(lr), 0.0)
    rows = {name: actor_weights.resolve(name, params, clip) for name, params, clip in (
        ("seq_tis", "", 1.2), ("topr", "", 2.0), ("areal", "max_staleness=1", 2.0))}
    with jax.enable_x64(True):
        got = jax.device_get(jax.jit(lambda *a: {name: actor_weights.update_weights(
            row, p, a[0], jnp.zeros((T_, B_)), a[1], a[2], starts=a[3], lags=a[4], normalize=True)
            for name, (row, p) in rows.items()})(*map(jnp.asarray, (lr, adv, mask, starts, lags))))
    for name, ref in (("seq_tis", ref_tis), ("topr", ref_topr), ("areal", ref_areal)):
        np.testing.assert_allclose(got[name], np.where(mask, ref, 0.0), rtol=1e-12, err_msg=name)
    assert len(set(np.round(ref_tis[mask], 12))) > 3  # several sequences, different ratios


def test_ground_truth_is_evaluated_at_the_last_update_too():
    """Issue 45 row 9: every ``gt_every`` updates AND at the last one, so a curve's last point
    is the run's end (3 updates, gt_every = 2: updates 1 and 2; before, only update 1)."""
    tr = Trainer(TrainConfig(env=TAB, gamma=0.9, lag="fixed:1", gt_every=2,
                             total_timesteps=32 * 3, **SMALL))
    _, metrics = tr.train(tr.init())
    err = np.asarray(jax.device_get(metrics["exact_err_pi"]))  # [updates, seeds]
    assert err.shape[0] == 3
    assert np.isnan(err[0]).all() and np.isfinite(err[1:]).all()
