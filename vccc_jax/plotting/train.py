"""Figures of neural training runs: learning curves and the grid's lag sweep."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np

from vccc_jax.analysis.seeds import MIN_INTERVAL_SEEDS, interval_method, seed_band
from vccc_jax.analysis.train import gt_curve, metric_column
from vccc_jax.plotting.style import (
    ALIASES,
    FLOOR,
    METHODS,
    dodge,
    figsize,
    lag_axis,
    legend_below,
    log_ticks,
    method_style,
    stats_note,
    styled,
)

ERROR_LABELS = {
    "gt_rel_err": r"critic $|V - V^{\pi_k}| / |V^{\pi_k}|$ (MC truth)",
    "exact_err_pi": r"critic RMSE to $V^{\pi_k}$",
    "exact_err_mix": r"critic RMSE to $V^{mix}$",
    "exact_rel_err_pi": r"critic relative error to $V^{\pi_k}$",
    "exact_rel_err_mix": r"critic relative error to $V^{mix}$",
    "exact_grad_rel_bias": "relative actor-gradient bias",
    "exact_gap": r"$\|V^{\pi_k} - V^{mix}\|$",
}


# curves.png panels: (metrics.csv column, title, y label, log y, valid range)
CURVE_PANELS = (
    ("return", "behaviour-policy return", "episode return", False, (None, None)),
    ("eval_return", "current-policy return", "episode return", False, (None, None)),
    ("exact_err_pi", r"critic error to $V^{\pi_k}$ (exact)", r"RMSE to $V^{\pi_k}$", True,
     (0.0, None)),
    ("gt_mse", r"critic error to $V^{\pi_k}$ (Monte Carlo)", r"MSE vs MC $V^{\pi_k}$", True,
     (0.0, None)),
    ("ess", "effective sample size", "ESS fraction (0-1]", False, (0.0, 1.0)),
    # vccc train --async only (the lag measured per update; absent from simulated runs)
    ("version_diff_avg", "measured lag (version_diff_avg)", "mean lag", False, (0.0, None)),
)
FEW_SEEDS = 5  # below this many seeds curves.png also draws every seed as a thin line


@styled
def plot_learning_curves(rows: list[dict], path: Path, title: str = "") -> Path:
    """``curves.png`` of one ``vccc train`` run: returns, critic error against the ground
    truth (exact when the env has exact values, Monte Carlo otherwise) and the ESS fraction
    against env steps: the mean over seeds and, with n >= 2 seeds, the interval of the one
    rule the console and summary.json use (:func:`analysis.seeds.seed_interval`: a 95%
    percentile bootstrap, which stays inside the seeds' range, so an ESS band never passes
    1); with fewer than ``FEW_SEEDS`` seeds also every seed as a thin line; with one seed
    the note says "n = 1: no interval". Returns ``path``."""
    steps = np.array(sorted({r["env_steps"] for r in rows}), np.float64)
    panels = [p for p in CURVE_PANELS if np.any(np.isfinite(metric_column(rows, p[0])))]
    ncols = 2 if len(panels) == 4 else min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.55 * ncols + 0.3, 2.1 * nrows + 0.7),
                             squeeze=False, layout="constrained")
    n_seeds = len({r["seed"] for r in rows})
    color = method_style("vccc").color
    for ax, (key, name, ylabel, log, (lo_ok, hi_ok)) in zip(axes.ravel(), panels):
        y = metric_column(rows, key)
        have = np.any(np.isfinite(y), axis=1)
        y, x = y[have], steps[have]
        marker = "o" if have.sum() < 40 else None
        mean, lo, hi = seed_band(y, axis=1)
        if n_seeds >= 2:
            lo, hi = np.clip(lo, lo_ok, hi_ok), np.clip(hi, lo_ok, hi_ok)
            ax.fill_between(x, lo, hi, color=color, alpha=0.25, lw=0,
                            label="95% bootstrap CI" if n_seeds >= MIN_INTERVAL_SEEDS
                            else "range of the seeds")
        if 1 < n_seeds < FEW_SEEDS:
            for j in range(y.shape[1]):
                ax.plot(x, y[:, j], color=color, lw=0.6, alpha=0.45,
                        label="one seed" if j == 0 else None)
        ax.plot(x, mean, color=color, lw=1.4, marker=marker, ms=2.5, label="mean over seeds")
        if log:
            ax.set_yscale("log")
        elif hi_ok is not None:
            ax.set_ylim(max(lo_ok, float(np.nanmin(y)) - 0.05), hi_ok + 0.02)
        ax.set_xlabel("env steps")
        ax.xaxis.set_major_formatter(mticker.EngFormatter(sep=""))  # 200k, not 200000
        ax.set_ylabel(ylabel)
        ax.set_title(name)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    # one short line each (the figure is 2 panels wide): what the band is, then the seeds
    note = (f"line: mean; band: {interval_method(n_seeds)}" if n_seeds >= 2
            else f"line: the one seed ({interval_method(n_seeds)})")
    if 1 < n_seeds < FEW_SEEDS:
        note += "\nthin lines: each seed"
    fig.suptitle((title + "\n" if title else "") + note, fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _nominal_lag(cell: dict) -> float:
    """k for a ``fixed:k`` lag law, else the mean lag the run saw."""
    law = str(cell["config"].get("lag", ""))
    if law.startswith("fixed:"):
        return float(law.split(":", 1)[1])
    return float(cell["summary"]["lag_mean"]["mean"])


def _error_bar(s: dict) -> tuple[float, float]:
    """(below, above) the mean of a ``summarize`` entry: the 95% t half-width with at least
    MIN_INTERVAL_SEEDS seeds, else down to the smallest and up to the largest seed."""
    if s.get("n", 0) >= MIN_INTERVAL_SEEDS:
        return s["ci95"], s["ci95"]
    seeds = [x for x in s.get("per_seed", []) if np.isfinite(x)]
    if len(seeds) < 2:
        return 0.0, 0.0
    return s["mean"] - min(seeds), max(seeds) - s["mean"]


def _wrapped(fig, *lines: str, fontsize: float = 9.0) -> str:
    """A suptitle whose lines fit ``fig``'s width at ``fontsize`` points (a long line is
    clipped at the figure's edges): about 120 / fontsize characters per inch."""
    width = int(fig.get_figwidth() * 120 / fontsize)
    return "\n".join(w for line in lines if line for w in textwrap.wrap(line, width))


@styled
def plot_lag_sweep(cells: list[dict], path: Path, title: str = "") -> Path:
    """Return and critic error vs lag (mean over seeds and error bars: the 95% t interval
    with >= MIN_INTERVAL_SEEDS seeds, else the seeds' range), one line per critic, one column
    per env; log2(1 + lag) axis with ticks at the lags run; the title states n, the
    statistic, the bars and each number's window.

    ``cells``: [{"config": TrainConfig dict, "summary": summarize(...)}].
    """
    envs = sorted({c["config"]["env"] for c in cells})
    critics = sorted({c["config"]["critic"] for c in cells})
    metrics = [("final_eval_return", "current-policy return"),
               ("final_return", "behaviour return"),
               ("gt_rel_err", "critic |V - V^pi| / |V^pi|")]
    metrics = [m for m in metrics if any(m[0] in c["summary"] for c in cells)]
    fig, axes = plt.subplots(len(metrics), len(envs), figsize=(4.5 * len(envs), 3.0 * len(metrics)),
                             squeeze=False, layout="constrained")
    ns = set()
    for j, env in enumerate(envs):
        for i, (key, label) in enumerate(metrics):
            ax = axes[i, j]
            for critic in critics:
                pts = sorted(
                    (_nominal_lag(c), c["summary"][key]["mean"], *_error_bar(c["summary"][key]))
                    for c in cells
                    if c["config"]["env"] == env and c["config"]["critic"] == critic
                    and key in c["summary"]
                )
                ns |= {c["summary"][key].get("n", 0) for c in cells if key in c["summary"]}
                if not pts:
                    continue
                x, y, below, above = map(np.asarray, zip(*pts))
                st = method_style(critic)
                ax.errorbar(dodge(x, critics.index(critic), len(critics), 0.06), y,
                            yerr=np.stack([below, above]), marker=st.marker, color=st.color,
                            ms=4, capsize=3, label=st.label)
            lag_axis(ax, sorted({_nominal_lag(c) for c in cells}))
            ax.set_xlabel("policy lag (updates)")
            ax.set_title(f"{env}: {label}", fontsize=9)
            ax.set_ylabel("relative error" if key == "gt_rel_err" else "episode return")
            if key == "gt_rel_err":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    n = min(ns) if ns else 0
    bars = ("95% t interval of the mean" if n >= MIN_INTERVAL_SEEDS
            else "smallest to largest seed")
    fig.suptitle(_wrapped(fig, title, f"{stats_note(n, 'seeds per point', 'mean; bars: ' + bars)}"
                          ". Current-policy return: the last 3 evaluations; behaviour return: "
                          "the last 10% of updates; critic error: the evaluations in the "
                          "second half of the run", fontsize=10), fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _panels(rows_by_label: dict) -> dict:
    """{panel: {label: rows}} from {(panel, label): rows} or {label: rows} (one panel)."""
    out: dict = {}
    for k, rows in rows_by_label.items():
        panel, label = k if isinstance(k, tuple) else ("", k)
        out.setdefault(panel, {})[label] = rows
    return out


def _band(ax, rows, key, color, **kw):
    """Mean over seeds and its band at the ground-truth updates (:func:`seed_band`: 95%
    percentile bootstrap, or the seeds' range with fewer than MIN_INTERVAL_SEEDS; never
    below the smallest seed, so never below 0 on a log axis); returns n seeds."""
    upd, g = gt_curve(rows, key)
    if g.size == 0:
        return 0
    mean, lo, hi = seed_band(g, axis=1)
    ax.plot(upd, np.maximum(mean, FLOOR), color=color, **kw)
    ax._vccc_means = getattr(ax, "_vccc_means", []) + [m for m in mean if np.isfinite(m) and m > 0]
    ax.fill_between(upd, np.maximum(lo, FLOOR), np.maximum(hi, FLOOR), color=color,
                    alpha=0.18, lw=0)
    return int(np.isfinite(g).any(axis=0).sum())


@styled
def error_curves(rows_by_label: dict, key: str = "exact_err_pi", *, gap: str = "pooled",
                 log: bool = True, ncols: int | None = None, title: str = ""):
    """Critic error vs update, one line per critic (mean over seeds, 95% bootstrap band), one panel
    per lag, with the exact gap ``exact_gap`` = ||V^{pi_k} - V^{mix}|| (the distance between
    the current policy's value and the replay mixture's) as a dashed reference.

    ``rows_by_label``: ``{(panel, label): metrics.csv rows}`` (panel: e.g. the lag "fixed:8";
    label: a critic / cell label, its first word picks the colour via ``method_style``, e.g.
    ``"truncated c=2"`` is drawn in truncated's colour) or ``{label: rows}`` for one panel.
    ``gap``: "pooled" (one black dashed line per panel: mean over every run in it), "per_method"
    (a thin dashed line in each critic's colour) or "none". Returns the figure (``publish`` it)."""
    if gap not in ("pooled", "per_method", "none"):
        raise ValueError(f"gap must be 'pooled', 'per_method' or 'none', got {gap!r}")
    panels = _panels(rows_by_label)
    ncols = ncols or min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    width = "one" if ncols == 1 else "two"
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize(width, 2.3 * nrows + 0.6), squeeze=False,
                             sharey=True, layout="constrained")
    n, gap_drawn = 0, False
    handles: dict = {}
    for ax, (panel, by_label) in zip(axes.ravel(), panels.items()):
        for label, rows in by_label.items():
            name, _, rest = str(label).partition(" ")
            st = method_style(name)
            shown = st.label + (f" {rest}" if rest else "") if name in _known() else str(label)
            n = max(n, _band(ax, rows, key, st.color, label=shown))
            if gap == "per_method" and key != "exact_gap" and "exact_gap" in rows[0]:
                gap_drawn |= _band(ax, rows, "exact_gap", st.color, ls="--", lw=0.8) > 0
        if gap == "pooled" and key != "exact_gap":
            pooled = [r for rows in by_label.values() if "exact_gap" in rows[0]
                      for r in _reseed(rows, by_label)]
            if pooled:
                gap_drawn |= _band(ax, pooled, "exact_gap", "#000000", ls="--", lw=1.0,
                                   label=ERROR_LABELS["exact_gap"] + " (all runs)") > 0
        ax.set_title(str(panel) if panel != "" else "")
        ax.set_xlabel("update")
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if log:  # one y range for the shared axis (per panel, the last panel's hid the others)
        means = [m for ax in axes.ravel() for m in getattr(ax, "_vccc_means", [])]
        for ax in axes.ravel()[:len(panels)]:
            ax.set_yscale("log")
            if means:  # a band reaching 1e-16 runs off the bottom
                ax.set_ylim(bottom=0.5 * min(means), top=2.0 * max(means))
            log_ticks(ax, "y")
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ERROR_LABELS.get(key, key))
    gap_txt = "; dashed: exact gap $V^{\\pi_k}$ vs $V^{mix}$" if gap_drawn else ""
    band = ("95% bootstrap band" if n >= MIN_INTERVAL_SEEDS
            else "band: smallest to largest seed")
    fig.suptitle(_wrapped(fig, title, stats_note(n, "seeds", f"line: mean over seeds, {band}; "
                                                 "at every ground-truth update") + gap_txt))
    legend_below(fig, handles=list(handles.values()), labels=list(handles),
                 ncol=min(4 if ncols > 1 else 2, len(handles)))
    return fig


def _known():
    return set(METHODS) | set(ALIASES)


def _reseed(rows: list[dict], by_label: dict) -> list[dict]:
    """Rows of one run with seeds renumbered so pooled runs do not collide on (update, seed)."""
    offset = 0
    for other in by_label.values():
        if other is rows:
            break
        offset += len({r["seed"] for r in other})
    return [dict(r, seed=r["seed"] + offset) for r in rows]
