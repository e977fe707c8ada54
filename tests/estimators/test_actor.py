"""actor.py: exact expected gradients on softmax tables vs NumPy, Eq 2 / Eq 13 invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators import actor

S, A = 4, 5


def setup(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(S, A))
    mu = rng.dirichlet(np.ones(A), size=S)
    adv = rng.normal(size=(S, A))
    return logits, mu, adv


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_weight(rho, kind, c):
    if kind == "ratio":
        return rho
    if kind == "truncate":
        return np.minimum(rho, c)
    return np.where((rho >= 1 / c) & (rho <= c), rho, 0.0)


def np_expected_grad(logits, mu, adv, kind, c, centered):
    """(1/S) sum_s E_{a~mu}[A (w u - m_w)] with u = e_a - pi(s) (grad wrt the logits)."""
    pi = softmax(logits)
    g = np.zeros_like(logits)
    for s in range(S):
        w = np_weight(pi[s] / mu[s], kind, c)
        u = np.eye(A) - pi[s][None, :]  # row a: score of action a
        m_w = (mu[s] * w) @ u
        for a in range(A):
            g[s] += mu[s, a] * adv[s, a] * (w[a] * u[a] - (m_w if centered else 0.0))
    return g / S


def expected_loss(logits, mu, adv, kind, c, centered):
    """Token-weighted loss whose gradient is minus the exact expectation over (s ~ uniform, a ~ mu)."""
    log_pi_all = jax.nn.log_softmax(logits)
    log_mu_all = jnp.log(mu)
    weight = S * A * (mu / S)  # mean over S*A tokens -> sum_s (1/S) sum_a mu(a|s)
    centering = None
    if centered:
        centering = jnp.broadcast_to(actor.centering_term(log_pi_all, log_mu_all, kind=kind, clip=c)[:, None], (S, A))
    return actor.policy_loss(log_pi_all, log_mu_all, weight * adv, kind=kind, clip=c, centering=centering)


_grad = jax.jit(jax.grad(expected_loss), static_argnames=("kind", "c", "centered"))


@pytest.mark.parametrize("kind,c", [("ratio", None), ("truncate", 1.5), ("mask", 2.0)])
@pytest.mark.parametrize("centered", [False, True])
def test_expected_gradient_matches_numpy(kind, c, centered):
    with jax.enable_x64(True):
        logits, mu, adv = setup(0)
        got = -np.asarray(_grad(jnp.asarray(logits), jnp.asarray(mu), jnp.asarray(adv), kind=kind, c=c, centered=centered))
        np.testing.assert_allclose(got, np_expected_grad(logits, mu, adv, kind, c, centered), atol=1e-12)


@pytest.mark.parametrize("kind,c", [("ratio", None), ("truncate", 1.5), ("mask", 2.0)])
def test_score_centering_removes_baseline_dependence_eq2(kind, c):
    with jax.enable_x64(True):
        logits, mu, adv = map(jnp.asarray, setup(1))
        b = jnp.asarray(np.random.default_rng(9).normal(size=(S, 1))) * 3.0
        g = lambda a, cen: _grad(logits, mu, a, kind=kind, c=c, centered=cen)
        np.testing.assert_allclose(g(adv + b, True), g(adv, True), atol=1e-12)
        drift = np.max(np.abs(np.asarray(g(adv + b, False) - g(adv, False))))
        if kind == "ratio":
            # Exact ratios: m_w = E_mu[rho u] = E_pi[u] = 0, so no drift even uncentred.
            assert drift < 1e-12
        else:
            # Clipped/masked weights: m_w != 0 off-policy and the baseline drifts the update (Eq 1).
            assert drift > 1e-3


def test_standard_ppo_special_case():
    with jax.enable_x64(True):
        rng = np.random.default_rng(2)
        log_mu = np.log(rng.uniform(0.05, 1, size=32))
        log_pi = log_mu + rng.normal(0, 0.3, size=32)
        log_pi = np.minimum(log_pi, 0.0)
        adv = rng.normal(size=32)
        eps = 0.2
        got = actor.policy_loss(jnp.asarray(log_pi), jnp.asarray(log_mu), jnp.asarray(adv), ppo_epsilon=eps, log_pi_old=jnp.asarray(log_mu))
        ratio = np.exp(log_pi - log_mu)
        want = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_topk_centering_exact_when_k_covers_or_tail_matches_model():
    with jax.enable_x64(True):
        logits, mu, _ = setup(3)
        log_pi_all = jax.nn.log_softmax(jnp.asarray(logits))
        full = lambda lp: actor.centering_term(lp, jnp.log(jnp.asarray(mu)), kind="truncate", clip=1.5)
        ids = jnp.argsort(-jnp.asarray(mu), axis=-1)
        topk = lambda lp, k, m: actor.centering_term_topk(lp, jnp.take_along_axis(jnp.log(m), ids[:, :k], -1), ids[:, :k], kind="truncate", clip=1.5)
        # k = A: identical values and gradients.
        np.testing.assert_allclose(topk(log_pi_all, A, jnp.asarray(mu)), full(log_pi_all), atol=1e-12)
        g_full = jax.jacrev(lambda x: full(jax.nn.log_softmax(x)))(jnp.asarray(logits))
        g_top = jax.jacrev(lambda x: topk(jax.nn.log_softmax(x), A, jnp.asarray(mu)))(jnp.asarray(logits))
        np.testing.assert_allclose(g_top, g_full, atol=1e-12)
        # k = 2 with a behaviour tail that really is pi-proportional: still exact.
        pi = np.exp(np.asarray(log_pi_all))
        mu2 = mu.copy()
        idn = np.asarray(ids)
        for s in range(S):
            tail = idn[s, 2:]
            mu2[s, tail] = mu[s, tail].sum() * pi[s, tail] / pi[s, tail].sum()
        np.testing.assert_allclose(
            topk(log_pi_all, 2, jnp.asarray(mu2)),
            actor.centering_term(log_pi_all, jnp.log(jnp.asarray(mu2)), kind="truncate", clip=1.5), atol=1e-12)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="log_mu"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.full(3, 0.5), jnp.ones(3))
    with pytest.raises(ValueError, match="advantages"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.zeros(3) - 1, jnp.ones(2))
    with pytest.raises(ValueError, match="ppo_epsilon"):
        actor.policy_loss(jnp.zeros(3) - 1, jnp.zeros(3) - 1, jnp.ones(3), ppo_epsilon=1.5)


def test_centering_weight_uses_the_proximal_policy_when_given():
    with jax.enable_x64(True):
        logits, mu, _ = setup(5)
        log_pi_all = jax.nn.log_softmax(jnp.asarray(logits))
        log_mu_all = jnp.log(jnp.asarray(mu))
        old = jax.nn.log_softmax(jnp.asarray(logits) + 0.5 * jnp.asarray(np.random.default_rng(6).normal(size=(S, A))))
        same = actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5, log_pi_old_all=log_pi_all)
        np.testing.assert_allclose(same, actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5), atol=1e-14)
        got = actor.centering_term(log_pi_all, log_mu_all, kind="truncate", clip=1.5, log_pi_old_all=old)
        w_old = np.minimum(np.exp(np.asarray(old)) / mu, 1.5)
        np.testing.assert_allclose(got, np.sum(mu * w_old * np.asarray(log_pi_all), -1), atol=1e-12)
        assert np.max(np.abs(np.asarray(got - same))) > 1e-3


def _old_centering_term_topk(log_pi_all, topk_log_mu, topk_ids, *, kind="ratio", clip=None):
    """Reference copy of the pre-round-3 formula (a [..., k, A] one-hot marks the top-k ids)."""
    from vccc_jax.estimators.importance import importance_weights
    sg = jax.lax.stop_gradient
    in_topk = jnp.sum(jax.nn.one_hot(topk_ids, log_pi_all.shape[-1], dtype=log_pi_all.dtype), axis=-2)
    pi_all = sg(jnp.exp(log_pi_all))
    topk_log_pi = jnp.take_along_axis(log_pi_all, topk_ids, axis=-1)
    tail_mu = jnp.clip(1.0 - jnp.sum(jnp.exp(topk_log_mu), axis=-1), 0.0, 1.0)
    tail_pi = jnp.clip(jnp.sum(pi_all * (1.0 - in_topk), axis=-1), 0.0, 1.0)
    w_top = importance_weights(sg(topk_log_pi) - topk_log_mu, kind, clip)
    top = jnp.sum(sg(jnp.exp(topk_log_mu) * w_top) * topk_log_pi, axis=-1)
    safe = (tail_mu > 0) & (tail_pi > 0)
    log_rho_tail = jnp.where(
        safe, jnp.log(jnp.where(safe, tail_pi, 1.0)) - jnp.log(jnp.where(safe, tail_mu, 1.0)), 0.0)
    w_tail = importance_weights(log_rho_tail, kind, clip)
    tail_mu_a = jnp.where(
        safe[..., None], tail_mu[..., None] * pi_all / jnp.where(safe, tail_pi, 1.0)[..., None], 0.0)
    tail = jnp.sum(sg(tail_mu_a * w_tail[..., None] * (1.0 - in_topk)) * log_pi_all, axis=-1)
    return top + tail


def _topk_rows(seed, shape=(2, 3), n=12, temp=0.7):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(size=shape + (n,)))
    log_mu = jax.nn.log_softmax(logits / temp + 0.3 * jnp.asarray(rng.normal(size=shape + (n,))))
    return logits, log_mu


@jax.jit
def _new_and_old_topk(logits, lp, ids, cot):
    """Values and cotangent-weighted logit gradients of the new and the reference formula,
    for the three weight kinds."""
    out = []
    for kind, c in (("ratio", None), ("truncate", 1.1), ("mask", 1.2)):
        for fn in (actor.centering_term_topk, _old_centering_term_topk):
            f = lambda z: fn(jax.nn.log_softmax(z), lp, ids, kind=kind, clip=c)  # noqa: E731
            val, vjp = jax.vjp(f, logits)
            out += [val, vjp(cot)[0]]
    return out


def test_topk_centering_equals_old_one_hot_formula():
    """The O(V + k) scatter version is bit-identical (float32 values and logit gradients) to
    the old [..., k, A] one-hot formula, for every weight kind."""
    logits, log_mu, cot = (jnp.asarray(x, jnp.float32) for x in (
        *_topk_rows(11), np.random.default_rng(1).normal(size=(2, 3))))
    for k in (1, 4):
        lp, ids = jax.lax.top_k(log_mu, k)
        got = _new_and_old_topk(logits, lp, ids, cot)
        for i in range(0, len(got), 4):  # (new value, new grad, old value, old grad) per kind
            np.testing.assert_array_equal(got[i], got[i + 2])
            np.testing.assert_array_equal(got[i + 1], got[i + 3])
        # a real gradient was compared (kind="ratio" has m_w = 0 exactly: mu w = pi)
        assert max(np.abs(np.asarray(got[i])).max() for i in (5, 9)) > 1e-3


@jax.jit
def _topk_vs_full(logits, log_mu, old, cot):
    """(top-4 summary value, grad; full-row value, grad) for pi_old None / ``old``, plus the
    k=2 values with pi_theta / pi_old weights."""
    lp, ids = jax.lax.top_k(log_mu, 4)
    out = []
    for lpo in (None, old):
        top = lambda z: actor.centering_term_topk(  # noqa: E731
            jax.nn.log_softmax(z), lp, ids, kind="truncate", clip=1.5, log_pi_old_all=lpo)  # noqa: B023
        full = lambda z: actor.centering_term(  # noqa: E731
            jax.nn.log_softmax(z), log_mu, kind="truncate", clip=1.5, log_pi_old_all=lpo)  # noqa: B023
        for f in (top, full):
            out += [f(logits), jax.grad(lambda z: jnp.sum(cot * f(z)))(logits)]  # noqa: B023
    lpi = jax.nn.log_softmax(logits)
    lp2, ids2 = jax.lax.top_k(log_mu, 2)
    out += [actor.centering_term_topk(lpi, lp, ids, kind="truncate", clip=1.5, log_pi_old_all=lpi),
            actor.centering_term_topk(lpi, lp, ids, kind="truncate", clip=1.5),
            actor.centering_term_topk(lpi, lp2, ids2, kind="truncate", clip=1.5),
            actor.centering_term_topk(lpi, lp2, ids2, kind="truncate", clip=1.5, log_pi_old_all=old)]
    return out


def test_topk_centering_with_proximal_policy_matches_full_rows_on_support():
    """log_pi_old_all: weights from pi_old (top-k and tail); k covering mu's support (a top-k
    sampler's rows, -inf elsewhere) gives centering_term exactly, values and gradients."""
    with jax.enable_x64(True):
        logits, log_mu = _topk_rows(20)
        kth = jax.lax.top_k(log_mu, 4)[0][..., -1:]
        log_mu = jax.nn.log_softmax(jnp.where(log_mu >= kth, log_mu, -jnp.inf))  # top-4 sampler
        old = jax.nn.log_softmax(logits + 0.5 * jnp.asarray(np.random.default_rng(21).normal(size=logits.shape)))
        cot = jnp.asarray(np.random.default_rng(22).normal(size=logits.shape[:-1]))
        got = [np.asarray(x) for x in _topk_vs_full(logits, log_mu, old, cot)]
        for i in (0, 4):  # pi_old None, pi_old given: top-k == full rows
            np.testing.assert_allclose(got[i], got[i + 2], atol=1e-12)
            np.testing.assert_allclose(got[i + 1], got[i + 3], atol=1e-12)
            assert np.abs(got[i + 3]).max() > 1e-3
        np.testing.assert_allclose(got[8], got[9], atol=1e-14)  # pi_old = pi_theta: no change
        # with a tail (k=2 < support), pi_old changes the weights: not the same as pi_theta
        assert np.max(np.abs(got[10] - got[11])) > 1e-3


def _all_eqn_shapes(jaxpr):
    """Output shapes of every equation, recursing into sub-jaxprs (jit, custom_jvp, ...)."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")]
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _all_eqn_shapes(inner)
    return shapes


def test_topk_centering_has_no_k_by_v_intermediate():
    B, k, V = 3, 5, 64
    lpi = jax.nn.log_softmax(jnp.zeros((B, V)))
    lp, ids = jax.lax.top_k(lpi, k)
    fn = lambda z, old: actor.centering_term_topk(  # noqa: E731
        jax.nn.log_softmax(z), lp, ids, kind="truncate", clip=2.0, log_pi_old_all=old)
    for f in (fn, jax.grad(lambda z, old: jnp.sum(fn(z, old)))):
        shapes = _all_eqn_shapes(jax.make_jaxpr(f)(jnp.zeros((B, V)), lpi).jaxpr)
        assert (B, V) in shapes  # the inspection sees the row-sized work
        assert not [s for s in shapes if len(s) >= 2 and s[-2:] == (k, V)], shapes
    # the reference one-hot formula does build one (the check can fail)
    old = jax.make_jaxpr(lambda z: _old_centering_term_topk(z, lp, ids, kind="truncate", clip=2.0))(lpi)
    assert [s for s in _all_eqn_shapes(old.jaxpr) if s[-2:] == (k, V)]


# ------------------------------------------- support-aware tail model (issue 12; §5.2, §7)


def _np_tail_set(ref, not_top, n_tail):
    """NumPy reference by sorting: the n_tail highest-ref non-top actions (ties kept)."""
    out = np.zeros(ref.shape, bool)
    for idx in np.ndindex(ref.shape[:-1]):
        r = np.where(not_top[idx] > 0, ref[idx], -np.inf)
        if n_tail[idx] > 0:
            thr = np.sort(r)[::-1][min(n_tail[idx], r.size) - 1]
            out[idx] = (r >= thr) & (not_top[idx] > 0)
    return out


_tail_mask = jax.jit(actor.tail_support_mask, static_argnums=(3,), static_argnames=("max_support",))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tail_support_mask_matches_a_sorting_reference(dtype):
    """The radix select (no max_support) and the lax.top_k path (max_support = a bound on
    n_s) give the sorted reference's tail set: the n_s - k highest-ref non-top actions, ties
    at the boundary kept, none when n_s <= k, every non-top action when n_s = V; rows with
    n_s > max_support are capped at max_support - k (+ ties)."""
    with jax.enable_x64(dtype == np.float64):
        rng = np.random.default_rng(0)
        B, V, k = 24, 40, 3
        ref = np.round(rng.normal(size=(B, V)), 1).astype(dtype)  # many ties
        ref[:4, :5] = -np.inf  # actions pi cannot take
        ref = np.asarray(jax.nn.log_softmax(jnp.asarray(ref)))
        ids = np.stack([rng.choice(V, k, replace=False) for _ in range(B)])
        not_top = np.ones((B, V), dtype)
        np.put_along_axis(not_top, ids, 0.0, -1)
        ns = rng.integers(0, 20, size=B)
        ns[:3] = (0, k, k + 1)
        want = _np_tail_set(ref, not_top, ns - k)
        for ms in (None, 20):
            got = np.asarray(_tail_mask(jnp.asarray(ref), jnp.asarray(not_top), jnp.asarray(ns), k,
                                        max_support=ms))
            np.testing.assert_array_equal(got, want.astype(dtype))
        assert want[:2].sum() == 0 and 1 <= want[2].sum() and (want.sum(-1) > ns - k).any()  # ties
        full = np.asarray(_tail_mask(jnp.asarray(ref), jnp.asarray(not_top), jnp.full(B, V), k))
        np.testing.assert_array_equal(full, not_top)
        capped = _tail_mask(jnp.asarray(ref), jnp.asarray(not_top), jnp.full(B, V), k, max_support=10)
        np.testing.assert_array_equal(capped, _np_tail_set(ref, not_top, np.full(B, 10 - k)).astype(dtype))
    with pytest.raises(ValueError, match="max_support"):
        actor.tail_support_mask(jnp.asarray(ref), jnp.asarray(not_top), jnp.asarray(ns), k, max_support=0)


@jax.jit
def _aware_vs_first_model(logits, lp, ids, old, cot):
    """(value, logit gradient) of centering_term_topk with support_size None and = V (the radix
    select and max_support = V), for 3 weight kinds x pi_old None / ``old``."""
    full = jnp.full(logits.shape[:-1], logits.shape[-1], jnp.int32)
    out = []
    for kind, c in (("ratio", None), ("truncate", 1.1), ("mask", 1.2)):
        for lpo in (None, old):
            for ns, ms in ((None, None), (full, None), (full, logits.shape[-1])):
                f = lambda z: actor.centering_term_topk(  # noqa: E731
                    jax.nn.log_softmax(z), lp, ids, kind=kind, clip=c, log_pi_old_all=lpo,  # noqa: B023
                    support_size=ns, max_support=ms)  # noqa: B023
                val, vjp = jax.vjp(f, logits)
                out.append((val, vjp(cot)[0]))
    return out


def test_support_aware_equals_first_model_when_nothing_is_truncated():
    """n_s = V (no truncation): bit-identical float32 values and logit gradients to the tail
    model over all other tokens, every weight kind, with and without pi_old."""
    logits, log_mu = (jnp.asarray(x, jnp.float32) for x in _topk_rows(12))
    old = jnp.asarray(jax.nn.log_softmax(logits + 0.5), jnp.float32)
    cot = jnp.asarray(np.random.default_rng(2).normal(size=(2, 3)), jnp.float32)
    for k in (4,):
        lp, ids = jax.lax.top_k(log_mu, k)
        got = _aware_vs_first_model(logits, lp, ids, old, cot)
        for i in range(0, len(got), 3):
            for j in (1, 2):
                np.testing.assert_array_equal(got[i + j][0], got[i][0])
                np.testing.assert_array_equal(got[i + j][1], got[i][1])
        assert max(np.abs(np.asarray(g[1])).max() for g in got) > 1e-3


@jax.jit
def _aware_rows(logits, log_mu, old, cot):
    """Support-aware top-k (k = 2, 5, 8; n_s from the rows, max_support None / 5) and full-row
    centering values and gradients, weights from ``old``."""
    ns = actor.behaviour_support_size(log_mu)
    out = []
    for k in (2, 5, 8):
        lp, ids = jax.lax.top_k(log_mu, k)
        for ms in (None, 5):
            f = lambda z: actor.centering_term_topk(  # noqa: E731
                jax.nn.log_softmax(z), lp, ids, kind="truncate", clip=1.5,  # noqa: B023
                log_pi_old_all=old, support_size=ns, max_support=ms)  # noqa: B023
            out.append((f(logits), jax.grad(lambda z: jnp.sum(cot * f(z)))(logits)))  # noqa: B023
        first = actor.centering_term_topk(jax.nn.log_softmax(logits), lp, ids, kind="truncate",
                                          clip=1.5, log_pi_old_all=old)
        out.append((first, None))
    f = lambda z: actor.centering_term(jax.nn.log_softmax(z), log_mu, kind="truncate",  # noqa: E731
                                       clip=1.5, log_pi_old_all=old)
    return out, (f(logits), jax.grad(lambda z: jnp.sum(cot * f(z)))(logits))


def test_support_aware_tail_is_exact_on_a_top_k_sampler_of_the_reference():
    """Rows of a temperature-1 top-5 sampler of pi_old: the support-aware tail (T = the
    sampler's support minus the top-k, mu ∝ pi_old there) is exact for every k -- k >= n_s
    (empty tail) and k = 2 < n_s -- values and gradients, both ranking paths; the first
    model is exact only when k covers the support."""
    with jax.enable_x64(True):
        logits, _ = _topk_rows(30)
        old = jax.nn.log_softmax(logits + 0.4 * jnp.asarray(np.random.default_rng(31).normal(size=logits.shape)))
        log_mu = jax.nn.log_softmax(jnp.where(old >= jax.lax.top_k(old, 5)[0][..., -1:], old, -jnp.inf))
        cot = jnp.asarray(np.random.default_rng(32).normal(size=logits.shape[:-1]))
        got, (c_full, g_full) = _aware_rows(logits, log_mu, old, cot)
        for i, k in enumerate((2, 5, 8)):
            for c, g in got[3 * i: 3 * i + 2]:
                np.testing.assert_allclose(c, c_full, atol=1e-12)
                np.testing.assert_allclose(g, g_full, atol=1e-12)
            first_err = np.abs(np.asarray(got[3 * i + 2][0] - c_full)).max()
            assert (first_err > 1e-2) if k == 2 else (first_err < 1e-12), (k, first_err)
        assert np.abs(np.asarray(g_full)).max() > 1e-3


def test_support_aware_topk_centering_has_no_k_by_v_or_v_by_v_intermediate_nor_sort():
    B, k, V = 3, 5, 64
    lpi = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(0), (B, V)))
    lp, ids = jax.lax.top_k(lpi, k)
    ns = jnp.asarray([3, 20, V], jnp.int32)
    for ms in (None, 24):
        fn = lambda z, old: actor.centering_term_topk(  # noqa: E731
            jax.nn.log_softmax(z), lp, ids, kind="truncate", clip=2.0, log_pi_old_all=old,
            support_size=ns, max_support=ms)  # noqa: B023
        for f in (fn, jax.grad(lambda z, old: jnp.sum(fn(z, old)))):  # noqa: B023
            jaxpr = jax.make_jaxpr(f)(jnp.zeros((B, V)), lpi).jaxpr
            shapes = _all_eqn_shapes(jaxpr)
            assert (B, V) in shapes
            assert not [s for s in shapes if len(s) >= 2 and s[-2:] in ((k, V), (V, V))], shapes
            assert "sort" not in _all_primitives(jaxpr)
            assert ("top_k" in _all_primitives(jaxpr)) == (ms is not None)


def _all_primitives(jaxpr):
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _all_primitives(inner)
    return names
