"""Samplers log the distribution they sample from (issue 12; Sec 7)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from vccc_jax.envs import samplers as sm
from vccc_jax.tabular import policies

ALPHA = 1e-3  # chi-square test level per sampler (fixed key; 8 samplers -> family level < 1e-2)
N = 20_000
LOGITS = jnp.asarray([2.0, 1.5, 1.0, 0.7, 0.3, 0.0, -0.4, -1.0, -1.7, -2.5])  # no ties
SPECS = {
    "temperature": sm.SamplerSpec(temperature=0.7),
    "top_k": sm.SamplerSpec(top_k=4),
    "top_p": sm.SamplerSpec(top_p=0.8),
    "top_k_p_temp": sm.SamplerSpec(temperature=1.5, top_k=6, top_p=0.9),
    "bf16": sm.SamplerSpec(mismatch="bf16"),
    "int8": sm.SamplerSpec(mismatch="int8", temperature=0.9),
    "mask": sm.SamplerSpec(),
    "greedy": sm.SamplerSpec(greedy=True),
}
MASK = jnp.arange(10) % 3 != 1


def _draw(key, spec, masked):
    """N independent draws from one logits row, as one batched (eager) call."""
    mask = jnp.broadcast_to(MASK, (N, 10)) if masked else None
    return sm.sample(key, jnp.broadcast_to(LOGITS, (N, 10)), spec, mask)


@pytest.mark.parametrize("name", list(SPECS))
def test_logged_log_probs_are_the_sampled_distribution(name):
    spec = SPECS[name]
    out = _draw(jax.random.PRNGKey(0), spec, name == "mask")
    log_mu = np.asarray(out.log_probs[0])
    np.testing.assert_allclose(out.log_probs, np.broadcast_to(log_mu, out.log_probs.shape))
    np.testing.assert_allclose(out.log_prob, log_mu[np.asarray(out.token)], rtol=1e-6)
    counts = np.bincount(np.asarray(out.token), minlength=10)
    support = np.isfinite(log_mu)
    assert counts[~support].sum() == 0
    probs = np.exp(log_mu[support].astype(np.float64))
    assert probs.sum() == pytest.approx(1.0, abs=1e-5)
    if support.sum() > 1:
        p = stats.chisquare(counts[support], N * probs / probs.sum()).pvalue
        assert p > ALPHA, (name, p)
    else:
        assert name == "greedy" and counts[0] == N and log_mu[0] == 0.0


def test_log_probs_match_tabular_references():
    probs = jax.nn.softmax(LOGITS)
    ref_k = policies.log_probs(policies.top_k_policy(probs[None], 4))[0]
    np.testing.assert_allclose(sm.sampler_log_probs(LOGITS, SPECS["top_k"]), ref_k, atol=1e-6)
    ref_p = policies.log_probs(policies.top_p_policy(probs[None], 0.8))[0]
    np.testing.assert_allclose(sm.sampler_log_probs(LOGITS, SPECS["top_p"]), ref_p, atol=1e-6)
    hot = sm.sampler_log_probs(LOGITS, SPECS["temperature"])
    np.testing.assert_allclose(hot, jax.nn.log_softmax(LOGITS / 0.7), atol=1e-6)


def test_mismatch_changes_the_behaviour_and_noise_needs_a_key():
    z = jax.random.normal(jax.random.PRNGKey(1), (4, 64)) * 3.0
    clean = sm.sampler_log_probs(z, sm.SamplerSpec())
    for kind in ("bf16", "int8"):
        diff = np.abs(sm.sampler_log_probs(z, sm.SamplerSpec(mismatch=kind)) - clean)
        assert 1e-5 < diff.max() < 0.2, kind
    noisy = sm.SamplerSpec(mismatch="noise", mismatch_scale=0.1)
    with pytest.raises(ValueError, match="key"):
        sm.sampler_log_probs(z, noisy)
    assert np.abs(sm.sampler_log_probs(z, noisy, key=jax.random.PRNGKey(2)) - clean).max() > 1e-3


def test_spec_parse_and_validation():
    spec = sm.SamplerSpec.parse("temp=0.7, k=50, top_p=0.9, mismatch=bf16")
    assert spec == sm.SamplerSpec(temperature=0.7, top_k=50, top_p=0.9, mismatch="bf16")
    assert sm.SamplerSpec.parse("") == sm.SamplerSpec()
    with pytest.raises(ValueError, match="top_p"):
        sm.SamplerSpec(top_p=0.0)
    with pytest.raises(ValueError, match="unknown"):
        sm.SamplerSpec.parse("beam=4")


@jax.jit
def _support_and_topk_numbers(z_pi, z_mu):
    """Everything the next test checks, in one compiled function (one compile, not an eager
    op-by-op trace of every call)."""
    log_pi = jax.nn.log_softmax(z_pi)
    topk_mu = sm.sampler_log_probs(z_mu, sm.SamplerSpec(top_k=8))
    out = dict(ref=policies.support_violation(jnp.exp(log_pi), jnp.exp(topk_mu)),
               mass=sm.support_violation_mass(log_pi, topk_mu))
    log_mu = jax.nn.log_softmax(z_mu)
    for kind, clip in (("truncate", 1.0), ("mask", 2.0)):
        out[kind] = [sm.z_topk(log_pi, log_mu, 32, kind=kind, clip=clip),
                     sm.z_topk(log_pi, log_mu, 4, kind=kind, clip=clip),
                     sm.z_topk(log_pi, topk_mu, 8, kind=kind, clip=clip)]  # covers support
    out["m4"] = sm.m_w_topk(z_pi, log_mu, 4, kind="truncate", clip=1.0)
    out["m32"] = sm.m_w_topk(z_pi, log_mu, 32, kind="truncate", clip=1.0)
    w = jnp.minimum(jnp.exp(log_pi - log_mu), 1.0)
    mu_w = jnp.exp(log_mu) * w
    out["formula"] = mu_w - jnp.sum(mu_w, -1, keepdims=True) * jnp.exp(log_pi)  # mu w - Z pi
    return out


def test_support_violation_mass_and_topk_z_mw():
    """Support mass equals the tabular reference; Z(s) and m_w(s) from a top-k summary plus
    the tail model are exact when k covers mu's support and carry a measurable error else."""
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    z_pi = 1.5 * jax.random.normal(keys[0], (5, 32))
    z_mu = z_pi + jax.random.normal(keys[1], z_pi.shape)
    n = jax.tree_util.tree_map(np.asarray, _support_and_topk_numbers(z_pi, z_mu))
    np.testing.assert_allclose(n["mass"], n["ref"], atol=1e-6)
    assert float(n["ref"].min()) > 0.01
    for kind in ("truncate", "mask"):
        (approx32, exact32), (approx4, exact4), (approx8, exact8) = n[kind]
        np.testing.assert_allclose(approx32, exact32, atol=1e-5)
        assert 1e-3 < np.abs(approx4 - exact4).max() < 0.5
        np.testing.assert_allclose(approx8, exact8, atol=1e-5)
    m_approx, m_exact = n["m4"]
    np.testing.assert_allclose(m_exact, n["formula"], atol=1e-5)
    assert np.abs(m_approx - m_exact).max() > 1e-3
    np.testing.assert_allclose(n["m32"][0], m_exact, atol=1e-5)


@jax.jit
def _support_aware_errors(z_pi, log_mu):
    """Per k in (1, 4, 16): (mean |Z_k - Z|, ||m_k - m|| / ||m||) of the first tail model and of
    the support-aware one (n_s = ``support_size(log_mu)``), truncation at c = 1; and the k = 4
    (Z_k, m_k) of both models."""
    ns = sm.support_size(log_mu)
    log_pi = jax.nn.log_softmax(z_pi)
    out, k4 = [], []
    for k in (1, 4, 16):
        row = []
        for support in (None, ns):
            z_k, z = sm.z_topk(log_pi, log_mu, k, kind="truncate", clip=1.0, support_size=support)
            m_k, m = sm.m_w_topk(z_pi, log_mu, k, kind="truncate", clip=1.0, support_size=support)
            row += [jnp.mean(jnp.abs(z_k - z)), jnp.linalg.norm(m_k - m) / jnp.linalg.norm(m)]
            k4 += [z_k, m_k] if k == 4 else []
        out.append(jnp.stack(row))
    return jnp.stack(out), ns, k4


def test_support_aware_tail_under_top_k_and_top_p_samplers():
    """Rows [64, 256] of pi (logits 1.5 N(0, 1)) sampled by top-32 / top-p 0.8 at temperature
    0.7, logged k = 1, 4, 16 < n_s. Measured (truncate, c = 1), first model -> support-aware:
    top-32: |Z err| 0.25 / 0.12 / 0.020 -> 0.0088 / 0.0062 / 0.0008, m_w rel err 0.84 / 0.68 /
    0.44 -> 0.082 / 0.063 / 0.022; top-p: 0.25 / 0.12 / 0.015 -> 0.0023 / 0.0019 / 0.0009 and
    0.81 / 0.64 / 0.40 -> 0.023 / 0.019 / 0.010 (the rest is mu ∝ pi^(1/0.7), not ∝ pi).
    Asserted: >= 10x smaller Z error and >= 6x smaller m_w error; a temperature-1 top-32
    sampler of pi is exact (the model holds); n_s = V equals the first model."""
    z_pi = 1.5 * jax.random.normal(jax.random.PRNGKey(5), (64, 256))
    for spec in (sm.SamplerSpec(top_k=32, temperature=0.7), sm.SamplerSpec(top_p=0.8, temperature=0.7)):
        err = np.asarray(_support_aware_errors(z_pi, sm.sampler_log_probs(z_pi, spec))[0])
        z_old, m_old, z_new, m_new = err.T
        assert np.all(z_old > 0.01) and np.all(m_old > 0.3), err
        assert np.all(z_new < 0.1 * z_old) and np.all(m_new < m_old / 6), err
    err = np.asarray(_support_aware_errors(z_pi, sm.sampler_log_probs(z_pi, sm.SamplerSpec(top_k=32)))[0])
    assert np.all(err[:, :2] > 0.09) and np.all(err[:, 2:] < 1e-6), err  # float32 rounding
    # no truncation (temperature): n_s = V, the same Z (up to rounding) and m_w (bitwise)
    _, ns, (z_old, m_old, z_new, m_new) = _support_aware_errors(
        z_pi, sm.sampler_log_probs(z_pi, sm.SamplerSpec(temperature=0.7)))
    assert np.all(np.asarray(ns) == 256)
    np.testing.assert_allclose(z_new, z_old, rtol=1e-6)
    np.testing.assert_array_equal(m_new, m_old)


# ------------------------------------------------------------------ ties (issue 19 §3)


def np_sampler_probs(z, *, temperature=1.0, top_k=0, top_p=1.0, ties="position"):
    """Independent NumPy reference of the sampling distribution of one logits row (float64):
    rank tokens by (logit descending, token id ascending); top-k keeps the first k ranks
    ("position") or every token whose logit is >= the k-th one ("value"); top-p then walks
    the ranking of the survivors, keeping a token while the mass strictly before it is < p
    (always the first), and "value" adds every survivor tied with the last one kept."""
    z = np.asarray(z, np.float64) / temperature
    ids = np.arange(len(z))

    def ranking(x):
        return sorted(ids[np.isfinite(x)], key=lambda i: (-x[i], i))

    if 0 < top_k < len(z):
        order = ranking(z)
        kept = order[:top_k] if ties == "position" else [i for i in ids if z[i] >= z[order[top_k - 1]]]
        z = np.where(np.isin(ids, kept), z, -np.inf)
    if top_p < 1.0:
        order = ranking(z)
        p = np.exp(z - z.max())
        p /= p.sum()
        kept, before = [], 0.0
        for i in order:
            if kept and not before < top_p:
                break
            kept.append(i)
            before += p[i]
        if ties == "value":
            kept = [i for i in ids if z[i] >= z[kept[-1]]]
        z = np.where(np.isin(ids, kept), z, -np.inf)
    p = np.where(np.isfinite(z), np.exp(z - z.max()), 0.0)
    return p / p.sum()


# Unnormalised probabilities (4, 1, 1, ...) as logits: ties at the k-th position and at the
# top-p crossing. Row 0 is the example (1/2, 1/4, 1/8, 1/8) in a shuffled order.
TIED_ROWS = np.log(np.asarray([
    [1 / 8, 1 / 2, 1 / 8, 1 / 4, 1e-3, 1e-3, 1e-3],
    [1.0, 4.0, 1.0, 2.0, 1.0, 0.5, 0.5],
    [2.0, 1.0, 2.0, 2.0, 1.0, 1.0, 3.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
]))
TIE_SPECS = [dict(top_k=k, top_p=p) for k in (0, 2, 3) for p in (1.0, 0.6, 0.8) if k or p < 1.0]
TIE_SPECS += [dict(top_k=3, top_p=0.8, temperature=0.7)]  # the filters act on tempered logits


@pytest.mark.parametrize("ties", sm.TIE_RULES)
def test_top_k_top_p_ties_match_numpy_reference(ties):
    """Both tie rules against the NumPy reference, rows with tied logits at the k-th position
    and at the top-p crossing (float32 and float64); the position cut keeps exactly k tokens
    and the issue's example keeps 3 tokens (position) or 4 (value)."""
    for spec_kw in TIE_SPECS:
        spec = sm.SamplerSpec(ties=ties, **spec_kw)
        ref = np.stack([np_sampler_probs(z, ties=ties, **spec_kw) for z in TIED_ROWS])
        for dtype in (jnp.float32, jnp.float64):
            with jax.enable_x64(dtype == jnp.float64):
                got = np.exp(np.asarray(sm.sampler_log_probs(jnp.asarray(TIED_ROWS, dtype), spec), np.float64))
            np.testing.assert_array_equal(got > 0, ref > 0, err_msg=f"{spec}")
            np.testing.assert_allclose(got, ref, atol=1e-6, err_msg=f"{spec}")
        if ties == "position" and spec.top_p == 1.0:
            assert np.all((ref > 0).sum(-1) == spec.top_k)
    p8 = lambda t: (np.exp(np.asarray(sm.sampler_log_probs(  # noqa: E731
        jnp.asarray(TIED_ROWS[:1]), sm.SamplerSpec(top_p=0.8, ties=t)))) > 0).sum()
    assert (p8("position"), p8("value")) == (3, 4)
    # the plain top-k path of the rollout and the tabular top-k policy cut by position too
    from vccc_jax.envs import rollout as rollout_lib
    row = jnp.asarray(TIED_ROWS, jnp.float32)
    np.testing.assert_array_equal(rollout_lib.sampling_log_probs(row, 1.0, 2),
                                  sm.sampler_log_probs(row, sm.SamplerSpec(top_k=2)))
    np.testing.assert_allclose(np.exp(sm.sampler_log_probs(row, sm.SamplerSpec(top_k=3))),
                               policies.top_k_policy(jax.nn.softmax(row), 3), atol=1e-6)
    with pytest.raises(ValueError, match="ties"):
        sm.SamplerSpec(ties="random")
    assert sm.SamplerSpec.parse("k=3,ties=value") == sm.SamplerSpec(top_k=3, ties="value")


def test_tied_samplers_draw_from_what_they_log():
    """Row 1 of ``TIED_ROWS`` under top-k 3 + top-p 0.8: the position cut samples {1, 3}
    only, the value rule {0, 1, 2, 3, 4}; each draw's logged log-prob is the log of the
    reference distribution, and the draws fit it (chi-square, level ALPHA, N draws)."""
    z = jnp.broadcast_to(jnp.asarray(TIED_ROWS[1], jnp.float32), (N, 7))
    for ties, support in (("position", {1, 3}), ("value", {0, 1, 2, 3, 4})):
        spec = sm.SamplerSpec(top_k=3, top_p=0.8, ties=ties)
        ref = np_sampler_probs(TIED_ROWS[1], top_k=3, top_p=0.8, ties=ties)
        assert set(np.flatnonzero(ref)) == support
        out = sm.sample(jax.random.PRNGKey(7), z, spec)
        tok = np.asarray(out.token)
        np.testing.assert_allclose(out.log_prob, np.log(ref[tok]), atol=1e-6)
        counts = np.bincount(tok, minlength=7)
        assert set(np.flatnonzero(counts)) == support
        assert stats.chisquare(counts[ref > 0], N * ref[ref > 0]).pvalue > ALPHA


# ------------------------------------------------------------ hard mask (issue 27 §2)

MASK_ROWS = np.asarray([[1, 0, 0, 1, 1, 0, 1],    # bans the argmax of every row below
                        [0, 1, 1, 1, 0, 1, 0],
                        [0, 0, 0, 0, 0, 0, 1],    # a single allowed token
                        [1, 1, 1, 1, 1, 1, 1]], bool)
MASK_SPECS = [dict(), dict(temperature=0.7), dict(top_k=2), dict(top_p=0.8), dict(top_k=3, top_p=0.6)]


def test_hard_mask_support_equals_the_mask():
    """The sampler's distribution under a hard mask against a NumPy reference (logits of the
    banned tokens set to -inf, then ``np_sampler_probs``): its support is the mask (no
    top-k / top-p) or a subset of it, never a banned token; greedy takes the argmax among the
    allowed tokens; the sampled tokens are allowed ones."""
    z = np.stack([TIED_ROWS[1], TIED_ROWS[2], TIED_ROWS[1], TIED_ROWS[0]])
    assert all(not MASK_ROWS[i, np.argmax(z[i])] for i in range(2))
    masked_z = np.where(MASK_ROWS, z, -np.inf)
    for spec_kw in MASK_SPECS:
        got = np.exp(np.asarray(sm.sampler_log_probs(jnp.asarray(z, jnp.float32),
                                                     sm.SamplerSpec(**spec_kw), jnp.asarray(MASK_ROWS)), np.float64))
        ref = np.stack([np_sampler_probs(row, **spec_kw) for row in masked_z])
        np.testing.assert_array_equal(got > 0, ref > 0, err_msg=f"{spec_kw}")
        np.testing.assert_allclose(got, ref, atol=1e-6, err_msg=f"{spec_kw}")
        assert not np.any(got[~MASK_ROWS] > 0)
        if not spec_kw.get("top_k") and spec_kw.get("top_p", 1.0) == 1.0:
            np.testing.assert_array_equal(got > 0, MASK_ROWS)
    greedy = np.exp(np.asarray(sm.sampler_log_probs(jnp.asarray(z, jnp.float32), sm.SamplerSpec(greedy=True),
                                                    jnp.asarray(MASK_ROWS))))
    np.testing.assert_array_equal(np.argmax(greedy, -1), np.argmax(masked_z, -1))
    np.testing.assert_array_equal(greedy.max(-1), 1.0)
    out = sm.sample(jax.random.PRNGKey(11), jnp.broadcast_to(jnp.asarray(z, jnp.float32), (256, 4, 7)),
                    sm.SamplerSpec(), jnp.broadcast_to(jnp.asarray(MASK_ROWS), (256, 4, 7)))
    tok = np.asarray(out.token)
    assert np.all(MASK_ROWS[np.arange(4), tok])
    assert {int(t) for t in tok[:, 1]} == set(np.flatnonzero(MASK_ROWS[1]))  # P(miss) <= 4 (5/6)^256 < 1e-19
