"""One style for every figure: fixed colour per method, paper sizes, fonts, PNG + PDF writer.

Use it from any figure module::

    from vccc_jax.plotting.style import method_style, figsize, styled, save, legend_below

    @styled                                    # draws inside the paper rc settings
    def fig_mine(rows):
        fig, ax = plt.subplots(figsize=figsize("one"), layout="constrained")
        label, color, marker = method_style("brace")   # the one colour of "brace"
        ...
        return fig
    save(fig, "figures/mine")                  # mine.png (300 dpi) + mine.pdf (vector)

Colours: Okabe-Ito (colour-blind safe) for the core targets, Paul Tol's muted set for the
comparators; every registry / comparator name has one fixed colour and marker
(:data:`METHODS`), so a method looks the same in every figure. An unknown name gets a
stable grey-ish fallback and a warning-free label (the name itself).
Sizes: :data:`ONE_COLUMN` (3.4 in) and :data:`TWO_COLUMN` (7.0 in) wide, the usual
single- and double-column widths of two-column papers; fonts 8-9 pt at those sizes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np

FLOOR = 1e-16  # errors at machine precision are drawn here on log axes
ZERO_TOL = 1e-10  # an exact (float64) error below this is "machine zero": drawn in its own band

# Okabe & Ito (2008) colour-blind-safe palette, and Paul Tol's "muted" scheme.
OKABE_ITO = {"orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "black": "#000000"}
TOL_MUTED = {"indigo": "#332288", "cyan": "#88CCEE", "teal": "#44AA99", "green": "#117733",
             "olive": "#999933", "sand": "#DDCC77", "rose": "#CC6677", "wine": "#882255",
             "purple": "#AA4499", "grey": "#DDDDDD"}
EXACT_COLOR = "#000000"  # exact / closed-form references
GREY = "#777777"


class MethodStyle(NamedTuple):
    label: str
    color: str
    marker: str


# One entry per method name used anywhere in the project (critic-target registry, trainer,
# comparators, critic-free baselines). Keep colours unique.
METHODS: dict[str, MethodStyle] = {
    # critic targets (estimators.registry + trainer)
    "uncorrected": MethodStyle("uncorrected (stale)", OKABE_ITO["vermillion"], "o"),
    "gae": MethodStyle("GAE (uncorrected)", GREY, "h"),
    "vccc": MethodStyle("VCCC / IW-TD", OKABE_ITO["blue"], "s"),
    "vccc_bstar": MethodStyle("VCCC, $b^*$", OKABE_ITO["sky"], "D"),
    "truncated": MethodStyle(r"truncated $\min(\rho, c)$", OKABE_ITO["green"], "^"),
    "masked": MethodStyle(r"masked $\rho\,1[1/c \leq \rho \leq c]$", OKABE_ITO["purple"], "v"),
    "naive_baseline": MethodStyle(r"naive clipped, $b = V^{\pi_0}$", OKABE_ITO["orange"], "x"),
    "centered_baseline": MethodStyle(r"$Z$-centred clipped, $b = V^{\pi_0}$", TOL_MUTED["wine"], "P"),
    "vtrace": MethodStyle(r"V-trace ($\bar\rho = \bar c$)", TOL_MUTED["indigo"], "*"),
    # comparators (estimators.related, issues 13-14)
    "brace": MethodStyle("BRACE", TOL_MUTED["green"], "<"),
    "decoupled": MethodStyle("decoupled PPO", TOL_MUTED["teal"], ">"),
    "ppo_ewma": MethodStyle("PPO-EWMA", TOL_MUTED["cyan"], "d"),
    "rac": MethodStyle("RAC", TOL_MUTED["purple"], "p"),
    "ps_ppo": MethodStyle("PS-PPO", TOL_MUTED["olive"], "X"),
    "grpo": MethodStyle("GRPO", TOL_MUTED["sand"], "8"),
    "drop": MethodStyle("drop late rewards", TOL_MUTED["rose"], "1"),
    "wait": MethodStyle("wait for slow", "#555555", "2"),
    # references
    "exact": MethodStyle("exact", EXACT_COLOR, "none"),
}
ALIASES = {"td": "uncorrected", "clipped": "truncated", "zcentered": "centered_baseline",
           "naive-clipped": "naive_baseline", "iw_td": "vccc", "ewma": "ppo_ewma"}

# Backwards-compatible view: name -> (label, colour, marker).
STYLE = {k: tuple(v) for k, v in METHODS.items()}

ERR_LABEL = r"fixed-point RMS error to $V^{\pi_K}$"
VAR_LABEL = r"target variance $\sum_s d_{mix}(s)\,\mathrm{Var}[Y \mid s]$"
CLIPPED_FRONTIER = ("truncated", "masked", "vtrace")

ONE_COLUMN = 3.4   # inches, single column of a two-column paper
TWO_COLUMN = 7.0   # inches, full text width
DPI = 300          # PNG resolution of paper figures
GALLERY_DPI = 110  # README gallery PNGs (< 200 KB)


def method_style(method: str) -> MethodStyle:
    """(label, colour, marker) of a method name; the same in every figure."""
    name = ALIASES.get(method, method)
    if name in METHODS:
        return METHODS[name]
    fallback = ("#9E9E9E", "#6B6B6B", "#BDBDBD", "#4D4D4D")
    return MethodStyle(method, fallback[sum(map(ord, method)) % len(fallback)], ".")


_style = method_style  # old private name (plotting.tabular)


def figsize(columns: str = "one", height: float | None = None, aspect: float = 0.75) -> tuple:
    """(width, height) in inches: ``columns`` "one" (3.4 in) or "two" (7.0 in); height
    defaults to width * aspect (one column) or 0.42 * width (two columns)."""
    if columns not in ("one", "two"):
        raise ValueError(f"columns must be 'one' or 'two', got {columns!r}")
    w = ONE_COLUMN if columns == "one" else TWO_COLUMN
    if height is None:
        height = w * aspect if columns == "one" else w * 0.42
    return (w, float(height))


RC = {
    "font.size": 8.5, "axes.titlesize": 8.5, "axes.labelsize": 8.5, "legend.fontsize": 7.5,
    "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "figure.titlesize": 9,
    "figure.dpi": 110, "savefig.dpi": DPI, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linewidth": 0.5, "lines.linewidth": 1.3, "lines.markersize": 4,
    "axes.linewidth": 0.6, "axes.spines.top": False, "axes.spines.right": False,
    "legend.frameon": False, "pdf.fonttype": 42, "ps.fonttype": 42,  # editable text in PDF
    "font.family": "DejaVu Sans", "mathtext.fontset": "dejavusans",
}


def styled(fn):
    """Draw inside ``plt.rc_context(RC)`` so the caller's matplotlib settings are untouched."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return fn(*args, **kwargs)
    return wrapper


_styled = styled


# Line style per method where curves can coincide (e.g. truncated, V-trace and Z-centred have
# the same fixed point): a distinct dash keeps each visible when drawn on top of another.
LINESTYLES = {"truncated": "-", "vtrace": (0, (5, 2)), "centered_baseline": (0, (1, 1.5)),
              "masked": (0, (3, 1, 1, 1)), "naive_baseline": (0, (6, 1.5, 1, 1.5)),
              "vccc_bstar": (0, (2, 1.5)), "brace": (0, (4, 1.5))}


def method_linestyle(method: str):
    """The line style of a method (solid unless :data:`LINESTYLES` gives one)."""
    return LINESTYLES.get(ALIASES.get(method, method), "-")


def fmt_num(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits; |x| < 1e-12 (float64 round-off) prints as 0."""
    return "0" if abs(x) < 1e-12 else f"{x:.{digits}g}"


# ------------------------------------------------------------------------ axes helpers


def _log2p(x):
    """sign(x) log2(1 + |x|): the lag axis scale (odd, so a dodge left of lag 0 survives)."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.log2(1.0 + np.abs(x))


def _exp2m(y):
    y = np.asarray(y, np.float64)
    return np.sign(y) * (np.exp2(np.abs(y)) - 1.0)


def lag_axis(ax, lags, axis: str = "x", label: str | None = None) -> None:
    """A lag axis on a log2(1 + lag) scale (lag 0 included, 0-8 not crowded next to 32+) with
    ticks at exactly the lags that were run."""
    lags = sorted({float(v) for v in lags})
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    set_scale("function", functions=(_log2p, _exp2m))
    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    set_ticks(lags, [f"{v:g}" for v in lags])
    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_locator(mticker.NullLocator())
    pad = 0.08 * max(_log2p(lags[-1]) - _log2p(lags[0]), 1.0)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(_exp2m(_log2p(lags[0]) - pad),
                                                   _exp2m(_log2p(lags[-1]) + pad))
    if label:
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


def dodge(x, k: int, n: int, step: float = 0.03):
    """``x`` moved by (k - (n-1)/2) * ``step`` on the :func:`lag_axis` scale: the k-th of n
    overlapping series sits a little apart from the others (same shift at every lag)."""
    return _exp2m(_log2p(x) + (k - (n - 1) / 2) * step)


def log_ticks(ax, axis: str = "y", focus=()) -> None:
    """Enough labelled ticks on a log axis, from its current limits (call it after plotting):
    the sparsest of every decade, 1, 3 x 10^k, 1, 2, 5 x 10^k, 1, 1.5, 2, 3, 5, 7 x 10^k and
    1, 2, ..., 9 x 10^k that puts at least 3 ticks inside the limits and, given ``focus``
    values (where the lines of interest sit), labels on both sides of them: a tick at most
    ``FOCUS_FACTOR`` below the lowest and one at most that factor above the highest (else plain
    round numbers without focus, the finest set with it); labels as plain numbers (0.02, not
    2 x 10^-2)."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    loc = mticker.MaxNLocator(nbins=4)
    focus = np.asarray([f for f in np.ravel(focus) if lo <= f <= hi], np.float64)
    if lo > 0:
        decades = 10.0 ** np.arange(np.floor(np.log10(lo)), np.ceil(np.log10(hi)) + 1)
        sets = ((1.0,), (1.0, 3.0), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
                tuple(float(k) for k in range(1, 10)))
        for subs in sets:
            ticks = np.outer(decades, subs).ravel()
            ticks = ticks[(ticks >= lo) & (ticks <= hi)]
            below, above = ticks[ticks <= focus.min()] if focus.size else ticks, \
                ticks[ticks >= focus.max()] if focus.size else ticks
            near = not focus.size or (below.size and above.size and focus.min() / below.max() <= FOCUS_FACTOR
                                      and above.min() / focus.max() <= FOCUS_FACTOR)
            if (ticks.size >= 3 and near) or (focus.size and subs is sets[-1]):
                loc = mticker.LogLocator(base=10, subs=subs, numticks=30)
                break
    a.set_major_locator(loc)
    a.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_locator(mticker.LogLocator(base=10, subs=np.arange(1, 10), numticks=30))
    a.set_minor_formatter(mticker.NullFormatter())


FOCUS_FACTOR = 1.25  # log_ticks: labelled ticks within this factor below and above the focus values


class ZeroBand(NamedTuple):
    """A log axis whose bottom strip stands for exact zero (see :func:`zero_band`)."""

    level: float   # where exact values are drawn
    top: float     # values below ``ZERO_TOL`` map to ``level``; the strip ends here
    tol: float

    def __call__(self, y):
        """Values to plot: y, or ``level`` where y < tol (NaN stays NaN)."""
        y = np.asarray(y, np.float64)
        return np.where(np.isfinite(y) & (y < self.tol), self.level, y)

    def exact(self, y) -> np.ndarray:
        y = np.asarray(y, np.float64)
        return np.isfinite(y) & (y < self.tol)


def zero_band(axes, values, tol: float = ZERO_TOL, label: str | None = None) -> ZeroBand:
    """Log y axes (shared limits) whose bottom strip, shaded, with the tick ``label`` ("exact"),
    holds every value below ``tol``, instead of a log axis running from 1e-14 up to the data
    as if the error fell gradually. The strip is separated from the data by a gap and a
    break mark; with no value below ``tol`` the axes are plain log axes. Returns the map to
    apply to y values before plotting."""
    axes = list(np.atleast_1d(axes).ravel())
    v = np.asarray([x for x in np.ravel(values) if x is not None], np.float64)
    v = v[np.isfinite(v)]
    nz = v[v >= tol]
    lo = nz.min() if nz.size else 1e-3
    hi = nz.max() if nz.size else 1.0
    top = lo / 10 ** 0.55
    level = lo / 10 ** 0.9
    bottom = lo / 10 ** 1.25
    label = label or "exact"
    if not (v < tol).any():  # nothing exact: a plain log axis (1-2-5 ticks when narrow)
        for ax in axes:
            ax.set_yscale("log")
            if hi / lo < 100:
                log_ticks(ax, "y")
        return ZeroBand(lo, lo, tol)
    ceil = max(hi * 10 ** 0.25, top * 10)
    decades = range(int(np.floor(np.log10(top))), int(np.ceil(np.log10(ceil))) + 1)
    ticks = [10.0 ** k for k in decades if 2 * top < 10.0 ** k <= ceil]
    if len(ticks) > 7:  # keep at most ~6 decade labels
        ticks = ticks[:: -(-len(ticks) // 6)]
    if len(ticks) < 3:  # under two decades: label 1, 2, 5 x 10^k too
        ticks = [m * 10.0 ** k for k in decades for m in (1, 2, 5) if 2 * top < m * 10.0 ** k <= ceil]
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylim(bottom, ceil)
        ax.axhspan(bottom, top, color="0.88", lw=0, zorder=0)
        ax.set_yticks([level] + ticks, [label] + [f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_locator(mticker.NullLocator())
        kw = dict(transform=ax.get_yaxis_transform(), color="0.3", clip_on=False, lw=0.8)
        for dy in (0.93, 1.07):  # break mark "//" on the y axis between the strip and the data
            ax.plot([-0.015, 0.015], [top * dy / 1.12, top * dy * 1.12], **kw)
    return ZeroBand(level, top, tol)


def band_line(ax, band: ZeroBand, x, y, *, color, ls="-", lw: float = 1.3, **marker_kw):
    """Draw y(x) on a :func:`zero_band` axis: the line (style ``ls``) between nonzero values,
    thin dotted segments into and along the "exact" strip (a fall to exact zero is a jump, not a
    gradual change), markers (``marker_kw``: marker, label, ...) at every point."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    yy, exact = band(y), band.exact(y)
    for i in range(len(x) - 1):
        both = not (exact[i] or exact[i + 1])
        ax.plot(x[i:i + 2], yy[i:i + 2], color=color, lw=lw if both else 0.7,
                ls=ls if both else ":", zorder=2)
    ax.plot(x, yy, color=color, ls="none", zorder=3, **marker_kw)


def legend_below(fig, ax=None, ncol: int = 2, handles=None, labels=None) -> None:
    """Legend under the axes (never on top of the data); needs a constrained layout."""
    if handles is None:
        handles, labels = (ax or fig.axes[0]).get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


def stats_note(n: int, unit: str, bars: str) -> str:
    """The line every statistical figure carries: what n counts and what the bars mean."""
    return f"n = {n} {unit}; {bars}"


def save(fig, path_stem: str | Path, *, close: bool = True, dpi: int = DPI,
         formats: tuple = ("png", "pdf")) -> list[Path]:
    """Write ``<stem>.png`` (raster, ``dpi``) and ``<stem>.pdf`` (vector), closing the figure
    unless ``close=False``. Returns the written paths."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in formats:
        p = path_stem.with_name(path_stem.name + f".{ext}")
        fig.savefig(p, bbox_inches="tight", dpi=dpi, metadata={"CreationDate": None}
                    if ext == "pdf" else None)
        out.append(p)
    if close:
        plt.close(fig)
    return out


ROOT = Path(__file__).resolve().parents[2]  # the repository root (an editable install)


def repo_path(path: str | Path) -> Path | str:
    """``path`` made absolute from the repository root (so a notebook's ``results =
    "results"`` means the same folder whatever the working directory); absolute paths are
    kept, "" stays "". Outside a source checkout the working directory stands in."""
    if not path:
        return path
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    return (ROOT if (ROOT / "pyproject.toml").is_file() else Path.cwd()) / p


def publish(fig, out_dir: str | Path, name: str, gallery: str | Path | None = None) -> list[Path]:
    """What every notebook calls per figure: :func:`save` ``<out_dir>/<name>.{png,pdf}``,
    also a small README-gallery PNG ``<gallery>/<name>.png`` (``GALLERY_DPI``) when
    ``gallery`` is given, show the figure inline when running under IPython, then close it."""
    paths = save(fig, Path(out_dir) / name, close=False)
    if gallery:
        paths += save(fig, Path(gallery) / name, close=False, dpi=GALLERY_DPI, formats=("png",))
    try:
        from IPython import get_ipython
        from IPython.display import Image, display

        if get_ipython() is not None:
            display(Image(filename=str(paths[0]), width=720))
    except ImportError:  # plain Python: nothing to show
        pass
    plt.close(fig)
    return paths
