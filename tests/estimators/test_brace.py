"""BRACE estimator (vccc_jax.estimators.related.brace): definition, reductions, conventions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.related.brace import brace, brace_reference
from vccc_jax.estimators.vtrace import vtrace

T, B = 7, 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    d = np.full((T, B), 0.9)
    d[3, 0] = 0.0  # episode end in column 0
    trunc = np.zeros((T, B), bool)
    trunc[4, 1] = True  # time-limit cut in column 1
    return dict(log_rhos=rng.normal(size=(T, B)) * 0.8, discounts=d, rewards=rng.normal(size=(T, B)),
                values=rng.normal(size=(T, B)), bootstrap_value=rng.normal(size=B),
                is_action=rng.random((T, B)) > 0.35, truncations=trunc,
                truncation_values=rng.normal(size=(T, B)))


def _call(data, **kw):
    args = [jnp.asarray(data[k]) for k in ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")]
    return brace(*args, **kw)


def _pg_reference(data, vs, pg_bar):
    """min(pg_bar, rho_t) (r_t + gamma_t v_{t+1} - V(s_t)), ratio 1 at tool steps, v_T the
    bootstrap and the truncation value at a time-limit cut (the definition, per step)."""
    rho = np.exp(data["log_rhos"])
    w = np.where(data["is_action"], rho if pg_bar is None else np.minimum(rho, pg_bar), 1.0)
    nxt = np.concatenate([vs[1:], data["bootstrap_value"][None]])
    nxt = np.where(data["truncations"], data["truncation_values"], nxt)
    return w * (data["rewards"] + data["discounts"] * nxt - data["values"])


@pytest.mark.parametrize("n,clips,anchor", [
    (0, (1.0, 1.0, 1.0), "prefix"), (2, (1.3, 0.8, 1.1), "prefix"), (3, (1.5, 0.8, None), "constant"),
    (2, (None, None, None), "constant"), (20, (1.2, 1.0, 1.0), "prefix"), (1, (0.9, 1.4, 1.0), "prefix")])
def test_matches_defining_sum(data, n, clips, anchor):
    """vs = the defining sum (``brace_reference``) and pg = its definition, with tool steps, an
    episode end and a time-limit cut; n < T with rho_bar != c_bar in both tail anchors."""
    with jax.enable_x64(True):
        kw = dict(n=n, clip_rho_threshold=clips[0], clip_c_threshold=clips[1], tail_anchor=anchor)
        out = _call(data, is_action=jnp.asarray(data["is_action"]),
                    truncations=jnp.asarray(data["truncations"]),
                    truncation_values=jnp.asarray(data["truncation_values"]), clip_pg_rho_threshold=clips[2], **kw)
        for b in range(B):
            ref = brace_reference(*(data[k][:, b] for k in ("log_rhos", "discounts", "rewards", "values")),
                                  data["bootstrap_value"][b], is_action=data["is_action"][:, b],
                                  truncations=data["truncations"][:, b],
                                  truncation_values=data["truncation_values"][:, b], **kw)
            np.testing.assert_allclose(np.asarray(out.vs[:, b]), ref, atol=1e-12)
        np.testing.assert_allclose(out.pg_advantages, _pg_reference(data, np.asarray(out.vs), clips[2]), atol=1e-12)


def test_reference_is_the_written_definition():
    """``brace_reference`` against the sum written out by hand for T = 4, n = 1, a tool step
    first: prefix = the tool step (weight 1, whatever its log-ratio) and the first action
    (rho-bar weight), tail = the rest, ratio-free, with weight c_1 ("prefix") or 1
    ("constant"), bootstrapped from Vbar(s_T)."""
    lr, r, v = np.array([2.0, 0.9, 0.4, -0.2]), np.array([1.0, -0.5, 0.3, 0.8]), np.array([0.2, -0.4, 0.6, 0.1])
    d, bv, act = np.array([0.9, 0.8, 0.7, 0.6]), 0.5, np.array([False, True, True, True])
    rbar, cbar = 1.3, 0.8
    delta = r + d * np.append(v[1:], bv) - v
    rho1 = np.exp(lr[1])
    prefix = delta[0] + d[0] * min(rbar, rho1) * delta[1]
    tail = d[0] * d[1] * (delta[2] + d[2] * delta[3])
    for anchor, weight in (("prefix", min(cbar, rho1)), ("constant", 1.0)):
        ref = brace_reference(lr, d, r, v, bv, n=1, clip_rho_threshold=rbar, clip_c_threshold=cbar, is_action=act,
                              tail_anchor=anchor)
        assert ref[0] == pytest.approx(v[0] + prefix + weight * tail, abs=1e-12)
    assert min(rbar, rho1) != min(cbar, rho1)  # both clips bind differently: the weights are distinguishable


def _mc_return(data):
    g = np.asarray(data["bootstrap_value"], np.float64)
    out = np.zeros((T, B))
    for t in reversed(range(T)):
        g = data["rewards"][t] + data["discounts"][t] * g
        out[t] = g
    return out


def test_reductions(data):
    with jax.enable_x64(True):
        full = _call(data, n=T, clip_rho_threshold=None, clip_c_threshold=None)
        vt = vtrace(*(jnp.asarray(data[k]) for k in ("log_rhos", "discounts", "rewards", "values",
                                                      "bootstrap_value")),
                    clip_rho_threshold=None, clip_c_threshold=None, clip_pg_rho_threshold=None)
        np.testing.assert_allclose(full.vs, vt.vs, atol=1e-12)
        mc = _mc_return(data)
        np.testing.assert_allclose(_call(data, n=0).vs, mc, atol=1e-12)
        on_policy = dict(data, log_rhos=np.zeros((T, B)))
        for n in (1, 4):
            np.testing.assert_allclose(_call(on_policy, n=n).vs, mc, atol=1e-12)
        # Tool steps never count toward n: all-tool steps give the MC return for any n.
        np.testing.assert_allclose(_call(data, n=3, is_action=jnp.zeros((T, B), bool)).vs, mc, atol=1e-12)


def test_batch_equals_separate_episodes():
    """Two episodes concatenated (discount 0 between, then a time-limit cut) = run separately."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        lr, r, v = (rng.normal(size=6) for _ in range(3))
        d = np.full(6, 0.95)
        d[2] = 0.0
        trunc = np.zeros(6, bool)
        trunc[5] = True
        tv = np.zeros(6)
        tv[5] = 0.7
        kw = dict(n=2, clip_rho_threshold=1.3, clip_c_threshold=0.9)
        joined = brace(*map(jnp.asarray, (lr, d, r, v)), jnp.asarray(0.0), truncations=jnp.asarray(trunc),
                       truncation_values=jnp.asarray(tv), **kw).vs
        first = brace(*(jnp.asarray(x[:3]) for x in (lr, d, r, v)), jnp.asarray(123.0), **kw).vs
        second = brace(*(jnp.asarray(x[3:]) for x in (lr, d, r, v)), jnp.asarray(0.7), **kw).vs
        np.testing.assert_allclose(joined, np.concatenate([first, second]), atol=1e-12)


def test_jit_vmap_grad_and_float32(data):
    args = [jnp.asarray(data[k], jnp.float32) for k in ("log_rhos", "discounts", "rewards", "values",
                                                         "bootstrap_value")]
    f = lambda lr, d, r, v, bv: brace(lr, d, r, v, bv, n=2).vs  # noqa: E731
    batched = f(*args)
    assert batched.dtype == jnp.float32
    per_col = jax.vmap(f, in_axes=(1, 1, 1, 1, 0), out_axes=1)(*args)
    np.testing.assert_allclose(jax.jit(f)(*args), batched, rtol=1e-6)
    np.testing.assert_allclose(per_col, batched, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda v: jnp.sum(f(args[0], args[1], args[2], v, args[4])))(args[3])
    assert float(jnp.abs(grad).max()) == 0.0  # targets are constants by default


def test_bad_inputs(data):
    with pytest.raises(ValueError, match="n must be"):
        _call(data, n=-1)
    with pytest.raises(ValueError, match="tail_anchor"):
        _call(data, n=1, tail_anchor="middle")
    with pytest.raises(ValueError, match="discounts"):
        _call(dict(data, discounts=data["discounts"] + 1.0), n=1)
    with pytest.raises(ValueError, match="bootstrap_value"):
        _call(dict(data, bootstrap_value=np.zeros(B + 1)), n=1)
