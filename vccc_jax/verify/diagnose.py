"""Which known bias an estimator has: least squares of its exact bias against closed forms.

An *atom* is the exact bias that a known (right or wrong) estimator family has on the same
problems: the uncorrected target (behaviour value; over the replay, the mixture value),
clipping to pitilde at threshold c, the naive-baseline leak (1 - Z) b, ... Each verify kind
computes its atoms in closed form next to the user's exact moments (the atoms never run an
estimator). :func:`match` fits the user's bias e (stacked over MDPs, versions and states)
to each atom d by least squares, e ~ alpha d, and reports the atom that explains e exactly
(||e - d|| at round-off), else the closest one with its alpha and the fraction of
||e||^2 it explains.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

MATCH_TOL = 1e-7   # relative residual ||e - d|| / ||e|| of an exact match
ABS_TOL = 1e-9     # ... or absolute (relative to the scale of the problem)


@dataclasses.dataclass
class Match:
    """The result of :func:`match` (``exact``: the atom explains the bias to round-off)."""

    label: str
    alpha: float
    residual: float     # ||e - alpha d|| / ||e|| (exact: with alpha = 1)
    exact: bool
    bias_norm: float

    def sentence(self, what: str = "its bias") -> str:
        if self.exact:
            return f"{what} matches {self.label} (least-squares residual {self.residual:.1e} of |bias| {self.bias_norm:.3g})"
        explained = max(0.0, 1.0 - self.residual**2)
        return (f"no known closed form matches {what} exactly; closest: {self.label} x {self.alpha:.3g} "
                f"(explains {100 * explained:.0f}% of |bias|^2 = {self.bias_norm:.3g}^2)")


def match(bias: np.ndarray, atoms: np.ndarray, labels: Sequence[str], scale: float = 1.0) -> Match:
    """Least-squares match of ``bias`` [N] against ``atoms`` [n, N] (each the exact bias of a
    known estimator on the same problems)."""
    e = np.nan_to_num(np.asarray(bias, float).ravel())
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


def failing_mdps(errors: np.ndarray, tol: float, names: Sequence[str], limit: int = 3) -> str:
    """"fails in n/N MDPs: name name ..." for per-MDP errors [N] (NaN fails), or ""."""
    errors = np.asarray(errors, float)
    bad = ~(errors <= tol)
    if not bad.any():
        return ""
    idx = np.flatnonzero(bad)
    shown = " ".join(names[i] for i in idx[:limit]) + (" ..." if len(idx) > limit else "")
    return f"fails in {len(idx)}/{len(errors)} MDPs: {shown}"


def mdp_names(groups) -> list[str]:
    """One name per MDP of the verify groups, e.g. ``episodic4x2#3``."""
    return [f"{g.kind}{g.num_states}x{g.num_actions}#{i}" for g in groups for i in range(g.num_mdps)]
