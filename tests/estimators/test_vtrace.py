"""vtrace.py (Eq 11) against an independent float64 NumPy reference and known identities.

The reference is the explicit double loop over (t, k) of Eq 11 / IMPALA's definition, with
time-limit truncations and the n-step horizon; the identities (importance-weighted n-step
return, GAE, episodes run separately, n_steps = 1) are each written from their own textbook
form, not from the recursion the library uses.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vccc_jax.estimators.importance import MAX_LOG_RHO

# the module (``from vccc_jax.estimators import vtrace`` is the function)
vt = importlib.import_module("vccc_jax.estimators.vtrace")


def _inplace(**kwargs):
    """vtrace_inplace on copies of the donated arrays, so callers may reuse their inputs."""
    donated = ("log_rhos", "rewards")
    return vt.vtrace_inplace(**{k: jnp.array(v, copy=True) if k in donated else v
                                for k, v in kwargs.items()})


METHODS = {"scan": vt.vtrace, "associative": vt.vtrace_associative, "inplace": _inplace}
SHAPE = (9, 3, 2)  # time-major with two trailing batch dims


# ----------------------------------------------------------------------------- reference


def reference(log_rhos, discounts, rewards, values, bootstrap_value, *, lambda_=1.0,
              rho_bar=1.0, c_bar=1.0, pg_bar=1.0, truncations=None,
              truncation_values=None, n_steps=None):
    """Eq 11 as written: v_t = V_t + sum_{k=t}^{t+n-1} (prod_{j=t}^{k-1} gamma_j c_j) rho^c_k delta_k.

    float64, vectorised over the trailing batch dims, explicit loops over t and k. A
    truncation at step k uses truncation_values[k] as V(s_{k+1}) and ends the sum at k.
    """
    lr, d, r, v = (np.asarray(x, np.float64) for x in (log_rhos, discounts, rewards, values))
    bv = np.asarray(bootstrap_value, np.float64)
    num_t = lr.shape[0]
    trunc = np.zeros(lr.shape, bool) if truncations is None else np.asarray(truncations, bool)
    tv = np.zeros(lr.shape) if truncation_values is None else np.asarray(truncation_values, np.float64)
    rho = np.exp(np.minimum(lr, MAX_LOG_RHO))
    rho_c = rho if rho_bar is None else np.minimum(rho_bar, rho)
    c = lambda_ * (rho if c_bar is None else np.minimum(c_bar, rho))
    rho_pg = rho if pg_bar is None else np.minimum(pg_bar, rho)
    horizon = num_t if n_steps is None else n_steps

    def next_value(k):  # Vbar(s_{k+1}) as seen from step k
        nxt = bv if k == num_t - 1 else v[k + 1]
        return np.where(trunc[k], tv[k], nxt)

    vs = np.zeros_like(v)
    for t in range(num_t):
        total = np.zeros(lr.shape[1:])
        weight = np.ones(lr.shape[1:])  # prod_{j=t}^{k-1} gamma_j c_j, zeroed past a truncation
        for k in range(t, min(t + horizon, num_t)):
            delta_k = r[k] + d[k] * next_value(k) - v[k]
            total = total + weight * rho_c[k] * delta_k
            weight = weight * d[k] * c[k] * (~trunc[k])
        vs[t] = v[t] + total
    pg = np.zeros_like(v)
    for t in range(num_t):
        vs_next = bv if t == num_t - 1 else vs[t + 1]
        vs_next = np.where(trunc[t], tv[t], vs_next)
        pg[t] = rho_pg[t] * (r[t] + d[t] * vs_next - v[t])
    return vs, pg


def make_inputs(shape, seed, *, terminal_p=0.2, trunc_p=0.0, log_rho_scale=1.0, gamma=0.9):
    rng = np.random.default_rng(seed)
    out = dict(
        log_rhos=rng.normal(0.0, log_rho_scale, shape),
        discounts=gamma * (rng.random(shape) > terminal_p),
        rewards=rng.normal(size=shape),
        values=rng.normal(size=shape),
        bootstrap_value=rng.normal(size=shape[1:]),
    )
    if trunc_p:
        out["truncations"] = rng.random(shape) < trunc_p
        out["truncation_values"] = rng.normal(size=shape)
    return out


def as_jax(inputs, dtype):
    return {k: (jnp.asarray(v) if v.dtype == bool else jnp.asarray(v, dtype)) for k, v in inputs.items()}


def split_kwargs(kw):
    """Library keyword names -> reference keyword names."""
    names = dict(clip_rho_threshold="rho_bar", clip_c_threshold="c_bar",
                 clip_pg_rho_threshold="pg_bar")
    return {names.get(k, k): v for k, v in kw.items()}


SETTINGS = {
    "default": dict(),
    "untruncated_lambda": dict(lambda_=0.8, clip_rho_threshold=None, clip_c_threshold=None,
                               clip_pg_rho_threshold=None),
    "mixed_thresholds": dict(lambda_=0.7, clip_rho_threshold=2.0, clip_c_threshold=0.5,
                             clip_pg_rho_threshold=1.5),
    "truncations": dict(lambda_=0.9, trunc=True),
    "n_steps": dict(lambda_=0.95, clip_rho_threshold=1.5, n_steps=3, trunc=True),
}


def run_setting(fn, name, shape, seed, dtype):
    kw = dict(SETTINGS[name])
    trunc = kw.pop("trunc", False)
    inputs = make_inputs(shape, seed, trunc_p=0.25 if trunc else 0.0)
    out = fn(**as_jax(inputs, dtype), **kw)
    return out, reference(**inputs, **split_kwargs(kw))


# ----------------------------------------------------------------------------- reference tests


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", SETTINGS)
def test_matches_float64_reference(method, name):
    with jax.enable_x64(True):
        out, (vs, pg) = run_setting(METHODS[method], name, SHAPE, seed=1, dtype=jnp.float64)
        assert out.vs.dtype == jnp.float64 and out.vs.shape == SHAPE
        np.testing.assert_allclose(out.vs, vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-10, atol=1e-10)


def test_float32_multiple_column_blocks_and_inplace():
    """Width 12288 > the loop's column block: several blocks, each restarting its trace."""
    shape = (5, 12288)
    inputs = make_inputs(shape, seed=2, trunc_p=0.1)
    vs, pg = reference(**inputs, lambda_=0.9)
    out = vt.vtrace(**as_jax(inputs, jnp.float32), lambda_=0.9)
    assert out.vs.dtype == jnp.float32
    np.testing.assert_allclose(out.vs, vs, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=2e-5, atol=2e-5)
    args = as_jax(inputs, jnp.float32)
    inplace = vt.vtrace_inplace(**args, lambda_=0.9)
    np.testing.assert_array_equal(inplace.vs, out.vs)
    np.testing.assert_array_equal(inplace.pg_advantages, out.pg_advantages)
    assert args["log_rhos"].is_deleted() and args["rewards"].is_deleted()  # reused for outputs


@pytest.mark.parametrize("method", METHODS)
def test_jit_and_vmap_over_independent_problems(method):
    with jax.enable_x64(True):
        problems = [make_inputs(SHAPE, seed=10 + i, trunc_p=0.2) for i in range(3)]
        stacked = {k: np.stack([p[k] for p in problems]) for k in problems[0]}
        fn = jax.jit(jax.vmap(lambda kw: METHODS[method](**kw, lambda_=0.9)))
        out = fn(as_jax(stacked, jnp.float64))
        for i, p in enumerate(problems):
            vs, pg = reference(**p, lambda_=0.9)
            np.testing.assert_allclose(out.vs[i], vs, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(out.pg_advantages[i], pg, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kw", [dict(lambda_=0.9, clip_rho_threshold=1.5), dict(lambda_=1.0)],
                         ids=["lambda0.9", "lambda1"])
def test_gradient_wrt_values_matches_reference_jacobian(method, kw):
    """With stop_target_gradients=False, d(w.vs + u.pg)/d(values, bootstrap) equals the
    reference's (exact, since both are linear in the values for fixed ratios)."""
    shape = (6, 2)
    with jax.enable_x64(True):
        inputs = make_inputs(shape, seed=3, trunc_p=0.2)
        rng = np.random.default_rng(4)
        w, u = rng.normal(size=shape), rng.normal(size=shape)

        def objective(values, bootstrap):
            args = as_jax({**inputs, "values": values, "bootstrap_value": bootstrap}, jnp.float64)
            out = METHODS[method](**args, **kw, stop_target_gradients=False)
            return jnp.sum(w * out.vs) + jnp.sum(u * out.pg_advantages)

        g_v, g_b = jax.jit(jax.grad(objective, argnums=(0, 1)))(
            inputs["values"], inputs["bootstrap_value"])

        def ref_objective(values, bootstrap):
            vs, pg = reference(**{**inputs, "values": values, "bootstrap_value": bootstrap},
                               **split_kwargs(kw))
            return np.sum(w * vs) + np.sum(u * pg)

        def fd(x, other, which):  # central differences; exact up to rounding (linear in x)
            grad = np.zeros_like(x)
            for idx in np.ndindex(*x.shape):
                e = np.zeros_like(x)
                e[idx] = 1e-3
                args = lambda y: (y, other) if which == 0 else (other, y)  # noqa: E731
                grad[idx] = (ref_objective(*args(x + e)) - ref_objective(*args(x - e))) / 2e-3
            return grad

        np.testing.assert_allclose(g_v, fd(inputs["values"], inputs["bootstrap_value"], 0), atol=1e-9)
        np.testing.assert_allclose(g_b, fd(inputs["bootstrap_value"], inputs["values"], 1), atol=1e-9)
        assert np.abs(np.asarray(g_v)).max() > 0.1  # the check has teeth


@pytest.mark.parametrize("method", METHODS)
def test_traced_lambda_matches_static_lambda(method):
    """A concrete lambda_ is compiled in as a constant (lambda = 1 takes a shortcut); a
    traced one (e.g. meta-learned) goes through the general path: both agree."""
    with jax.enable_x64(True):
        p = make_inputs(SHAPE, seed=15, trunc_p=0.2)
        args = as_jax(p, jnp.float64)

        @jax.jit  # one compile: traced lambdas (arguments) and static ones (Python floats)
        def paths(lams):
            traced = [METHODS[method](**args, lambda_=lam) for lam in lams]
            static = [METHODS[method](**args, lambda_=lam) for lam in (1.0, 0.6)]
            d_lam = jax.grad(lambda lam: jnp.sum(METHODS[method](
                **args, lambda_=lam, stop_target_gradients=False).vs))(lams[1])
            return traced, static, d_lam

        traced, static, d_lam = paths(jnp.asarray([1.0, 0.6], jnp.float64))
        for i, lam in enumerate((1.0, 0.6)):
            vs, pg = reference(**p, lambda_=lam)
            for out in (traced[i], static[i]):
                np.testing.assert_allclose(out.vs, vs, rtol=1e-10, atol=1e-10)
                np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-10, atol=1e-10)
        eps = 1e-6
        fd = (np.sum(reference(**p, lambda_=0.6 + eps)[0]) - np.sum(reference(**p, lambda_=0.6 - eps)[0])) / (2 * eps)
        np.testing.assert_allclose(d_lam, fd, rtol=1e-6)


@jax.jit
def _default_and_enabled_gradients(inputs):
    """Per method: d/d(values, log_rhos) of sum(vs^2) + sum(pg^2) with the default
    stop_target_gradients, and d/dvalues of sum(vs) with it off (one compile for all)."""

    def objective(values, log_rhos, method):
        out = METHODS[method](**{**inputs, "values": values, "log_rhos": log_rhos})
        return jnp.sum(out.vs ** 2) + jnp.sum(out.pg_advantages ** 2)

    out = {}
    for method in METHODS:
        g_v, g_lr = jax.grad(objective, argnums=(0, 1))(inputs["values"], inputs["log_rhos"], method)
        g_on = jax.grad(lambda v: jnp.sum(METHODS[method](
            **{**inputs, "values": v}, stop_target_gradients=False).vs))(inputs["values"])
        out[method] = (g_v, g_lr, g_on)
    return out


def test_targets_carry_no_gradient_by_default():
    inputs = as_jax(make_inputs(SHAPE, seed=5, trunc_p=0.2), jnp.float32)
    for method, (g_v, g_lr, g_on) in _default_and_enabled_gradients(inputs).items():
        assert not np.any(np.asarray(g_v)) and not np.any(np.asarray(g_lr)), method
        assert np.any(np.asarray(g_on)), method


# ----------------------------------------------------------------------------- identities


@pytest.mark.parametrize("method", METHODS)
def test_untruncated_lambda_one_is_importance_weighted_return(method):
    """rhobar = cbar = None, lambda = 1: per-decision importance-sampled return with a
    control variate, G_t = rho_t (r_t + gamma_t G_{t+1}) + (1 - rho_t) V_t, G_T = V(s_T);
    with V = 0 before s_T it is sum_k (prod_{j<k} gamma_j rho_j) rho_k r_k + prod_j (gamma_j rho_j) V(s_T)."""
    with jax.enable_x64(True):
        p = make_inputs(SHAPE, seed=6, log_rho_scale=0.5)
        kw = dict(clip_rho_threshold=None, clip_c_threshold=None, clip_pg_rho_threshold=None)
        rho = np.exp(p["log_rhos"])
        g = np.zeros(SHAPE)
        nxt = p["bootstrap_value"]
        for t in reversed(range(SHAPE[0])):
            g[t] = rho[t] * (p["rewards"][t] + p["discounts"][t] * nxt) + (1 - rho[t]) * p["values"][t]
            nxt = g[t]
        out = METHODS[method](**as_jax(p, jnp.float64), **kw)
        np.testing.assert_allclose(out.vs, g, rtol=1e-10, atol=1e-10)

        p0 = {**p, "values": np.zeros(SHAPE)}
        out0 = METHODS[method](**as_jax(p0, jnp.float64), **kw)
        for t in range(SHAPE[0]):
            expected, weight = 0.0, 1.0
            for k in range(t, SHAPE[0]):
                expected = expected + weight * rho[k] * p["rewards"][k]
                weight = weight * p["discounts"][k] * rho[k]
            expected = expected + weight * p["bootstrap_value"]
            np.testing.assert_allclose(out0.vs[t], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
def test_on_policy_is_gae_lambda_return(method, lam):
    """rho = 1: vs is the lambda-return G^lambda_t = r_t + gamma_t ((1-lambda) V_{t+1} +
    lambda G^lambda_{t+1}), i.e. V + GAE(gamma, lambda); pg = r + gamma vs_{t+1} - V."""
    with jax.enable_x64(True):
        p = make_inputs(SHAPE, seed=7)
        p["log_rhos"] = np.zeros(SHAPE)
        v_next = np.concatenate([p["values"][1:], p["bootstrap_value"][None]])
        g = np.zeros(SHAPE)
        nxt = p["bootstrap_value"]
        for t in reversed(range(SHAPE[0])):
            g[t] = p["rewards"][t] + p["discounts"][t] * ((1 - lam) * v_next[t] + lam * nxt)
            nxt = g[t]
        out = METHODS[method](**as_jax(p, jnp.float64), lambda_=lam)
        np.testing.assert_allclose(out.vs, g, rtol=1e-10, atol=1e-10)
        g_next = np.concatenate([g[1:], p["bootstrap_value"][None]])
        pg = p["rewards"] + p["discounts"] * g_next - p["values"]
        np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_is_eq11_with_rho_one(lam):
    """gae(): returns = Eq 11's v_t with log_rhos = 0 (the reference's double loop, with
    episode ends and time-limit truncations), advantages = returns - values, float64."""
    with jax.enable_x64(True):
        p = make_inputs(SHAPE, seed=11, trunc_p=0.25)
        vs, _ = reference(**{**p, "log_rhos": np.zeros(SHAPE)}, lambda_=lam)
        args = as_jax({k: x for k, x in p.items() if k != "log_rhos"}, jnp.float64)
        out = vt.gae(**args, lambda_=lam)
        assert out.returns.dtype == jnp.float64 and out.returns.shape == SHAPE
        np.testing.assert_allclose(out.returns, vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out.advantages, vs - p["values"], rtol=1e-10, atol=1e-10)


def test_gae_float32_column_blocks_traced_lambda_and_no_gradient():
    """Width 12288 (several column blocks) in float32 against the float64 reference; a traced
    lambda inside jit gives the same numbers; targets carry no gradient by default."""
    shape = (5, 12288)
    p = make_inputs(shape, seed=12, trunc_p=0.1)
    vs, _ = reference(**{**p, "log_rhos": np.zeros(shape)}, lambda_=0.9)
    args = as_jax({k: x for k, x in p.items() if k != "log_rhos"}, jnp.float32)
    out = vt.gae(**args, lambda_=0.9)
    np.testing.assert_allclose(out.returns, vs, rtol=2e-5, atol=2e-5)
    traced = jax.jit(lambda lam, **kw: vt.gae(**kw, lambda_=lam))(jnp.float32(0.9), **args)
    np.testing.assert_allclose(traced.returns, out.returns, rtol=1e-6, atol=1e-6)
    grad = jax.grad(lambda v: vt.gae(**{**args, "values": v}, lambda_=0.9).returns.sum())
    np.testing.assert_array_equal(grad(args["values"]), 0.0)


def test_gae_checks_its_arguments():
    p = as_jax(make_inputs((4, 3), seed=13), jnp.float32)
    with pytest.raises(ValueError, match="rewards"):
        vt.gae(p["discounts"], p["rewards"][:3], p["values"], p["bootstrap_value"])
    with pytest.raises(ValueError, match="lambda_"):
        vt.gae(p["discounts"], p["rewards"], p["values"], p["bootstrap_value"], lambda_=1.5)


def test_shard_map_over_the_batch_gives_the_same_bits():
    """``shard_map`` with the batch axis split (a one-device mesh here; docs/scaling.md splits
    it over forced host devices) runs the same loop: vtrace, vtrace_inplace and gae equal
    the plain call bit for bit, with shard_map's default varying-axis check on."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("b",))
    tb, b = jax.sharding.PartitionSpec(None, "b"), jax.sharding.PartitionSpec("b")
    p = as_jax(make_inputs((6, 4), seed=14), jnp.float32)
    args = [p[k] for k in ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")]
    want = vt.vtrace(*args)
    for fn in (vt.vtrace, vt.vtrace_inplace):  # inside jit: no donation, args stay valid
        got = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(tb,) * 4 + (b,),
                                    out_specs=tb))(*args)
        np.testing.assert_array_equal(got.vs, want.vs)
        np.testing.assert_array_equal(got.pg_advantages, want.pg_advantages)
    split_gae = jax.jit(jax.shard_map(vt.gae, mesh=mesh, in_specs=(tb,) * 3 + (b,),
                                      out_specs=tb))
    np.testing.assert_array_equal(split_gae(*args[1:]).returns, vt.gae(*args[1:]).returns)


def test_scan_method_rule():
    """The associative scan only where the measured rule says so: nowhere on CPU."""
    assert vt.ASSOCIATIVE_WINS["cpu"] is None
    assert {vt.scan_method("cpu", t, b) for t in (1, 1024, 2**16) for b in (1, 4096)} == {"scan"}
    assert vt.scan_method("unmeasured", 4096, 1) == "scan"
    rules = {**vt.ASSOCIATIVE_WINS, "fake": (256, 64)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vt, "ASSOCIATIVE_WINS", rules)
        assert vt.scan_method("fake", 256, 64) == "associative"
        assert vt.scan_method("fake", 255, 64) == vt.scan_method("fake", 256, 65) == "scan"


@pytest.mark.parametrize("method", METHODS)
def test_batch_with_episode_ends_and_truncations_equals_separate_episodes(method):
    """Three episodes in one time axis: one ends by termination (discount 0), one is cut by
    a time limit (truncation, bootstrapping from the final observation's value), one runs
    past the batch end (bootstrap_value). Each column uses different boundaries."""
    num_t, width = 12, 3
    cuts = [(3, 8), (0, 5), (6, 7)]  # per column: (terminal step, truncated step)
    with jax.enable_x64(True):
        p = make_inputs((num_t, width), seed=8, terminal_p=0.0)
        p["truncations"] = np.zeros((num_t, width), bool)
        p["truncation_values"] = np.random.default_rng(9).normal(size=(num_t, width))
        for col, (term, cut) in enumerate(cuts):
            p["discounts"][term, col] = 0.0
            p["truncations"][cut, col] = True
        kw = dict(lambda_=0.9, clip_rho_threshold=1.2)
        out = METHODS[method](**as_jax(p, jnp.float64), **kw)
        for col, (term, cut) in enumerate(cuts):
            episodes = [(0, term + 1, 123.0), (term + 1, cut + 1, p["truncation_values"][cut, col]),
                        (cut + 1, num_t, p["bootstrap_value"][col])]
            for start, stop, boot in episodes:
                sub = {k: p[k][start:stop, col] for k in ("log_rhos", "discounts", "rewards", "values")}
                alone = METHODS[method](**as_jax(sub, jnp.float64), bootstrap_value=jnp.float64(boot), **kw)
                np.testing.assert_allclose(out.vs[start:stop, col], alone.vs, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(out.pg_advantages[start:stop, col], alone.pg_advantages,
                                           rtol=1e-12, atol=1e-12)
        # Nothing of the next episode leaks across the truncation: perturbing it changes nothing before.
        q = {k: v.copy() for k, v in p.items()}
        for col, (_, cut) in enumerate(cuts):
            q["rewards"][cut + 1:, col] += 10.0
            q["values"][cut + 1:, col] -= 5.0
        out_q = METHODS[method](**as_jax(q, jnp.float64), **kw)
        for col, (_, cut) in enumerate(cuts):
            np.testing.assert_array_equal(out_q.vs[: cut + 1, col], out.vs[: cut + 1, col])
            assert not np.allclose(out_q.vs[cut + 1:, col], out.vs[cut + 1:, col])


def test_scan_and_associative_agree_float32_long_horizon():
    """Traces c <= 1 (cbar <= 1) keep the recurrence contractive; with cbar = None the
    products of ratios can grow without bound and any two float32 summation orders drift."""
    shape = (4096, 8)
    p = make_inputs(shape, seed=11, terminal_p=0.002, trunc_p=0.002, gamma=0.99)
    args = as_jax(p, jnp.float32)
    kws = (dict(), dict(lambda_=0.95, clip_rho_threshold=2.0, clip_pg_rho_threshold=None))
    # one compile for the six (method, kw) pairs
    outs = jax.jit(lambda a: [[m(**a, **kw) for m in METHODS.values()] for kw in kws])(args)
    for a, *others in outs:
        for b in others:
            np.testing.assert_allclose(a.vs, b.vs, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(a.pg_advantages, b.pg_advantages, rtol=1e-5, atol=1e-5)
        assert np.abs(np.asarray(a.vs) - np.asarray(args["values"])).max() > 1.0  # long traces


@pytest.mark.parametrize("method", METHODS)
def test_one_step_is_clipped_one_step_target(method):
    """n_steps = 1: vs = V + min(rhobar, rho) delta (Eq 10, truncated weights); pg uses that
    one-step vs_{t+1}."""
    with jax.enable_x64(True):
        p = make_inputs(SHAPE, seed=12, trunc_p=0.2)
        kw = dict(lambda_=0.7, clip_rho_threshold=1.3, clip_pg_rho_threshold=0.8)
        rho = np.exp(p["log_rhos"])
        v_next = np.concatenate([p["values"][1:], p["bootstrap_value"][None]])
        v_next = np.where(p["truncations"], p["truncation_values"], v_next)
        delta = p["rewards"] + p["discounts"] * v_next - p["values"]
        vs = p["values"] + np.minimum(1.3, rho) * delta
        vs_next = np.concatenate([vs[1:], p["bootstrap_value"][None]])
        vs_next = np.where(p["truncations"], p["truncation_values"], vs_next)
        pg = np.minimum(0.8, rho) * (p["rewards"] + p["discounts"] * vs_next - p["values"])
        out = METHODS[method](**as_jax(p, jnp.float64), **kw, n_steps=1)
        np.testing.assert_allclose(out.vs, vs, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-12, atol=1e-12)
        full = METHODS[method](**as_jax(p, jnp.float64), **kw)
        long = METHODS[method](**as_jax(p, jnp.float64), **kw, n_steps=SHAPE[0])
        np.testing.assert_allclose(long.vs, full.vs, rtol=1e-12, atol=1e-12)
        assert not np.allclose(out.vs, full.vs)


# ----------------------------------------------------------------------------- properties

PROP_SHAPE = (8, 3)
_FIXED = make_inputs(PROP_SHAPE, seed=13, trunc_p=0.2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_rhos=hnp.arrays(np.float32, PROP_SHAPE,
                           elements=st.floats(-100, 100, width=32, allow_nan=False)))
def test_any_finite_log_ratios_give_finite_outputs(log_rhos):
    """Fixed shapes, so the jitted cores compile once for all examples."""
    args = {**as_jax(_FIXED, jnp.float32), "log_rhos": jnp.asarray(log_rhos)}
    for fn in METHODS.values():
        for kw in (dict(), dict(lambda_=0.9, clip_rho_threshold=None, clip_pg_rho_threshold=None)):
            out = fn(**args, **kw)
            assert np.isfinite(np.asarray(out.vs)).all()
            assert np.isfinite(np.asarray(out.pg_advantages)).all()


def _corrupt(kind, value):
    p = as_jax(make_inputs((5, 2), seed=14), jnp.float32)
    kw = {}
    if kind == "rewards_shape":
        p["rewards"] = p["rewards"][:, :1]
    elif kind == "values_shape":
        p["values"] = jnp.concatenate([p["values"], p["values"]])
    elif kind == "bootstrap_rank":
        p["bootstrap_value"] = p["bootstrap_value"][None]
    elif kind == "bootstrap_shape":
        p["bootstrap_value"] = p["bootstrap_value"][:1]
    elif kind == "discounts_range":
        p["discounts"] = p["discounts"].at[2, 1].set(value)
    elif kind == "lambda_range":
        kw["lambda_"] = value
    elif kind == "threshold":
        kw["clip_c_threshold"] = -abs(value)  # < 0 (or NaN)
    elif kind == "n_steps":
        kw["n_steps"] = 0
    elif kind == "truncation_values_missing":
        kw["truncations"] = jnp.zeros((5, 2), bool)
    elif kind == "truncations_shape":
        kw["truncations"] = jnp.zeros((5, 3), bool)
        kw["truncation_values"] = jnp.zeros((5, 3))
    return p, kw


EXPECTED_NAME = {
    "rewards_shape": "rewards", "values_shape": "values", "bootstrap_rank": "bootstrap_value",
    "bootstrap_shape": "bootstrap_value", "discounts_range": "discounts",
    "lambda_range": "lambda_", "threshold": "clip_c_threshold", "n_steps": "n_steps",
    "truncation_values_missing": "truncation_values", "truncations_shape": "truncations",
}


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(sorted(EXPECTED_NAME)),
       value=st.one_of(st.floats(1.0001, 1e6), st.floats(-1e6, -1e-6), st.just(float("nan"))),
       method=st.sampled_from(sorted(METHODS)))
def test_invalid_input_raises_error_naming_the_argument(kind, value, method):
    p, kw = _corrupt(kind, value)
    with pytest.raises(ValueError, match=EXPECTED_NAME[kind]):
        METHODS[method](**p, **kw)
