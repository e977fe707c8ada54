"""The actor-correction table (issue 21): every row against a NumPy reference written here
(extreme log-ratios, masks and sequence boundaries included), M2PO's finite-batch and
population masks against brute force, and the contract's errors. One compiled graph for all
rows (float64)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators import actor_registry as ar
from vccc_jax.estimators import importance

T, B = 7, 5
PARAMS = {"truncate": {"clip": 1.5}, "mask": {"clip": 1.5}, "icepop": {"alpha": 0.6, "beta": 1.8},
          "seq_tis": {"clip": 1.5}, "seq_mis": {"alpha": 0.3, "beta": 2.5},
          "gspo": {"eps_low": 0.05, "eps_high": 0.1}, "cispo": {"eps_low": 0.3, "eps_high": 0.5},
          "ppo": {"epsilon": 0.2}, "areal": {"cap": 3.0, "max_staleness": 1}, "m2po": {"tau": 0.3},
          "geo_mean": {"eps_low": 0.3, "eps_high": 0.5}, "sapo": {"tau_pos": 1.0, "tau_neg": 2.0},
          "dppo_tv": {"eps_low": 0.1, "eps_high": 0.2, "clip": 1.8},
          "dppo_kl": {"eps_low": 0.05, "eps_high": 0.1, "clip": 1.8}}


# ------------------------------------------------------------------ NumPy references

def np_rho(lr):
    x = np.where(np.isnan(lr) | (lr == np.inf), -np.inf, np.minimum(lr, 20.0))  # invalid: 0
    return np.exp(x)


def np_segments(starts):
    """Per column, the list of (start, stop) token ranges of its sequences."""
    out = []
    for b in range(starts.shape[1]):
        cuts = [0] + [t for t in range(1, starts.shape[0]) if starts[t, b]] + [starts.shape[0]]
        out.append(list(zip(cuts[:-1], cuts[1:])))
    return out


def np_sequence_stats(lr, mask, starts):
    """(log R, |y|) per token: sums over the masked tokens of each token's sequence, of the
    RAW log-ratios (the caller caps the aggregate, issue 29)."""
    invalid = np.isnan(lr) | (lr == np.inf)
    clean = np.where(mask, np.where(invalid, -np.inf, lr), 0.0)
    log_r, n = np.zeros_like(lr), np.zeros_like(lr)
    for b, segs in enumerate(np_segments(starts)):
        for lo, hi in segs:
            with np.errstate(invalid="ignore"):
                log_r[lo:hi, b] = np.sum(clean[lo:hi, b])
            n[lo:hi, b] = np.sum(mask[lo:hi, b])
    return log_r, n


def np_keep(x, adv, lo, hi):
    return ~(((adv > 0) & (x > 1 + hi)) | ((adv < 0) & (x < 1 - lo)))


def np_m2po_keep(lr, mask, tau):
    """Greedy: drop the largest (log r)^2 of the raw log-ratio (ties: the highest flat index)
    until the kept mean is <= tau; if that empties the batch, keep its smallest (AReaL)."""
    x2 = np.where(np.isnan(lr), np.inf, np.square(lr)).reshape(-1)
    x2 = np.where(np.isfinite(x2), x2, np.inf)
    kept = [i for i in range(x2.size) if mask.reshape(-1)[i]]
    on = list(kept)
    while kept and np.mean(x2[kept]) > tau:
        worst = max(kept, key=lambda i: (x2[i], i))
        kept.remove(worst)
    if on and not kept:
        kept = [min(on, key=lambda i: (x2[i], i))]
    keep = np.zeros(x2.size)
    keep[kept] = 1.0
    return keep.reshape(lr.shape)


def np_gmpo(lr, adv, mask, starts, lo, hi):
    """GMPO (verl geo_mean): per sequence S = exp(mean over action tokens of m_t), m_t =
    sgn(A) min(sgn(A) l, sgn(A) clip(l, -lo, hi)) (0 where A = 0); a NaN / +inf token counts
    as l = -inf (weight 0); w = S where the token's own clip lets the gradient through."""
    lr = np.where(np.isnan(lr) | (lr == np.inf), -np.inf, lr)
    with np.errstate(invalid="ignore"):
        m = np.where(adv > 0, np.minimum(lr, np.clip(lr, -lo, hi)),
                     np.where(adv < 0, np.maximum(lr, np.clip(lr, -lo, hi)), 0.0))
    s = np.zeros_like(lr)
    for b, segs in enumerate(np_segments(starts)):
        for a, z in segs:
            on = mask[a:z, b]
            mean = np.mean(m[a:z, b][on]) if on.any() else 0.0
            s[a:z, b] = np.exp(min(mean, 20.0))
    clipped = ((adv > 0) & (lr > hi)) | ((adv < 0) & (lr < -lo))
    return np.where(clipped, 0.0, s)


def np_dppo(kind, lr, adv, log_mu, lo, hi, c):
    """DPPO-Binary-TV / -KL (verl dppo_tv / dppo_kl) with p = mu e^{log r}, p_old = mu."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        p_old, p = np.exp(log_mu), np.exp(log_mu + lr)
        if kind == "tv":
            valid = np.where(adv > 0, p - p_old <= hi, p - p_old >= -lo)
        else:
            kl = p_old * (log_mu - (log_mu + lr)) + (1 - p_old) * np.log(
                (1 - p_old + 1e-8) / (1 - p + 1e-8))
            valid = np.where(adv > 0, (kl <= hi) | (p <= p_old), (kl <= lo) | (p >= p_old))
    return np.minimum(np_rho(lr), c) * valid


def np_reference(name, lr, adv, mask, starts, lags, log_mu):
    p = PARAMS.get(name, {})
    rho = np_rho(lr)
    log_r, n = np_sequence_stats(lr, mask, starts)
    big_r = np.exp(np.minimum(log_r, 20.0))
    if name == "none":
        w = np.ones_like(lr)
    elif name == "ratio":
        w = rho
    elif name == "truncate":
        w = np.minimum(rho, p["clip"])
    elif name == "mask":
        w = np.where((rho >= 1 / p["clip"]) & (rho <= p["clip"]), rho, 0.0)
    elif name == "icepop":
        w = np.where((rho >= p["alpha"]) & (rho <= p["beta"]), rho, 0.0)
    elif name == "seq_tis":
        w = np.minimum(big_r, p["clip"])
    elif name == "seq_mis":
        w = np.where((big_r >= p["alpha"]) & (big_r <= p["beta"]), big_r, 0.0)
    elif name == "gspo":
        s = np.exp(np.minimum(np.where(n > 0, log_r / np.maximum(n, 1), 0.0), 20.0))
        w = s * np_keep(s, adv, p["eps_low"], p["eps_high"])
    elif name == "topr":
        w = np.where(adv >= 0, 1.0, np.minimum(big_r, 1.0))
    elif name == "topr_token":
        w = np.where(adv >= 0, 1.0, np.minimum(rho, 1.0))
    elif name == "cispo":
        w = np.clip(rho, 1 - p["eps_low"], 1 + p["eps_high"])
    elif name == "ppo":
        w = rho * np_keep(rho, adv, p["epsilon"], p["epsilon"])
    elif name == "areal":
        w = np.where((rho <= p["cap"]) & (lags <= p["max_staleness"]), rho, 0.0)
    elif name == "m2po":
        w = rho * np_m2po_keep(lr, mask, p["tau"])
    elif name == "geo_mean":
        w = np_gmpo(lr, adv, mask, starts, p["eps_low"], p["eps_high"])
    elif name == "sapo":
        x = np.where(adv > 0, p["tau_pos"], p["tau_neg"]) * (rho - 1.0)
        with np.errstate(over="ignore"):
            w = 4.0 * rho / (1.0 + np.exp(-x)) / (1.0 + np.exp(x))
    elif name in ("dppo_tv", "dppo_kl"):
        w = np_dppo(name[-2:], lr, adv, log_mu, p["eps_low"], p["eps_high"], p["clip"])
    else:
        raise AssertionError(name)
    return np.where(mask, w, 0.0)


# ------------------------------------------------------------------ one graph, all rows

NAMES = tuple(ar.ACTOR_CORRECTIONS)


@functools.partial(jax.jit, static_argnums=(0,))
def _all_rows(names, lr, adv, mask, starts, lags, log_mu):
    out = {}
    for name in names:
        row = ar.get_actor_correction(name)
        data = {k: v for k, v in (("starts", starts), ("lags", lags), ("log_mu", log_mu))
                if k in row.data}
        out[name] = row(lr, adv, mask=mask, **PARAMS.get(name, {}), **data)
    return out


def _inputs(seed):
    rng = np.random.default_rng(seed)
    lr = 0.8 * rng.normal(size=(T, B))
    lr[1, 0], lr[2, 1], lr[3, 2], lr[4, 3] = 30.0, -np.inf, np.inf, np.nan  # overflow / support
    adv = rng.normal(size=(T, B))
    adv[0, 4] = 0.0
    mask = rng.uniform(size=(T, B)) > 0.2
    mask[:, 3] = False  # a column with no action token (GSPO's |y| = 0)
    starts = rng.uniform(size=(T, B)) > 0.7
    lags = rng.integers(0, 3, size=(T, B))
    log_mu = np.log(rng.uniform(0.05, 0.95, size=(T, B)))
    return lr, adv, mask, starts, lags, log_mu


@pytest.fixture(scope="module")
def rows_and_refs():
    with jax.enable_x64(True):
        out = []
        for seed in (0, 1):
            lr, adv, mask, starts, lags, log_mu = _inputs(seed)
            got = jax.device_get(_all_rows(NAMES, jnp.asarray(lr), jnp.asarray(adv), jnp.asarray(mask),
                                           jnp.asarray(starts), jnp.asarray(lags), jnp.asarray(log_mu)))
            out.append((got, {n: np_reference(n, lr, adv, mask, starts, lags, log_mu)
                              for n in NAMES}))
        return out


@pytest.mark.parametrize("name", NAMES)
def test_row_matches_numpy_reference(rows_and_refs, name):
    for got, ref in rows_and_refs:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-12, atol=1e-12, err_msg=name)
        assert np.all(np.isfinite(got[name]))


def test_rows_see_their_inputs(rows_and_refs):
    """Guard against a vacuous comparison: the rows differ where their definitions do."""
    got, _ = rows_and_refs[0]
    assert not np.allclose(got["truncate"], got["ratio"])
    assert not np.allclose(got["seq_tis"], got["truncate"])
    assert not np.allclose(got["m2po"], got["ratio"])  # tau binds
    assert not np.allclose(got["areal"], got["ratio"])
    for name in ("geo_mean", "dppo_tv", "dppo_kl"):  # their clip / band binds somewhere
        assert np.any((got[name] == 0) & _inputs(0)[2]), name
    assert not np.allclose(got["sapo"], 1.0)
    # sequence rows are constant along a sequence (for one advantage sign)
    segs = np_segments(_inputs(0)[3])
    mask = _inputs(0)[2]
    for b, col in enumerate(segs):
        for lo, hi in col:
            vals = got["seq_tis"][lo:hi, b][mask[lo:hi, b]]
            assert np.ptp(vals) == 0 if vals.size else True


def test_m2po_population_threshold_matches_brute_force():
    rng = np.random.default_rng(3)
    lr = rng.normal(size=(40,)) * np.where(np.arange(40) < 5, 3.0, 0.5)
    p = rng.uniform(size=(40,))
    tau = 0.2
    with jax.enable_x64(True):
        kappa, frac = ar.second_moment_threshold(jnp.asarray(lr), jnp.asarray(p), tau)
        keep = np.asarray(ar.threshold_keep(jnp.asarray(lr), kappa, frac))
    x2 = lr ** 2
    order = np.argsort(x2)
    mass = moment = 0.0
    ref = np.zeros(40)
    for i in order:  # admit atoms in order of x2 while the kept mean stays <= tau
        if moment + p[i] * x2[i] <= tau * (mass + p[i]):
            ref[i], mass, moment = 1.0, mass + p[i], moment + p[i] * x2[i]
        else:
            ref[i] = (tau * mass - moment) / (p[i] * (x2[i] - tau))
            break
    np.testing.assert_allclose(keep, ref, atol=1e-12)
    assert 0 < ref.sum() < 40
    np.testing.assert_allclose(np.sum(p * keep * x2), tau * np.sum(p * keep), rtol=1e-12)
    # not binding: nothing dropped
    with jax.enable_x64(True):
        k2, f2 = ar.second_moment_threshold(jnp.asarray(lr), jnp.asarray(p), 100.0)
    assert np.isinf(float(k2)) and float(f2) == 1.0


def test_sequence_sum_with_starts():
    x = np.arange(1.0, 7.0).reshape(6, 1) * np.ones((1, 2))
    starts = np.zeros((6, 2), bool)
    starts[3, 0] = True
    got = np.asarray(ar.sequence_sum(jnp.asarray(x), jnp.asarray(starts)))
    np.testing.assert_array_equal(got[:, 0], [6, 6, 6, 15, 15, 15])
    np.testing.assert_array_equal(got[:, 1], [21] * 6)


def test_contract_errors_name_the_argument():
    lr = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match="unknown.*'gamma'"):
        ar.get_actor_correction("icepop")(lr, lr, gamma=1.0)
    with pytest.raises(ValueError, match="beta must be >= alpha"):
        ar.get_actor_correction("icepop")(lr, lr, alpha=2.0, beta=1.0)
    with pytest.raises(ValueError, match="clip must be >= 1"):
        ar.get_actor_correction("mask")(lr, lr, clip=0.5)
    with pytest.raises(ValueError, match="data inputs"):
        ar.get_actor_correction("truncate")(lr, lr, starts=lr > 0)
    with pytest.raises(ValueError, match="lags"):
        ar.get_actor_correction("areal")(lr, lr, max_staleness=2)
    with pytest.raises(ValueError, match="must be one of"):
        ar.get_actor_correction("nope")
    with pytest.raises(ValueError, match="already registered"):
        ar.register_actor_correction(ar.get_actor_correction("ratio"))
    assert ar.get_actor_correction("tis").name == "truncate"
    assert ar.WEIGHT_KIND_ROWS == importance.WEIGHT_KINDS  # the first rows of the table


# ------------------------------------------- issue 29: cap the aggregate, not the token

def _published_sequence_rows(lr, adv):
    """One sequence (all tokens actions), the published definitions: verl
    ``rollout_corr_helper.compute_rollout_correction_weights`` level=sequence (log R = sum of
    the raw log-ratios, then clamp(log R, -20, 20)); TOPR (Le Roux et al. 2025): min(R, 1) on
    a negative advantage; GSPO (Zheng et al. 2025, Eq 7): s = exp(mean_t log r_t), its
    gradient kept unless the clip binds (A < 0: s < 1 - eps_low)."""
    log_r = np.clip(np.sum(lr), -20.0, 20.0)
    big_r = np.exp(log_r)
    s = np.exp(np.mean(lr))
    return dict(seq_tis=min(big_r, 2.0), topr=min(big_r, 1.0) if adv < 0 else 1.0,
                gspo=s if not (adv < 0 and s < 1 - 3e-4) else 0.0,
                seq_mis=big_r if 0.5 <= big_r <= 2.0 else 0.0)


@pytest.mark.parametrize("lr,name,value", [
    ((30.0, -29.0, 0.0), "seq_tis", 2.0),              # min(e^1, 2); the token cap gave 1.23e-4
    ((30.0, -29.0, 0.0), "topr", 1.0),                 # min(e^1, 1); the token cap gave 1.23e-4
    ((30.0, -29.0, 0.0), "gspo", np.exp(1.0 / 3.0)),   # 1.396; the token cap gave 0
    ((30.0, -29.5, 0.0), "seq_mis", np.exp(0.5)),      # 1.649 in [0.5, 2]; the token cap gave 0
])
def test_sequence_rows_cap_the_aggregate_not_the_token(lr, name, value):
    """Issue 29: one token at log r = 30 and one at -29 make log R = 1 (a per-token cap at +20
    made it -9). Defaults of each row; A = -1 on every token."""
    ref = _published_sequence_rows(np.asarray(lr), -1.0)[name]
    assert ref == pytest.approx(value, rel=1e-12)
    with jax.enable_x64(True):
        x = jnp.asarray(lr)[:, None]
        w = np.asarray(ar.get_actor_correction(name)(x, -jnp.ones_like(x)))[:, 0]
    np.testing.assert_allclose(w, ref, rtol=1e-12)


def _areal_m2po_keep(lr, tau):
    """AReaL ``trainer/ppo/actor.py::_get_m2po_loss_mask`` in NumPy: sort (log r)^2
    descending, drop the first k where k is the first index whose suffix mean is < tau; if
    none is, drop all but the last (the smallest)."""
    m2 = np.square(lr)
    order = np.argsort(-m2, kind="stable")
    srt = m2[order]
    suffix = np.cumsum(srt[::-1])[::-1] / np.arange(srt.size, 0, -1)
    below = np.nonzero(suffix < tau)[0]
    k = below[0] if below.size else srt.size - 1
    keep = np.ones(srt.size)
    keep[:k] = 0.0
    out = np.zeros(srt.size)
    out[order] = keep
    return out


def test_m2po_squares_the_raw_log_ratio():
    """500 tokens at log r ~ N(0, 0.05) and one at log r = 25, tau = 1: (log r)^2 = 625 is the
    largest, so M2PO drops it (batch mean ~1.25 > 1); squaring the guard's 20 (400: batch
    mean ~0.80 <= 1) kept it with w = e^20 = 4.85e8."""
    rng = np.random.default_rng(29)
    lr = np.concatenate([rng.normal(0.0, 0.05, 500), [25.0]])
    ref_keep = _areal_m2po_keep(lr, 1.0)
    assert ref_keep[-1] == 0.0 and ref_keep[:-1].sum() == 500
    with jax.enable_x64(True):
        w = np.asarray(ar.get_actor_correction("m2po")(jnp.asarray(lr), jnp.ones(501), tau=1.0))
    np.testing.assert_allclose(w, ref_keep * np.exp(lr), rtol=1e-12)


def test_m2po_keeps_the_smallest_when_every_token_exceeds_tau():
    """Every (log r)^2 > tau = 1: AReaL keeps the single smallest token (here log r = -1.5)
    instead of dropping the whole batch. Masked tokens never count."""
    lr = np.array([2.0, -1.5, 3.0, 0.1])
    mask = np.array([True, True, True, False])
    ref = _areal_m2po_keep(lr[:3], 1.0)
    np.testing.assert_array_equal(ref, [0.0, 1.0, 0.0])
    with jax.enable_x64(True):
        w = np.asarray(ar.get_actor_correction("m2po")(jnp.asarray(lr), jnp.ones(4),
                                                      mask=jnp.asarray(mask), tau=1.0))
    np.testing.assert_allclose(w, [0.0, np.exp(-1.5), 0.0, 0.0], rtol=1e-12)


def test_m2po_matches_areal_rule_off_ties():
    """Random batches with no exact tie at tau: our mask (kept mean <= tau, keep >= 1) is
    AReaL's (suffix mean < tau, keep >= 1), token for token."""
    rng = np.random.default_rng(7)
    lr = rng.normal(0.0, 1.0, (6, 40)) * rng.uniform(0.1, 3.0, (6, 1))
    with jax.enable_x64(True):
        got = np.stack([np.asarray(ar.second_moment_keep(jnp.asarray(x), 0.5)) for x in lr])
    ref = np.stack([_areal_m2po_keep(x, 0.5) for x in lr])
    np.testing.assert_array_equal(got, ref)
    assert 0 < ref.sum() < ref.size


def test_float32_sequence_overflow_is_the_guard_not_invalid():
    """A finite float32 sum past the dtype (3e38 + 3e38 = inf) is the overflow guard (log R ->
    20, R = e^20), not invalid data (weight 0)."""
    lr = jnp.asarray([[3e38], [3e38], [-1.0]], jnp.float32)
    w = np.asarray(ar.get_actor_correction("seq_tis")(lr, jnp.ones_like(lr), clip=2.0))
    np.testing.assert_array_equal(w[:, 0], [2.0, 2.0, 2.0])
