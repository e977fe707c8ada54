"""``vccc verify --target`` for a one-step critic target: the library rows, plus what a user needs.

A user's target enters as a :class:`~vccc_jax.verify.targets.TargetSpec` whose ``fn`` is
the :class:`~vccc_jax.verify.contracts.OneStepTarget` of their function (exactly how the
built-in targets are built, :func:`targets.default_targets`), so the mean and sampled rows
come from :func:`targets.target_checks` / :func:`targets.target_rows` on the same problems
and keys as ``vccc verify``. Two specs per target: the cells of every behaviour version
(exact) with samples from the stalest, and the replay mixture (Eq 6).

Added in the same compiled graph (:func:`user_extras`), per problem:

- the fixed point V* of the expected update, from the exact mean's affine map in Vbar
  (S + 1 evaluations of the target on the enumerated cells), for the stalest version and
  the replay, against the claimed V^pi / V^pitilde (:func:`claimed.claimed_value`);
- Var(Y | s) (must be finite), and the gradient of sum(w Y) with respect to every input
  field (:func:`diagnose.gradient_row`: a warning, or with ``loss_ready`` a failure, when it
  reaches the values, ratios or baselines; targets are constants, docs/layout.md);
- the diagnosis atoms (:func:`mean_atoms`): the exact means of the known estimator
  families, in closed form, and their fixed points; :mod:`.diagnose` matches the user's
  bias against them on the host.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact as ex
from vccc_jax.verify import diagnose
from vccc_jax.verify.cells import Cells, all_cells
from vccc_jax.verify.claimed import ClaimedMean, behaviour_mass, claimed_value, clipped_mean
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.contracts import INF, Claim, OneStepTarget
from vccc_jax.verify.problems import EXACT_TOL, MASK_CLIP, NUM_VERSIONS, Problem, maxabs
from vccc_jax.verify.report import Row
from vccc_jax.verify.sections.lqr import lqr_user_rows
from vccc_jax.verify.targets import TargetCheck, TargetSpec, target_checks, target_rows

Array = chex.Array

# Thresholds at which the diagnosis tries clipping / masking / the naive baseline.
GRID = (1.0, 1.1, 1.2, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 10.0)
GRAD_FIELDS = ("rewards", "discounts", "values", "next_values", "log_rhos", "baseline", "baseline_vmu",
               "baseline_star", "z_truncate", "z_mask")
GRAD_NAMES = tuple("rewards discounts values next_values log_rhos baseline baseline_vmu baseline_star z z_mask".split())
FIXED_TOL = 1e-8   # a linear solve: round-off times the condition number of I - M


def _kinds() -> tuple[tuple[str, str], ...]:
    return (("truncate", "clipping to pitilde ∝ min(c mu, pi)"), ("mask", "masking to pitilde ∝ pi 1[1/c <= rho <= c]"))


def atom_labels() -> list[str]:
    """Labels of :func:`mean_atoms`, in order."""
    labels = ["the uncorrected target: T_mu Vbar, the behaviour backup (over the replay: the replay "
              "mixture's T_mubar Vbar)"]
    for _, text in _kinds():
        labels += [f"{text} at c={c:g} (Eq 10)" for c in GRID]
    for kind, _ in _kinds():
        labels += [f"the naive-baseline leak (1 - Z) b: H + (w - 1)(H - b) with w = {kind}(rho, c={c:g}) (Sec 4.2)"
                   for c in GRID]
    labels += ["rho used where rho - 1 belongs: H + rho (H - b), mean T_mu Vbar + T_pi Vbar - b (Eq 4)",
               "rho used where rho - 1 belongs, b = Vbar: H + rho delta, mean T_mu Vbar + T_pi Vbar - Vbar (Eq 8)",
               "an off-by-one bootstrap: Vbar(s_t) used where Vbar(s_{t+1}) belongs (ratio weight)"]
    for kind, _ in _kinds():
        labels += [f"an off-by-one bootstrap: Vbar(s_t) used where Vbar(s_{{t+1}}) belongs ({kind} c={c:g})"
                   for c in GRID]
    return labels


def mean_atoms(p: Problem, mix: Array) -> Array:
    """Exact E[Y | s] of each known estimator family under the version law ``mix``, in closed
    form (order of :func:`atom_labels`; b = the cells' arbitrary baseline). [n_atoms, S]"""
    mdp, vbar, b = p.mdp, p.vbar, p.baselines[1]
    q = ex.q_values(mdp, v=vbar)
    gam = jnp.sum(mdp.P * ex.next_state_discounts(mdp)[None, None, :], axis=-1)          # E[gamma(s') | s, a]
    r = mdp.R if mdp.R.ndim == 3 else mdp.R[:, :, None]
    q_here = jnp.sum(mdp.P * r, axis=-1) + gam * vbar[:, None]                        # bootstrap from s
    beh = behaviour_mass(p, mix, "none", None)
    t_beh, t_pi = jnp.sum(beh * q, -1), jnp.sum(p.pi * q, -1)
    grid = jnp.asarray(GRID, vbar.dtype)
    rows = [t_beh[None]]
    masses = [jax.vmap(lambda c, k=k: behaviour_mass(p, mix, k, c))(grid) for k, _ in _kinds()]  # [G, S, A]
    rows += [jax.vmap(lambda m: clipped_mean(p, m))(m) for m in masses]
    rows += [jnp.sum(m * q[None], -1) + (1.0 - jnp.sum(m, -1)) * b[None] for m in masses]
    rows += [(t_beh + t_pi - b)[None], (t_beh + t_pi - vbar)[None],
             (vbar + jnp.sum(p.pi * (q_here - vbar[:, None]), -1))[None]]
    rows += [vbar[None] + jnp.sum(m * (q_here - vbar[:, None])[None], -1) for m in masses]
    return jnp.concatenate(rows)


TERM_LABELS = ("reward: E_pi[r | s]", "reward: E_mu[r | s]", "bootstrap: E_pi[gamma Vbar(s') | s]",
               "bootstrap: E_mu[gamma Vbar(s') | s]", "bootstrap: E_pi[Vbar(s') | s]", "bootstrap: E_mu[Vbar(s') | s]",
               "baseline: Vbar(s)", "baseline: b(s)")
TERM_GROUPS = (("the reward term", (0, 1)), ("the bootstrap term", (2, 3, 4, 5)), ("the baseline term", (6, 7)))


def mean_terms(p: Problem, mix: Array) -> Array:
    """The per-state terms a one-step target's mean is built from (:data:`TERM_LABELS`): the
    expected reward and bootstrap (discounted, and undiscounted for a gamma written into the
    target) under pi and under the behaviour law ``mix`` (mu; over the replay, the mixture),
    Vbar and the cells' baseline b. [8, S]"""
    mdp, vbar = p.mdp, p.vbar
    r = mdp.R if mdp.R.ndim == 3 else mdp.R[:, :, None]
    r_sa = jnp.sum(mdp.P * r, axis=-1)
    boot_sa = ex.q_values(mdp, v=vbar) - r_sa
    next_sa = jnp.einsum("sat,t->sa", mdp.P, vbar)
    beh = behaviour_mass(p, mix, "none", None)
    return jnp.stack([jnp.sum(m * x, -1) for x in (r_sa, boot_sa, next_sa) for m in (p.pi, beh)]
                     + [vbar, p.baselines[1]])


class _ClaimsView(NamedTuple):
    """The fields of ``targets.Claims`` that :class:`ClaimedMean` reads."""

    problem: Problem
    mix: Array

    @property
    def t_pi(self):
        return ex.bellman_operator(self.problem.mdp, self.problem.pi, self.problem.vbar)


def affine_fixed_points(mean_of: callable, p: Problem) -> tuple[Array, Array]:
    """Fixed points of V -> mean_of(p with Vbar = V) [..., S] (affine in V): (V* [..., S],
    identified [..., S]); states whose expected update is identically 0 keep V* = 0."""
    return solve_affine(jax.vmap(lambda v: mean_of(p.replace(vbar=v)))(_basis(p)))


def _basis(p: Problem) -> Array:
    """The S + 1 bootstrap vectors 0, e_1, ..., e_S of an affine map. [S + 1, S]"""
    S, dtype = p.vbar.shape[-1], p.vbar.dtype
    return jnp.concatenate([jnp.zeros((1, S), dtype), jnp.eye(S, dtype=dtype)])


def solve_affine(values: Array) -> tuple[Array, Array]:
    """Fixed point of an affine map f(V) = c + M V from its values [S + 1, ..., S] at
    :func:`_basis` (exact for affine maps, indifferent to stop_gradient, unlike a Jacobian)."""
    c, cols = values[0], values[1:]
    S, dtype = c.shape[-1], c.dtype
    M = jnp.moveaxis(cols - c[None], 0, -1)                                           # [..., S_i, S_j]
    eye = jnp.broadcast_to(jnp.eye(S, dtype=dtype), M.shape)
    A = eye - M
    scale = jnp.max(jnp.abs(A), axis=(-2, -1), keepdims=True)[..., 0] + jnp.max(jnp.abs(c), -1, keepdims=True) + 1.0
    ok = jnp.max(jnp.abs(A), axis=-1) > 1e-12 * scale
    A = jnp.where(ok[..., None], A, eye)
    rhs = jnp.where(ok, c, 0.0)
    batch = A.shape[:-2]
    x = jax.vmap(solve_pivoted)(A.reshape((-1, S, S)), rhs.reshape((-1, S)))
    return x.reshape(batch + (S,)), ok


def solve_pivoted(a: Array, b: Array) -> Array:
    """a x = b by Gaussian elimination with partial pivoting, in XLA ops (a [n, n], b [n]).

    Not ``jnp.linalg.solve``: jaxlib 0.10's CPU LU can deadlock when two LU calls run
    concurrently (two independent solves in one graph; see ``tabular.linear``), and not the
    pivot-free ``solve_dominant``: a user's I - M need not be diagonally dominant."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def forward(k, m):
        piv = jnp.argmax(jnp.where(idx >= k, jnp.abs(m[:, k]), -1.0))
        rk, rp = m[k], m[piv]
        m = m.at[k].set(rp).at[piv].set(rk)
        f = jnp.where(idx > k, m[:, k] / m[k, k], 0.0)
        return m - f[:, None] * m[k][None, :]

    m = jax.lax.fori_loop(0, n, forward, jnp.concatenate([a, b[:, None]], axis=1))

    def backward(i, x):
        k = n - 1 - i
        return x.at[k].set((m[k, n] - jnp.dot(m[k, :n], x)) / m[k, k])

    return jax.lax.fori_loop(0, n, backward, jnp.zeros_like(b))


@dataclasses.dataclass(frozen=True)
class UserOneStep:
    """A one-step target to check: its name, contract wrapper and claim."""

    name: str
    target: OneStepTarget
    claim: Claim

    @property
    def zclip(self) -> float:
        return self.claim.c if self.claim.name in ("clipped", "masked") else INF

    def specs(self) -> tuple[TargetSpec, TargetSpec]:
        """(every version, sampled from the stalest; the replay mixture) -- the built-in rows' specs."""
        claimed, eq = ClaimedMean(self.claim), "user"
        return (TargetSpec(self.name, eq, self.target, claimed, "stale", False, self.zclip),
                TargetSpec(f"{self.name} (replay)", eq, self.target, claimed, "replay", False, self.zclip))


class Extras(NamedTuple):
    """Per-problem results of :func:`user_extras` (sources: K versions, then the replay)."""

    means: Array        # [K + 1, S] exact E[Y | s]
    variances: Array    # [K + 1, S]
    claimed: Array      # [K + 1, S]
    fixed: Array        # [2, S] V* (stalest version, replay)
    identified: Array   # [2, S]
    fixed_claim: Array  # [2, S]
    claim_ok: Array     # [2, S] states where the claimed fixed point is defined (Z > 0)
    grads: Array        # [len(GRAD_FIELDS)] max |d sum(w Y) / d field|
    atoms: Array        # [K + 1, n_atoms, S]
    atom_fixed: Array   # [2, n_atoms, S]
    terms: Array        # [K + 1, 8, S] (mean_terms)


def _mixes(p: Problem) -> Array:
    """Version laws [K + 1, K, S]: each version (one-hot), then the replay mixture."""
    eye = jnp.eye(NUM_VERSIONS, dtype=p.vbar.dtype)[:, :, None]
    return jnp.concatenate([jnp.broadcast_to(eye, (NUM_VERSIONS,) + p.mix.shape), p.mix[None]])


def _cells(p: Problem, zclip: float):
    return all_cells(p, zclip, zclip if zclip >= 1 else MASK_CLIP)


class _ClaimParts(NamedTuple):
    claimed: Array
    fixed_claim: Array
    claim_ok: Array


def _claim_parts(p: Problem, claim: Claim) -> _ClaimParts:
    """What depends on the claim only (shared by the targets with that claim)."""
    mixes = _mixes(p)
    last2 = mixes[NUM_VERSIONS - 1:]
    return _ClaimParts(
        claimed=jax.vmap(lambda q: ClaimedMean(claim)(_ClaimsView(p, q)))(mixes),
        fixed_claim=jax.vmap(lambda q: claimed_value(p, q, claim))(last2),
        claim_ok=jax.vmap(lambda q: jnp.sum(behaviour_mass(p, q, claim.weight_kind, claim.c), -1) > 0)(last2))


def _atoms(p: Problem) -> tuple[Array, Array, Array]:
    """The diagnosis atoms (claim-independent): means [K + 1, n, S], fixed points [2, n, S]
    and the mean terms [K + 1, 6, S]."""
    mixes = _mixes(p)
    last2 = mixes[NUM_VERSIONS - 1:]
    return (jax.vmap(lambda q: mean_atoms(p, q))(mixes),
            affine_fixed_points(lambda pv: jax.vmap(lambda m: mean_atoms(pv, m))(last2), p)[0],
            jax.vmap(lambda q: mean_terms(p, q))(mixes))


def problem_checks(key: Array, p: Problem, users: tuple, num_samples: int):
    """Everything for one problem, in one graph: (the built-in target checks, the extras).

    The cells (at the problem's Vbar and at the S + 1 bootstrap vectors of the affine map)
    are built once per Z threshold and the claim's closed forms once per claim, so each
    further target adds only its own evaluations to the graph."""
    specs = tuple(s for u in users for s in u.specs())
    checks = target_checks(key, p, specs, num_samples)
    cells, fp_cells, parts, fp_means, grads = {}, {}, {}, [], []
    for u in users:
        if u.zclip not in cells:
            cells[u.zclip] = _cells(p, u.zclip)
            fp_cells[u.zclip] = jax.vmap(lambda v, z=u.zclip: (lambda pv, rv: (
                jax.tree_util.tree_map(lambda x: x[-1], pv), rv))(*_cells(p.replace(vbar=v), z)))(_basis(p))
        key_ = (u.claim.weight_kind, u.claim.c)
        if key_ not in parts:
            parts[key_] = _claim_parts(p, u.claim)
        stale_fp, replay_fp = fp_cells[u.zclip]
        stale = jax.tree_util.tree_map(lambda x: x[-1], cells[u.zclip][0])
        (y_sf, y_rf), g = _value_and_grads(u.target, stale_fp, replay_fp, stale)
        fp_means.append(jnp.stack([_weighted(stale_fp, y_sf), _weighted(replay_fp, y_rf)], axis=1))
        grads.append(g)
    fixed, identified = solve_affine(jnp.stack(fp_means, axis=1))       # one solve for every target
    atoms, atom_fixed, terms = _atoms(p)
    extras = []
    for j, u in enumerate(users):
        # the exact moments of target_checks: every version (spec 2j), the replay (spec 2j + 1)
        means = jnp.concatenate([checks.mean[2 * j], checks.mean[2 * j + 1][:1]])
        variances = jnp.concatenate([checks.var[2 * j], checks.var[2 * j + 1][:1]])
        k = parts[u.claim.weight_kind, u.claim.c]
        extras.append(Extras(means, variances, k.claimed, fixed[j], identified[j], k.fixed_claim, k.claim_ok,
                             grads[j], atoms, atom_fixed, terms))
    return checks, tuple(extras)


def _weighted(cells: Cells, y: Array) -> Array:
    """E[Y | s] [..., S] of y [..., S, C] under the cells' probabilities."""
    return jnp.sum(cells.prob * jnp.where(cells.prob > 0, y, 0.0), axis=-1)


def _value_and_grads(target, *cell_sets: Cells):
    """The target on the cell sets with one call (``cells.evaluate_joined``), and max |d sum(w Y)
    / d field| per field of GRAD_FIELDS over all of them (must be 0: targets are constants).
    Returns (outputs per set except the ignored last weights, grads)."""
    flat = {f: jnp.concatenate([getattr(c, f).ravel() for c in cell_sets]) for f in Cells._fields}
    w = jnp.cos(jnp.arange(flat["rewards"].size, dtype=flat["rewards"].dtype))

    def loss(x):
        y = target(Cells(**{**flat, **x}))
        return jnp.sum(w * y), y

    (_, y), g = jax.value_and_grad(loss, has_aux=True)({f: flat[f] for f in GRAD_FIELDS})
    out, start = [], 0
    for c in cell_sets:
        out.append(y[start:start + c.rewards.size].reshape(c.rewards.shape))
        start += c.rewards.size
    return out[:-1], jnp.stack([maxabs(g[f]) for f in GRAD_FIELDS])


GRAPH = fast_jit(jax.vmap(problem_checks, in_axes=(0, 0, None, None)), static_argnums=(2, 3))


# ------------------------------------------------------------------------------ rows


def user_reports(users: Sequence[UserOneStep], outs: list, groups, num_samples: int,
                 loss_ready: bool = False) -> list[tuple[list[Row], list[str]]]:
    """(rows, diagnosis lines) per user target, from the per-group graph outputs
    (``loss_ready``: gradient through the target fails its row, else a warning)."""
    names = diagnose.mdp_names(groups)
    checks = [TargetCheck(*o[0]) for o in outs]
    labels = atom_labels()
    out = []
    for j, u in enumerate(users):
        specs = u.specs()
        sub = [TargetCheck(*(x[:, 2 * j:2 * j + 2] for x in c)) for c in checks]
        rows = target_rows(specs, sub, num_samples)
        errs = np.concatenate([c.exact_error for c in sub])  # [B, 2]
        ex_ = [o[1][j] for o in outs]
        fixed_err = np.concatenate([np.max(np.where(np.asarray(e.claim_ok),
                                                    np.abs(np.asarray(e.fixed) - np.asarray(e.fixed_claim)), 0.0),
                                           axis=-1) for e in ex_])  # [B, 2]
        var = np.concatenate([np.max(np.asarray(e.variances), axis=-1) for e in ex_])  # [B, K + 1]
        grads = np.concatenate([np.asarray(e.grads) for e in ex_])  # [B, F]
        rows = _decorate(rows, u, errs, names)
        rows += lqr_user_rows(u.name, u.target, u.claim)   # continuous actions (issue 31)
        for i, src in enumerate(("stalest version", "replay mixture")):
            name = u.name if i == 0 else f"{u.name} (replay)"
            e = fixed_err[:, i]
            rows.append(Row(f"{name}: fixed point = {u.claim.value_label}", "Eq 4-10", "exact", len(e),
                            float(np.max(e)), FIXED_TOL, bool(np.all(e <= FIXED_TOL)),
                            diagnose.failing_mdps(e, FIXED_TOL, names) or "of the expected TD update"))
        ok_var = bool(np.all(np.isfinite(var)))
        rows.append(Row(f"{u.name}: Var(Y|s) finite", "user", "exact", len(var), float(np.max(var)), INF, ok_var,
                        f"median {np.median(var):.3g} over MDPs"))
        row, warnings = diagnose.gradient_row(f"{u.name}: stop_gradient (grad through Y = 0)", len(grads),
                                              np.max(grads, axis=0), GRAD_NAMES, loss_ready)
        rows.append(row)
        diagnosis = _diagnosis(u, ex_, labels, rows, groups) + warnings
        if u.claim.name == "any":
            rows = _as_any(rows, u, diagnosis)
        out.append((rows, diagnosis))
    return out


def _decorate(rows: list[Row], u: UserOneStep, errs: np.ndarray, names) -> list[Row]:
    """Name the exact mean rows after the claim and list the MDPs where they fail."""
    claim_text = "T_pi Vbar" if u.claim.weight_kind == "ratio" else "Vbar + Z (T_pit Vbar - Vbar)"
    exact = [r for r in rows if r.kind == "exact"]
    for i, r in enumerate(exact):
        r.name = r.name.replace(": mean = claim", f": E[Y|s] = {claim_text}")
        r.equation = "Eq 4-10"
        r.detail = diagnose.failing_mdps(errs[:, i], EXACT_TOL, names) or (
            "every behaviour version" if i == 0 else "Eq 6: versions mixed by q_k(s)")
    for r in rows:
        if r.kind == "sampled":
            r.equation = "Eq 4-10"
    return rows


def _diagnosis(u: UserOneStep, ex_: list, labels: list[str], rows: list[Row], groups) -> list[str]:
    """The diagnosis lines: which closed form the bias of the mean matches and the fixed point
    it implies."""
    lines = []
    bias = np.concatenate([(np.asarray(e.means) - np.asarray(e.claimed)).ravel() for e in ex_])
    atoms = np.concatenate([np.moveaxis(np.asarray(e.atoms) - np.asarray(e.claimed)[:, :, None, :], 2, 0)
                            .reshape(len(labels), -1) for e in ex_], axis=1)
    scale = float(np.max(np.abs(np.concatenate([np.asarray(e.claimed).ravel() for e in ex_]))))
    m = diagnose.match(bias, atoms, labels, scale)
    mean_ok = all(r.passed for r in rows if r.kind == "exact" and "E[Y|s]" in r.name)
    if m.label == "no bias" or (mean_ok and u.claim.name != "any") or (
            u.claim.name == "any" and float(np.max(np.abs(bias))) <= EXACT_TOL):
        lines.append(f"E[Y|s] = {'the claim' if u.claim.name != 'any' else 'T_pi Vbar'}: no bias in the mean")
    else:
        lines.append("E[Y|s] - claim: " + m.sentence("the bias", candidate=u.claim.name == "any"))
        shape = diagnose.bias_shape(bias, EXACT_TOL * (1.0 + scale))
        if shape:
            lines.append(shape)
        if m.exact:
            k = labels.index(m.label)
            fp = np.concatenate([np.asarray(e.atom_fixed)[:, :, k].ravel() for e in ex_])
            user_fp = np.concatenate([np.asarray(e.fixed).ravel() for e in ex_])
            dist = float(np.max(np.abs(np.concatenate([(np.asarray(e.fixed) - np.asarray(e.fixed_claim)).ravel()
                                                       for e in ex_]))))
            lines.append(f"fixed point: max |V* - {u.claim.value_label}| = {dist:.3g}; V* = {_fixed_text(m.label)} "
                         f"(to {float(np.max(np.abs(fp - user_fp))):.1e})")
        elif not m.explains_most:
            where = diagnose.where_bias([np.asarray(e.means) - np.asarray(e.claimed) for e in ex_],
                                        [np.asarray(e.terms) for e in ex_], TERM_GROUPS,
                                        diagnose.mdp_names(groups), EXACT_TOL * (1.0 + scale))
            lines += where[1:] if "constant offset" in shape else where  # no term explains a constant
    return lines


def _fixed_text(label: str) -> str:
    """What the fixed point of the matched family is, in words."""
    if label.startswith("the uncorrected"):
        return "V^mu, the behaviour's value (over the replay: V^mubar, the replay mixture's value)"
    if label.startswith(("clipping", "masking")):
        return "V^pitilde at that c"
    if label.startswith("the naive-baseline"):
        return "the naive fixed point, (I - Z P_pitilde) V = Z r_pitilde + (1 - Z) b: b leaks in"
    return "that family's fixed point"


def _as_any(rows: list[Row], u: UserOneStep, diagnosis: list[str]) -> list[Row]:
    """``--claim any``: the mean, fixed-point and sampled rows are information; one row says
    whether a known closed form explains the mean exactly."""
    for r in rows:
        if "E[Y|s] =" in r.name or r.kind == "sampled" or "fixed point" in r.name:
            diagnose.as_info(r)
    explained = "no bias" in diagnosis[0] or (" matches " in diagnosis[0] and "no known" not in diagnosis[0])
    rows.append(Row(f"{u.name}: E[Y|s] is a known closed form", "user", "exact", rows[0].mdps,
                    0.0 if explained else 1.0, 0.0, explained, diagnosis[0]))
    return rows
