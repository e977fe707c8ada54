"""Critic error vs lag with a Gaussian actor (issue 31; ``experiments/continuous_pendulum_lag.py``).

Input: the rows that script writes (one per seed and update: ``lag``, ``critic``, ``seed``,
``update``, and at the evaluated updates ``critic_error`` / ``critic_error_mc_se``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from scipy import stats

from vccc_jax.plotting.style import figsize, method_style, styled


def lag_cells(rows: list[dict], which: str = "last") -> dict:
    """{(lag, critic): per-seed critic errors}: at each seed's last update (``which="last"``)
    or the mean over its evaluated updates (``"mean"``)."""
    out: dict = {}
    last = max(r["update"] for r in rows)
    for lag, critic in dict.fromkeys((r["lag"], r["critic"]) for r in rows):
        ev = [r for r in rows if r["lag"] == lag and r["critic"] == critic and "critic_error" in r]
        seeds = sorted({r["seed"] for r in ev})
        if which == "last":
            vals = [r["critic_error"] for s in seeds for r in ev if r["seed"] == s and r["update"] == last]
        else:
            vals = [float(np.mean([r["critic_error"] for r in ev if r["seed"] == s])) for s in seeds]
        out[(lag, critic)] = np.asarray(vals, float)
    return out


def _half(x: np.ndarray) -> float:
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


@styled
def fig_continuous_lag(rows: list[dict], env: str = "Pendulum-v1"):
    """Two panels (last update; mean over the evaluated updates): critic RMS error against the
    Monte-Carlo V^{pi_k} per lag law, one marker per critic target, mean and 95% t interval
    over seeds; the dotted line is the MC standard error (the noise floor)."""
    fig, axes = plt.subplots(1, 2, figsize=figsize("two"), sharey=True)
    lags = list(dict.fromkeys(r["lag"] for r in rows))
    critics = list(dict.fromkeys(r["critic"] for r in rows))
    se = float(np.mean([r["critic_error_mc_se"] for r in rows if "critic_error_mc_se" in r]))
    n = len({r["seed"] for r in rows})
    for ax, which, title in zip(axes, ("last", "mean"), ("at the last update", "mean over evaluated updates")):
        cells = lag_cells(rows, which)
        for j, critic in enumerate(critics):
            st = method_style(critic)
            x = np.arange(len(lags)) + (j - (len(critics) - 1) / 2) * 0.12
            y = [cells[(lag, critic)].mean() for lag in lags]
            h = [_half(cells[(lag, critic)]) for lag in lags]
            ax.errorbar(x, y, yerr=h, marker=st.marker, color=st.color, label=st.label, capsize=2, lw=1)
        ax.axhline(se, color="0.4", ls=":", lw=0.8, label="MC s.e.")
        ax.set_xticks(np.arange(len(lags)), lags)
        ax.set_xlabel("lag law")
        ax.set_title(title)
    axes[0].set_ylabel(r"critic RMS error to $V^{\pi_k}$ (MC)")
    axes[1].legend(loc="upper left", fontsize=6.5)
    fig.suptitle(f"{env}, Gaussian actor: critic error vs lag (mean, 95% t interval, n = {n} seeds)")
    fig.tight_layout()
    return fig
