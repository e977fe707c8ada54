"""Figure of the async tabular actor-critic grid (``runs.async_ac`` rows)."""

from __future__ import annotations

from typing import Optional

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.analysis.async_ac import default_reference
from vccc_jax.analysis.stats import CI_LEVEL, ci_dict
from vccc_jax.plotting.style import TWO_COLUMN, dodge, lag_axis, method_style, styled

_C = {k: method_style(k).color for k in ("uncorrected", "vccc")}
# (critic, centering) -> (label, colour, marker, linestyle): colour = the critic's fixed colour,
# line style = the actor's centering (solid none, dashed exact, dotted top-k).
ASYNC_VARIANT_STYLE = {
    ("uncorrected", "none"): ("stale critic, no centering", _C["uncorrected"], "o", "-"),
    ("uncorrected", "exact"): ("stale critic + score centering", _C["uncorrected"], "s", "--"),
    ("vccc", "none"): ("VCCC critic, no centering", _C["vccc"], "^", "-"),
    ("vccc", "exact"): ("VCCC critic + score centering", _C["vccc"], "D", "--"),
    ("uncorrected", "topk"): ("stale critic + top-k centering", _C["uncorrected"], "v", ":"),
    ("vccc", "topk"): ("VCCC critic + top-k centering", _C["vccc"], "P", ":"),
}


@styled
def fig_async_ac(rows: list[dict], mode: str = "expected", actor_kind: Optional[str] = None):
    """The 2 x 2 grid across mean lag for one actor weight: final return gap, the paired change
    of the training-averaged gap, gradient bias, cosine to the true policy gradient, the
    bias's drift / critic / weight parts, critic error (MDP means with ``CI_LEVEL``
    t-intervals; paired over MDPs for the return change), on a log2(1 + lag) axis with the
    variants dodged sideways so their bars do not overlap. Returns a matplotlib Figure."""
    sel = [r for r in rows if r["cell"]["mode"] == mode]
    if not sel:
        raise ValueError(f"no rows with mode {mode!r}")
    kinds = sorted({r["cell"]["actor_kind"] for r in sel})
    actor_kind = actor_kind or ("truncate" if "truncate" in kinds else kinds[0])
    sel = [r for r in sel if r["cell"]["actor_kind"] == actor_kind]
    n = len(sel[0]["metrics"]["gap"]["per_mdp"])
    reference = default_reference(sel)
    panels = [
        ("gap", r"final return gap $(J^*-J_K)/(J^*-J_{unif})$", False),
        ("gap_auc", "return gap over training: paired change\nvs " + ASYNC_VARIANT_STYLE[reference][0], True),
        ("bias", r"bias $\|g_{app}-g_{ref}\|$ / $\|g_{ref}\|$", False),
        ("cos_true", r"cosine($g_{app}$, true PG)", False),
        ("drift_part", "baseline-drift part (Eq 1)", False),
        ("critic_part", "critic (future-policy) part", False),
        ("weight_part", r"weight part ($w \neq \rho$: clipping, no IS)", False),
        ("critic_err", r"critic error $\|V - V^{\pi_k}\|_{d}$", False),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(TWO_COLUMN, 4.4), layout="constrained")
    ref = {r["cell"]["mean_lag"]: r for r in sel
           if (r["cell"]["critic"], r["cell"]["centering"]) == reference}
    lags = sorted({r["cell"]["mean_lag"] for r in sel})
    present = [v for v in ASYNC_VARIANT_STYLE
               if any((r["cell"]["critic"], r["cell"]["centering"]) == v for r in sel)]
    for ax, (metric, label, paired) in zip(axes.ravel(), panels):
        for (crit, cen), (name, color, marker, ls) in ASYNC_VARIANT_STYLE.items():
            rs = sorted((r for r in sel if r["cell"]["critic"] == crit and r["cell"]["centering"] == cen),
                        key=lambda r: r["cell"]["mean_lag"])
            if paired:
                rs = [r for r in rs if r["cell"]["mean_lag"] in ref]
                st = [ci_dict(np.asarray(r["metrics"][metric]["per_mdp"])
                              - np.asarray(ref[r["cell"]["mean_lag"]]["metrics"][metric]["per_mdp"]),
                              CI_LEVEL)
                      for r in rs]
            else:
                st = [r["metrics"][metric] for r in rs]
            if not rs:
                continue
            x = dodge(np.array([r["cell"]["mean_lag"] for r in rs]),
                      present.index((crit, cen)), len(present), 0.12)
            y = np.array([t["mean"] for t in st])
            e = np.array([t["ci"] for t in st])
            ax.errorbar(x, y, yerr=e, label=name, color=color, marker=marker, ls=ls, capsize=2, ms=3)
        lag_axis(ax, lags)
        ax.set_title(label, fontsize=7)
        ax.set_xlabel(f"mean lag ({sel[0]['config']['grid']['law']} law)", fontsize=7)
        ax.tick_params(labelsize=6.5)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False)
    weight = {"none": "w = 1", "ratio": r"w = $\rho$", "truncate": r"w = min($\rho$, c)",
              "mask": r"w = $\rho\,1[1/c\leq\rho\leq c]$"}[actor_kind]
    fig.suptitle(f"Async tabular actor-critic ({mode} updates, actor {weight}); "
                 f"mean over n = {n} random MDPs, bars: {int(CI_LEVEL * 100)}% t-intervals", fontsize=8)
    return fig
