"""Figures of statistics over seeds (``analysis.seeds``): neural lag curves (IQM + stratified
bootstrap CIs), paired "does the correction help" differences, performance profiles.

Input: the train grid store rows (``runs.train.run_grid``: {"cell": TrainConfig dict,
"metrics": summary with ``per_seed`` lists}). Every figure says n and what the bars mean.
"""

from __future__ import annotations

from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.analysis.seeds import CI_LEVEL, aggregate, paired_difference, performance_profile
from vccc_jax.plotting.style import (
    dodge,
    figsize,
    lag_axis,
    legend_below,
    method_linestyle,
    method_style,
    stats_note,
    styled,
)

LAG_METRICS = {
    "final_eval_return": "current-policy return",
    "final_return": "behaviour return",
    "gt_rel_err": r"critic $|V - V^{\pi}|/|V^{\pi}|$ (MC truth)",
    "exact_rel_err": r"critic $|V - V^{\pi}|/|V^{\pi}|$ (exact truth)",
    # whole-run summaries (analysis.train.whole_run_summary)
    "gt_rel_err_auc": r"critic rel. error, mean over the run (MC truth)",
    "exact_err_pi_auc": r"critic RMSE to $V^{\pi_k}$, mean over the run",
    "exact_err_pi@25": r"critic RMSE to $V^{\pi_k}$ at 25% of the run",
    "exact_gap_auc": r"$\|V^{\pi_k} - V^{mix}\|$, mean over the run",
    "exact_grad_rel_bias_auc": "relative actor-gradient bias, mean over the run",
    "clip_at_max_lag": "clip rate at the largest lag",
}
LAG_YLABELS = {"final_eval_return": "episode return", "final_return": "episode return",
               "gt_rel_err": "relative error", "exact_rel_err": "relative error",
               "gt_rel_err_auc": "relative error", "exact_err_pi_auc": "RMSE",
               "exact_err_pi@25": "RMSE", "exact_gap_auc": "RMSE",
               "exact_grad_rel_bias_auc": "relative bias", "clip_at_max_lag": "fraction clipped"}
LOWER_IS_BETTER = ("gt_rel_err", "gt_mse", "exact_rel_err", "exact_err", "gt_rel_err_auc",
                   "exact_err_pi_auc", "exact_err_pi@25", "exact_grad_rel_bias_auc")


def _cells(rows):
    out = []
    for r in rows:
        cfg = r.get("cell", r.get("config"))
        out.append((cfg, r.get("metrics", r.get("summary"))))
    return out


def _per_seed(summary, key):
    v = summary.get(key)
    return None if v is None else np.asarray(v["per_seed"], np.float64)


def _lag_value(cfg, summary):
    """The lag for the x axis: k for a ``fixed:k`` law (the realised mean is lower, since
    early updates have fewer versions to lag behind), else the mean lag the run saw."""
    law = str(cfg.get("lag", ""))
    if law.startswith("fixed:"):
        return float(law.split(":", 1)[1])
    return float(np.nanmean(_per_seed(summary, "lag_mean")))


@styled
def fig_lag_curves(rows: list[dict], metrics: Optional[Sequence[str]] = None, env: Optional[str] = None):
    """Per critic, each metric against the lag: interquartile mean over seeds with
    ``CI_LEVEL`` stratified-bootstrap CIs. The lag axis is log2(1 + lag) with ticks at the
    lags run (``fixed:k`` at k); critics are dodged sideways so their bars do not overlap."""
    cells = _cells(rows)
    envs = sorted({c["env"] for c, _ in cells})
    env = env or envs[0]
    cells = [(c, s) for c, s in cells if c["env"] == env]
    metrics = [m for m in (metrics or LAG_METRICS) if any(m in s for _, s in cells)]
    critics = sorted({c["critic"] for c, _ in cells})
    fig, axes = plt.subplots(1, len(metrics), figsize=figsize("two", 2.6), squeeze=False,
                             layout="constrained")
    n = 0
    lags_run = sorted({_lag_value(c, s) for c, s in cells})
    for ax, key in zip(axes[0], metrics):
        for k, critic in enumerate(critics):
            pts = []
            for c, s in cells:
                x = _per_seed(s, key) if c["critic"] == critic else None
                if x is None:
                    continue
                a = aggregate({"x": x})["x"]
                n = max(n, a["n"])
                pts.append((_lag_value(c, s), a["point"], a["point"] - a["lo"], a["hi"] - a["point"]))
            if not pts:
                continue
            pts.sort()
            lag, y, lo, hi = map(np.asarray, zip(*pts))
            label, color, marker = method_style(critic)
            ax.errorbar(dodge(lag, k, len(critics), 0.06), y, yerr=[lo, hi], color=color,
                        marker=marker, capsize=2, label=label, ls=method_linestyle(critic))
        lag_axis(ax, lags_run)
        ax.set_xlabel("policy lag (updates)")
        ax.set_title(LAG_METRICS.get(key, key))
        ax.set_ylabel(LAG_YLABELS.get(key, key) + (" (lower is better)" if key in LOWER_IS_BETTER
                                                   else ""))
    legend_below(fig, axes[0][0], ncol=min(4, len(critics)))
    fig.suptitle(f"{env}: metrics vs policy lag — IQM over seeds, "
                 + stats_note(n, "seeds", f"bars: {int(CI_LEVEL * 100)}% stratified bootstrap CI"))
    return fig


@styled
def fig_paired_differences(rows: list[dict], key: str = "final_eval_return",
                           control: str = "gae", env: Optional[str] = None):
    """Does the correction help? Per lag and critic, the per-seed difference
    critic - ``control`` (same seed index = same PRNG keys) with its mean and a
    ``CI_LEVEL`` bootstrap CI; the share of seeds that improve is printed on each point."""
    cells = _cells(rows)
    env = env or sorted({c["env"] for c, _ in cells})[0]
    cells = [(c, s) for c, s in cells if c["env"] == env and key in s]
    ctrl = {c["lag"]: s for c, s in cells if c["critic"] == control}
    critics = sorted({c["critic"] for c, _ in cells} - {control})
    fig, ax = plt.subplots(figsize=figsize("one", 2.8), layout="constrained")
    sign = -1.0 if key in LOWER_IS_BETTER else 1.0
    n = 0
    for k, critic in enumerate(critics):
        pts = []
        for c, s in cells:
            if c["critic"] != critic or c["lag"] not in ctrl:
                continue
            d = paired_difference(sign * _per_seed(s, key), sign * _per_seed(ctrl[c["lag"]], key))
            n = max(n, d["n"])
            pts.append((_lag_value(c, s), d))
        if not pts:
            continue
        pts.sort(key=lambda t: t[0])
        label, color, marker = method_style(critic)
        x = dodge(np.array([p[0] for p in pts]), k, len(critics), 0.25)
        y = np.array([p[1]["point"] for p in pts])
        err = [[p[1]["point"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["point"] for p in pts]]
        ax.errorbar(x, y, yerr=err, color=color, marker=marker, capsize=2, label=label)
        for xi, (_, d) in zip(x, pts):
            ax.annotate(f"{d['frac_better']:.0%}", (xi, d["hi"]), textcoords="offset points",
                        xytext=(0, 2), ha="center", fontsize=6, color=color)
    ax.axhline(0, color="0.3", lw=0.8)
    lag_axis(ax, sorted({_lag_value(c, s) for c, s in cells}))
    ax.set_xlabel("policy lag (updates)")
    better = "improvement" if sign > 0 else "error reduction"
    ax.set_ylabel(f"{better} vs {method_style(control).label}")
    ax.set_title(f"{env}: paired {LAG_METRICS.get(key, key)}\n"
                 + stats_note(n, "paired seeds", f"mean, {int(CI_LEVEL * 100)}% bootstrap CI")
                 + "\n% = share of seeds that improve", fontsize=7)
    legend_below(fig, ax, ncol=2)
    return fig


def normalized_scores(rows: list[dict], key: str = "final_eval_return") -> dict:
    """{(critic, lag): [seeds, envs]} of ``key`` min-max normalised per env over every run of
    that env in ``rows`` (0 = worst run, 1 = best run); envs missing a cell are dropped."""
    cells = _cells(rows)
    envs = sorted({c["env"] for c, _ in cells})
    lo = {e: np.nanmin(np.concatenate([_per_seed(s, key) for c, s in cells if c["env"] == e and key in s]))
          for e in envs}
    hi = {e: np.nanmax(np.concatenate([_per_seed(s, key) for c, s in cells if c["env"] == e and key in s]))
          for e in envs}
    out: dict = {}
    for c, s in cells:
        if key in s:
            x = (_per_seed(s, key) - lo[c["env"]]) / max(hi[c["env"]] - lo[c["env"]], 1e-12)
            out.setdefault((c["critic"], c["lag"]), {})[c["env"]] = x
    return {k: np.stack([v[e] for e in envs], axis=1) for k, v in out.items() if len(v) == len(envs)}


@styled
def fig_performance_profile(rows: list[dict], key: str = "final_eval_return", lag: Optional[str] = None):
    """Score distributions across envs (rliable's performance profile): the fraction of runs
    whose env-normalised score exceeds tau, per critic at one lag, with stratified
    bootstrap CI bands."""
    scores = normalized_scores(rows, key)
    lags = sorted({lg for _, lg in scores}, key=str)
    lag = lag or lags[-1]
    taus = np.linspace(0, 1, 21)
    fig, ax = plt.subplots(figsize=figsize("one", 2.6), layout="constrained")
    n = t = 0
    for critic, lg in sorted(scores):
        if lg != lag:
            continue
        prof = performance_profile(scores[(critic, lg)], taus, num_boot=500)
        n, t = scores[(critic, lg)].shape
        label, color, _ = method_style(critic)
        ax.plot(taus, prof["point"], color=color, label=label)
        ax.fill_between(taus, prof["lo"], prof["hi"], color=color, alpha=0.2, lw=0)
    ax.set_xlabel(r"normalised score $\tau$ (per env: 0 worst run, 1 best)")
    ax.set_ylabel(r"fraction of runs with score > $\tau$")
    ax.set_title(f"performance profile, lag {lag}, {t} env(s)\n"
                 + stats_note(n, "seeds per env", f"bands: {int(CI_LEVEL * 100)}% stratified bootstrap"),
                 fontsize=7.5)
    legend_below(fig, ax, ncol=2)
    return fig
