"""Figures of the tabular staleness sweeps (PNG + PDF), from loaded result rows.

Every figure function is pure: it takes the rows of a result store (``runs.store``
rows: dicts with ``cell`` and ``metrics``) plus a few selectors, and returns a matplotlib
Figure; :func:`make_figures` writes all of them; ``vccc figures`` is ``commands.figures``.
Notebooks only load rows and call these functions.

    fig_error_vs_lag        fixed-point error vs mean lag per method (log y), one panel per law
    fig_clip_heatmap        fixed-point error over (mean lag, clip c) for clipped targets
    fig_variance_vs_clip    target variance vs c
    fig_bias_variance       bias-variance frontier across c: truncation vs masking vs V-trace
    fig_trained_curves      trained-critic error curves at one lag

Imports ``analysis`` (and lower) only; ``runs`` never imports plotting.
No backend is forced: headless processes get matplotlib's Agg fallback, notebooks their
inline backend.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.plotting.style import (
    CLIPPED_FRONTIER,
    ERR_LABEL,
    FLOOR,
    VAR_LABEL,
    _style,
    _styled,
    save,
)

log = logging.getLogger(__name__)


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
                log.info("figures: skipped %s/%s: %s", fam, name, e)
                continue
            out += save(fig, Path(out_dir) / f"{fam}_{name}")
    return out
