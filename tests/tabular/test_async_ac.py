"""Asynchronous tabular actor-critic (score-centred actor + version-corrected critic), float64.

What is checked (the exact identities Eq 1, 2, 12 themselves live in ``vccc verify``):
* lag 0: every variant (actor weight x centering x critic target) is on-policy actor-critic
  -- exact expected updates equal an independent closed-form on-policy AC to 1e-10, and
  sampled runs equal an independent sampled on-policy AC fed the same draws;
* exact expected updates: the combined variant (critic = V^pi, exact ratios, behaviour
  state weighting) is the policy-gradient direction d(s) E_pi[Q^pi u] (Eq 12, Sec 7),
  while a stale critic or clipped weights are not; the bias splits exactly into the
  drift (Eq 1), critic and weight parts, and score centering zeroes the drift part;
* the expected update the diagnostics use is the expectation of the sampled step
  (library loss on the enumerated cells, exactly; sampled batches, at 99.9%);
* the rollout workers' exact (lag, state) law matches simulated workers (chi-square, 99.9%);
* determinism for a fixed key; errors name the argument;
* the Sec 3.4 Monte-Carlo mismatch is detected at 99.9% (Bonferroni), while the one-step
  VCCC target is not rejected and the uncorrected one is.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from vccc_jax import plotting
from vccc_jax.analysis import async_ac as AA
from vccc_jax.analysis.async_mc import format_report
from vccc_jax.runs import async_ac as RA
from vccc_jax.tabular import async_ac as AC
from vccc_jax.tabular import async_mc as MC
from vccc_jax.tabular import exact
from vccc_jax.tabular import history as H
from vccc_jax.tabular import mdp as M

N_MDPS, S, A, L = 3, 4, 3, 3
LEVEL = 0.999  # confidence of every statistical test here
TOPK = 1  # top-k summary in the diagnostics tests (with one tail action the tail model is exact)
CRITICS = ("uncorrected", "vccc", "truncated", "centered_baseline")

EXPECTED_CFG = AC.ACConfig(num_chunks=6, chunk_len=1, actor_lr=3.0, critic_lr=0.5,
                           critic_methods=CRITICS, max_lag=L, expected=True, topk=2)
SAMPLED_CFG = AC.ACConfig(num_chunks=3, chunk_len=2, batch_size=8, actor_lr=3.0, critic_lr=0.5,
                          critic_methods=CRITICS, max_lag=L, expected=False, topk=2)


@pytest.fixture(scope="module", autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def problems(x64):
    mdps = M.random_mdp(jax.random.PRNGKey(0), N_MDPS, S, A, gamma=0.9, dtype=jnp.float64)
    logits = H.initial_logits(jax.random.PRNGKey(1), N_MDPS, S, A, 1.0, dtype=jnp.float64)
    return mdps, logits


def all_variants(cfg, **kw):
    """Every actor weight x centering x critic target (clips 1.5 / 2 so they are active)."""
    out, names = [], []
    for kind in AC.ACTOR_KINDS:
        for cen in AC.CENTERINGS:
            for crit in cfg.critic_methods:
                out.append(AC.make_variant(cfg, actor_kind=kind, actor_clip=2.0 if kind == "mask" else 1.5,
                                           centering=cen, critic=crit, critic_clip=1.5,
                                           dtype=jnp.float64, **kw))
                names.append((kind, cen, crit))
    return out, names


def run(cfg, problems, variants, keys):
    """All variants x MDPs in one vmapped call; outputs reshaped to [num_variants, N_MDPS, ...]."""
    mdps, logits = problems
    nv = len(variants)
    tile = lambda x: jnp.concatenate([x] * nv, axis=0)  # noqa: E731
    vs = jax.tree_util.tree_map(lambda x: jnp.repeat(x, N_MDPS, axis=0), AC.stack_variants(variants))
    res = AC.make_train_fn(cfg)(jax.tree_util.tree_map(tile, mdps), tile(logits), vs, tile(keys))
    return jax.tree_util.tree_map(lambda x: np.asarray(x).reshape((nv, N_MDPS) + x.shape[1:]), res)


# ------------------------------------------------------------------ lag 0 = on-policy


def onpolicy_expected_reference(mdp, theta, num_updates, actor_lr, critic_lr):
    """Closed-form on-policy actor-critic (independent of async_ac): V_0 = V^{pi_0},
    V <- V + lr (T_pi V - V), theta(s, b) += lr d^pi(s) sum_a pi(a|s) A(s, a) (1[a = b] - pi(b|s)),
    A = Q_V - V."""
    v = exact.policy_value(mdp, jax.nn.softmax(theta, axis=-1))
    rets = []
    for _ in range(num_updates):
        pi = jax.nn.softmax(theta, axis=-1)
        d = exact.visitation(mdp, pi)
        rets.append(float(mdp.init @ exact.policy_value(mdp, pi)))
        v = jnp.where(d > 0, v + critic_lr * (exact.bellman_operator(mdp, pi, v) - v), v)
        adv = exact.q_values(mdp, v=v) - v[:, None]
        pa = pi * adv
        theta = theta + actor_lr * d[:, None] * (pa - pi * jnp.sum(pa, axis=-1, keepdims=True))
    return np.asarray(theta), np.asarray(v), np.asarray(rets)


def test_lag0_expected_every_variant_is_onpolicy_ac(problems):
    variants, names = all_variants(EXPECTED_CFG, mean_lag=0.0)
    keys = jax.random.split(jax.random.PRNGKey(5), N_MDPS)
    res = run(EXPECTED_CFG, problems, variants, keys)
    mdps, logits = problems
    for i in range(N_MDPS):
        th, v, rets = onpolicy_expected_reference(mdps[i], logits[i], EXPECTED_CFG.num_updates,
                                                  EXPECTED_CFG.actor_lr, EXPECTED_CFG.critic_lr)
        assert np.abs(th - logits[i]).max() > 1e-2  # the policy really moved
        for j, name in enumerate(names):
            np.testing.assert_allclose(res.theta[j, i], th, atol=1e-10, err_msg=str(name))
            np.testing.assert_allclose(res.values[j, i], v, atol=1e-10, err_msg=str(name))
            np.testing.assert_allclose(res.curves.ret[j, i], rets, atol=1e-10, err_msg=str(name))
    # on-policy: no drift, no weight bias; the bias left is the critic's
    assert np.abs(res.curves.drift_norm).max() < 1e-10
    assert np.abs(res.curves.weight_norm).max() < 1e-10
    assert np.abs(res.curves.mean_lag).max() == 0


def onpolicy_sampled_reference(mdp, theta, key, cfg):
    """Vanilla on-policy AC on the same draws (sampler + key schedule of async_ac): critic moves
    each visited state towards the mean of r + gamma V(s'); actor ascends
    (1/B) sum_b A_b (e_{a_b} - pi(s_b)) in row s_b."""
    V = cfg.num_versions
    B = cfg.batch_size
    log_w = jnp.log(jnp.zeros((V,), jnp.float64).at[-1].set(1.0))
    v = exact.policy_value(mdp, jax.nn.softmax(theta, axis=-1))
    k_init, k_run = jax.random.split(key)
    gam = 0.9 * (1.0 - mdp.terminal)
    for k in jax.random.split(k_run, cfg.num_updates):
        lp = jax.nn.log_softmax(theta, axis=-1)
        pi = jnp.exp(lp)
        vis = jnp.broadcast_to(exact.visitation(mdp, pi)[None], (V, S))
        k_s, k_t, _ = jax.random.split(k, 3)
        ver, s = AC.sample_replay_states(k_s, log_w, vis, B)
        a, s2 = AC.sample_transitions(k_t, mdp, jnp.broadcast_to(lp[None], (V, S, A)), ver, s)
        y = mdp.R[s, a, s2] + gam[s2] * v[s2]
        cnt = np.bincount(np.asarray(s), minlength=S)
        tot = np.bincount(np.asarray(s), weights=np.asarray(y), minlength=S)
        v = jnp.where(cnt > 0, v + cfg.critic_lr * (tot / np.maximum(cnt, 1) - v), v)
        adv = mdp.R[s, a, s2] + gam[s2] * v[s2] - v[s]
        g = np.zeros((S, A))
        for b in range(B):
            g[int(s[b])] += float(adv[b]) * (np.eye(A)[int(a[b])] - np.asarray(pi[s[b]])) / B
        theta = theta + cfg.actor_lr * g
    return np.asarray(theta), np.asarray(v)


@pytest.fixture(scope="module")
def sampled_runs(problems):
    """Every variant at lag 0 and at mean lag 1.5 (uniform law), in one compiled program run
    three times: key A, key A again, key B."""
    lag0, names = all_variants(SAMPLED_CFG, mean_lag=0.0)
    stale, _ = all_variants(SAMPLED_CFG, mean_lag=1.5, law="uniform")
    keys_a = jax.random.split(jax.random.PRNGKey(11), N_MDPS)
    keys_b = jax.random.split(jax.random.PRNGKey(12), N_MDPS)
    runs = [run(SAMPLED_CFG, problems, lag0 + stale, k) for k in (keys_a, keys_a, keys_b)]
    return runs, names, keys_a


def test_lag0_sampled_every_variant_is_onpolicy_ac(problems, sampled_runs):
    (res, _, _), names, keys = sampled_runs
    mdps, logits = problems
    for i in range(N_MDPS):
        th, v = onpolicy_sampled_reference(mdps[i], logits[i], keys[i], SAMPLED_CFG)
        assert np.abs(th - logits[i]).max() > 1e-2
        for j, name in enumerate(names):
            np.testing.assert_allclose(res.theta[j, i], th, atol=1e-10, err_msg=str(name))
            np.testing.assert_allclose(res.values[j, i], v, atol=1e-10, err_msg=str(name))


def test_determinism_and_staleness_changes_the_run(sampled_runs):
    (a, b, c), names, _ = sampled_runs
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert np.abs(a.theta - c.theta).max() > 1e-3
    nv = len(names)
    # lag > 0 is really stale: transitions come from older versions, pi moved away from them
    assert np.all(np.abs(a.curves.mean_lag[nv:, :, -1] - 1.5) < 1e-9)
    assert np.all(a.curves.kl[nv:, :, -1] > 0)
    # and staleness changes the run (the lag-0 variants are all the same run)
    assert np.abs(a.theta[nv:] - a.theta[:nv]).max() > 1e-3


# ---------------------------------------------------- exact expected updates (Eq 12, 1, 13)


@pytest.fixture(scope="module")
def stale_setting(problems):
    """One MDP, versions pi_0..pi_5 from NPG steps, a uniform replay with mean lag 2.5."""
    mdps, logits = problems
    mdp = mdps[0]
    hist = H.policy_history(mdp, logits[0], H.HistoryConfig(num_versions=6, step_size=0.6))
    w = jnp.asarray(H.version_weights("uniform", 2.5, 6))
    d = H.replay_state_distribution(w, hist.visitation)
    post = H.version_posterior(w, hist.visitation)
    return mdp, hist, d, post


@functools.lru_cache(maxsize=None)
def _diag_fn():
    def f(mdp, theta, values, log_mus, d, post, kind, clip, cen):
        diag = AC.actor_diagnostics(mdp, theta, values, log_mus, d, post, kind, clip, cen, TOPK)
        g = AC.expected_actor_gradient(mdp, theta, values, log_mus, d, post, kind, clip, cen, TOPK)
        return diag, g

    combos = [(k, c) for k in range(4) for c in range(3)]
    kinds = jnp.asarray([k for k, _ in combos])
    cens = jnp.asarray([c for _, c in combos])
    clips = jnp.where(kinds == 3, 2.0, 1.5)
    inner = jax.vmap(f, in_axes=(None, None, None, None, None, None, 0, 0, 0))
    return jax.jit(lambda *a: inner(*a, kinds, clips, cens)), combos


def diagnostics_all(setting, values):
    mdp, hist, d, post = setting
    fn, combos = _diag_fn()
    diag, g = fn(mdp, hist.logits[-1], values, hist.log_probs, d, post)
    return jax.tree_util.tree_map(np.asarray, diag), np.asarray(g), combos


def test_combined_variant_is_the_policy_gradient_direction(stale_setting):
    mdp, hist, d, post = stale_setting
    v_pi = hist.values[-1]
    diag, _, combos = diagnostics_all(stale_setting, v_pi)
    ref = diag.g_ref[0]
    assert np.linalg.norm(ref) > 1e-2
    for j, (kind, cen) in enumerate(combos):
        if AC.ACTOR_KINDS[kind] == "ratio":  # exact ratios + critic V^pi: Eq 12, any centering
            np.testing.assert_allclose(diag.g_app[j], ref, atol=1e-10)
            np.testing.assert_allclose(diag.critic[j], 0.0, atol=1e-12)
    # the reference is the policy-gradient theorem's per-state term, re-weighted by d
    pi = jnp.exp(hist.log_probs[-1])
    d_pi = exact.visitation(mdp, pi, normalize=False)
    np.testing.assert_allclose(np.asarray(d_pi)[:, None] * ref / np.asarray(d)[:, None],
                               diag.g_true[0], atol=1e-10)
    # where the write-up says it should NOT hold: clipped weights keep a weight bias
    for j, (kind, cen) in enumerate(combos):
        if AC.ACTOR_KINDS[kind] in ("truncate", "mask", "none"):
            assert np.linalg.norm(diag.weight[j]) > 1e-4, (kind, cen)


def test_stale_critic_biases_ratio_actor_and_centering_cannot_fix_it(stale_setting):
    mdp, hist, d, post = stale_setting
    v_stale = hist.values[0]  # a critic of the oldest version
    diag, _, combos = diagnostics_all(stale_setting, v_stale)
    for j, (kind, cen) in enumerate(combos):
        if AC.ACTOR_KINDS[kind] == "ratio":
            assert np.linalg.norm(diag.g_app[j] - diag.g_ref[j]) > 1e-3
            assert np.linalg.norm(diag.critic[j]) > 1e-3
            np.testing.assert_allclose(diag.drift[j], 0.0, atol=1e-12)  # m_rho = E_pi[u] = 0


def test_bias_decomposition_and_centering_zeroes_drift(stale_setting):
    mdp, hist, d, post = stale_setting
    vals = jax.random.normal(jax.random.PRNGKey(9), (S,), jnp.float64)
    diag, g_lib, combos = diagnostics_all(stale_setting, vals)
    for j, (kind, cen) in enumerate(combos):
        parts = diag.drift[j] + diag.critic[j] + diag.weight[j]
        np.testing.assert_allclose(diag.g_app[j] - diag.g_ref[j], parts, atol=1e-12)
        # the expected update used by `expected=True` is the library loss in expectation
        np.testing.assert_allclose(g_lib[j], diag.g_app[j], atol=1e-12)
        if AC.CENTERINGS[cen] == "exact":
            np.testing.assert_allclose(diag.drift[j], 0.0, atol=1e-12)
    # uncentred truncated / unweighted actors do drift (Eq 1), and centering removes exactly it
    by = {(AC.ACTOR_KINDS[k], AC.CENTERINGS[c]): j for j, (k, c) in enumerate(combos)}
    for kind in ("none", "truncate", "mask"):
        j0, j1 = by[(kind, "none")], by[(kind, "exact")]
        assert np.linalg.norm(diag.drift[j0]) > 1e-3
        np.testing.assert_allclose(diag.g_app[j0] - diag.g_app[j1], diag.drift[j0], atol=1e-12)
        # the top-k estimate of m_w (k = 1 of 3 actions) is approximate; its error is tracked
        jt = by[(kind, "topk")]
        assert np.abs(diag.m_hat[jt] - diag.m_w[jt]).max() > 1e-6
    # the tail model is exact for the unclipped ratio (m_rho = 0 either way)
    jt = by[("ratio", "topk")]
    np.testing.assert_allclose(diag.m_hat[jt], diag.m_w[jt], atol=1e-12)


def test_sampled_actor_step_has_the_exact_expectation(stale_setting):
    """Mean of the sampled step over many batches vs the closed-form g_app (z-test at 99.9%,
    Bonferroni over components and variants), with power against the uncentred expectation."""
    mdp, hist, d, post = stale_setting
    vals = jax.random.normal(jax.random.PRNGKey(9), (S,), jnp.float64)
    diag, _, combos = diagnostics_all(stale_setting, vals)
    theta, log_mus = hist.logits[-1], hist.log_probs
    log_w = jnp.log(jnp.asarray(H.version_weights("uniform", 2.5, 6)))
    n, B = 4000, 4

    def one(key, kind, clip, cen):
        k1, k2 = jax.random.split(key)
        ver, s = AC.sample_replay_states(k1, log_w, hist.visitation, B)
        a, s2 = AC.sample_transitions(k2, mdp, log_mus, ver, s)
        return AC.sampled_actor_gradient(mdp, theta, vals, log_mus, (ver, s, a, s2), kind, clip, cen, TOPK)

    kinds = jnp.asarray([k for k, _ in combos])
    cens = jnp.asarray([c for _, c in combos])
    clips = jnp.where(kinds == 3, 2.0, 1.5)
    keys = jax.random.split(jax.random.PRNGKey(21), n)
    g = jax.jit(jax.vmap(jax.vmap(one, (0, None, None, None)), (None, 0, 0, 0)))(keys, kinds, clips, cens)
    g = np.asarray(g)  # [variants, n, S, A]
    mean, se = g.mean(1), g.std(1, ddof=1) / np.sqrt(n)
    ok = se > 1e-12
    zcrit = stats.norm.ppf(1 - (1 - LEVEL) / (2 * ok.sum()))
    z = np.where(ok, (mean - diag.g_app) / np.where(ok, se, 1.0), 0.0)
    assert np.abs(z).max() < zcrit
    by = {(AC.ACTOR_KINDS[k], AC.CENTERINGS[c]): j for j, (k, c) in enumerate(combos)}
    j1, j0 = by[("truncate", "exact")], by[("truncate", "none")]
    z_wrong = (mean[j1] - diag.g_app[j0]) / np.where(ok[j1], se[j1], np.inf)
    assert np.abs(z_wrong).max() > zcrit  # the test can tell centred from uncentred


# ------------------------------------------------------------------ rollout workers


def test_worker_law_matches_simulated_workers(stale_setting):
    mdp, hist, d, post = stale_setting
    log_mus = hist.log_probs  # [6, S, A] oldest first, max_lag 5
    Lmax, steps, n, p = 5, 6, 20000, 0.4
    joint = jnp.zeros((Lmax + 1, S), jnp.float64).at[0].set(mdp.init)
    for _ in range(steps):
        joint = AC.propagate_workers(mdp, log_mus, joint, jnp.asarray(p))
    np.testing.assert_allclose(float(joint.sum()), 1.0, atol=1e-12)

    @jax.jit
    def simulate(key):
        k0, k = jax.random.split(key)
        s = jax.random.categorical(k0, jnp.log(mdp.init), shape=(n,))
        lag = jnp.zeros((n,), jnp.int32)
        for kk in jax.random.split(k, steps):
            k1, k2 = jax.random.split(kk)
            a, s2 = AC.sample_transitions(k1, mdp, log_mus, Lmax - lag, s)
            s, lag = AC.step_workers(k2, mdp, s2, lag, jnp.asarray(p), Lmax)
        return s, lag

    s, lag = map(np.asarray, simulate(jax.random.PRNGKey(2)))
    counts = np.zeros((Lmax + 1, S))
    np.add.at(counts, (lag, s), 1)
    expect = n * np.asarray(joint)
    keep = expect > 5
    chi2 = float(np.sum((counts[keep] - expect[keep]) ** 2 / expect[keep]))
    assert stats.chi2.sf(chi2, keep.sum() - 1) > 1 - LEVEL
    assert expect[1:].sum() > 0.2 * n  # stale workers are common: the test has something to see


def test_rollout_sampling_runs_with_switches(problems):
    cfg = AC.ACConfig(num_chunks=2, chunk_len=2, batch_size=8, critic_methods=("uncorrected", "vccc"),
                      max_lag=L, sampling="rollout", expected=True)
    vs = [AC.make_variant(cfg, critic=c, centering="exact", refresh_prob=p, dtype=jnp.float64)
          for c in ("uncorrected", "vccc") for p in (1.0, 0.3)]
    res = run(cfg, problems, vs, jax.random.split(jax.random.PRNGKey(0), N_MDPS))
    assert np.abs(res.curves.mean_lag[[0, 2]]).max() < 1e-12  # always fresh weights: lag 0
    assert np.all(res.curves.mean_lag[[1, 3], :, -1] > 0.3)  # switching workers are stale
    assert np.all(np.isfinite(res.theta))


# ------------------------------------------------------------------ misc


def test_optimal_values_and_errors(problems):
    mdps, logits = problems
    mdp = mdps[0]
    vstar = AC.optimal_values(mdp)
    np.testing.assert_allclose(jnp.max(exact.q_values(mdp, v=vstar), axis=-1), vstar, atol=1e-9)
    for th in logits:
        assert np.all(np.asarray(exact.policy_value(mdp, jax.nn.softmax(th))) <= np.asarray(vstar) + 1e-9)
    with pytest.raises(ValueError, match="sampling"):
        AC.ACConfig(sampling="bogus")
    with pytest.raises(ValueError, match="critic_methods"):
        AC.ACConfig(critic_methods=("vtrace",))
    with pytest.raises(ValueError, match="actor_kind"):
        AC.make_variant(SAMPLED_CFG, actor_kind="ppo")
    with pytest.raises(ValueError, match="actor_clip"):
        AC.make_variant(SAMPLED_CFG, actor_kind="mask", actor_clip=0.5)
    with pytest.raises(ValueError, match="init_logits"):
        AC.train(mdp, logits[0][:, :2], AC.make_variant(SAMPLED_CFG, dtype=jnp.float64),
                 jax.random.PRNGKey(0), SAMPLED_CFG)


def test_grid_rows_and_figure(tmp_path):
    # the same ACConfig and lane count as the expected-mode test: no new compilation
    c = EXPECTED_CFG
    cfg = {"num_mdps": N_MDPS, "family": {"kind": "random", "num_states": S, "num_actions": A, "gamma": 0.9},
           "ac": {"num_chunks": c.num_chunks, "chunk_len": c.chunk_len, "actor_lr": c.actor_lr,
                  "critic_lr": c.critic_lr, "max_lag": c.max_lag, "topk": c.topk},
           "critics": list(CRITICS), "mean_lags": [0, 1],
           "lanes_per_call": len(AC.ACTOR_KINDS) * len(AC.CENTERINGS) * len(CRITICS) * N_MDPS}
    rows = RA.run_grid(cfg)
    assert len(rows) == len(CRITICS) * 2 * 2  # critics x {none, exact} centering x lags
    for r in rows:
        for k in AA.METRICS:
            assert np.isfinite(r["metrics"][k]["mean"]) and len(r["metrics"][k]["per_mdp"]) == 3
    ratios = AA.reduction_ratios(rows)
    assert len(ratios) == len(CRITICS) * 2 and all(r["mean_lag"] == 1 for r in ratios)
    assert "VCCC critic" in AA.ratio_table(rows)
    fig = plotting.fig_async_ac(rows)
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000


# ------------------------------------------------------------------ Sec 3.4 Monte Carlo


def test_switching_rollouts_mc_mismatch_and_one_step_unbiased():
    # seed / schedule chosen for power: the closest stationary value (V^{mu_5}) is 0.22 from
    # the switching expectation, about 9 standard errors at 8000 rollouts
    mdp, mus, pi, vbar, labels = MC.default_problem(1, dtype=jnp.float64)
    rep = MC.mc_demo(jax.random.PRNGKey(1), mdp, mus, pi, vbar, (0, 2, 5), num_rollouts=8000,
                     horizon=150, labels=labels)
    g = rep["g0"]
    zc = rep["z_crit"]  # two-sided 99.9%, Bonferroni over the stationary comparisons
    assert rep["confidence"] == LEVEL
    assert g["truncation_bound"] < 0.01 * g["se"]
    assert abs(g["z_switching"]) < stats.norm.ppf(1 - (1 - LEVEL) / 2)  # MC is right ...
    for name, z in g["z_stationary"].items():  # ... and matches no single version's value
        assert abs(z) > zc, name
    # exact schedule value vs a direct check: with one version it is that version's value
    one = MC.switching_values(mdp, mus[:1], (0,), 400)
    np.testing.assert_allclose(one, exact.policy_value(mdp, mus[0]), atol=1e-12)
    assert rep["one_step"]["vccc"]["p"] > 1 - LEVEL  # conditionally unbiased for T_pi Vbar
    assert rep["one_step"]["uncorrected"]["p"] < 1 - LEVEL  # the stale target is not
    assert rep["returns"]["pi_k"]["p"] < 1 - LEVEL  # pooled MC returns miss V^{pi_k}
    assert "MISMATCH" in format_report(rep)
