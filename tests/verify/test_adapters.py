"""Library adapters (issue 29): rlax's functions, unchanged, under the verify contracts; the
PyTorch bridge's contract code on NumPy stand-ins (no torch needed); lags; the field-audit
verdicts of two rlax rows at lags 0 and 4.

References are written here: NumPy loops for V-trace (rho_bar = c_bar = 1), TD(lambda),
lambda-returns, GAE and per-decision importance-sampled TD errors; the NPG history in NumPy.
The verify runs use one small group (8 episodic MDPs 4x2), fixed keys; exact rows are
float64 closed forms (no statistical level enters the asserted verdicts).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.commands import verify as cmd
from vccc_jax.estimators.actor_registry import get_actor_correction
from vccc_jax.verify import adapters, field_audit, lags
from vccc_jax.verify.adapters import rlax as ra
from vccc_jax.verify.adapters import torch_bridge as tb
from vccc_jax.verify.contracts import TargetError, load_target, preflight, wrap
from vccc_jax.verify.problems import GroupSpec, make_problems
from vccc_jax.verify.user import Target, check_all

pytest.importorskip("rlax")


@pytest.fixture(autouse=True)
def _x64_restored():
    """The bridge turns float64 mode on process-wide (torch_bridge.require_x64): restore it."""
    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)

T, B = 4, 3
GROUP = GroupSpec("episodic", 4, 2, 8)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.5, 1.0, (T, B))
    d[2, 1] = 0.0
    return dict(log_rhos=rng.normal(0, 0.7, (T, B)), discounts=d, rewards=rng.normal(size=(T, B)),
                values=rng.normal(size=(T, B)), bootstrap_value=rng.normal(size=(B,)))


def _next_values(x):
    return np.concatenate([x["values"][1:], x["bootstrap_value"][None]], axis=0)


def ref_vtrace(x, rho_bar=1.0, c_bar=1.0, lam=1.0):
    rho = np.exp(x["log_rhos"])
    nv = _next_values(x)
    out, acc = np.zeros((T, B)), np.zeros(B)
    for t in reversed(range(T)):
        delta = np.minimum(rho[t], rho_bar) * (x["rewards"][t] + x["discounts"][t] * nv[t] - x["values"][t])
        acc = delta + x["discounts"][t] * lam * np.minimum(rho[t], c_bar) * acc
        out[t] = x["values"][t] + acc
    return out


def ref_lambda(x, lam, rho=None):
    """The lambda-return target V_t + A_t, A_t = delta_t + gamma_t lam A_{t+1}; with per-decision
    ratios (rlax's importance_corrected_td_errors): A_t = rho_t (delta_t + gamma_t lam A_{t+1})."""
    nv = _next_values(x)
    delta = x["rewards"] + x["discounts"] * nv - x["values"]
    rho = np.ones((T, B)) if rho is None else rho
    out, acc = np.zeros((T, B)), np.zeros(B)
    for t in reversed(range(T)):
        acc = rho[t] * (delta[t] + x["discounts"][t] * lam * acc)
        out[t] = acc
    return x["values"] + out


def _call(name, x, **kw):
    with jax.enable_x64(True):
        return np.asarray(getattr(ra, name)(**{k: jnp.asarray(v) for k, v in x.items()}, **kw))


def test_rlax_sequence_adapters_match_numpy_references():
    x = _inputs()
    rho = np.exp(x["log_rhos"])
    np.testing.assert_allclose(_call("vtrace", x), ref_vtrace(x), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_call("vtrace", x, clip_rho_threshold=np.inf), ref_vtrace(x, np.inf), atol=1e-12)
    vs, pg = _call("vtrace_td_error_and_advantage", x)
    np.testing.assert_allclose(vs, ref_vtrace(x), atol=1e-12)
    vs_next = np.concatenate([ref_vtrace(x)[1:], x["bootstrap_value"][None]])
    np.testing.assert_allclose(pg, np.minimum(rho, 1.0) * (x["rewards"] + x["discounts"] * vs_next - x["values"]),
                               atol=1e-12)
    np.testing.assert_allclose(_call("td_lambda", x), ref_lambda(x, 0.95), atol=1e-12)
    np.testing.assert_allclose(_call("lambda_returns", x), ref_lambda(x, 1.0), atol=1e-12)
    np.testing.assert_allclose(_call("truncated_generalized_advantage_estimation", x), ref_lambda(x, 0.95),
                               atol=1e-12)
    np.testing.assert_allclose(_call("importance_corrected_td_errors", x), ref_lambda(x, 0.95, rho), atol=1e-12)


def test_rlax_adapters_keep_trailing_batch_axes_and_stop_gradients():
    x = _inputs(1)
    x4 = {k: (v.reshape(T, B, 1) if v.ndim == 2 else v.reshape(B, 1)) for k, v in x.items()}
    np.testing.assert_allclose(_call("vtrace", x4)[..., 0], ref_vtrace(x), atol=1e-12)
    with jax.enable_x64(True):
        g = jax.grad(lambda v: jnp.sum(ra.vtrace(**dict({k: jnp.asarray(a) for k, a in x.items()}, values=v))))(
            jnp.asarray(x["values"]))
    assert float(jnp.max(jnp.abs(g))) == 0.0


def test_rlax_actor_adapters_weights_equal_our_rows_on_moderate_ratios():
    rng = np.random.default_rng(2)
    lr, adv = rng.normal(0, 0.4, 7), rng.choice([-1.0, 1.0], 7)
    with jax.enable_x64(True):
        ours = np.asarray(get_actor_correction("ppo")(jnp.asarray(lr), jnp.asarray(adv), epsilon=0.2))
    theirs = field_audit.loss_weights(ra.clipped_surrogate_pg_loss, lr, adv)
    assert np.any(ours == 0.0) and np.any(ours > 0)  # both branches of the clip are exercised
    np.testing.assert_allclose(theirs, ours, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(field_audit.loss_weights(ra.policy_gradient_loss, lr, adv), np.ones(7), atol=1e-12)


def test_lookup_and_load_target_resolve_library_specs():
    assert load_target("rlax:vtrace") is ra.vtrace
    assert adapters.lookup("numpy:mean") is None
    with pytest.raises(TargetError, match="no adapter for 'rlax:nope'"):
        load_target("rlax:nope")
    table = adapters.registry()
    assert {"rlax:vtrace", "verl:vanilla", "verl:compute_value_loss", "areal:ppo_actor_loss_fn",
            "areal:ppo_critic_loss_fn", "verl:gpg", "verl:gpg_advantage", "tunix:grpo_advantages"} <= set(table)
    for a in table.values():
        assert a.kind in ("sequence", "actor", "group") and a.key == f"{a.library}:{a.function}"


def test_bad_lag_and_out_without_field_audit_are_one_line_status_2(capsys):
    assert cmd.main(["--target", "rlax:vtrace", "--lag", "17"]) == 2
    assert cmd.main(["--out", "x.md"]) == 2
    assert cmd.main(["--field-audit", "--libraries", "numpy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("vccc verify: ") for e in err)


# ------------------------------------------------------------------------------ lags


def test_lagged_problem_is_the_npg_history_in_numpy():
    with jax.enable_x64(True):
        p = jax.tree_util.tree_map(lambda x: x[0], make_problems(jax.random.PRNGKey(3), GroupSpec("dirichlet", 3, 2, 1)))
        q = lags.lagged(p, 4, steps=6, eta=0.3)
        P, R, g = (np.asarray(a) for a in (p.mdp.P, p.mdp.R, p.mdp.gamma))
        R = R if R.ndim == 3 else R[:, :, None]
        pol = np.asarray(p.pi)
        hist = [pol]
        for _ in range(6):
            r_pi = np.einsum("sa,sat,sat->s", pol, P, np.broadcast_to(R, P.shape))
            v = np.linalg.solve(np.eye(3) - g * np.einsum("sa,sat->st", pol, P), r_pi)
            qv = np.einsum("sat,sat->sa", P, np.broadcast_to(R, P.shape)) + g * P @ v
            pol = pol * np.exp(0.3 * (qv - np.sum(pol * qv, -1, keepdims=True)))
            pol = pol / pol.sum(-1, keepdims=True)
            hist.append(pol)
        np.testing.assert_allclose(np.asarray(q.pi), hist[6], atol=1e-10)
        for k in range(q.mus.shape[0]):
            np.testing.assert_allclose(np.asarray(q.mus[k]), hist[2], atol=1e-10)
        assert float(lags.kl(lags.lagged(p, 0, steps=6, eta=0.3))) == 0.0


# ------------------------------------------------------------------ torch bridge, NumPy stand-ins


def standin_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
    """NumPy stand-in with the signature of verl's compute_policy_loss_vanilla (no dual clip):
    returns (loss, d loss / d log_prob), token-mean, PPO clip eps 0.2."""
    r = np.exp(log_prob - old_log_prob)
    keep = ~(((advantages > 0) & (r > 1.2)) | ((advantages < 0) & (r < 0.8)))
    n = response_mask.sum()
    loss = -np.sum(np.minimum(r * advantages, np.clip(r, 0.8, 1.2) * advantages) * response_mask) / n
    return loss, -(r * advantages * keep * response_mask) / n


def standin_is(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
    """Exact-IS loss -mean(rho A) with its gradient -rho A / n."""
    r = np.exp(log_prob - old_log_prob)
    n = response_mask.sum()
    return -np.sum(r * advantages) / n, -(r * advantages) / n


def _bridge(standin):
    def vg(lp, lm, a):
        loss, grad = standin(old_log_prob=lm[:, None], log_prob=lp[:, None], advantages=a[:, None],
                             response_mask=np.ones((lp.shape[0], 1)))
        return loss, grad[:, 0]

    return tb.host_loss(vg)


def test_bridge_weight_is_minus_n_dloss_dlogprob_and_passes_preflight():
    rng = np.random.default_rng(4)
    lr, adv = rng.normal(0, 0.4, 9), rng.choice([-1.0, 1.0], 9)
    with jax.enable_x64(True):
        ours = np.asarray(get_actor_correction("ppo")(jnp.asarray(lr), jnp.asarray(adv), epsilon=0.2))
    np.testing.assert_allclose(field_audit.loss_weights(_bridge(standin_vanilla), lr, adv), ours, atol=1e-13)
    from vccc_jax.verify.contracts import Claim
    preflight(wrap(_bridge(standin_vanilla), "actor", Claim()))


def test_bridge_sequence_target_is_the_numpy_function_without_gradient():
    x = _inputs(5)
    target = tb.host_sequence(lambda lr, d, r, v, b: ref_vtrace(dict(log_rhos=lr, discounts=d, rewards=r, values=v,
                                                                     bootstrap_value=b)))
    with jax.enable_x64(True):
        args = {k: jnp.asarray(v) for k, v in x.items()}
        np.testing.assert_allclose(np.asarray(jax.jit(target)(**args)), ref_vtrace(x), atol=1e-12)
        g = jax.grad(lambda v: jnp.sum(target(**dict(args, values=v))))(args["values"])
        assert float(jnp.max(jnp.abs(g))) == 0.0


# ---------------------------------------------------------------- field-audit verdicts (exact)


def _reports(lag, targets):
    return check_all(targets, groups=(GROUP,), num_samples=64, make=lags.maker(lag))


def test_field_audit_verdicts_rlax_and_a_bridged_loss():
    """rlax.vtrace passes its claim (V^pitilde, c = 1) at lags 0 and 4 and fails V^pi at lag 4
    (biased by design); rlax.td_lambda is exact at lag 0 and fails at lag 4 with a fixed point
    that the diagnosis names V^mu (biased by staleness alone); an exact-IS loss through the
    bridge is Eq 12 at lag 4, a PPO-clip stand-in is not."""
    targets = [Target("rlax:vtrace", "sequence", "clipped:1"), Target("rlax:vtrace", "sequence", "vpi"),
               Target("rlax:td_lambda", "sequence", "vpi"),
               Target(_bridge(standin_is), "actor", "vpi", name="is"),
               Target(_bridge(standin_vanilla), "actor", "vpi", name="ppo")]
    r0, r4 = _reports(0, targets), _reports(4, targets)
    ok = field_audit.exact_pass
    assert ok(r0[0]) and ok(r4[0]) and ok(r0[1]) and not ok(r4[1])
    assert ok(r0[2]) and not ok(r4[2])
    assert "V^mu" in " ".join(r4[2].diagnosis) or "uncorrected" in r4[2].diagnosis[0]
    assert ok(r0[3]) and ok(r4[3]) and ok(r0[4]) and not ok(r4[4])
    table = adapters.registry()
    au = field_audit.Audit(table["rlax:vtrace"], {0: r0[0], 4: r4[0]}, {0: r0[1], 4: r4[1]})
    assert field_audit.verdict(au).startswith("**biased by design**")
    au = field_audit.Audit(table["rlax:td_lambda"], {0: r0[2], 4: r4[2]}, {0: r0[2], 4: r4[2]})
    assert field_audit.verdict(au).startswith("**biased by staleness alone**")


def standin_tunix_gae(rewards, values, completion_mask, gamma, gae_lambda):
    """Stand-in with the signature of tunix's compute_gae_advantages ([bs, L], one gamma per
    row, next value 0 after the last token, masked tokens skipped), as a NumPy loop."""
    r, v, m = (np.asarray(x, np.float64) for x in (rewards, values, completion_mask))
    g = np.asarray(gamma, np.float64)
    adv, gae, nv = np.zeros_like(r), np.zeros(r.shape[0]), np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + g * nv - v[:, t]
        new = delta + g * gae_lambda * gae
        nv = v[:, t] * m[:, t] + (1 - m[:, t]) * nv
        gae = new * m[:, t] + (1 - m[:, t]) * gae
        adv[:, t] = gae
    return jnp.asarray(adv), jnp.asarray(adv + v)


def test_tunix_gae_adapter_maps_bootstrap_and_episode_ends_on_a_standin(monkeypatch):
    """The adapter's mapping (gamma per trajectory, bootstrap folded into the last reward,
    tokens after an episode's end masked and left at their value) gives the lambda = 1 return
    of a time-major trajectory with per-step discounts gamma_b or 0."""
    import types

    from vccc_jax.verify.adapters import tunix as tu

    monkeypatch.setattr(tu, "algo_core", lambda: types.SimpleNamespace(compute_gae_advantages=standin_tunix_gae))
    x = _inputs(6)
    gam = np.array([0.9, 0.8, 1.0])
    x["discounts"] = np.broadcast_to(gam, (T, B)).copy()
    x["discounts"][1:, 1] = 0.0                      # trajectory 1 ends after step 1
    got = _call_module(tu.compute_gae_advantages, x)
    ref = ref_lambda(x, 1.0)
    np.testing.assert_allclose(got[:, [0, 2]], ref[:, [0, 2]], atol=1e-12)
    np.testing.assert_allclose(got[:2, 1], ref[:2, 1], atol=1e-12)
    np.testing.assert_allclose(got[2:, 1], x["values"][2:, 1], atol=0)


def _call_module(fn, x):
    with jax.enable_x64(True):
        return np.asarray(fn(**{k: jnp.asarray(v) for k, v in x.items()}))


def published_gspo(log_pi, log_mu, advantages, eps=0.2):
    """GSPO as published (Zheng et al. 2025) on ONE response, token-mean: s = exp(mean log rho),
    per token s_t = sg(s) pi_t / sg(pi_t), loss = -mean(min(s_t A, clip(s_t, 1 - eps, 1 + eps) A))."""
    sg = jax.lax.stop_gradient
    s = jnp.exp(jnp.mean(sg(log_pi) - log_mu))
    s_t = sg(s) * jnp.exp(log_pi - sg(log_pi))
    return -jnp.mean(jnp.minimum(s_t * advantages, jnp.clip(s_t, 1 - eps, 1 + eps) * advantages))


def test_cross_rows_compare_our_row_with_a_library_loss_per_token():
    """cross_rows reads -n d loss / d log pi / A of the library loss and compares it with our
    row: our gspo row equals the published GSPO on random responses (1e-12)."""
    table = {"verl:gspo": adapters.Adapter("verl", "gspo", "published", "actor", "vpi", "", lambda: jax.jit(published_gspo),
                                           lambda: "test")}
    (row,) = field_audit.cross_rows(table, n_random=16)
    assert (row.ours, row.theirs) == ("gspo", "verl:gspo")
    assert row.max_diff_random <= 1e-12


def test_areal_critic_target_is_the_lambda_1_return_and_batch_independent():
    """AReaL's ppo_critic_loss_fn as a target (needs `make audit`'s source and torch): in its
    float64 re-run the lambda = 1 return to 1e-12; in float32 (as AReaL runs it) within 1e-5 of
    it and the same bits for a trajectory whatever the rest of the batch (the power-of-two pad)."""
    pytest.importorskip("torch")
    from vccc_jax.verify.adapters import areal

    try:
        areal.functional()
    except ImportError:
        pytest.skip("AReaL source not unpacked (make audit)")
    x = _inputs(6)
    x["discounts"] = np.broadcast_to(np.array([0.9, 0.8, 1.0]), (T, B)).copy()  # one gamma per response
    x["discounts"][1:, 1] = 0.0
    args = [np.asarray(x[k]) for k in ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")]
    ref = ref_lambda(x, 1.0)
    f64 = areal._critic_target(*args, float64=True)
    f32 = areal._critic_target(*args)
    live = np.ones_like(ref, bool)
    live[2:, 1] = False
    np.testing.assert_allclose(f64[live], ref[live], atol=1e-12)
    np.testing.assert_allclose(f32[live], ref[live], atol=1e-5)
    assert np.max(np.abs(f32 - f64)) > 0  # float32 inside, on purpose
    one = areal._critic_target(*[a[..., :1] for a in args[:4]], args[4][:1])
    np.testing.assert_array_equal(one, f32[:, :1])


def test_tunix_grpo_loss_through_a_tiny_nnx_model_is_the_ppo_clip_weight():
    """tunix's grpo_loss_fn (needs `make audit`'s source; its model is the one-parameter
    TokenLogProbs): -n d loss / d log pi / A = rho 1[inside PPO's clip for the sign of A];
    1e-6 as tunix runs it (float32 on purpose), 1e-13 in its float64 re-run."""
    pytest.importorskip("flax")
    from vccc_jax.verify.adapters import tunix as tu

    try:
        tu.algo_core()
    except ImportError:
        pytest.skip("tunix source not unpacked (make audit)")
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        lm = jnp.log(jnp.asarray(rng.uniform(0.1, 0.9, 8)))
        lp = jnp.minimum(lm + jnp.asarray(rng.normal(0, 0.3, 8)), -1e-3)
        a = jnp.asarray(rng.normal(size=8))
        rho = np.exp(np.asarray(lp - lm))
        inside = ((a > 0) & (rho <= 1.2)) | ((a < 0) & (rho >= 0.8))
        assert 0 < inside.sum() < 8
        for f64, tol in ((False, 1e-6), (True, 1e-13)):
            w = -8 * np.asarray(jax.grad(tu.grpo_loss(float64=f64))(lp, lm, a)) / np.asarray(a)
            np.testing.assert_allclose(w, np.where(inside, rho, 0.0), atol=tol)
