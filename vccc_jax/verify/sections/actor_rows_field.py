"""Issue 29 rows of the actor table, exactly, in float64: the published definitions at large
ratios (the aggregate is capped, not the token), the rows from verl's policy-loss registry
against the gradients of verl's losses, and AReaL's interpolated proximal policy (A-3PO).

Rows (docs/method.md "Actor corrections", A3-A5, A9-A12, A8):

- A3-A5, A9: sequence / batch rows at large ratios = the published definitions: one
  sequence log r = [30, -29, 0] (A = -1): seq_tis min(e^1, 2) = 2, topr min(e^1, 1) = 1, gspo
  e^(1/3) (GSPO: s = exp(mean log r)); [30, -29.5, 0]: seq_mis e^0.5 (verl
  ``rollout_corr_helper``: log R = sum of the raw log-ratios, then clamp(+-20)); M2PO on 500
  tokens N(0, 0.05^2) + one at log r = 25, tau = 1: the mask is AReaL's
  (``_get_m2po_loss_mask``: suffix means of the descending (log r)^2), the 25 dropped;
- A10: the ``geo_mean`` row = |y| / Abar x (-d loss / d log pi_t) of verl's GMPO loss
  -Abar exp(mean_t m_t) written here from ``compute_policy_loss_geo_mean``;
- A11: the ``sapo`` row = -d loss / d log pi_t / A_t of SAPO's -f(r) A, f(r) = (4 / tau)
  sigmoid(tau (r - 1));
- A12: DPPO-TV in probabilities: mu w = min(pi, c mu) 1[pi - mu in the band];
- A0: path enumeration = per-state closed form for the rows reading ``log_mu`` (dppo_tv) and
  sapo on a finite-horizon tabular MDP (the new data input's code paths);
- A8: A-3PO at theta = pi_k: the decoupled PPO gradient with AReaL's interpolated pi_prox
  (alpha = (l - 1) / l) is rho A u where rho^(1/l) is inside PPO's clip and 0 elsewhere --
  the total weight is still pi / mu, but the clip, inactive at the update's start with the
  exact proximal, binds on rho^(1/l).

One compiled graph (``fast_jit``) with the library functions as a static argument; keys
``fold_in(ctx.key, 29)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import actor_registry as ar
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.tabular import actor_paths as ap
from vccc_jax.tabular import exact, exact_actor
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, exact_row, pair_row
from vccc_jax.verify.sections.actor_corrections import A, H, S, enumeration_problem

EPS, TAU_M2, LAG = 0.2, 1.0, 3
ROWS_CHECKED = ("dppo_tv", "sapo")
DPPO = {"eps_low": 0.1, "eps_high": 0.1, "clip": 1.5}


def library_fns() -> tuple:
    """The library functions the graph checks, looked up now (the graph's cache key)."""
    return (tuple((n, r) for n, r in ar.ACTOR_CORRECTIONS.items()), ar.second_moment_keep,
            dec.decoupled_policy_loss, exact_actor.correction_coefficients, ap.expected_update)


def _areal_m2po_keep(x):
    """AReaL's M2PO mask in jnp: sort (log r)^2 descending, drop the first k, k = the first
    index whose suffix mean is < tau (else all but the smallest)."""
    m2 = jnp.square(x)
    order = jnp.argsort(-m2)
    srt = m2[order]
    suffix = jnp.cumsum(srt[::-1])[::-1] / jnp.arange(srt.size, 0, -1)
    below = suffix < TAU_M2
    k = jnp.where(jnp.any(below), jnp.argmax(below), srt.size - 1)
    keep_sorted = (jnp.arange(srt.size) >= k).astype(x.dtype)
    return jnp.zeros_like(x).at[order].set(keep_sorted)


def _large_ratios(fns, key):
    """(library, published) for the issue's cases (module docstring)."""
    row = dict(fns[0])
    a = -jnp.ones((3, 1))
    big = jnp.asarray([[30.0], [-29.0], [0.0]])
    big2 = jnp.asarray([[30.0], [-29.5], [0.0]])
    lib = jnp.stack([row["seq_tis"](big, a)[0, 0], row["topr"](big, a)[0, 0],
                     row["gspo"](big, a)[0, 0], row["seq_mis"](big2, a)[0, 0]])
    pub = jnp.stack([jnp.minimum(jnp.exp(jnp.clip(jnp.sum(big), -20.0, 20.0)), 2.0),
                     jnp.minimum(jnp.exp(jnp.sum(big)), 1.0), jnp.exp(jnp.mean(big)),
                     jnp.exp(jnp.sum(big2))])
    x = jnp.concatenate([0.05 * jax.random.normal(key, (500,)), jnp.asarray([25.0])])
    keep = fns[1](x, TAU_M2)
    return jnp.concatenate([lib, keep]), jnp.concatenate([pub, _areal_m2po_keep(x)]), keep[-1]


def _loss_gradients(fns, key):
    """GMPO and SAPO rows vs the gradients of their losses; DPPO-TV in probabilities."""
    row = dict(fns[0])
    k1, k2, k3, k4 = jax.random.split(key, 4)
    T, B = 6, 4
    lmu = jax.nn.log_softmax(jax.random.normal(k1, (T, B, 5)), -1)[..., 0]
    lpi = lmu + 0.6 * jax.random.normal(k2, (T, B))
    mask = jnp.broadcast_to((jnp.arange(T) % 4 != 2)[:, None], (T, B))
    adv_seq = jnp.asarray([1.5, -0.7, 0.9, -2.0])
    adv = jnp.broadcast_to(adv_seq, (T, B))
    n = jnp.sum(mask, axis=0)
    lo, hi = 0.3, 0.4

    def gmpo_loss(lp):  # verl compute_policy_loss_geo_mean, one sequence per column
        neg_kl = lp - lmu
        sgn = jnp.sign(adv)
        m = sgn * jnp.minimum(sgn * neg_kl, sgn * jnp.clip(neg_kl, -lo, hi))
        ratio = jnp.exp(jnp.sum(jnp.where(mask, m, 0.0), 0) / n)
        return jnp.sum(-adv_seq * ratio)

    g = -jax.grad(gmpo_loss)(lpi) * n[None] / adv_seq[None]
    w_g = row["geo_mean"](lpi - lmu, adv, mask=mask, eps_low=lo, eps_high=hi)
    gmpo = jnp.stack([jnp.where(mask, w_g, 0.0), jnp.where(mask, g, 0.0)])
    gmpo_clipped = jnp.mean(jnp.where(mask, (w_g == 0).astype(lpi.dtype), 0.0))
    tau_pos, tau_neg = 1.0, 1.05
    a_tok = jax.random.normal(k3, (T, B))

    def sapo_loss(lp):
        r = jnp.exp(lp - lmu)
        tau = jnp.where(a_tok > 0, tau_pos, tau_neg)
        return jnp.sum(-jax.nn.sigmoid(tau * (r - 1.0)) * (4.0 / tau) * a_tok)

    sapo = jnp.stack([row["sapo"](lpi - lmu, a_tok), -jax.grad(sapo_loss)(lpi) / a_tok])
    # DPPO-TV on per-state tables: mu w = min(pi, c mu) 1[-eps_low <= pi - mu <= eps_high by sign]
    pi = jax.nn.softmax(jax.random.normal(k4, (8, 4)), -1)
    mu = jax.nn.softmax(jnp.log(pi) + 0.8 * jax.random.normal(k1, (8, 4)), -1)
    a_sa = jax.random.normal(k2, (8, 4))
    w_d = row["dppo_tv"](jnp.log(pi) - jnp.log(mu), a_sa, log_mu=jnp.log(mu), **DPPO)
    band = jnp.where(a_sa > 0, pi - mu <= DPPO["eps_high"], pi - mu >= -DPPO["eps_low"])
    dppo = jnp.stack([mu * w_d, jnp.minimum(pi, DPPO["clip"] * mu) * band])
    return gmpo, gmpo_clipped, sapo, dppo, 1.0 - jnp.mean(band)


def _enumeration(fns, key):
    """Tabular (H = 3) path enumeration vs the per-state closed forms (the token truth reads
    ``log_mu`` through the same ``correction_coefficients``)."""
    corr, expected_update = fns[3], fns[4]
    mdp, pi, mus, vw, paths, crit_t, adv, d_lt = enumeration_problem(key)
    adv_sas = (mdp.R[None] + mdp.gamma * (1.0 - mdp.terminal)[None, None, None] * crit_t[1:, None, None]
               - crit_t[:H, :, None, None])
    errs = []
    for name in ROWS_CHECKED:
        params = DPPO if name == "dppo_tv" else {}
        enum = expected_update(paths, adv, vw, correction=name, params=params, num_ids=S,
                               num_actions=A)
        c = corr(jnp.log(pi)[None, None], jnp.log(mus)[:, None], adv_sas[None], correction=name,
                 params=params, next_prob=mdp.P[None, None])
        errs.append(jnp.max(jnp.abs(enum - jnp.einsum("l,lts,ltsa->sa", vw, d_lt, c))))
    return jnp.max(jnp.stack(errs))


def _a3po(fns, key):
    """The decoupled PPO gradient at theta = pi_k with A-3PO's pi_prox vs rho 1[rho^(1/l)
    unclipped] A u (module docstring), on [N, A] tables with one token per (s, a)."""
    dec_loss = fns[2]
    k1, k2, k3 = jax.random.split(key, 3)
    N, nA = 6, 4
    pi = jax.nn.softmax(jax.random.normal(k1, (N, nA)), -1)
    mu = jax.nn.softmax(jnp.log(pi) + 1.0 * jax.random.normal(k2, (N, nA)), -1)
    a_sa = jax.random.normal(k3, (N, nA))
    s_idx, a_idx = jnp.repeat(jnp.arange(N), nA), jnp.tile(jnp.arange(nA), N)
    lp_tok, lmu = jnp.log(pi)[s_idx, a_idx], jnp.log(mu)[s_idx, a_idx]
    adv = a_sa[s_idx, a_idx]
    lags = jnp.full(adv.shape, LAG)
    prox = dec.old_log_probs("interpolated", lmu, log_pi=lp_tok, lags=lags)
    grad = jax.grad(lambda th: dec_loss(jax.nn.log_softmax(th, -1)[s_idx, a_idx], lmu, adv,
                                        route="exact", exact_log_pi_old=prox, kind="ratio",
                                        clip=None, ppo_epsilon=EPS))(jnp.log(pi))
    rho = jnp.exp(lp_tok - lmu)
    r = rho ** (1.0 / LAG)  # pi / pi_prox = (pi / mu)^(1 - alpha), 1 - alpha = 1 / l
    keep = ~(((adv > 0) & (r > 1 + EPS)) | ((adv < 0) & (r < 1 - EPS)))
    u = exact.softmax_score(pi)[s_idx, a_idx]
    closed = -jax.ops.segment_sum((rho * keep * adv)[:, None] * u, s_idx, num_segments=N) / (N * nA)
    return jnp.stack([grad, closed]), 1.0 - jnp.mean(keep)


@functools.partial(fast_jit, static_argnums=(1,))
def _numbers(key, fns) -> dict:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    lib, pub, kept25 = _large_ratios(fns, k1)
    gmpo, gmpo_clipped, sapo, dppo, dppo_out = _loss_gradients(fns, k2)
    a3po, a3po_clipped = _a3po(fns, k4)
    return dict(lib=lib, pub=pub, kept25=kept25, gmpo=gmpo, gmpo_clipped=gmpo_clipped, sapo=sapo,
                dppo=dppo, dppo_out=dppo_out, enum=_enumeration(fns, k3), a3po=a3po,
                a3po_clipped=a3po_clipped)


def field_actor_rows(ctx) -> list[Row]:
    """Issue 29 rows (keys: ``fold_in(ctx.key, 29)``)."""
    with jax.enable_x64(True):
        n = jax.tree_util.tree_map(np.asarray, _numbers(jax.random.fold_in(ctx.key, 29),
                                                         library_fns()))
    rows = [
        pair_row("sequence / batch rows at large ratios = published definitions", "A3-A5, A9", 1,
                 n["lib"], n["pub"], EXACT_TOL,
                 "log r [30, -29, 0]: seq_tis 2, topr 1, gspo e^(1/3); [30, -29.5, 0]: seq_mis "
                 f"e^0.5; M2PO = AReaL's mask, log r = 25 kept: {float(n['kept25']):g}"),
        pair_row("GMPO (verl geo_mean): row = -|y|/A d loss / d log pi", "A10", 1, *n["gmpo"],
                 EXACT_TOL, f"eps (0.3, 0.4); clipped tokens {float(n['gmpo_clipped']):.0%}"),
        pair_row("SAPO: row = -d loss / d log pi / A (soft gate)", "A11", 1, *n["sapo"], EXACT_TOL,
                 "tau_pos 1, tau_neg 1.05"),
        pair_row("DPPO-TV: mu w = min(pi, c mu) 1[pi - mu inside the TV band]", "A12", 1,
                 *n["dppo"], EXACT_TOL, f"band 0.1, c 1.5; outside {float(n['dppo_out']):.0%}",
                 min_size=1e-2),
        exact_row("new rows: path enumeration = per-state closed form", "A0", 1, float(n["enum"]),
                  EXACT_TOL, f"rows {', '.join(ROWS_CHECKED)}; tabular S={S} A={A} H={H}"),
        pair_row(f"A-3PO at theta = pi_k: rho 1[rho^(1/l) in PPO clip] A u (l = {LAG})", "A8", 1,
                 *n["a3po"], EXACT_TOL, f"epsilon {EPS}; clip binds on "
                 f"{float(n['a3po_clipped']):.0%} of tokens", min_size=1e-3),
    ]
    # the claims need the M2PO outlier dropped, a binding GMPO clip and a binding A-3PO clip
    rows[0].passed = bool(rows[0].passed and float(n["kept25"]) == 0.0)
    rows[1].passed = bool(rows[1].passed and float(n["gmpo_clipped"]) > 0)
    rows[5].passed = bool(rows[5].passed and float(n["a3po_clipped"]) > 0)
    return rows
