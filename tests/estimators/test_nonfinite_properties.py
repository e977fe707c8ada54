"""The public estimator API at the edges of its inputs (issue 19 §2): property tests.

The contract (``importance.safe_ratios``; the README's ratio-guard paragraph): a finite
log-ratio <= MAX_LOG_RHO = 20 gives rho = exp(log rho), a finite one above it the guard e^20,
and -inf (learner probability 0), +inf (logged behaviour probability 0: invalid data) and NaN
all give weight 0 exactly. Hence, for every function that takes log-ratios:

* with finite rewards / values / discounts every output is finite (value and gradient);
* the output equals the output at ``canon(log rho)`` -- -inf / +inf / NaN replaced by -1e4
  (weight exactly 0 in float32 and float64) and finite values above the guard by 20 -- so a
  non-finite log-ratio does exactly what the contract says and nothing else; the sequence and
  batch rows of the actor table guard the AGGREGATE (issue 29: log R = sum of raw log-ratios,
  then the guard), so for them only the non-finite values are replaced (``canon_aggregate``);
* ``ratio_diagnostics`` counts the non-finite ones (``num_nonfinite``) and the guard
  (``guard_fraction``); its other fields equal those at ``canon``;
* empty inputs where a result is undefined raise a ValueError naming the argument.

Log-ratios are drawn from {-inf, -1e4, -104, 0, 20, 25, +inf, NaN} mixed with ordinary
values; discounts from {0, 0.5, 0.9, 1}. Cost: the whole API is ONE jitted function per
(shape, dtype) -- (4, 2) in float32 and float64, (1, 1) (a length-1 time axis, batch 1) in
float32: three compiles, shared by every example; hypothesis is derandomized (reproducible).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vccc_jax.estimators as E
from vccc_jax.estimators import importance
from vccc_jax.estimators.actor import behaviour_support_size
from vccc_jax.estimators.registry import SequenceInputs
from vccc_jax.estimators.related import brace, decoupled, ps_ppo, rac

EDGES = (-np.inf, -1e4, -104.0, 0.0, 20.0, 25.0, np.inf, np.nan)
DTYPES = ("float32", "float64")
CASES = (((1, 1), "float32"), ((4, 2), "float32"), ((4, 2), "float64"))  # (shape, dtype)
ZERO_WEIGHT = -1e4  # exp(-1e4) == 0 exactly in float32 and float64


def canon(lr: np.ndarray) -> np.ndarray:
    """The finite log-ratio with the same weight (module docstring)."""
    lr = np.where(np.isfinite(lr), lr, ZERO_WEIGHT)
    return np.minimum(lr, importance.MAX_LOG_RHO)


def canon_aggregate(lr: np.ndarray) -> np.ndarray:
    """``canon`` without the per-token guard: what the sequence / batch rows must not tell
    apart from ``lr``."""
    return np.where(np.isfinite(lr), lr, ZERO_WEIGHT)


AGGREGATE_ROWS = tuple(f"actor_{n}" for n, r in E.ACTOR_CORRECTIONS.items() if r.level != "token")


def _critic_side(lr, d, r, v, boot):
    """Every public function that takes log-ratios (time-major [T, B]), its values and a few
    gradients, as one flat dict."""
    nv = 0.5 * v + 1.0
    base = v[::-1] - 0.3
    z = jnp.full_like(v, 0.7)
    ids = jnp.arange(lr.size).reshape(lr.shape) % 3
    zero = jnp.zeros_like(lr)
    t = E.Transitions(r, d, v, nv, lr)
    ex = E.TargetExtras(baseline=base, z=z, b_star=base)
    out = {
        "safe_ratios": E.safe_ratios(lr),
        "w_ratio": E.importance_weights(lr, "ratio"),
        "w_truncate": E.importance_weights(lr, "truncate", 2.0),
        "w_mask": E.importance_weights(lr, "mask", 2.0),
        "uncorrected": E.uncorrected_target(r, d, nv),
        "bellman": E.bellman_sample(r, d, nv),
        "vccc_b": E.vccc_target(r, d, v, nv, lr, base),
        "clipped_mask": E.clipped_target(r, d, v, nv, lr, clip=2.0, kind="mask"),
        "naive": E.naive_clipped_target(r, d, v, nv, lr, base, clip=1.5),
        "centered": E.centered_clipped_target(r, d, v, nv, lr, base, z, clip=1.5),
        "b_star": E.optimal_baseline(lr, r + d * nv, ids, 3)[0],
        "vtrace_scan": E.vtrace(lr, d, r, v, boot),
        "vtrace_assoc": E.vtrace_associative(lr, d, r, v, boot),
        "vtrace_inplace": E.vtrace_inplace(lr, d, r, v, boot),
        "vtrace_unclipped": E.vtrace(lr, d, r, v, boot, lambda_=0.9, clip_rho_threshold=None,
                                     clip_c_threshold=None, clip_pg_rho_threshold=None),
        "vtrace_nstep": E.vtrace_associative(lr, d, r, v, boot, n_steps=2, clip_rho_threshold=2.0),
        "brace_prefix": brace.brace(lr, d, r, v, boot, n=2),
        "brace_const": brace.brace(lr, d, r, v, boot, n=1, tail_anchor="constant",
                                   clip_rho_threshold=None, clip_c_threshold=None),
        "brace_registry": E.get_critic_target("brace").sequence(SequenceInputs(lr, d, r, v, boot), 1.5, {}),
        "rac_residual": rac.channel_residuals(lr, d, r, v, boot),
        "rac_inject": rac.inject(r, lr, 0.5, clip_pg_rho_threshold=None),
        "rac_adv": rac.rac_advantages(v, r, lr, kernel=(0.5,)),
        # log-ratio = log_pi_old - log_mu (discrepancy), then log_pi - log_pi_old (staleness)
        "decoupled_d": decoupled.decoupled_ratios(zero, zero, -lr, kind="mask"),
        "decoupled_r": decoupled.decoupled_ratios(lr, zero, zero, kind="truncate"),
        "decoupled_w": decoupled.decoupled_weights(lr, zero, zero),
        "ps_ppo": ps_ppo.ppo_token_loss(lr, zero, r, jnp.abs(v)),
        "diag": E.ratio_diagnostics(lr, kind="truncate", clip=2.0),
    }
    for name, row in E.ACTOR_CORRECTIONS.items():  # every row of the actor table
        data = {"lags": jnp.zeros(lr.shape, jnp.int32)} if "lags" in row.data else {}
        if "log_mu" in row.data:  # DPPO: the behaviour's log-probs (finite, < 0)
            data["log_mu"] = jnp.full(lr.shape, -1.2, lr.dtype)
        out[f"actor_{name}"] = E.get_actor_correction(name)(lr, r, **data)
    for name, spec in E.CRITIC_TARGETS.items():  # every one-step row of the registry
        if spec.one_step is not None:
            out[f"registry_{name}"] = spec.one_step(t, ex, 1.5)
    # gradients (targets not stopped), to the rewards / values and to the log-probs
    out["grad_vccc"] = jax.grad(lambda rv: jnp.sum(E.vccc_target(
        rv[0], d, rv[1], nv, lr, stop_target_gradients=False)))((r, v))
    out["grad_vtrace"] = jax.grad(lambda vv: jnp.sum(E.vtrace_associative(
        lr, d, r, vv, boot, stop_target_gradients=False).vs))(v)
    out["grad_ps_ppo"] = jax.grad(lambda lp: jnp.sum(ps_ppo.ppo_token_loss(
        lp, jnp.zeros_like(lp), r, jnp.abs(v))))(lr)
    return out


_critic_side_jit = jax.jit(_critic_side)


def _evaluate(lr, d, r, v, boot, dtype):
    with jax.enable_x64(dtype == "float64"):
        args = [jnp.asarray(x, dtype) for x in (lr, d, r, v, boot)]
        return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), _critic_side_jit(*args))


def check_contract(lr, d, r, v, boot, dtype):
    got = _evaluate(lr, d, r, v, boot, dtype)
    ref = _evaluate(canon(lr), d, r, v, boot, dtype)
    ref.update({k: v for k, v in _evaluate(canon_aggregate(lr), d, r, v, boot, dtype).items()
                if k in AGGREGATE_ROWS})
    diag, diag_ref = got.pop("diag"), ref.pop("diag")
    g_ppo, g_ppo_ref = got.pop("grad_ps_ppo"), ref.pop("grad_ps_ppo")
    for path, x in jax.tree_util.tree_leaves_with_path(got):
        assert np.all(np.isfinite(x)), (jax.tree_util.keystr(path), lr, x)
    jax.tree_util.tree_map_with_path(
        lambda p, x, y: np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(p)), got, ref)
    # gradients to the log-ratio: 0 exactly where the weight is constant (non-finite, guard)
    assert np.all(np.isfinite(g_ppo)) and np.all(g_ppo[~(lr <= importance.MAX_LOG_RHO)] == 0.0)
    np.testing.assert_array_equal(g_ppo[lr < importance.MAX_LOG_RHO], g_ppo_ref[lr < importance.MAX_LOG_RHO])
    # diagnostics: counted, not propagated
    finite = np.isfinite(lr)
    assert diag.num_nonfinite == np.sum(~finite)
    np.testing.assert_allclose(diag.guard_fraction, np.mean(finite & (lr > importance.MAX_LOG_RHO)))
    for field in ("ess_fraction", "clip_fraction", "clip_fraction_by_version"):
        np.testing.assert_allclose(getattr(diag, field), getattr(diag_ref, field), rtol=1e-6)
        assert np.all(np.isfinite(getattr(diag, field)))


def _inputs(shape, seed, lr):
    rng = np.random.default_rng(seed)
    d = rng.choice([0.0, 0.5, 0.9, 1.0], size=shape)
    r, v = rng.normal(size=shape), rng.normal(size=shape)
    return lr, d, r, v, rng.normal(size=shape[1:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_edge_log_ratio_at_once(dtype):
    """All eight edge values in one [4, 2] batch, and (float32) a length-1 time axis with
    batch 1 at each of them (deterministic companion of the property test below)."""
    check_contract(*_inputs((4, 2), 0, np.asarray(EDGES).reshape(4, 2)), dtype)
    for e in EDGES if dtype == "float32" else ():
        check_contract(*_inputs((1, 1), 1, np.full((1, 1), e)), dtype)


LOG_RATIO = st.one_of(st.sampled_from(EDGES), st.floats(-3.0, 3.0))


@pytest.mark.parametrize("shape, dtype", CASES)
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
@given(data=st.data())
def test_contract_holds_for_mixed_log_ratios(shape, dtype, data):
    n = int(np.prod(shape))
    lr = np.asarray(data.draw(st.lists(LOG_RATIO, min_size=n, max_size=n)), np.float64).reshape(shape)
    seed = data.draw(st.integers(0, 2**16))
    check_contract(*_inputs(shape, seed, lr), dtype)


# ----------------------------------------------------------------------------- actor side

A = 5


def _actor_side(logits, log_mu_all, tok, adv):
    """Losses and logit gradients of the actor API with a masked learner (logits -inf) and a
    truncated behaviour (log mu -inf), [T, B, A] rows; ``tok`` may pick a token either one
    gives probability 0 (invalid data for mu)."""
    take = lambda x: jnp.take_along_axis(x, tok[..., None], -1)[..., 0]  # noqa: E731
    log_mu = take(log_mu_all)
    topk_lm, topk_ids = jax.lax.top_k(log_mu_all, 2)
    n_s = behaviour_support_size(log_mu_all)

    def losses(z):
        lp_all = jax.nn.log_softmax(z)
        lp = take(lp_all)
        c_full = E.centering_term(lp_all, log_mu_all, kind="truncate", clip=1.0)
        c_topk = E.centering_term_topk(lp_all, topk_lm, topk_ids, kind="truncate", clip=1.0,
                                       support_size=n_s)
        return jnp.stack([
            E.policy_loss(lp, log_mu, adv),
            E.policy_loss(lp, log_mu, adv, kind="mask", clip=2.0, ppo_epsilon=0.2),
            E.policy_loss(lp, log_mu, adv, kind="truncate", clip=1.0, centering=c_full),
            E.policy_loss(lp, log_mu, adv, kind="truncate", clip=1.0, centering=c_topk),
            E.policy_loss(lp, log_mu, adv, ppo_epsilon=0.2, log_pi_old=jax.lax.stop_gradient(lp[::-1])),
            decoupled.decoupled_policy_loss(lp, log_mu, adv, route="behaviour"),
            jnp.sum(c_full), jnp.sum(c_topk),
        ])

    return losses(logits), jax.jacrev(losses)(logits), E.expected_weight(
        jax.nn.log_softmax(logits), log_mu_all, kind="truncate", clip=1.0)


_actor_side_jit = jax.jit(_actor_side)


def test_actor_api_with_masked_learner_and_truncated_behaviour():
    """Masked learner tokens (logit -inf, log pi = -inf), tokens off the behaviour support
    (log mu = -inf: ratio +inf) and a NaN log mu: every loss and logit gradient is finite
    (the old code gave NaN: exp(-inf - -inf), 0 * -inf in the centering sums); a token with
    weight 0 contributes exactly 0 (its advantage can be changed freely); Z(s) is finite."""
    rng = np.random.default_rng(5)
    T, B = 3, 2
    logits = rng.normal(size=(T, B, A))
    logits[..., 3] = -np.inf  # the learner masks token 3 everywhere
    logits[0, 0, 1] = -np.inf
    z_mu = rng.normal(size=(T, B, A))
    z_mu[..., 4] = -np.inf  # behaviour top-k: token 4 never emitted
    log_mu_all = z_mu - np.log(np.sum(np.exp(z_mu), -1, keepdims=True))
    tok = np.asarray([[3, 1], [4, 0], [2, 3]])  # 3: learner prob 0; 4: mu = 0 (invalid)
    log_mu_all[2, 0, 2] = np.nan  # a NaN logged log-prob
    adv = rng.normal(size=(T, B))
    for dtype in ("float32",):  # float64 is covered by the critic-side properties above
        with jax.enable_x64(dtype == "float64"):
            cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
            vals, jac, z = _actor_side_jit(cast(logits), cast(log_mu_all), jnp.asarray(tok), cast(adv))
            assert np.all(np.isfinite(vals)) and np.all(np.isfinite(jac)), (vals, jac)
            assert np.all(np.isfinite(np.asarray(z)[[0, 1], :])) and np.all(np.isfinite(z[2, 1]))
            # zero-weight tokens ((0,0): learner 0, (1,0): mu 0, (2,0): NaN, (2,1): learner 0)
            adv2 = adv.copy()
            adv2[0, 0], adv2[1, 0], adv2[2, 0], adv2[2, 1] = 7.0, -3.0, 11.0, -5.0
            vals2, jac2, _ = _actor_side_jit(cast(logits), cast(log_mu_all), jnp.asarray(tok), cast(adv2))
            keep = [0, 1, 6, 7]  # plain / masked-PPO losses and the centering sums
            np.testing.assert_array_equal(np.asarray(vals2)[keep], np.asarray(vals)[keep])
            np.testing.assert_array_equal(np.asarray(jac2)[keep], np.asarray(jac)[keep])
            assert np.abs(np.asarray(jac)[:6]).max() > 1e-3  # real gradients were compared


# ----------------------------------------------------------------------------- named errors

EMPTY = jnp.zeros((0, 2))


@pytest.mark.parametrize("call, name", [
    (lambda: E.vtrace(EMPTY, EMPTY, EMPTY, EMPTY, jnp.zeros(2)), "values"),
    (lambda: E.vtrace_associative(EMPTY, EMPTY, EMPTY, EMPTY, jnp.zeros(2)), "values"),
    (lambda: E.vtrace_inplace(EMPTY, EMPTY, EMPTY, EMPTY, jnp.zeros(2)), "values"),
    (lambda: E.gae(EMPTY, EMPTY, EMPTY, jnp.zeros(2)), "values"),
    (lambda: E.vtrace(jnp.zeros((3, 0)), *[jnp.zeros((3, 0))] * 3, jnp.zeros(0)), "values"),
    (lambda: brace.brace(EMPTY, EMPTY, EMPTY, EMPTY, jnp.zeros(2), n=2), "values"),
    (lambda: rac.channel_residuals(EMPTY, EMPTY, EMPTY, EMPTY, jnp.zeros(2)), "values"),
    (lambda: E.ratio_diagnostics(jnp.zeros(0), kind="truncate", clip=1.0), "log_rhos"),
    (lambda: E.policy_loss(jnp.zeros(0), jnp.zeros(0), jnp.zeros(0)), "log_pi"),
    (lambda: E.expected_weight(EMPTY.T, EMPTY.T, kind="truncate", clip=1.0), "log_mu_all"),
])
def test_empty_inputs_raise_naming_the_argument(call, name):
    """A trajectory of no steps, a mean over no tokens, Z(s) over no actions: undefined."""
    with pytest.raises(ValueError, match=f"^{name} must be non-empty"):
        call()


def test_elementwise_functions_accept_empty_inputs():
    """Elementwise maps are defined on empty arrays (empty in, empty out); so is b* (no
    sample: not identified)."""
    e = jnp.zeros((0, 2))
    assert E.importance_weights(e, "truncate", 2.0).shape == (0, 2)
    assert E.vccc_target(e, e, e, e, e).shape == (0, 2)
    b, ok = E.optimal_baseline(e, e, jnp.zeros((0, 2), int), 3)
    assert b.shape == (3,) and not np.any(ok)


# ----------------------------------------------------------------------------- coverage

COVERED = {  # every public name that takes log-ratios / log-probs is exercised above
    "log_ratios", "safe_ratios", "importance_weights", "expected_weight", "ratio_diagnostics",
    "bellman_sample", "uncorrected_target", "vccc_target", "clipped_target",
    "naive_clipped_target", "centered_clipped_target", "optimal_baseline", "vtrace",
    "vtrace_associative", "vtrace_inplace", "policy_loss", "centering_term",
    "centering_term_topk", "get_critic_target", "CRITIC_TARGETS", "ACTOR_CORRECTIONS",
    "get_actor_correction",
}
NO_LOG_RATIOS = {  # types, constants, the registry's plumbing, and GAE (rho == 1)
    "Transitions", "TargetExtras", "CriticTarget", "register_critic_target", "WEIGHT_KINDS",
    "MAX_LOG_RHO", "RatioDiagnostics", "VTraceOutput", "ActorCorrection",
    "register_actor_correction", "gae", "GAEOutput",
}


def test_every_public_name_is_covered():
    """A public estimator added later must be added here (and to the properties above)."""
    assert set(E.__all__) == COVERED | NO_LOG_RATIOS
    with pytest.raises(ValueError, match="behaviour_log_probs"):  # log_ratios: positive log-prob
        E.log_ratios(jnp.zeros(2), jnp.asarray([0.0, 0.5]))
    np.testing.assert_array_equal(E.log_ratios(jnp.asarray([-jnp.inf, -1.0]), jnp.asarray([-1.0, -jnp.inf])),
                                  [-np.inf, np.inf])  # -inf / +inf pass through, weighed as above
