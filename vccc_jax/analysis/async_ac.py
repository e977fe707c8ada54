"""Statistics and tables of the async tabular actor-critic grid (``runs.async_ac`` rows).

Per-MDP metrics of a run, Student-t intervals over MDPs, paired-bootstrap reduction ratios
against a reference variant, and markdown tables (strings).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from vccc_jax.analysis.stats import CI_LEVEL, ci_dict

CRITIC_LABEL = {"uncorrected": "stale critic", "vccc": "VCCC critic"}
CENTERING_LABEL = {"none": "no centering", "exact": "score centering", "topk": "top-k centering"}
NUMERICAL_ZERO = 1e-10  # a reference metric below this is a float64 zero: no ratio is reported



def per_mdp_metrics(res) -> dict:
    """Per-run summary numbers (numpy, leading lane axis) from an :class:`ACResult`.

    gap: (J* - J(pi_final)) / (J* - J(uniform)), the remaining fraction of the uniform
    policy's suboptimality; gap_auc: the same averaged over training (learning speed). bias, drift, critic_part, weight_part: time-averaged norms over
    the time-averaged ||g_ref|| (ratios of sums, robust to ||g_ref|| -> 0 at convergence).
    cos_true, cos_ref, critic_err, critic_err_pi, topk_rel_err, mean_lag, kl: time averages.
    """
    c = type(res.curves)(*(np.asarray(x, np.float64) for x in res.curves))
    jstar = np.asarray(res.optimal_return, np.float64)
    ref = c.ref_norm.mean(-1)
    den = np.where(ref > 0, ref, 1.0)
    m = c.m_norm.mean(-1)
    scale = jstar - np.asarray(res.uniform_return)
    return {
        "gap": (jstar - np.asarray(res.final_return)) / scale,
        "gap_auc": (jstar[:, None] - c.ret).mean(-1) / scale,
        "bias": c.bias_norm.mean(-1) / den,
        "drift_part": c.drift_norm.mean(-1) / den,
        "critic_part": c.critic_norm.mean(-1) / den,
        "weight_part": c.weight_norm.mean(-1) / den,
        "cos_true": c.cos_true.mean(-1),
        "cos_ref": c.cos_ref.mean(-1),
        "critic_err": c.critic_err.mean(-1),
        "critic_err_pi": c.critic_err_pi.mean(-1),
        "topk_rel_err": c.topk_err.mean(-1) / np.where(m > 0, m, 1.0),
        "mean_lag": c.mean_lag.mean(-1),
        "kl": c.kl.mean(-1),
    }


METRICS = ("gap", "gap_auc", "bias", "drift_part", "critic_part", "weight_part", "cos_true", "cos_ref",
           "critic_err", "critic_err_pi", "topk_rel_err", "mean_lag", "kl")


def _row_index(rows):
    return {(r["cell"]["mode"], r["cell"]["actor_kind"], r["cell"]["critic"], r["cell"]["centering"],
             r["cell"]["mean_lag"]): r for r in rows}


def reduction_ratios(rows: list[dict], metric: str = "bias", reference=("uncorrected", "none"),
                     num_boot: int = 2000, seed: int = 0) -> list[dict]:
    """metric(variant) vs metric(reference variant) per (mode, actor kind, lag), paired over MDPs.

    ``ratio``: ratio of MDP means with a ``CI_LEVEL`` paired-bootstrap interval (lo, hi);
    ``diff``: mean paired difference with a ``CI_LEVEL`` t half-width ``diff_ci``. Lag-0 cells
    (where every variant is the same on-policy run) are skipped."""
    idx = _row_index(rows)
    rng = np.random.default_rng(seed)
    out = []
    for (mode, kind, crit, cen, lag), r in sorted(idx.items(), key=lambda kv: str(kv[0])):
        if lag == 0:
            continue
        ref = idx.get((mode, kind, reference[0], reference[1], lag))
        if ref is None:
            continue
        x = np.asarray(r["metrics"][metric]["per_mdp"])
        y = np.asarray(ref["metrics"][metric]["per_mdp"])
        n = len(x)
        b = rng.integers(0, n, size=(num_boot, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            boots = x[b].mean(1) / y[b].mean(1)
        lo, hi = np.nanquantile(boots, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
        d = ci_dict(x - y, CI_LEVEL)
        out.append({"mode": mode, "actor_kind": kind, "critic": crit, "centering": cen,
                    "mean_lag": lag, "ratio": float(x.mean() / y.mean()) if y.mean() != 0 else float("nan"),
                    "lo": float(lo), "hi": float(hi), "diff": d["mean"], "diff_ci": d["ci"],
                    "ref_mean": float(y.mean())})
    return out


def summary_table(rows: list[dict]) -> str:
    """Markdown table: per (mode, actor kind, lag, variant) mean +- CI of the headline metrics
    (plus the top-k centering's relative error ||m_hat - m_w|| / ||m_w|| when a cell uses it)."""
    cols = ("gap", "gap_auc", "bias", "drift_part", "critic_part", "weight_part", "cos_true",
            "critic_err", "kl")
    if any(r["cell"]["centering"] == "topk" for r in rows):
        cols = cols + ("topk_rel_err",)
    head = "| mode | actor w | lag | critic | centering | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (5 + len(cols))]
    for r in sorted(rows, key=lambda r: (r["cell"]["mode"], r["cell"]["actor_kind"], r["cell"]["mean_lag"],
                                         r["cell"]["critic"], r["cell"]["centering"])):
        c = r["cell"]
        vals = " | ".join(f"{r['metrics'][k]['mean']:.3g} ± {r['metrics'][k]['ci']:.2g}" for k in cols)
        lines.append(f"| {c['mode']} | {c['actor_kind']} | {c['mean_lag']:g} | "
                     f"{CRITIC_LABEL.get(c['critic'], c['critic'])} | "
                     f"{CENTERING_LABEL.get(c['centering'], c['centering'])} | {vals} |")
    return "\n".join(lines)


def default_reference(rows: list[dict]) -> tuple:
    """(critic, centering) the ratios compare against: (uncorrected, none) when present, else
    the first critic of the rows without centering."""
    pairs = {(r["cell"]["critic"], r["cell"]["centering"]) for r in rows}
    if ("uncorrected", "none") in pairs:
        return ("uncorrected", "none")
    return sorted(p for p in pairs if p[1] == "none")[0]


def ratio_table(rows: list[dict], reference: Optional[tuple] = None) -> str:
    """Markdown table of :func:`reduction_ratios` against ``reference`` (default
    :func:`default_reference`): ratios of the bias and of its drift / critic parts, and the
    paired change of the training-averaged return gap."""
    reference = default_reference(rows) if reference is None else tuple(reference)
    lines = ["| mode | actor w | lag | variant | bias ratio [CI] | drift ratio [CI] | "
             "critic-part ratio [CI] | Δ gap_auc ± CI |",
             "|---|---|---|---|---|---|---|---|"]
    metrics = ("bias", "drift_part", "critic_part", "gap_auc")
    tabs = {m: {(d["mode"], d["actor_kind"], d["mean_lag"], d["critic"], d["centering"]): d
                for d in reduction_ratios(rows, m, reference)} for m in metrics}
    ref_name = f"{CRITIC_LABEL.get(reference[0], reference[0])} + {CENTERING_LABEL.get(reference[1], reference[1])}"
    lines[0] = lines[0].replace("| variant |", f"| variant (vs {ref_name}) |")
    for key in sorted(tabs["bias"]):
        mode, kind, lag, crit, cen = key
        if (crit, cen) == reference:
            continue
        def cellf(d):
            if d["ref_mean"] < NUMERICAL_ZERO:  # e.g. the drift of an exact-ratio actor
                return "n/a (ref = 0)"
            return f"{d['ratio']:.3g} [{d['lo']:.3g}, {d['hi']:.3g}]"

        g = tabs["gap_auc"][key]
        lines.append(f"| {mode} | {kind} | {lag:g} | {CRITIC_LABEL.get(crit, crit)} + "
                     f"{CENTERING_LABEL.get(cen, cen)} | " +
                     " | ".join(cellf(tabs[m][key]) for m in metrics[:3]) +
                     f" | {g['diff']:+.2g} ± {g['diff_ci']:.2g} |")
    return "\n".join(lines)
