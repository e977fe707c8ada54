"""Decoupled correction routes and PPO-EWMA (vccc_jax.estimators.related.decoupled)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.actor import policy_loss
from vccc_jax.estimators.related import decoupled as dc


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(0)
    lp = lambda x: jax.nn.log_softmax(jnp.asarray(x), axis=-1)[..., 0]  # noqa: E731
    base = rng.normal(size=(16, 4))
    return dict(log_pi=lp(base + 0.3 * rng.normal(size=base.shape)), log_old=lp(base),
                log_mu=lp(base + 0.5 * rng.normal(size=base.shape)),
                adv=jnp.asarray(rng.normal(size=16)))


def test_split_ratio_and_exact_route_is_policy_loss(tokens):
    t = tokens
    out = dc.decoupled_ratios(t["log_pi"], t["log_old"], t["log_mu"], kind="ratio", clip=None, ppo_epsilon=None)
    np.testing.assert_allclose(out.discrepancy * out.staleness, jnp.exp(t["log_pi"] - t["log_mu"]), rtol=1e-5)
    a = dc.decoupled_policy_loss(t["log_pi"], t["log_mu"], t["adv"], route="exact",
                                 exact_log_pi_old=t["log_old"], kind="mask", clip=2.0, ppo_epsilon=0.2)
    b = policy_loss(t["log_pi"], t["log_mu"], t["adv"], kind="mask", clip=2.0, ppo_epsilon=0.2,
                    log_pi_old=t["log_old"])
    np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(ValueError, match="exact_log_pi_old"):
        dc.decoupled_policy_loss(t["log_pi"], t["log_mu"], t["adv"], route="exact")


def test_behaviour_route_entangles_thresholds(tokens):
    """pi_old = mu: the discrepancy threshold never fires, the PPO clip sees pi/mu."""
    t = tokens
    ref = dc.old_log_probs("behaviour", t["log_mu"])
    out = dc.decoupled_ratios(t["log_pi"], ref, t["log_mu"], kind="mask", clip=1.2, ppo_epsilon=0.1)
    assert not bool(jnp.any(out.discrepancy_fired))
    np.testing.assert_allclose(out.discrepancy, 1.0)
    exact = dc.decoupled_ratios(t["log_pi"], t["log_old"], t["log_mu"], kind="mask", clip=1.2, ppo_epsilon=0.1)
    assert bool(jnp.any(exact.discrepancy_fired))
    w = dc.decoupled_weights(t["log_pi"], ref, t["log_mu"], kind="truncate", clip=2.0, ppo_epsilon=None)
    np.testing.assert_allclose(w, jnp.exp(t["log_pi"] - t["log_mu"]), rtol=1e-5)


def test_ewma_is_debiased_parameter_average():
    params = [{"w": jnp.full((2,), float(k))} for k in range(1, 6)]
    beta = dc.ewma_decay_for_lag(3.0)
    assert beta == pytest.approx(0.75)
    state = dc.ewma_init(params[0])
    step = jax.jit(dc.ewma_update)
    for p in params:
        state = step(state, p, beta)
    weights = (1 - beta) * beta ** np.arange(4, -1, -1)
    expected = np.dot(weights, np.arange(1, 6)) / weights.sum()
    np.testing.assert_allclose(dc.ewma_params(state, beta)["w"], expected, rtol=1e-6)
    assert int(state.count) == 5
    # decay 0 (lag 0): the EWMA is the current parameters.
    s0 = dc.ewma_update(dc.ewma_init(params[0]), params[2], 0.0)
    np.testing.assert_allclose(dc.ewma_params(s0, 0.0)["w"], 3.0)


def test_route_cost():
    snap = dc.route_cost("exact", num_params=10, max_lag=4)
    model = dc.route_cost("exact", num_params=10, max_lag=4, exact_strategy="old_logit_model")
    assert snap["extra_params"] == 50 and model["extra_params"] == 10
    assert dc.route_cost("behaviour", num_params=10, max_lag=4)["extra_forward_passes"] == 0
    with pytest.raises(ValueError, match="route"):
        dc.route_cost("magic", num_params=1, max_lag=0)


@pytest.mark.parametrize("kind,clip,eps", [("truncate", 1.3, 0.2), ("mask", 1.3, 0.1), ("ratio", None, None)])
def test_ratios_weights_and_loss_match_the_definition(tokens, kind, clip, eps):
    """d = w(pi_old / mu) (truncated / masked), r = pi / pi_old, clip(r) to [1 - eps, 1 + eps];
    critic weight d clip(r); loss = -mean d min(r A, clip(r) A) (numpy, from probabilities)."""
    t = tokens
    with jax.enable_x64(True):
        pi, old, mu = (np.exp(np.asarray(t[k], np.float64)) for k in ("log_pi", "log_old", "log_mu"))
        adv = np.asarray(t["adv"], np.float64)
        raw = old / mu
        d = {"ratio": raw, "truncate": np.minimum(raw, clip or 1.0),
             "mask": np.where((raw >= 1 / (clip or 1.0)) & (raw <= (clip or 1.0)), raw, 0.0)}[kind]
        r = pi / old
        r_c = r if eps is None else np.clip(r, 1 - eps, 1 + eps)
        out = dc.decoupled_ratios(*(jnp.asarray(t[k], jnp.float64) for k in ("log_pi", "log_old", "log_mu")),
                                  kind=kind, clip=clip, ppo_epsilon=eps)
        np.testing.assert_allclose(out.discrepancy, d, rtol=1e-12)
        np.testing.assert_allclose(out.staleness, r, rtol=1e-12)
        np.testing.assert_allclose(out.staleness_clipped, r_c, rtol=1e-12)
        w = dc.decoupled_weights(*(jnp.asarray(t[k], jnp.float64) for k in ("log_pi", "log_old", "log_mu")),
                                 kind=kind, clip=clip, ppo_epsilon=eps)
        np.testing.assert_allclose(w, d * r_c, rtol=1e-12)
        loss = dc.decoupled_policy_loss(jnp.asarray(t["log_pi"], jnp.float64), jnp.asarray(t["log_mu"], jnp.float64),
                                        jnp.asarray(adv), route="exact",
                                        exact_log_pi_old=jnp.asarray(t["log_old"], jnp.float64), kind=kind,
                                        clip=clip, ppo_epsilon=eps)
        want = -np.mean(d * np.minimum(r * adv, r_c * adv))
        assert float(loss) == pytest.approx(want, rel=1e-12)
        assert kind == "ratio" or np.any(d != raw)  # the discrepancy threshold binds somewhere
        assert eps is None or np.any(r_c != r)      # so does the PPO clip


def test_routes_pick_their_pi_old(tokens):
    """old_log_probs and the trainer's route_log_pi_old return, per route, the exact snapshot,
    the EWMA policy's or mu's log-probs (and the learner's for route "")."""
    t = tokens
    ewma = t["log_old"] - 0.3
    for route, want in (("exact", t["log_old"]), ("ewma", ewma), ("behaviour", t["log_mu"])):
        got = dc.old_log_probs(route, t["log_mu"], exact_log_pi_old=t["log_old"], ewma_log_pi=ewma)
        np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(1)
    T, B, A = 3, 2, 4
    logits = {k: jnp.asarray(rng.normal(size=(T, B, A))) for k in ("pi", "mu", "b", "e")}
    lsm = {k: jax.nn.log_softmax(x, -1) for k, x in logits.items()}
    action = jnp.asarray(rng.integers(0, A, size=(T, B)))
    kw = dict(log_pi_all=lsm["pi"], log_mu_all=lsm["mu"], behaviour_log_pi_all=lsm["b"], ewma_logits=logits["e"])
    for route, key in (("", "pi"), ("exact", "b"), ("ewma", "e"), ("behaviour", "mu")):
        tok, full = dc.route_log_pi_old(route, action, **kw)
        np.testing.assert_allclose(full, lsm[key], rtol=1e-6)
        np.testing.assert_allclose(tok, jnp.take_along_axis(lsm[key], action[..., None], -1)[..., 0], rtol=1e-6)


def _areal_loglinear(old_logp, logprobs, versions, current_version):
    """AReaL ``compute_prox_logp_approximations`` (method loglinear) in NumPy: v_prox =
    current - 1, alpha = (v_prox - v_behave) / (v_theta - v_behave) where v_theta > v_behave
    (else 0), clipped to [0, 1]; log p_prox = old + alpha (new - old)."""
    diff = current_version - versions.astype(float)
    gap = (current_version - 1) - versions.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where(diff > 0, gap / diff, 0.0)
    alpha = np.clip(alpha, 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        return old_logp + alpha * (logprobs - old_logp), alpha


def test_interpolated_route_is_areals_loglinear_proximal():
    """A-3PO: per token, with lag l = v_theta - v_behave, alpha = (l - 1) / l (0 at l <= 1);
    the route's taken-token values and full rows equal AReaL's formula; a -inf log mu (off a
    top-k support) stays -inf; no gradient flows into the learner's log-probs."""
    rng = np.random.default_rng(3)
    T, B, A = 4, 3, 5
    lags = rng.integers(0, 6, size=(T, B))
    lags[0] = [0, 1, 2]
    lp_all = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(T, B, A))), -1)
    lm_all = np.array(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(T, B, A))), -1))
    lm_all[1, 1, 4] = -np.inf
    action = jnp.asarray(rng.integers(0, A, size=(T, B)))
    current = 10
    ref_full, alpha = _areal_loglinear(lm_all, np.asarray(lp_all), (current - lags)[..., None], current)
    np.testing.assert_allclose(alpha[0, :, 0], [0.0, 0.0, 0.5])
    ref_full[1, 1, 4] = -np.inf  # (1 - alpha) (-inf) + alpha x: AReaL's form gives nan when alpha > 0
    tok, full = dc.route_log_pi_old("interpolated", action, log_pi_all=lp_all,
                                    log_mu_all=jnp.asarray(lm_all), lags=jnp.asarray(lags))
    np.testing.assert_allclose(full, ref_full, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tok, np.take_along_axis(ref_full, np.asarray(action)[..., None], -1)[..., 0],
                               rtol=1e-6, atol=1e-6)
    one = dc.old_log_probs("interpolated", jnp.asarray(lm_all[..., 0]), log_pi=lp_all[..., 0],
                           lags=jnp.asarray(lags))
    np.testing.assert_allclose(one, ref_full[..., 0], rtol=1e-6, atol=1e-6)
    g = jax.grad(lambda x: jnp.sum(dc.interpolated_log_prox(jnp.asarray(lm_all[..., 0]), x,
                                                            jnp.asarray(lags))))(lp_all[..., 0])
    assert float(jnp.max(jnp.abs(g))) == 0.0
    with pytest.raises(ValueError, match="lags"):
        dc.route_log_pi_old("interpolated", action, log_pi_all=lp_all, log_mu_all=jnp.asarray(lm_all))
