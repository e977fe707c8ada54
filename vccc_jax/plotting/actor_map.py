"""The staleness-tolerance map as a heat map, one panel per critic correction (issue 21).

Rows: actor corrections; columns: task x sampler; colour: the largest lag at which the exact
expected update's cosine to the reference stays >= ``threshold`` (``analysis.actor_map``),
each cell annotated with L_0.9 over L_0.5. Grey 'n/a': no closed form on that task (never sampled).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap

from vccc_jax.analysis.actor_map import (
    CRITIC_LABEL,
    REFERENCES,
    SAMPLER_LABEL,
    THRESHOLDS,
    format_lag,
    grid_lags,
    tolerance_records,
)
from vccc_jax.analysis.actor_map import actor_rows as grid_rows
from vccc_jax.plotting.style import TWO_COLUMN, styled

__all__ = ["fig_actor_map"]

NA_COLOR = "#DDDDDD"


@styled
def fig_actor_map(rows: list[dict], reference: str = "eq12", thresholds=THRESHOLDS):
    """Tolerance map (module docstring) of the ``exact`` study's stored rows; ``reference``
    eq12 or pg. Returns a Figure."""
    recs = tolerance_records(rows, thresholds)
    ok = [r for r in recs if "na" not in r]
    if not ok:
        raise ValueError("fig_actor_map: no exact rows to draw")
    na = {(r["task"], r["row"]) for r in recs if "na" in r}
    actor_rows = [x for x in grid_rows(rows) if any(r["row"] == x for r in recs)]
    tasks = list(dict.fromkeys(r["task"] for r in recs))
    samplers = list(dict.fromkeys(r["sampler"] for r in ok))
    critics = list(dict.fromkeys(r["critic"] for r in ok))
    max_lag = max(r["max_lag"] for r in ok)
    levels = [None] + grid_lags(rows)  # colour index 0: fails at the smallest lag
    idx = {(r["task"], r["sampler"], r["row"], r["critic"]): r for r in ok}
    cols = [(t, s) for t in tasks for s in samplers]
    cmap = ListedColormap(plt.get_cmap("viridis")(np.linspace(0.05, 0.95, len(levels))))
    cmap.set_bad("white")  # a cell not in the store (yet): blank
    norm = BoundaryNorm(np.arange(len(levels) + 1) - 0.5, cmap.N)
    ncol = 2 if len(critics) > 1 else 1
    nrow = -(-len(critics) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(TWO_COLUMN, 0.26 * len(actor_rows) * nrow + 1.4),
                             layout="constrained", squeeze=False)
    for ax, critic in zip(axes.ravel(), critics):
        grid = np.full((len(actor_rows), len(cols)), np.nan)
        for i, row in enumerate(actor_rows):
            for j, (task, sampler) in enumerate(cols):
                r = idx.get((task, sampler, row, critic))
                if r is None:
                    continue
                grid[i, j] = levels.index(r[f"lag_{reference}_{thresholds[0]}"])
                text = "\n".join(format_lag(r[f"lag_{reference}_{t}"], max_lag) for t in thresholds)
                ax.text(j, i, text, ha="center", va="center", fontsize=4.2, linespacing=0.95,
                        color="white" if grid[i, j] < len(levels) / 2 else "black")
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
        for i, row in enumerate(actor_rows):
            for j, (task, sampler) in enumerate(cols):
                if (task, row) in na:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color=NA_COLOR, zorder=2))
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=4.6, zorder=3,
                            color="#555555")
        ax.set_xticks(range(len(cols)),
                      [f"{t}, {SAMPLER_LABEL.get(s, s)}" for t, s in cols], fontsize=4.8,
                      rotation=30, ha="right", rotation_mode="anchor")
        ax.set_yticks(range(len(actor_rows)), actor_rows, fontsize=6)
        ax.set_title(f"critic: {CRITIC_LABEL.get(critic, critic)}")
        ax.grid(False)
        ax.tick_params(length=0)
    for ax in axes.ravel()[len(critics):]:
        ax.set_visible(False)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=norm)
    bar = fig.colorbar(sm, ax=axes, shrink=0.6, ticks=range(len(levels)))
    bar.ax.set_yticklabels([format_lag(v, max_lag) for v in levels], fontsize=6)
    bar.set_label(f"largest lag with cos >= {thresholds[0]}", fontsize=7)
    fig.suptitle(f"Staleness tolerance of the exact expected actor update: cosine to the "
                 f"{REFERENCES[reference]}\ncell: largest lag with cos >= "
                 + " (top) / ".join(str(t) for t in thresholds) + " (bottom) ('-': fails at the smallest lag; "
                 "grey: no closed form)", fontsize=7)
    return fig
