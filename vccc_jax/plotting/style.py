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

FLOOR = 1e-16  # errors at machine precision are drawn here on log axes

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
