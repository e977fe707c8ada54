"""Which known bias an estimator has: least squares of its exact bias against closed forms.

An *atom* is the exact bias that a known (right or wrong) estimator family has on the same
problems: the uncorrected target (behaviour value; over the replay, the mixture value),
clipping to pitilde at threshold c, the naive-baseline leak (1 - Z) b, ... Each verify kind
computes its atoms in closed form next to the user's exact moments (the atoms never run an
estimator). :func:`match` fits the user's bias e (stacked over MDPs, versions and states)
to each atom d by least squares, e ~ alpha d, and reports the atom that explains e exactly
(||e - d|| at round-off), else the closest one with its alpha and the fraction of
||e||^2 it explains. A closest form that explains less than ``EXPLAINS`` (90%) of ||e||^2
is not named as the answer: the report says that no known form explains the bias and
:func:`where_bias` shows where it lives (which term of the mean, which MDPs and states,
whether it depends on the behaviour version).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from vccc_jax.verify.report import Row, failing

MATCH_TOL = 1e-7   # relative residual ||e - d|| / ||e|| of an exact match
ABS_TOL = 1e-9     # ... or absolute (relative to the scale of the problem)
EXPLAINS = 0.9     # a closest match must explain this fraction of ||e||^2 to be named as the cause


@dataclasses.dataclass
class Match:
    """The result of :func:`match` (``exact``: the atom explains the bias to round-off)."""

    label: str
    alpha: float
    residual: float     # ||e - alpha d|| / ||e|| (exact: with alpha = 1)
    exact: bool
    bias_norm: float

    @property
    def explained(self) -> float:
        """The fraction of ||e||^2 that alpha d explains."""
        return 1.0 if self.exact else max(0.0, 1.0 - self.residual**2)

    @property
    def explains_most(self) -> bool:
        return self.exact or self.explained >= EXPLAINS

    def sentence(self, what: str = "its bias", candidate: bool = False) -> str:
        """One line; ``candidate`` (``--claim any``: the user asks what the mean is) names the
        closest form even when it explains too little to be the cause."""
        if self.exact:
            return f"{what} matches {self.label} (least-squares residual {self.residual:.1e} of |bias| {self.bias_norm:.3g})"
        if not self.explains_most:
            best = (f"the best candidate, {self.label} x {self.alpha:.3g}," if candidate and self.label
                    and np.isfinite(self.bias_norm) else "the best of them")
            return (f"no known closed form explains {what} (|bias| = {self.bias_norm:.3g}; {best} "
                    f"explains {100 * self.explained:.0f}% of |bias|^2, under the {100 * EXPLAINS:.0f}% needed "
                    "to name it as the cause)")
        return (f"no known closed form matches {what} exactly; closest: {self.label} x {self.alpha:.3g} "
                f"(explains {100 * self.explained:.0f}% of |bias|^2 = {self.bias_norm:.3g}^2)")


def match(bias: np.ndarray, atoms: np.ndarray, labels: Sequence[str], scale: float = 1.0) -> Match:
    """Least-squares match of ``bias`` [N] against ``atoms`` [n, N] (each the exact bias of a
    known estimator on the same problems)."""
    raw = np.asarray(bias, float).ravel()
    if not np.all(np.isfinite(raw)):  # an overflowing mean matches nothing (inf <= inf is no match)
        return Match("no known form: the bias is not finite (the target's mean overflows or is NaN)",
                     0.0, float("inf"), False, float("inf"))
    e = raw
    d = np.nan_to_num(np.asarray(atoms, float).reshape(len(labels), -1))
    ne = float(np.linalg.norm(e))
    if ne == 0.0:
        return Match("no bias", 0.0, 0.0, True, 0.0)
    r1 = np.linalg.norm(e[None] - d, axis=1)
    best = int(np.argmin(r1))
    if r1[best] <= max(MATCH_TOL * ne, ABS_TOL * (1.0 + scale)):
        return Match(labels[best], 1.0, float(r1[best] / ne), True, ne)
    dd = np.einsum("nj,nj->n", d, d)
    alpha = np.where(dd > 0, d @ e / np.where(dd > 0, dd, 1.0), 0.0)
    res = np.linalg.norm(e[None] - alpha[:, None] * d, axis=1) / ne
    best = int(np.argmin(res))
    return Match(labels[best], float(alpha[best]), float(res[best]), False, ne)


def _num(x: float) -> str:
    return f"{x:.2f}" if 0.01 <= abs(x) < 1e4 else f"{x:.3g}"


def bias_shape(bias, tol: float) -> str:
    """Sign and constancy of a bias (any shape; every entry one state of one MDP and source):
    "bias -1.00 in every state (a constant offset)", "bias negative in every biased state, from
    -1.20 to -0.10", "bias of both signs, from -0.30 to 0.70"; "" when there is none (|bias| <=
    ``tol`` everywhere). NaN / inf entries are counted and left out of the range."""
    e = np.asarray(bias, float).ravel()
    bad = int(np.sum(~np.isfinite(e)))
    e = e[np.isfinite(e)]
    tail = f"; not finite in {bad} entries" if bad else ""
    if not e.size or float(np.max(np.abs(e))) <= tol:
        return f"bias not finite in {bad} entries" if bad else ""
    lo, hi = float(np.min(e)), float(np.max(e))
    if hi - lo <= tol:
        return f"bias {_num(lo)} in every state (a constant offset){tail}"
    if lo >= -tol or hi <= tol:
        sign = "positive" if lo >= -tol else "negative"
        return f"bias {sign} in every biased state, from {_num(lo)} to {_num(hi)} (one-signed){tail}"
    return f"bias of both signs, from {_num(lo)} to {_num(hi)}{tail}"


def as_info(row: Row, why: str = "no claim (any)") -> Row:
    """Mark a row as information only (``--claim any``): printed "info", not deciding the verdict."""
    row.detail, row.passed, row.info = f"{why}: {row.detail}", True, True
    return row


def where_bias(bias: Sequence[np.ndarray], terms: Sequence[np.ndarray], groups: Sequence[tuple[str, Sequence[int]]],
               names: Sequence[str], tol: float) -> list[str]:
    """Where a bias that no known form explains lives, in two lines.

    ``bias``: per problem group [B, V, S] (V sources: behaviour versions, the replay);
    ``terms``: per group [B, V, n, S], the per-state terms the mean is built from (e.g. the
    expected reward, bootstrap and baseline under pi and mu); ``groups``: (name, term indices).
    Each term group is fitted to the bias by least squares separately in every MDP (its own
    coefficients: gamma differs between MDPs) over all sources and states; the line gives the
    share of ||bias||^2 each group explains, largest first. The second line: how many MDPs
    carry bias (|bias| > ``tol``), the largest |bias| (MDP, state, source), and whether the
    bias is the same for every source (then it does not depend on the behaviour policy)."""
    raw = [np.asarray(b, float) for b in bias]
    e_all = [np.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0) for b in raw]  # the fits see finite numbers
    total = sum(float(np.sum(e**2)) for e in e_all)
    per_mdp = np.concatenate([np.max(np.abs(b), axis=(1, 2)) for b in raw])  # NaN / inf kept
    nonfinite = int(np.sum(~np.isfinite(per_mdp)))
    if total == 0.0 and not nonfinite:
        return []
    shares = []
    for label, idx in groups:
        resid = 0.0
        for e, t in zip(e_all, terms):
            t = np.nan_to_num(np.asarray(t, float))
            for eb, tb in zip(e, t):
                X = np.moveaxis(tb[:, list(idx)], 1, -1).reshape(-1, len(idx))      # [V * S, k]
                coef = np.linalg.lstsq(X, eb.ravel(), rcond=None)[0]
                resid += float(np.sum((eb.ravel() - X @ coef) ** 2))
        shares.append((max(0.0, 1.0 - resid / total) if total else 0.0, label))
    shares.sort(key=lambda x: -x[0])
    first = (f"where the bias lives: {shares[0][1]} explains {100 * shares[0][0]:.0f}% of |bias|^2 "
             "(least squares in each MDP on its pi and mu expectations)")
    first += "; " + ", ".join(f"{label} {100 * x:.0f}%" for x, label in shares[1:])
    flat = [(float(np.abs(e[b, v, s])), i0 + b, v, s, e.shape[1])
            for i0, e in zip(np.cumsum([0] + [len(e) for e in e_all]), e_all)
            for b, v, s in [np.unravel_index(int(np.argmax(np.abs(e))), e.shape)]]
    size, i, v, s, nv = max(flat)
    source = "the replay mixture" if v == nv - 1 else f"behaviour version {v + 1}"
    spread = max(float(np.max(np.abs(e - e[:, :1]))) for e in e_all)
    same = ("the same under every behaviour version and the replay: it does not depend on mu"
            if spread <= tol else "it changes with the behaviour version")
    bad = int(np.sum(failing(per_mdp, tol)))
    where = (f"not finite (NaN or inf) in {nonfinite} of them; largest finite |bias|" if nonfinite
             else "largest |bias|")
    return [first, f"biased in {bad}/{len(per_mdp)} MDPs; {where} {size:.3g} at {names[i]} state {s} "
                   f"({source}); {same}"]


def failing_mdps(errors: np.ndarray, tol: float, names: Sequence[str], limit: int = 3) -> str:
    """"fails in n/N MDPs: name name ..." for per-MDP errors [N] (NaN fails), or ""."""
    errors = np.asarray(errors, float)
    bad = failing(errors, tol)
    if not bad.any():
        return ""
    idx = np.flatnonzero(bad)
    shown = " ".join(names[i] for i in idx[:limit]) + (" ..." if len(idx) > limit else "")
    return f"fails in {len(idx)}/{len(errors)} MDPs: {shown}"


def mdp_names(groups) -> list[str]:
    """One name per MDP of the verify groups, e.g. ``episodic4x2#3``."""
    return [f"{g.kind}{g.num_states}x{g.num_actions}#{i}" for g in groups for i in range(g.num_mdps)]


# Gradient into these inputs is harmless: a critic's loss never differentiates them.
HARMLESS_GRAD = ("rewards", "discounts")
CONSTANTS_DOC = "docs/layout.md, 'Targets are constants'"


def gradient_row(name: str, mdps: int, grads: Sequence[float], fields: Sequence[str],
                 loss_ready: bool) -> tuple[Row, list[str]]:
    """The stop-gradient row of a critic target and its warning lines, from max |grad| per
    input field. Gradient into rewards or discounts is not named (nothing upstream of a critic
    loss differentiates them). Gradient into the rest fails the row only when a loss-ready
    target is asked for (``loss_ready``); otherwise the row passes (the mean, which every
    other row checks, does not depend on it) and a warning says how to fix it."""
    carrying = [f for f, g in zip(fields, grads) if f not in HARMLESS_GRAD and not g == 0.0]
    error = float(max((g for f, g in zip(fields, grads) if f not in HARMLESS_GRAD), default=0.0))
    if not carrying:
        return Row(name, "Eq 4-11", "exact", mdps, error, 0.0, True, "all inputs"), []
    where = ", ".join(carrying)
    if loss_ready:
        return (Row(name, "Eq 4-11", "exact", mdps, error, 0.0, False, f"gradient flows into {where}"),
                [f"the target is not loss-ready: gradient flows into {where} (wrap it in "
                 f"jax.lax.stop_gradient; {CONSTANTS_DOC})"])
    return (Row(name, "Eq 4-11", "exact", mdps, error, float("inf"), True,
                f"warning: gradient flows into {where}; --loss-ready fails on it"),
            [f"warning: gradient flows into {where}. The rows check the target's mean, which "
             "this does not change; regressing a critic on it as written would also "
             f"differentiate through the target: wrap it in jax.lax.stop_gradient ({CONSTANTS_DOC}). "
             "--loss-ready (check(..., loss_ready=True)) makes this a failure."])
