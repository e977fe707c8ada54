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

from vccc_jax.analysis.seeds import bootstrap_band
from vccc_jax.plotting.style import (
    CLIPPED_FRONTIER,
    ERR_LABEL,
    FLOOR,
    VAR_LABEL,
    _style,
    _styled,
    band_line,
    dodge,
    lag_axis,
    log_ticks,
    method_linestyle,
    save,
    stats_note,
    zero_band,
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
    one panel per staleness law. Clipped methods at threshold ``clip``.

    Log y with a separate "exact" strip at the bottom for errors below ``ZERO_TOL`` (float64
    zero): an exact correction is drawn there, not on a log axis that runs down to 1e-14 as if
    its error fell gradually; a line entering the strip is dotted. The lag axis is
    log2(1 + lag) with ticks at the lags run. Methods whose errors coincide (truncated,
    V-trace and Z-centred share a fixed point) get distinct dashes and are dodged sideways."""
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
    series = {}
    for law in laws:
        for m in methods:
            c = _clip_for(R, m, clip)
            pts = [(lag, R.get(family, m, law, lag, c)) for lag in R.lags]
            pts = [(lag, x["fp_err_rms"]) for lag, x in pts if x is not None]
            if pts:
                series[law, m] = (c, pts)
    band = zero_band(axes.flat[: len(laws)], [y for _, pts in series.values() for _, y in pts])
    drawn = [m for m in methods if any((law, m) in series for law in laws)]
    for ax, law in zip(axes.flat, laws):
        for k, m in enumerate(drawn):
            if (law, m) not in series:
                continue
            c, pts = series[law, m]
            lags, err = map(np.asarray, zip(*pts))
            label, color, marker = _style(m)
            if c is not None:
                label = f"{label}, c={c:g}"
            band_line(ax, band, dodge(lags, k, len(drawn)), err, color=color,
                      ls=method_linestyle(m), marker=marker, ms=4.5, label=label,
                      mfc="white" if m in ("vtrace", "centered_baseline") else color)
        lag_axis(ax, R.lags)
        ax.set_title(f"law: {law}")
    for ax in axes[-1]:
        ax.set_xlabel("mean lag (versions; log2(1 + lag) axis)")
    for ax in axes[:, 0]:
        ax.set_ylabel(ERR_LABEL)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)),
               frameon=False)
    fig.suptitle(f"{family}: fixed-point error vs staleness (exact, float64; "
                 "mean over MDPs)\ngrey strip: exact to machine precision; markers dodged "
                 "sideways where methods coincide")
    return fig


@_styled
def fig_clip_heatmap(rows, family=None, law=None, methods: Sequence[str] = ("truncated", "masked", "vtrace")):
    """log10 fixed-point RMS error over (mean lag, clip c), one panel per clipped method, all
    panels on the same c columns; a (lag, c) cell a method was not run at is hatched and says
    why (masking at c = 1 keeps only rho = 1 exactly: an empty mask, left out of the grid)."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    methods = [m for m in methods if m in R.methods]
    if not methods:
        raise ValueError("no clipped methods in the rows")
    lags = R.lags
    clips = sorted({c for m in methods for c in R.clips(m)})
    grids = []
    for m in methods:
        g = np.full((len(lags), len(clips)), np.nan)
        for i, lag in enumerate(lags):
            for j, c in enumerate(clips):
                x = R.get(family, m, law, lag, c)
                if x is not None:
                    g[i, j] = np.log10(_floor(x["fp_err_rms"]))
        grids.append(g)
    finite = np.concatenate([g[np.isfinite(g)] for g in grids])
    vmin, vmax = (max(finite.min(), -6.0), finite.max()) if finite.size else (-6, 0)
    fig, axes = plt.subplots(1, len(methods), figsize=(2.9 * len(methods) + 0.9, 3.6),
                             squeeze=False, layout="constrained")
    im, missing = None, set()
    for ax, m, g in zip(axes[0], methods, grids):
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
                    continue
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fc="0.93", ec="0.6",
                                           hatch="////", lw=0))
                why = "empty\nmask" if m == "masked" and clips[j] <= 1.0 else "not run"
                missing.add(why.replace("\n", " "))
                ax.text(j, i, why, ha="center", va="center", fontsize=6, color="0.25")
    axes[0][0].set_ylabel("mean lag (versions)")
    # cells below the colour range (exact fixed points, ~1e-14) get the arrow of extend="min"
    below = bool(finite.size and finite.min() < vmin)
    cb = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.95, extend="min" if below else "neither")
    cb.set_label("log10 fixed-point RMS error" + (f" (arrow: below {vmin:g})" if below else ""))
    note = ""
    if "empty mask" in missing:
        note = ("\nhatched: not in the grid (masking at c = 1 keeps only "
                r"$\rho = 1$ exactly, an empty mask)")
    elif missing:
        note = "\nhatched: not in the grid"
    fig.suptitle(f"{family}, law {law}: fixed-point error of clipped targets (exact, mean over "
                 f"MDPs){note}")
    return fig


@_styled
def fig_variance_vs_clip(rows, family=None, law=None, lag=None,
                         methods: Sequence[str] = ("truncated", "masked", "vtrace",
                                                   "naive_baseline", "centered_baseline")):
    """Exact target variance at the fixed point (sum_s d_mix(s) Var[Y|s]) vs clip c, with
    the unclipped VCCC targets and the uncorrected target as horizontal references (the log
    axis has labelled ticks within a factor 1.25 below and above them: ``style.log_ticks``
    focus)."""
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
    refs = []
    for m, ls in (("vccc", "--"), ("vccc_bstar", ":"), ("uncorrected", "-.")):
        x = R.get(family, m, law, lag, None)
        if x is not None:
            label, color, _ = _style(m)
            ax.axhline(x["target_var"], color=color, ls=ls, lw=1.2, label=f"{label} (no clip)")
            refs.append(x["target_var"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(R.clips(), [f"{c:g}" for c in R.clips()])
    ax.minorticks_off()
    ax.set_yscale("log")
    log_ticks(ax, "y", focus=refs)  # labels where the unclipped references sit
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

    Log axes labelled at 1, 2, 5 x 10^k. The marker grows with c (the legend says which size
    is which c) instead of text labels that collide where curves meet; fixed points that are
    exact (error < ``ZERO_TOL``, e.g. VCCC) sit in the bottom "exact" strip.
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
    all_c = sorted({c for _, pts in curves for c, _, _ in pts})
    size = {c: 3.0 + 2.2 * i for i, c in enumerate(all_c)}  # marker size (points) per c
    fig, ax = plt.subplots(figsize=(6.6, 5.0), layout="constrained")
    band = zero_band(ax, [p[2] for _, pts in curves for p in pts] + [r[2] for r in refs])
    for k, (m, pts) in enumerate(curves):
        label, color, marker = _style(m)
        cs, xs, yv = zip(*pts)
        ys = band(yv)
        ax.plot(xs, ys, color=color, lw=1.3, ls=method_linestyle(m), label=label, zorder=2)
        for c, x, y in zip(cs, xs, ys):
            ax.plot([x], [y], marker=marker, color=color, ms=size[c], ls="none", zorder=3,
                    mfc="white" if k else color)
    for m, x, y in refs:
        label, color, marker = _style(m)
        ax.plot([x], [band([y])[0]], marker=marker, color=color, ls="none", ms=8,
                label=label + " (no clip)", zorder=4, mec="black", mew=0.5)
    for c in all_c:  # size key: one grey marker per c
        ax.plot([], [], marker="o", color="0.45", ls="none", ms=size[c], label=f"c = {c:g}")
    ax.set_xscale("log")
    log_ticks(ax, "x")
    ax.set_xlabel(VAR_LABEL)
    ax.set_ylabel("bias: " + ERR_LABEL)
    ax.set_title(f"{family}, law {law}, mean lag {lag:g}: bias vs variance across c\n"
                 "(exact, mean over MDPs; marker size grows with c)")
    _legend_below(fig, ax, ncol=4)
    return fig


@_styled
def fig_trained_curves(rows, family=None, law=None, lag=None, clip=None,
                       methods: Optional[Sequence[str]] = None):
    """RMS error of the stochastically trained critic vs update: the mean over MDPs with its
    95% percentile-bootstrap band over MDPs (from ``tc_curve_rms_seeds``; stores written
    before it existed draw the mean only and say so), and each method's exact fixed-point
    error as a dashed line of the same colour."""
    R = rows if isinstance(rows, Rows) else Rows(rows)
    family = family or R.families[0]
    law = law or R.default_law()
    lag = R.default_lag() if lag is None else lag
    clip = R.default_clip() if clip is None else clip
    methods = list(methods or R.methods)
    fig, ax = plt.subplots(figsize=(6.6, 5.4), layout="constrained")
    drawn, n_mdps, banded, fixed = 0, 0, True, []
    for m in methods:
        c = _clip_for(R, m, clip)
        x = R.get(family, m, law, lag, c)
        if x is None or "tc_curve_rms" not in x:
            continue
        label, color, _ = _style(m)
        if c is not None:
            label = f"{label}, c={c:g}"
        ax.plot(x["tc_updates"], x["tc_curve_rms"], color=color, label=label, lw=1.5,
                ls=method_linestyle(m))
        per_mdp = x.get("tc_curve_rms_seeds")
        if per_mdp is not None and len(per_mdp) > 1:
            _, lo, hi = bootstrap_band(np.asarray(per_mdp, np.float64), axis=0)
            ax.fill_between(x["tc_updates"], lo, hi, color=color, alpha=0.15, lw=0)
            n_mdps = max(n_mdps, len(per_mdp))
        else:
            banded = False
        fixed.append((x["fp_err_rms"], color, label))
        drawn += 1
    if not drawn:
        raise ValueError("no trained-critic curves in the rows (was training disabled?)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("critic update")
    ax.set_ylabel(r"RMS error to $V^{\pi_K}$ ($d^{\pi_K}$-weighted)")
    off = _fixed_points(ax, fixed)
    bars = (stats_note(n_mdps, "MDPs", "line: mean, band: 95% percentile-bootstrap CI")
            if banded and n_mdps else "mean over MDPs (no per-MDP curves in this store)")
    ax.set_title(f"{family}, law {law}, mean lag {lag:g}: trained critic\n{bars}; "
                 "sparse dots + arrow at right: that method's exact fixed point")
    if off:
        ax.text(0.01, 0.01, "fixed points below the axis (exact to round-off): " + "; ".join(
            f"{label} {fp:.0e}" for fp, _, label in off), transform=ax.transAxes, fontsize=7,
            va="bottom", ha="left", color="0.3")
    _legend_below(fig, ax)
    return fig


FIXED_POINT_LS = (0, (1, 4))  # fig_trained_curves' fixed-point lines: no method's curve uses it


def _fixed_points(ax, fixed: list) -> list:
    """Each method's exact fixed-point error as a sparse dotted line of its colour with an
    arrow on the right edge; returns the (error, colour, label) of the exact ones (below
    ``EXACT_FP``: VCCC's ~1e-14, off any useful scale), for the note that names them."""
    off = []
    for fp, color, label in fixed:
        if fp < EXACT_FP:
            off.append((fp, color, label))
            continue
        ax.axhline(fp, color=color, ls=FIXED_POINT_LS, lw=1.1)
        ax.plot([1.0], [fp], marker="<", color=color, ms=6, clip_on=False, ls="none",
                transform=ax.get_yaxis_transform())
    return off


EXACT_FP = 1e-6  # a fixed-point error below this is exact (round-off): noted, not drawn


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
