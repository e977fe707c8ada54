"""Exact identities of the method, one problem at a time (closed forms, float64).

Each *identity section* is ``section(p: Problem, pre: Prelude) -> {key: scalar error}``; all
sections run inside one ``jax.vmap`` over a group of problems (one compile per group). Each
key becomes one row through :data:`EXACT_ROWS` (max over the MDPs; NaN = not applicable).

To add an identity here: write a section (or add a key to one), append it to
:data:`IDENTITY_SECTIONS` and add an :class:`IdentityRow` for each key. (Checks that do not
fit the per-problem vmap register a *row section* in ``vccc_jax.verify.sections`` instead.)
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from vccc_jax.verify.identities.clipped import clipped_section
from vccc_jax.verify.identities.critic import critic_section, eq9_section, values_section
from vccc_jax.verify.identities.operators import actor_section, vtrace_section
from vccc_jax.verify.identities.shared import Prelude, affine_fixed_point, grid_mean, prelude
from vccc_jax.verify.problems import EXACT_TOL, Problem
from vccc_jax.verify.report import Row, worst

IDENTITY_SECTIONS = (values_section, critic_section, eq9_section, clipped_section, vtrace_section, actor_section)

__all__ = ["EXACT_ROWS", "IDENTITY_SECTIONS", "IdentityRow", "Prelude", "affine_fixed_point",
           "exact_identity_errors", "grid_mean", "identity_rows", "prelude"]


def exact_identity_errors(p: Problem, sections=IDENTITY_SECTIONS) -> dict:
    """All closed-form identity checks for one problem: {name: max abs error (scalar)}.

    NaN means "not applicable to this MDP" (e.g. a mask that rejects every action of a
    state, where Z(s) = 0 and the clipped fixed point is not unique).
    """
    errs = {}
    pre = prelude(p)
    for section in sections:
        errs.update(section(p, pre))
    return errs


class IdentityRow(NamedTuple):
    key: str
    name: str
    equation: str
    tolerance: float = EXACT_TOL


EXACT_ROWS = (
    IdentityRow("vpi_fixed_point", "V^pi (linear solve) = T_pi V^pi", "Sec 1.4"),
    IdentityRow("finite_horizon_fold", "backward induction = time-folded linear solve", "Sec 1.4"),
    IdentityRow("eq3", "T_pi V - T_mu V = Cov_mu(rho, H)", "Eq 3"),
    IdentityRow("uncorrected_tmu", "E_mu[H|s] = T_mu V (stale)", "Sec 3.1"),
    IdentityRow("eq5", "E_mu_k[Y_b] = T_pi V, 3 versions x 8 baselines", "Eq 5"),
    IdentityRow("eq6_random_mix", "replay mixture (random q_k(s)): E[Y] = T_pi V", "Eq 6"),
    IdentityRow("eq6_visitation_mix", "replay mixture (q_k ∝ d^mu_k): E[Y] = T_pi V", "Eq 6"),
    IdentityRow("replay_uncorrected", "uncorrected over replay = T_{sum q mu} V", "Sec 1.3"),
    IdentityRow("eq4_is_eq8", "Eq 4 with b = Vbar equals Eq 8 (pointwise)", "Eq 4/8"),
    IdentityRow("eq9_minimises", "b* minimises Var(Y_b) over a baseline grid", "Eq 9"),
    IdentityRow("eq9_orthogonal", "E[(rho-1) Y_b*] = 0 (orthogonality)", "Eq 9"),
    IdentityRow("eq9_closed_form_var", "Var(Y_b) closed form = enumeration", "Eq 9"),
    IdentityRow("clipped_fp_truncate", "clipped fixed point = V^pitilde, pitilde ∝ min(c mu, pi)", "Eq 10"),
    IdentityRow("clipped_fp_mask", "masked fixed point = V^pitilde, pitilde ∝ pi 1[mask]", "Eq 10"),
    IdentityRow("clipped_fp_replay", "clipped fixed point over replay = V^pibar", "Eq 10/6"),
    IdentityRow("naive_fp_leaks", "naive clipped fixed point: Z T V + (1-Z) b (leak)", "Sec 4.2"),
    IdentityRow("centred_fp", "Z-centred fixed point = V^pitilde for any b", "Sec 4.2"),
    IdentityRow("eq11_untruncated", "V-trace untruncated, lambda=1 = T_pi^n V (n=1,4,inf)", "Eq 11"),
    IdentityRow("eq11_on_policy_gae", "V-trace with rho=1 = GAE(gamma,lambda) lambda-return", "Eq 11"),
    IdentityRow("eq1", "g_b (autodiff) = Cov(G,u) + (V^mu - b) m_mu", "Eq 1"),
    IdentityRow("eq2", "E[(G-b)(Z_w - m_w)] = Cov(G, Z_w), any b, 3 weights", "Eq 2"),
    IdentityRow("eq13_library", "library actor loss + centering grad = Eq 13, b-free", "Eq 13"),
    IdentityRow("eq12", "E_mu[rho A^TD u] with V = V^pi equals E_pi[Q^pi u]", "Eq 12"),
    IdentityRow("policy_gradient", "sum_s d(s) E_pi[Q u] = grad init.V^pi (autodiff)", "Eq 12"),
)


def identity_rows(errs: Sequence[dict]) -> list[Row]:
    """One row per :data:`EXACT_ROWS` entry from the per-group error dicts ([B] arrays)."""
    rows = []
    for spec in EXACT_ROWS:
        e = np.concatenate([x[spec.key] for x in errs])
        ok = e != -np.inf  # -inf: not applicable (every version masks all actions of a state); NaN fails
        err = worst(e[ok]) if ok.any() else float("nan")
        detail = ""
        if spec.key == "naive_fp_leaks":
            leak = np.concatenate([x["naive_leak_size"] for x in errs])
            active = np.concatenate([x["naive_clipping_active"] for x in errs]) > 1e-3
            n_leak = int(np.sum(leak[active] > 1e-6))  # NaN leaks are no leak: the row fails
            detail = (f"leak |V_naive - V^pitilde| > 0 in {n_leak}/{int(active.sum())} MDPs with Z < 1 "
                      f"(median {np.median(leak[active]) if active.any() else 0:.3f})")
            passed = bool(err <= spec.tolerance and n_leak == int(active.sum()) and active.any())
        else:
            passed = bool(ok.any() and err <= spec.tolerance)
        if (~ok).any():
            detail = f"{int((~ok).sum())} MDPs not applicable (every version masks all actions of a state)"
        rows.append(Row(spec.name, spec.equation, "exact", int(ok.sum()), err, spec.tolerance, passed, detail))
    return rows
