"""Exact fixed points and trained critics on mixed-version replay (float64).

What the write-up predicts, checked exactly on small Garnet MDPs: the uncorrected
fixed point drifts with staleness, VCCC / IW-TD lands on V^{pi_K} at every lag (Eq 6),
clipping trades bias for variance (Eq 10), the naive general-baseline target leaks
(1 - Z) b and the Z-centred one does not (Sec 4.2). Cross-checked against independent
routes in ``tabular.exact``.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import critic as C
from vccc_jax.tabular import exact
from vccc_jax.tabular import history as H
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular.critic_sgd import CriticSGDConfig

N_MDPS, S, A, V = 3, 5, 3, 9
NO_TRAIN = CriticSGDConfig(enabled=False)


@pytest.fixture(scope="module", autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def setting(x64):
    mdps = jax.jit(lambda k: M.garnet_mdp(k, N_MDPS, S, A, 3, gamma=0.9))(jax.random.PRNGKey(0))
    cfg = H.HistoryConfig(algorithm="npg", step_size=0.4, num_versions=V)
    th = H.initial_logits(jax.random.PRNGKey(1), N_MDPS, S, A, 1.0)
    hist = jax.jit(jax.vmap(functools.partial(H.policy_history, config=cfg)))(mdps, th)
    return mdps, hist


def cell_inputs(setting, cells):
    """CellInputs batched over cells x MDPs; cells = [(law, lag, clip), ...]."""
    mdps, hist = setting
    n = len(cells)
    tile = lambda x: jnp.concatenate([x] * n, axis=0)  # noqa: E731
    w = np.stack([H.version_weights(law, lag, V) for law, lag, _ in cells])
    return C.CellInputs(
        mdp=jax.tree_util.tree_map(tile, mdps), log_probs=tile(hist.log_probs),
        values=tile(hist.values), visitation=tile(hist.visitation),
        weights=jnp.repeat(jnp.asarray(w), N_MDPS, axis=0),
        clip=jnp.repeat(jnp.asarray([c for _, _, c in cells], jnp.float64), N_MDPS),
        key=jax.random.split(jax.random.PRNGKey(7), n * N_MDPS),
    )


@functools.lru_cache(maxsize=None)
def _eval_fn(method, train_cfg, options=()):
    """Compiled at the suite's optimisation level 0 (tests/conftest.py), not the sweep's
    ``C.COMPILER_OPTIONS`` (level 1: this file's tiny problems compile 25% faster at 0,
    2026-12-03; the sweep runs its own level-1 programs in tests/runs/test_results.py and
    test_resume.py)."""
    spec = C.METHODS[method]
    return jax.jit(jax.vmap(functools.partial(C.evaluate, spec, spec.options(dict(options)),
                                              train_cfg)))


def evaluate(setting, method, cells, train_cfg=NO_TRAIN, **options):
    out = _eval_fn(method, train_cfg, tuple(sorted(options.items())))(cell_inputs(setting, cells))
    return {k: np.asarray(v).reshape((len(cells), N_MDPS) + v.shape[1:]) for k, v in out.items()}


def replay_of(setting, i, law, lag):
    mdps, hist = setting
    w = jnp.asarray(H.version_weights(law, lag, V))
    return C.make_replay(mdps[i], hist.log_probs[i], hist.visitation[i], w)


LAWS_LAGS = list(itertools.product(H.STALENESS_LAWS, [0, 1, 2, 3]))


# ----------------------------------------------------------------------- the claims


@pytest.mark.parametrize("method", ["vccc", "vccc_bstar"])
def test_vccc_fixed_point_is_v_pi_k_at_every_lag(setting, method):
    """Eq 6: E_replay[Y | s] = T_{pi_K} Vbar for any version mixture -> fixed point V^{pi_K}."""
    out = evaluate(setting, method, [(law, lag, 0.0) for law, lag in LAWS_LAGS])
    assert out["fp_err_max"].max() < 1e-8
    assert np.all(out["unidentified"] == 0)


def test_uncorrected_error_grows_with_lag_and_matches_replay_policy(setting):
    lags = [0, 1, 2, 4, 8]
    out = evaluate(setting, "uncorrected", [("fixed", lag, 0.0) for lag in lags])
    err = out["fp_err_rms"].mean(1)
    assert err[0] < 1e-10
    assert np.all(np.diff(err) > 0), err
    assert err[-1] > 0.1
    # Independent route: the uncorrected critic learns V of the replay's acting policy
    # sum_i q_i(s) mu_i(a|s) (Sec 1.3); for a fixed lag, simply V^{mu}.
    mdps, hist = setting

    @jax.jit
    def both(rep):
        fp = C.fixed_point(C.METHODS["uncorrected"], rep, jnp.inf, {}, jnp.zeros(S))
        return fp.values, exact.policy_value(rep.mdp, exact.replay_policy(rep.mus, rep.posterior))

    for i in range(N_MDPS):
        fp, v_replay = both(replay_of(setting, i, "geometric", 2))
        np.testing.assert_allclose(fp, v_replay, atol=1e-10)
        np.testing.assert_allclose(out["fp_values"][3, i], hist.values[i, V - 1 - 4], atol=1e-10)


@pytest.mark.parametrize("kind", ["truncate", "mask"])
def test_clipped_fixed_point_matches_exact_mixture_route(setting, kind):
    """Eq 10 under a mixture: fixed point V^{pibar}, pibar ∝ sum_i q_i mu_i w_i (exact.py)."""
    method = {"truncate": "truncated", "mask": "masked"}[kind]
    cells = [("geometric", 2, 1.5), ("zipf", 3, 2.0), ("uniform", 1, 4.0)]
    out = evaluate(setting, method, cells)
    mdps, hist = setting
    for j, (law, lag, c) in enumerate(cells):
        for i in range(N_MDPS):
            rep = replay_of(setting, i, law, lag)
            ref = exact.clipped_fixed_point(mdps[i], rep.pi, rep.mus, c, kind, mix=rep.posterior)
            np.testing.assert_allclose(out["fp_values"][j, i], ref, atol=1e-10)


def test_clipped_bias_falls_and_variance_rises_with_c(setting):
    clips = [1.0, 1.25, 1.5, 2.0, 3.0, 1e6]
    out = evaluate(setting, "truncated", [("fixed", 4, c) for c in clips])
    bias = out["fp_err_rms"].mean(1)
    var = out["target_var"].mean(1)
    clip_rate = out["clip_rate"].mean(1)
    # Monotone in c, and strictly so while some ratio is still clipped.
    live = clip_rate[:-1] > 0
    assert np.all(np.diff(bias) <= 1e-14) and np.all(np.diff(bias)[live] < 0), bias
    assert np.all(np.diff(var) >= -1e-14) and np.all(np.diff(var)[live] > 0), var
    assert live[:3].all() and bias[0] > 0.05
    assert bias[-1] < 1e-10  # c beyond every ratio: exactly VCCC / IW-TD
    assert np.all(np.diff(clip_rate) <= 0)


def test_naive_general_baseline_leaks_and_z_centred_does_not(setting):
    mdps, hist = setting
    cells = [("fixed", 4, 1.0), ("geometric", 2, 1.0), ("fixed", 4, 2.0), ("fixed", 4, 1e6)]
    out = evaluate(setting, "naive_baseline", cells)
    naive = out["fp_values"]
    centred = evaluate(setting, "centered_baseline", cells)["fp_values"]
    clipped = evaluate(setting, "truncated", cells)["fp_values"]
    # The Z-centred target keeps Eq 10's fixed point for an arbitrary baseline ...
    np.testing.assert_allclose(centred, clipped, atol=1e-9)
    # ... the naive one is pulled towards the baseline b = V^{pi_0} wherever Z < 1, i.e.
    # wherever some ratio is clipped (c = 1 always clips at lag > 0; c = 2 on some MDPs).
    gap = np.sqrt(np.mean((naive - clipped) ** 2, axis=-1))
    clips_some = out["clip_rate"] > 0
    assert clips_some[:2].all() and clips_some[2].any() and not clips_some[2].all()
    assert np.all(gap[clips_some] > 1e-2), gap
    assert np.all(gap[~clips_some] < 1e-9), gap
    # Unclipped (c -> inf, Z = 1): no leak, both are VCCC and land on V^{pi_K}.
    np.testing.assert_allclose(naive[3], hist.values[:, -1], atol=1e-9)
    # Independent route for one version: exact.naive_clipped_fixed_point.
    for i in range(N_MDPS):
        mu = hist.probs[i, V - 1 - 4]
        ref = exact.naive_clipped_fixed_point(mdps[i], hist.probs[i, -1], mu, hist.values[i, 0], 1.0)
        np.testing.assert_allclose(naive[0, i], ref, atol=1e-9)


def test_bstar_is_exact_eq9_and_minimises_variance(setting):
    mdps, hist = setting
    for i in range(N_MDPS):
        rep = replay_of(setting, i, "fixed", 3)
        vbar = hist.values[i, 2]
        ref = exact.optimal_baseline(mdps[i], rep.pi, hist.probs[i, V - 1 - 3], vbar)
        np.testing.assert_allclose(C.mixture_optimal_baseline(rep, vbar), ref, atol=1e-10)
    cells = [(law, 3, 0.0) for law in H.STALENESS_LAWS]
    v_b = evaluate(setting, "vccc_bstar", cells)["target_var"]
    v_1 = evaluate(setting, "vccc", cells)["target_var"]
    assert np.all(v_b <= v_1 + 1e-12) and np.any(v_b < 0.99 * v_1)


def test_mixture_moments_match_brute_force_enumeration(setting):
    mdps, hist = setting
    rep = replay_of(setting, 1, "zipf", 2)
    vbar = hist.values[1, 3]
    b = hist.values[1, 0]
    spec, c = C.METHODS["centered_baseline"], 1.5
    mean, var = C.expected_target(spec, rep, vbar, c, spec.options(), b)
    P, R, g = map(np.asarray, (mdps.P[1], mdps.R[1], mdps.gamma[1]))
    pi, mus, q = map(np.asarray, (rep.pi, rep.mus, rep.posterior))
    vb, bb = np.asarray(vbar), np.asarray(b)
    for s in range(S):
        ys, ps = [], []
        for i in range(V):
            rho = pi[s] / mus[i, s]
            w = np.minimum(rho, c)
            z = np.sum(mus[i, s] * w)
            for a in range(A):
                for s2 in range(S):
                    delta = R[s, a, s2] + g * vb[s2] - vb[s]
                    ys.append(vb[s] + w[a] * delta - (w[a] - z) * (bb[s] - vb[s]))
                    ps.append(q[i, s] * mus[i, s, a] * P[s, a, s2])
        ys, ps = np.array(ys), np.array(ps)
        m = np.sum(ps * ys)
        assert float(mean[s]) == pytest.approx(m, abs=1e-10)
        assert float(var[s]) == pytest.approx(np.sum(ps * (ys - m) ** 2), abs=1e-10)


def _vtrace_paths(P, R, g, pi, mu, v, s0, n, lam, rhobar, cbar):
    """Every n-step path from s0 under mu with its probability and its Eq 11 target."""
    out = []
    for path in itertools.product(range(A), range(S), repeat=n):
        s, prob, total, trace, disc = s0, 1.0, v[s0], 1.0, 1.0
        for t in range(n):
            a, s2 = path[2 * t], path[2 * t + 1]
            prob *= mu[s, a] * P[s, a, s2]
            rho = pi[s, a] / mu[s, a]
            delta = R[s, a, s2] + g * v[s2] - v[s]
            total += disc * trace * min(rhobar, rho) * delta
            trace *= lam * min(cbar, rho)
            disc *= g
            s = s2
        out.append((prob, total))
    return np.array(out)


@pytest.mark.parametrize("n, lam, clip", [(1, 1.0, 1.0), (2, 0.9, 1.5), (3, 1.0, np.inf)])
def test_vtrace_moments_match_path_enumeration(setting, n, lam, clip):
    mdps, hist = setting
    m = mdps[2]
    pi, mu, v = hist.probs[2, -1], hist.probs[2, 4], hist.values[2, 1]
    mean, var = C.vtrace_moments(m, pi, mu, v, n_steps=n, lambda_=lam,
                                 clip_rho_threshold=clip, clip_c_threshold=clip)
    ref = exact.expected_vtrace_operator(m, pi, mu, v, n_steps=n, lambda_=lam,
                                         clip_rho_threshold=clip, clip_c_threshold=clip)
    np.testing.assert_allclose(mean, ref, atol=1e-10)
    args = [np.asarray(x) for x in (m.P, m.R, m.gamma, pi, mu, v)]
    for s0 in (0, 3):
        pv = _vtrace_paths(*args, s0, n, lam, clip, clip)
        mu_ = np.sum(pv[:, 0] * pv[:, 1])
        assert float(mean[s0]) == pytest.approx(mu_, abs=1e-10)
        assert float(var[s0]) == pytest.approx(np.sum(pv[:, 0] * (pv[:, 1] - mu_) ** 2), abs=1e-10)


def test_unidentified_states_keep_their_initial_value(setting):
    # A zero-width mask (c = 1) drops every stale transition: at a fixed lag > 0 no state
    # gets an expected update, so the fixed point is the critic's initial value 0.
    out = evaluate(setting, "masked", [("fixed", 2, 1.0), ("fixed", 0, 1.0)])
    assert np.all(out["unidentified"][0] == S)
    np.testing.assert_array_equal(out["fp_values"][0], 0.0)
    assert np.all(out["unidentified"][1] == 0) and out["fp_err_max"][1].max() < 1e-10


def test_weight_diagnostics_are_population_ess_and_clip_rates(setting):
    out = evaluate(setting, "truncated", [("uniform", 2, 1.2), ("uniform", 2, 1e9)])
    _, hist = setting
    # Lag 0 never clips; huge c never clips; ESS of rho by version computed directly.
    assert np.all(out["clip_by_version"][:, :, -1] == 0)
    assert np.all(out["clip_by_version"][1] == 0) and np.all(out["clip_rate"][0] > 0)
    i, ver = 0, V - 3
    rho = np.exp(np.asarray(hist.log_probs[i, -1] - hist.log_probs[i, ver]))
    p = np.asarray(hist.visitation[i, ver])[:, None] * np.asarray(hist.probs[i, ver])
    ess = np.sum(p * rho) ** 2 / np.sum(p * rho**2)
    assert out["ess_by_version"][1, i, ver] == pytest.approx(ess, rel=1e-10)
    assert np.all(out["ess"] <= 1 + 1e-12)


# ----------------------------------------------------------------------- training

TRAIN = CriticSGDConfig(num_updates=800, batch_size=32, learning_rate=0.5, lr_decay=50.0,
                      num_checkpoints=8)


def test_trained_critic_approaches_the_fixed_point(setting):
    """Stochastic semi-gradient TD (fixed key): VCCC's trained critic ends near V^{pi_K};
    the uncorrected one ends near its own, stale, fixed point."""
    cells = [("geometric", 2, 0.0), ("fixed", 4, 0.0)]
    vccc = evaluate(setting, "vccc", cells, TRAIN)
    unc = evaluate(setting, "uncorrected", cells, TRAIN)
    start = vccc["tc_curve_rms"][..., 0]
    assert np.all(vccc["tc_err_rms"] < 0.1 * start)
    assert np.all(vccc["tc_err_rms"] < 0.5 * unc["fp_err_rms"])
    assert np.all(unc["tc_err_to_fp"] < 0.5 * unc["fp_err_rms"])
    # The recorded per-update target variance estimates the exact one (sampling error
    # of a mean over 400 updates x 32 draws: well inside 30 %).
    np.testing.assert_allclose(vccc["tc_target_var"], vccc["target_var"], rtol=0.3)


def test_polyak_target_network_also_converges(setting):
    cfg = CriticSGDConfig(num_updates=800, batch_size=32, learning_rate=0.5, lr_decay=50.0,
                        polyak=0.3, num_checkpoints=8)
    out = evaluate(setting, "vccc", [("geometric", 2, 0.0)], cfg)
    assert np.all(out["tc_err_rms"] < 0.1 * out["tc_curve_rms"][..., 0])


# ----------------------------------------------------------------------- interface


def test_register_method_adds_a_comparator_to_the_same_interface(setting):
    from vccc_jax.estimators import critic_targets as ct

    spec = C.MethodSpec(
        name="test_vccc_b0", description="VCCC with b = 0", weight_kind="ratio",
        uses_clip=False,
        one_step=lambda x, e, clip, o: ct.vccc_target(
            x.rewards, x.discounts, x.values, x.next_values, x.log_rhos,
            baseline=jnp.zeros_like(x.values)),
    )
    C.register_method(spec)
    try:
        out = evaluate(setting, "test_vccc_b0", [("zipf", 2, 0.0)])
        assert out["fp_err_max"].max() < 1e-8  # Eq 5: any state-only baseline
    finally:
        del C.METHODS["test_vccc_b0"]
    with pytest.raises(ValueError, match="multi-step"):
        C.register_method(C.MethodSpec(name="x", description="", weight_kind="ratio",
                                       uses_clip=False))
    with pytest.raises(ValueError, match="no option 'lamda'"):
        C.METHODS["vtrace"].options({"lamda": 0.5})


def test_train_config_errors():
    with pytest.raises(ValueError, match="num_updates"):
        CriticSGDConfig(num_updates=0)
    with pytest.raises(ValueError, match="polyak"):
        CriticSGDConfig(polyak=0.0)
    assert CriticSGDConfig(num_updates=100, num_checkpoints=5).checkpoints().tolist() == [1, 3, 10, 32, 100]


@pytest.mark.parametrize("n, lam, clip", [(2, 0.9, 1.5), (3, 1.0, np.inf)])
def test_vtrace_trajectory_target_is_eq11_on_every_path(setting, n, lam, clip):
    """The trained critic's V-trace target (estimators.vtrace on pre-truncated log-ratios)
    equals Eq 11 with rhobar = cbar = c on every enumerated path, hence the same moments."""
    mdps, hist = setting
    m = mdps[0]
    pi, mu, v = (np.asarray(x) for x in (hist.probs[0, -1], hist.probs[0, 3], hist.values[0, 2]))
    P, R, g = np.asarray(m.P), np.asarray(m.R), float(m.gamma)
    s0 = 1
    paths = list(itertools.product(range(A), range(S), repeat=n))
    lr = np.zeros((n, len(paths)))
    rew, disc, vals = np.zeros_like(lr), np.full_like(lr, g), np.zeros_like(lr)
    boot = np.zeros(len(paths))
    for b, path in enumerate(paths):
        s = s0
        for t in range(n):
            a, s2 = path[2 * t], path[2 * t + 1]
            lr[t, b] = np.log(pi[s, a]) - np.log(mu[s, a])
            rew[t, b], vals[t, b] = R[s, a, s2], v[s]
            s = s2
        boot[b] = v[s]
    traj = C.Trajectory(*(jnp.asarray(x) for x in (lr, disc, rew, vals, boot)))
    got = C.METHODS["vtrace"].trajectory_target(traj, jnp.asarray(clip), {"lambda_": lam, "n_steps": n})
    ref = _vtrace_paths(P, R, g, pi, mu, v, s0, n, lam, clip, clip)[:, 1]
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_method_bank_gives_the_same_numbers_as_each_method(setting):
    """The sweep evaluates one-step methods through one program with a traced method index
    (critic.resolve_bank); it must reproduce each method evaluated on its own."""
    names = ("truncated", "masked", "centered_baseline")
    specs = tuple(C.METHODS[m] for m in names)
    opts = tuple(s.options() for s in specs)
    cfg = CriticSGDConfig(num_updates=50, batch_size=8, num_checkpoints=3)
    xs = cell_inputs(setting, [("geometric", 2, 1.5), ("fixed", 3, 4.0)])
    bank = jax.jit(lambda i, xs: jax.vmap(
        lambda x: C.evaluate(C.resolve_bank(specs, opts, i), None, cfg, x))(xs))
    for i, name in enumerate(names):
        got = bank(jnp.int32(i), xs)
        ref = _eval_fn(name, cfg)(xs)
        for k in ("fp_values", "target_var", "clip_rate", "tc_err_rms", "tc_target_var"):
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-12, atol=1e-12, err_msg=f"{name} {k}")
    with pytest.raises(ValueError, match="uses_clip"):
        C.resolve_bank((C.METHODS["vccc"], C.METHODS["truncated"]), ({}, {}), 0)
    with pytest.raises(ValueError, match="one-step"):
        C.resolve_bank((C.METHODS["vtrace"], C.METHODS["truncated"]),
                       (C.METHODS["vtrace"].options(), {}), 0)
