"""One-step critic targets: exact conditional means against the method's claims, and the
sampled z-score checks (the second half of ``vccc verify``).

Each :class:`TargetSpec` pairs a target (the *library's* estimator, Eq 4/5, 8, 10, Sec 4.2)
with the conditional mean the method claims for it, computed in closed form independently
of any target (:class:`Claims`). A wrong estimator passed in a TargetSpec fails the same
machinery (tests/verify/test_verify.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import exact as ex
from vccc_jax.verify import stats
from vccc_jax.verify.cells import Cells, all_cells, cell_moments, draw, evaluate_joined
from vccc_jax.verify.contracts import INF, OneStepTarget
from vccc_jax.verify.problems import (
    ALPHA,
    CLIP,
    EXACT_TOL,
    MASK_CLIP,
    NUM_VERSIONS,
    Z_CRIT,
    Problem,
    masked_policy,
    maxabs,
    truncated_policy,
)
from vccc_jax.verify.report import Row, failing, worst

Array = chex.Array


class Claims(NamedTuple):
    """Per-state reference quantities computed in closed form, independently of any target."""

    t_pi: Array           # T_pi Vbar
    vbar: Array
    baseline: Array
    z_truncate: Array     # sum_a min(c mu, pi)
    t_truncate: Array     # T_pitilde Vbar, pitilde ∝ min(c mu, pi)
    z_mask: Array         # sum_a pi 1[1/c <= rho <= c]
    t_mask: Array
    z_replay: Array       # sum_k q_k sum_a min(c mu_k, pi)
    t_replay: Array       # T_pibar Vbar, pibar ∝ sum_k q_k min(c mu_k, pi)
    problem: Problem      # the problem (for claims at other thresholds, ``verify.user``)
    mix: Array            # [K, S] the version law of the cells: one-hot (a version) or q_k(s)


def claims(p: Problem, version: int = -1, replay: bool = False) -> Claims:
    """Claims for the cells of behaviour version ``version`` (or of the replay mixture)."""
    mdp, pi, vbar = p.mdp, p.pi, p.vbar
    mu = p.mus[version]
    z_t, pit_t = truncated_policy(pi, mu, CLIP)
    z_m, pit_m = masked_policy(pi, mu, MASK_CLIP)
    m_replay = jnp.einsum("ks,ksa->sa", p.mix, jnp.minimum(CLIP * p.mus, pi[None]))
    z_r = jnp.sum(m_replay, axis=-1)

    def T(pol):
        return ex.bellman_operator(mdp, pol, vbar)

    return Claims(
        t_pi=T(pi), vbar=vbar, baseline=p.baselines[1],
        z_truncate=z_t, t_truncate=T(pit_t), z_mask=z_m, t_mask=T(pit_m),
        z_replay=z_r, t_replay=T(m_replay / z_r[:, None]), problem=p,
        mix=p.mix if replay else jnp.broadcast_to(jax.nn.one_hot(version % NUM_VERSIONS, NUM_VERSIONS,
                                                                 dtype=vbar.dtype)[:, None], p.mix.shape),
    )


class TargetSpec(NamedTuple):
    """A one-step target and the conditional mean the method claims for it.

    ``fn(cells) -> Y`` is elementwise over any shape (library and user targets alike enter
    as a :class:`~vccc_jax.verify.contracts.OneStepTarget`: the registry's one-step
    contract evaluated on the cells); ``claimed(claims) -> [S]``; ``source``: "stale" (the
    stalest version) or "replay" (the mixture of versions); ``must_reject``: the claim is
    false (a negative control the tests must reject); ``clip``: the threshold c of the
    cells' Z(s) fields the target may read (``extras.z``).
    """

    name: str
    equation: str
    fn: Callable[[Cells], Array]
    claimed: Callable[[Claims], Array]
    source: str = "stale"
    must_reject: bool = False
    clip: float = CLIP


def bellman_h(c: Cells) -> Array:
    return ct.bellman_sample(c.rewards, c.discounts, c.next_values)


def default_targets() -> tuple[TargetSpec, ...]:
    """Every one-step target of the estimator core, with its claimed conditional mean.

    Each target is the library function under the one-step contract
    (:class:`~vccc_jax.verify.contracts.OneStepTarget`), exactly as ``vccc verify --target``
    wraps a user's function: the baseline argument reads the named cell field.
    """
    def t_pi(k):
        return k.t_pi

    def clipped_t(k):
        return k.vbar + k.z_truncate * (k.t_truncate - k.vbar)

    def clipped_m(k):
        return k.vbar + k.z_mask * (k.t_mask - k.vbar)

    def lib(fn, clip=INF, baseline="baseline", **kw):
        return OneStepTarget(fn, clip, tuple(kw.items()), baseline)

    return (
        TargetSpec("uncorrected H vs T_pi", "Sec 1.3", lib(ct.uncorrected_target), t_pi, must_reject=True),
        TargetSpec("VCCC, arbitrary b", "Eq 4/5", lib(ct.vccc_target), t_pi),
        TargetSpec("VCCC, b = V^mu (stale)", "Eq 4/5", lib(ct.vccc_target, baseline="baseline_vmu"), t_pi),
        TargetSpec("VCCC, b = b*", "Eq 4/9", lib(ct.vccc_target, baseline="baseline_star"), t_pi),
        TargetSpec("IW-TD (b = Vbar)", "Eq 8", lib(ct.vccc_target, baseline=None), t_pi),
        TargetSpec("clipped, truncate c=2", "Eq 10", lib(ct.clipped_target, CLIP), clipped_t),
        TargetSpec("clipped, mask c=2", "Eq 10", lib(ct.clipped_target, MASK_CLIP, kind="mask"), clipped_m),
        TargetSpec("naive clipped, arbitrary b", "Sec 4.2", lib(ct.naive_clipped_target, CLIP),
                   lambda k: k.z_truncate * k.t_truncate + (1.0 - k.z_truncate) * k.baseline),
        TargetSpec("Z-centred clipped, arbitrary b", "Sec 4.2", lib(ct.centered_clipped_target, CLIP), clipped_t),
        TargetSpec("VCCC over replay mixture", "Eq 6", lib(ct.vccc_target), t_pi, source="replay"),
        TargetSpec("clipped over replay mixture", "Eq 10/6", lib(ct.clipped_target, CLIP),
                   lambda k: k.vbar + k.z_replay * (k.t_replay - k.vbar), source="replay"),
        TargetSpec("uncorrected over replay vs T_pi", "Eq 6", lib(ct.uncorrected_target), t_pi, source="replay",
                   must_reject=True),
    )


class TargetCheck(NamedTuple):
    """Per-problem results of :func:`target_checks`."""

    exact_error: Array  # [n_targets] max over versions and states of |E[Y|s] - claimed(s)|
    z: Array            # [n_targets, S] z-score of the sample mean against the claim
    valid: Array        # [n_targets, S] exact Var > 0 (else no z-score)
    gap: Array          # [n_targets, S] exact mean - claimed (stalest version / replay)
    ncp: Array          # [n_targets, S] N gap^2 / Var: non-centrality of z^2 (for power)
    mean: Array         # [n_targets, K, S] exact E[Y | s] per version (replay targets: the replay's, repeated)
    var: Array          # [n_targets, K, S] exact Var(Y | s), likewise


def target_checks(key: Array, p: Problem, targets: Sequence[TargetSpec], num_samples: int) -> TargetCheck:
    """Exact and sampled checks of one-step targets for one problem.

    Exact: E[Y | s] of ``t.fn`` by enumeration against ``t.claimed``, under every behaviour
    version (source "stale") or the replay mixture. Sampled: draw ``num_samples``
    transitions per state from the stalest version (or the replay mixture), evaluate the
    target on the sampled [S, N] batch, and z-score its mean against the claim using the
    exact variance.
    """
    per_claims = jax.vmap(lambda k: claims(p, k))(jnp.arange(NUM_VERSIONS))
    replay_claims = claims(p, replay=True)
    keys = dict(zip(("stale", "replay"), jax.random.split(key)))
    built, drawn = {}, {}
    out = {f: [] for f in TargetCheck._fields}
    for t in targets:
        if t.clip not in built:  # one set of cells per Z threshold (the same draws for each)
            per_version, replay = all_cells(p, t.clip, t.clip if t.clip >= 1 else MASK_CLIP)
            built[t.clip] = per_version, {"stale": jax.tree_util.tree_map(lambda x: x[-1], per_version),
                                          "replay": replay}
        per_version, sources = built[t.clip]
        replay = sources["replay"]
        if (t.source, t.clip) not in drawn:
            cells = sources[t.source]
            idx = draw(keys[t.source], cells.prob, num_samples)
            drawn[t.source, t.clip] = jax.tree_util.tree_map(lambda x: jnp.take_along_axis(x, idx, axis=-1), cells)
        sample = drawn[t.source, t.clip]
        # one call of the (elementwise) target on the exact cells and the sample, joined
        y, y_sample = evaluate_joined(t.fn, per_version if t.source == "stale" else replay, sample)
        if t.source == "stale":
            means, vars_ = jax.vmap(cell_moments)(per_version, y)
            claimed_all = jax.vmap(t.claimed)(per_claims)
            err = maxabs(means - claimed_all)
            mean, var, claimed = means[-1], vars_[-1], claimed_all[-1]
        else:
            mean, var = cell_moments(replay, y)
            claimed = t.claimed(replay_claims)
            err = maxabs(mean - claimed)
            means, vars_ = (jnp.broadcast_to(x[None], (NUM_VERSIONS,) + x.shape) for x in (mean, var))
        sample_mean = jnp.mean(y_sample, axis=-1)
        ok = ~(var <= 1e-20 * (1.0 + jnp.square(mean)))  # a NaN variance gives a NaN z-score: it fails
        safe_var = jnp.where(ok, var, 1.0)
        out["exact_error"].append(err)
        out["z"].append(jnp.where(ok, (sample_mean - claimed) / jnp.sqrt(safe_var / num_samples), 0.0))
        out["valid"].append(ok)
        out["gap"].append(mean - claimed)
        out["ncp"].append(jnp.where(ok, num_samples * jnp.square(mean - claimed) / safe_var, 0.0))
        out["mean"].append(means)
        out["var"].append(vars_)
    return TargetCheck(**{f: jnp.stack(v) for f, v in out.items()})


# sqrt(ncp) >= sqrt(crit) + Z_POWER guarantees power >= 99.9% (see sampled_rows).
Z_POWER = 3.090
MAX_STATES_PADDED = 64


def sampled_rows(
    targets: Sequence[TargetSpec], z: np.ndarray, valid: np.ndarray, gap: np.ndarray, ncp: np.ndarray,
    num_samples: int,
) -> list[Row]:
    """Turn z-scores [B, n_targets, S] into one row per target.

    Correct targets pass when the fraction of |z| > 3.29 is within the binomial 99.9% upper
    bound for p = 0.001 and a KS test against N(0, 1) does not reject at the 0.1% level.

    A ``must_reject`` target (a false claim) passes when the KS test rejects at 0.1% and the
    per-MDP chi-square test (sum_s z_s^2 ~ chi2(S) under the claim) rejects at 0.1% in every
    MDP where it has power >= 99.9%. Power is certified from the exact non-centrality
    lambda = sum_s N gap_s^2 / Var_s: the statistic is at least (N(0,1) + sqrt(lambda))^2,
    so sqrt(lambda) >= sqrt(crit) + 3.09 guarantees rejection with probability >= 99.9%.
    """
    rows = []
    p_tail = stats.two_sided_tail(Z_CRIT)
    for j, t in enumerate(targets):
        zj, vj = z[:, j], valid[:, j]
        zz = zj[vj]
        n = int(zz.size)
        frac = float(np.mean(failing(np.abs(zz), Z_CRIT))) if n else 0.0  # a NaN z counts
        bound = stats.binomial_upper(n, p_tail) / max(n, 1)
        D, p = stats.ks_test(zz)
        num_mdps = int(np.sum(np.any(vj, axis=-1)))
        if t.must_reject:
            chi = np.sum(np.where(vj, zj**2, 0.0), axis=-1)
            df = np.sum(vj, axis=-1)
            has = df > 0
            pvals = np.ones_like(chi)
            pvals[has] = stats.chi2_sf(chi[has], df[has])
            rejected = pvals < ALPHA
            lam = np.sum(ncp[:, j], axis=-1)
            powered = has & (np.sqrt(lam) >= np.sqrt(stats.chi2_isf(ALPHA, np.maximum(df, 1))) + Z_POWER)
            passed = bool(np.all(rejected[powered]) and powered.any() and p < ALPHA)
            detail = (
                f"must be REJECTED: chi2 rejects at 0.1% in {int(rejected.sum())}/{int(has.sum())} MDPs, "
                f"incl. {int((rejected & powered).sum())}/{int(powered.sum())} with certified power >= 99.9%; "
                f"KS D={D:.3f} p={p:.1e}; max |E[Y|s] - claim| = {np.max(np.abs(gap[:, j])):.2f}"
            )
        else:
            passed = bool(frac <= bound and p > ALPHA)
            detail = f"{n} z-scores, N={num_samples}/state; KS D={D:.4f} p={p:.3f} (pass: p > 0.001)"
        rows.append(Row(t.name, t.equation, "sampled", num_mdps, frac, bound, passed, detail))
    return rows


def _pad_states(arrays):
    """Pad the trailing state axis (zeros / False) so that groups of different S concatenate."""
    return tuple(
        np.pad(x, ((0, 0), (0, 0), (0, MAX_STATES_PADDED - x.shape[-1])), constant_values=np.zeros((), x.dtype))
        for x in arrays
    )


def target_rows(targets: Sequence[TargetSpec], results: Sequence[TargetCheck], num_samples: int) -> list[Row]:
    """Rows of the exact and sampled target checks from per-group :class:`TargetCheck` results."""
    errs = np.concatenate([r.exact_error for r in results])
    rows = []
    for j, t in enumerate(targets):
        e = errs[:, j]
        if t.must_reject:
            rows.append(Row(f"{t.name} (mean != claim)", t.equation, "exact", len(e), float(np.min(e)), 1e-6,
                            bool(np.min(e) > 1e-6), "negative control: smallest violation over MDPs must be > tol"))
        else:
            rows.append(Row(f"{t.name}: mean = claim", t.equation, "exact", len(e), worst(e), EXACT_TOL,
                            not failing(e, EXACT_TOL).any()))
    padded = [_pad_states((r.z, r.valid, r.gap, r.ncp)) for r in results]
    rows += sampled_rows(targets, *(np.concatenate(x) for x in zip(*padded)), num_samples)
    return rows
