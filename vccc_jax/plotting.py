"""Figures of the tabular staleness sweeps (PNG + PDF), from loaded result rows.

Every figure function is pure: it takes the rows of a result store (``sweeps.store``
rows: dicts with ``cell`` and ``metrics``) plus a few selectors, and returns a matplotlib
Figure; :func:`make_figures` writes all of them; :func:`main` is ``vccc figures``.
Notebooks only load rows and call these functions.

    fig_error_vs_lag        fixed-point error vs mean lag per method (log y), one panel per law
    fig_clip_heatmap        fixed-point error over (mean lag, clip c) for clipped targets
    fig_variance_vs_clip    target variance vs c
    fig_bias_variance       bias-variance frontier across c: truncation vs masking vs V-trace
    fig_trained_curves      trained-critic error curves at one lag

Sits on the top layer: it may import ``sweeps``; nothing in the library imports it.
No backend is forced: headless processes get matplotlib's Agg fallback, notebooks their
inline backend.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.sweeps import train as train_run
from vccc_jax.tabular import async_ac

FLOOR = 1e-16  # errors at machine precision are drawn here on log axes

STYLE = {
    "uncorrected": ("uncorrected (stale)", "#d62728", "o"),
    "vccc": ("VCCC / IW-TD", "#1f77b4", "s"),
    "vccc_bstar": ("VCCC, $b^*$", "#17becf", "D"),
    "truncated": (r"truncated $\min(\rho, c)$", "#2ca02c", "^"),
    "masked": (r"masked $\rho\,1[1/c \leq \rho \leq c]$", "#9467bd", "v"),
    "naive_baseline": (r"naive clipped, $b = V^{\pi_0}$", "#ff7f0e", "x"),
    "centered_baseline": (r"$Z$-centred clipped, $b = V^{\pi_0}$", "#8c564b", "P"),
    "vtrace": (r"V-trace $\bar\rho = \bar c = c$", "#e377c2", "*"),
}
ERR_LABEL = r"fixed-point RMS error to $V^{\pi_K}$"
VAR_LABEL = r"target variance $\sum_s d_{mix}(s)\,\mathrm{Var}[Y \mid s]$"
CLIPPED_FRONTIER = ("truncated", "masked", "vtrace")


def _style(method: str):
    if method in STYLE:
        return STYLE[method]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return method, colors[sum(map(ord, method)) % len(colors)], "."


RC = {
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "legend.fontsize": 8.5,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.dpi": 110,
    "axes.grid": True, "grid.alpha": 0.3,
}
DPI = 150


def _styled(fn):
    """Draw inside ``plt.rc_context(RC)`` so the caller's matplotlib settings are untouched."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return fn(*args, **kwargs)
    return wrapper


# ------------------------------------------------------------------------ row access


class Rows:
    """Index of result rows: ``rows.get(family, method, law, lag, clip)`` -> metrics.

    Rows are taken in order and a later row for the same (family, method, law, lag, clip)
    replaces an earlier one: a store that was run with several versions of its config shows
    the newest. Plot one sweep's store at a time.
    """

    def __init__(self, rows: Iterable[dict]):
        rows = list(rows)
        if not rows:
            raise ValueError("no result rows to plot")
        self._idx = {}
        for r in rows:
            c = r["cell"]
            key = (c["family"]["name"], c["method"], c["law"], float(c["mean_lag"]), c["clip"])
            self._idx[key] = r  # a store run with several config versions: newest wins
        self.rows = list(self._idx.values())

    def _values(self, field: str) -> list:
        out = []
        for r in self.rows:
            v = r["cell"]["family"]["name"] if field == "family" else r["cell"][field]
            if v not in out:
                out.append(v)
        return out

    @property
    def families(self) -> list:
        return self._values("family")

    @property
    def methods(self) -> list:
        return self._values("method")

    @property
    def laws(self) -> list:
        return self._values("law")

    @property
    def lags(self) -> list:
        return sorted({float(r["cell"]["mean_lag"]) for r in self.rows})

    def clips(self, method: Optional[str] = None) -> list:
        return sorted({r["cell"]["clip"] for r in self.rows if r["cell"]["clip"] is not None
                       and (method is None or r["cell"]["method"] == method)})

    def get(self, family, method, law, lag, clip=None) -> Optional[dict]:
        r = self._idx.get((family, method, law, float(lag), clip))
        return None if r is None else r["metrics"]

    def cell(self, family, method, law, lag, clip=None) -> Optional[dict]:
        r = self._idx.get((family, method, law, float(lag), clip))
        return None if r is None else r["cell"]

    # default selectors --------------------------------------------------------------
    def default_law(self) -> str:
        return "geometric" if "geometric" in self.laws else self.laws[0]

    def default_lag(self) -> float:
        nonzero = [m for m in self.lags if m > 0]
        return nonzero[len(nonzero) // 2] if nonzero else self.lags[-1]

    def default_clip(self) -> Optional[float]:
        cs = self.clips()
        return cs[len(cs) // 2] if cs else None


def _clip_for(rows: Rows, method: str, clip):
    """``clip`` for methods swept over the clip axis, None for the others."""
    return clip if rows.clips(method) else None


def _legend_below(fig, ax, ncol: int = 2) -> None:
    """Legend under the axes (never on top of the data); needs a constrained layout."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


def _floor(x):
    return max(float(x), FLOOR) if x is not None and np.isfinite(x) else np.nan


# ------------------------------------------------------------------------- figures


@_styled
def fig_error_vs_lag(rows, family=None, clip=None, methods: Optional[Sequence[str]] = None,
                     laws: Optional[Sequence[str]] = None):
    """Fixed-point RMS error |V_fp - V^{pi_K}| (d^{pi_K}-weighted) vs mean lag, per method,
    log y; one panel per staleness law. Clipped methods at threshold ``clip``."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    clip = R.default_clip() if clip is None else clip
    laws = list(laws or R.laws)
    methods = list(methods or R.methods)
    ncols = 2 if len(laws) > 2 else len(laws)
    nrows = -(-len(laws) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols + 0.6, 2.7 * nrows + 1.3),
                             sharey=True, sharex=True, squeeze=False, layout="constrained")
    for ax in axes.flat[len(laws):]:
        ax.set_visible(False)
    for ax, law in zip(axes.flat, laws):
        for m in methods:
            c = _clip_for(R, m, clip)
            pts = [(lag, R.get(family, m, law, lag, c)) for lag in R.lags]
            pts = [(lag, _floor(x["fp_err_rms"])) for lag, x in pts if x is not None]
            if not pts:
                continue
            label, color, marker = _style(m)
            if c is not None:
                label = f"{label}, c={c:g}"
            ax.plot(*zip(*pts), marker=marker, color=color, label=label, lw=1.4, ms=5)
        ax.set_yscale("log")
        ax.set_title(f"law: {law}")
    for ax in axes[-1]:
        ax.set_xlabel("mean lag (versions)")
    for ax in axes[:, 0]:
        ax.set_ylabel(ERR_LABEL)
    axes[0][0].set_ylim(bottom=FLOOR / 3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)),
               frameon=False)
    fig.suptitle(f"{family}: fixed-point error vs staleness\n(about 1e-14: exact in float64)")
    return fig


@_styled
def fig_clip_heatmap(rows, family=None, law=None, methods: Sequence[str] = ("truncated", "masked", "vtrace")):
    """log10 fixed-point RMS error over (mean lag, clip c), one panel per clipped method."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    methods = [m for m in methods if m in R.methods]
    if not methods:
        raise ValueError("no clipped methods in the rows")
    lags = R.lags
    grids = []
    for m in methods:
        clips = R.clips(m)
        g = np.full((len(lags), len(clips)), np.nan)
        for i, lag in enumerate(lags):
            for j, c in enumerate(clips):
                x = R.get(family, m, law, lag, c)
                if x is not None:
                    g[i, j] = np.log10(_floor(x["fp_err_rms"]))
        grids.append((clips, g))
    finite = np.concatenate([g[np.isfinite(g)] for _, g in grids])
    vmin, vmax = (max(finite.min(), -6.0), finite.max()) if finite.size else (-6, 0)
    fig, axes = plt.subplots(1, len(methods), figsize=(2.9 * len(methods) + 0.9, 3.4),
                             squeeze=False, layout="constrained")
    im = None
    for ax, m, (clips, g) in zip(axes[0], methods, grids):
        im = ax.imshow(g, origin="lower", aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        ax.set_xticks(range(len(clips)), [f"{c:g}" for c in clips])
        ax.set_yticks(range(len(lags)), [f"{lag:g}" for lag in lags])
        ax.set_xlabel("clip threshold c")
        ax.set_title(_style(m)[0])
        ax.grid(False)
        for i in range(len(lags)):
            for j in range(len(clips)):
                if np.isfinite(g[i, j]):
                    ax.text(j, i, f"{10 ** g[i, j]:.0e}" if g[i, j] < -2 else f"{10 ** g[i, j]:.2f}",
                            ha="center", va="center", fontsize=7.5,
                            color="white" if g[i, j] < (vmin + vmax) / 2 else "black")
    axes[0][0].set_ylabel("mean lag (versions)")
    cb = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.95)
    cb.set_label("log10 fixed-point RMS error")
    fig.suptitle(f"{family}, law {law}: fixed-point error of clipped targets")
    return fig


@_styled
def fig_variance_vs_clip(rows, family=None, law=None, lag=None,
                         methods: Sequence[str] = ("truncated", "masked", "vtrace",
                                                   "naive_baseline", "centered_baseline")):
    """Exact target variance at the fixed point (sum_s d_mix(s) Var[Y|s]) vs clip c, with
    the unclipped VCCC targets and the uncorrected target as horizontal references."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    lag = R.default_lag() if lag is None else lag
    fig, ax = plt.subplots(figsize=(6.4, 5.0), layout="constrained")
    for m in methods:
        if m not in R.methods:
            continue
        pts = [(c, R.get(family, m, law, lag, c)) for c in R.clips(m)]
        pts = [(c, x["target_var"]) for c, x in pts if x is not None]
        if pts:
            label, color, marker = _style(m)
            ax.plot(*zip(*pts), marker=marker, color=color, label=label, lw=1.4)
    for m, ls in (("vccc", "--"), ("vccc_bstar", ":"), ("uncorrected", "-.")):
        x = R.get(family, m, law, lag, None)
        if x is not None:
            label, color, _ = _style(m)
            ax.axhline(x["target_var"], color=color, ls=ls, lw=1.2, label=f"{label} (no clip)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(R.clips(), [f"{c:g}" for c in R.clips()])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("clip threshold c")
    ax.set_ylabel(VAR_LABEL)
    ax.set_title(f"{family}, law {law}, mean lag {lag:g}: target variance vs c")
    _legend_below(fig, ax)
    return fig


@_styled
def fig_bias_variance(rows, family=None, law=None, lag=None,
                      methods: Sequence[str] = CLIPPED_FRONTIER):
    """Bias-variance frontier across c: (target variance, fixed-point error) per clip c,
    connected in order of c, for truncation vs masking vs V-trace; unclipped references.

    Log axes; fixed points that are exact (error < 1e-10, e.g. VCCC) sit on the bottom
    edge, marked as such, so they do not stretch the axis down to 1e-14.
    """
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    lag = R.default_lag() if lag is None else lag
    curves, refs = [], []
    for m in methods:
        if m not in R.methods:
            continue
        pts = [(c, R.get(family, m, law, lag, c)) for c in R.clips(m)]
        pts = [(c, x["target_var"], x["fp_err_rms"]) for c, x in pts if x is not None]
        if pts:
            curves.append((m, pts))
    for m in ("vccc", "vccc_bstar", "uncorrected"):
        x = R.get(family, m, law, lag, None)
        if x is not None:
            refs.append((m, x["target_var"], x["fp_err_rms"]))
    ys = [p[2] for _, pts in curves for p in pts] + [r[2] for r in refs]
    inexact = [y for y in ys if y is not None and y > 1e-10]
    bottom = min(inexact) / 4 if inexact else 1e-3
    clamp = lambda y: max(y, bottom)  # noqa: E731
    fig, ax = plt.subplots(figsize=(6.6, 5.0), layout="constrained")
    for m, pts in curves:
        label, color, marker = _style(m)
        cs, xs, yv = zip(*pts)
        ax.plot(xs, [clamp(y) for y in yv], marker=marker, color=color, label=label, lw=1.4)
        for i in {0, len(pts) - 1}:
            ax.annotate(f"c={cs[i]:g}", (xs[i], clamp(yv[i])), textcoords="offset points",
                        xytext=(5, 4 if i else -10), fontsize=8, color=color)
    for m, x, y in refs:
        label, color, marker = _style(m)
        ax.plot([x], [clamp(y)], marker=marker, color=color, ls="none", ms=8, label=label)
    ax.axhline(bottom, color="0.5", lw=0.8, ls=":")
    ax.text(0.01, 0.01, "bottom edge: exact (error < 1e-10)", transform=ax.transAxes,
            fontsize=7.5, color="0.35", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=bottom / 1.5)
    ax.set_xlabel(VAR_LABEL)
    ax.set_ylabel("bias: " + ERR_LABEL)
    ax.set_title(f"{family}, law {law}, mean lag {lag:g}: bias vs variance across c")
    _legend_below(fig, ax, ncol=3)
    return fig


@_styled
def fig_trained_curves(rows, family=None, law=None, lag=None, clip=None,
                       methods: Optional[Sequence[str]] = None):
    """RMS error of the stochastically trained critic vs update (mean over MDPs), with each
    method's fixed-point error as a dashed line of the same colour."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    lag = R.default_lag() if lag is None else lag
    clip = R.default_clip() if clip is None else clip
    methods = list(methods or R.methods)
    fig, ax = plt.subplots(figsize=(6.6, 5.4), layout="constrained")
    drawn = 0
    for m in methods:
        c = _clip_for(R, m, clip)
        x = R.get(family, m, law, lag, c)
        if x is None or "tc_curve_rms" not in x:
            continue
        label, color, _ = _style(m)
        if c is not None:
            label = f"{label}, c={c:g}"
        ax.plot(x["tc_updates"], x["tc_curve_rms"], color=color, label=label, lw=1.5)
        fp = x["fp_err_rms"]
        if fp > 1e-6:
            ax.axhline(fp, color=color, ls="--", lw=1.0, alpha=0.8)
        drawn += 1
    if not drawn:
        raise ValueError("no trained-critic curves in the rows (was training disabled?)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("critic update")
    ax.set_ylabel(r"RMS error to $V^{\pi_K}$ ($d^{\pi_K}$-weighted)")
    ax.set_title(f"{family}, law {law}, mean lag {lag:g}: trained critic\n"
                 "(dashed: that method's exact fixed point)")
    _legend_below(fig, ax)
    return fig


FIGURES = {
    "error_vs_lag": fig_error_vs_lag,
    "clip_heatmap": fig_clip_heatmap,
    "variance_vs_clip": fig_variance_vs_clip,
    "bias_variance": fig_bias_variance,
    "trained_curves": fig_trained_curves,
}


# ------------------------------------------------------- async actor-critic (issue 5)


ASYNC_VARIANT_STYLE = {
    ("uncorrected", "none"): ("stale critic, no centering", "#d62728", "o", "-"),
    ("uncorrected", "exact"): ("stale critic + score centering", "#ff7f0e", "s", "--"),
    ("vccc", "none"): ("VCCC critic, no centering", "#1f77b4", "^", "-"),
    ("vccc", "exact"): ("VCCC critic + score centering", "#2ca02c", "D", "--"),
    ("uncorrected", "topk"): ("stale critic + top-k centering", "#e377c2", "v", ":"),
    ("vccc", "topk"): ("VCCC critic + top-k centering", "#9467bd", "P", ":"),
}


def fig_async_ac(rows: list[dict], mode: str = "expected", actor_kind: Optional[str] = None):
    """The 2 x 2 grid across mean lag for one actor weight: final return gap, the paired change
    of the training-averaged gap, gradient bias, cosine to the true policy gradient, the
    bias's drift / critic / weight parts, critic error (MDP means with ``async_ac.CI_LEVEL``
    t-intervals; paired over MDPs for the return change). Returns a matplotlib Figure."""
    sel = [r for r in rows if r["cell"]["mode"] == mode]
    if not sel:
        raise ValueError(f"no rows with mode {mode!r}")
    kinds = sorted({r["cell"]["actor_kind"] for r in sel})
    actor_kind = actor_kind or ("truncate" if "truncate" in kinds else kinds[0])
    sel = [r for r in sel if r["cell"]["actor_kind"] == actor_kind]
    n = len(sel[0]["metrics"]["gap"]["per_mdp"])
    reference = async_ac.default_reference(sel)
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
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.4))
    ref = {r["cell"]["mean_lag"]: r for r in sel
           if (r["cell"]["critic"], r["cell"]["centering"]) == reference}
    for ax, (metric, label, paired) in zip(axes.ravel(), panels):
        for (crit, cen), (name, color, marker, ls) in ASYNC_VARIANT_STYLE.items():
            rs = sorted((r for r in sel if r["cell"]["critic"] == crit and r["cell"]["centering"] == cen),
                        key=lambda r: r["cell"]["mean_lag"])
            if paired:
                rs = [r for r in rs if r["cell"]["mean_lag"] in ref]
                st = [async_ac.mean_ci(np.asarray(r["metrics"][metric]["per_mdp"])
                            - np.asarray(ref[r["cell"]["mean_lag"]]["metrics"][metric]["per_mdp"]))
                      for r in rs]
            else:
                st = [r["metrics"][metric] for r in rs]
            if not rs:
                continue
            x = np.array([r["cell"]["mean_lag"] for r in rs])
            y = np.array([t["mean"] for t in st])
            e = np.array([t["ci"] for t in st])
            ax.errorbar(x, y, yerr=e, label=name, color=color, marker=marker, ls=ls, capsize=3, ms=5)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f"mean lag ({sel[0]['config']['grid']['law']} law)")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    weight = {"none": "w = 1", "ratio": r"w = $\rho$", "truncate": r"w = min($\rho$, c)",
              "mask": r"w = $\rho\,1[1/c\leq\rho\leq c]$"}[actor_kind]
    fig.suptitle(f"Async tabular actor-critic ({mode} updates, actor {weight}); "
                 f"mean over {n} random MDPs, {int(async_ac.CI_LEVEL * 100)}% t-intervals", fontsize=11)
    fig.tight_layout()
    return fig




# ------------------------------------------------------------ neural training (issue 6)


def plot_learning_curves(rows: list[dict], path: Path, title: str = "") -> Path:
    """Return, critic error vs ground truth and ESS vs env steps; mean and 95% CI over seeds."""
    steps = np.array(sorted({r["env_steps"] for r in rows}), np.float64)
    panels = [("return", "behaviour return"), ("eval_return", "current-policy return"),
              ("gt_mse", "critic MSE vs MC V^pi"), ("ess", "ESS fraction")]
    panels = [(k, lab) for k, lab in panels if np.any(np.isfinite(train_run.metric_column(rows, k)))]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        y = train_run.metric_column(rows, key)
        have = np.any(np.isfinite(y), axis=1)
        mean, half = train_run.mean_ci(y[have], axis=1)
        x = steps[have]
        ax.plot(x, mean, lw=1.5, marker="o" if have.sum() < 40 else None, ms=3)
        ax.fill_between(x, mean - half, mean + half, alpha=0.25)
        ax.set_xlabel("env steps")
        ax.set_title(label, fontsize=10)
        if key == "gt_mse":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_lag_sweep(cells: list[dict], path: Path, title: str = "") -> Path:
    """Return and critic error vs mean lag, one line per critic, one column per env.

    ``cells``: [{"config": TrainConfig dict, "summary": summarize(...)}].
    """
    envs = sorted({c["config"]["env"] for c in cells})
    critics = sorted({c["config"]["critic"] for c in cells})
    metrics = [("final_eval_return", "current-policy return"),
               ("final_return", "behaviour return"),
               ("gt_rel_err", "critic |V - V^pi| / |V^pi|")]
    metrics = [m for m in metrics if any(m[0] in c["summary"] for c in cells)]
    fig, axes = plt.subplots(len(metrics), len(envs), figsize=(4.5 * len(envs), 3.0 * len(metrics)),
                             squeeze=False)
    for j, env in enumerate(envs):
        for i, (key, label) in enumerate(metrics):
            ax = axes[i, j]
            for critic in critics:
                pts = sorted(
                    (c["summary"]["lag_mean"]["mean"], c["summary"][key]["mean"],
                     c["summary"][key]["ci95"])
                    for c in cells
                    if c["config"]["env"] == env and c["config"]["critic"] == critic
                    and key in c["summary"]
                )
                if not pts:
                    continue
                x, y, e = map(np.asarray, zip(*pts))
                ax.errorbar(x, y, yerr=e, marker="o", ms=4, capsize=3, label=critic)
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlabel("mean lag (updates)")
            ax.set_title(f"{env}: {label}", fontsize=9)
            if key == "gt_rel_err":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save(fig, path_stem: str | Path, *, close: bool = True) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf`` (closing the figure unless ``close=False``)."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "pdf"):
        p = path_stem.with_suffix(f".{ext}")
        fig.savefig(p, bbox_inches="tight", dpi=DPI)
        out.append(p)
    if close:
        plt.close(fig)
    return out


def make_figures(rows: Iterable[dict], out_dir: str | Path) -> list[Path]:
    """Every figure for every family in ``rows``: ``<out>/<family>_<figure>.{png,pdf}``.

    A figure whose data are absent from the rows (e.g. no clipped methods) is skipped.
    """
    R = Rows(rows)
    out = []
    for fam in R.families:
        for name, fn in FIGURES.items():
            try:
                fig = fn(R, family=fam)
            except ValueError as e:
                print(f"figures: skipped {fam}/{name}: {e}", file=sys.stderr)
                continue
            out += save(fig, Path(out_dir) / f"{fam}_{name}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """``vccc figures --results DIR --out DIR``: figures for every store in DIR (or a file)."""
    from vccc_jax.sweeps.store import iter_store_files, read_rows

    p = argparse.ArgumentParser(prog="vccc figures",
                                description="regenerate the sweep figures from a result store")
    p.add_argument("--results", default="results", help="store file or directory (default: results)")
    p.add_argument("--out", default="figures", help="output directory (default: figures)")
    args = p.parse_args(argv)
    src = Path(args.results)
    files = [src] if src.is_file() else list(iter_store_files(src)) if src.is_dir() else []
    if not files:
        print(f"vccc figures: no result store at {src}", file=sys.stderr)
        return 2
    total = 0
    for f in files:
        rows = read_rows(f)
        if not rows:
            continue
        paths = make_figures(rows, Path(args.out) / f.stem)
        total += len(paths)
        print(f"{f}: {len(paths)} files in {Path(args.out) / f.stem}")
    return 0 if total else 1


if __name__ == "__main__":
    sys.exit(main())
