"""Figures of Comparators I (issue 13): BRACE's (n, lag) bias-variance picture and the
decoupled-correction route comparison. Inputs are result rows (``results/brace_tabular.jsonl``
of ``experiments/brace_tabular.toml``) and the route-study dict (``results/decoupled_routes.json``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.plotting.style import (
    ERR_LABEL,
    TWO_COLUMN,
    VAR_LABEL,
    band_line,
    lag_axis,
    log_ticks,
    method_linestyle,
    method_style,
    styled,
    zero_band,
)

BRACE_NS = (1, 2, 4, 8)
_ROUTE_STYLE = {"exact": ("exact (snapshot)", "#000000", "s"),
                "ewma": ("PPO-EWMA", method_style("ppo_ewma").color, "d"),
                "behaviour": (r"naive $\pi_{old} := \mu$", method_style("uncorrected").color, "o")}


def _series(rows, method, law, metric):
    sel = sorted((r for r in rows if r["cell"]["method"] == method and r["cell"]["law"] == law),
                 key=lambda r: r["cell"]["mean_lag"])
    lags = np.array([r["cell"]["mean_lag"] for r in sel])
    vals = np.array([np.mean(r["metrics"][metric]["per_mdp"]) if isinstance(r["metrics"][metric], dict)
                     else r["metrics"][metric] for r in sel], float)
    return lags, vals


def _brace_color(n):
    base = np.array(plt.matplotlib.colors.to_rgb(method_style("brace").color))
    t = (BRACE_NS.index(n) + 1) / (len(BRACE_NS) + 1)
    return tuple(1 - (1 - base) * (0.35 + 0.65 * t))


@styled
def fig_brace_lag(rows: list[dict], law: str = "geometric"):
    """Fixed-point error and target variance vs mean lag, BRACE n in BRACE_NS (light to dark
    green) vs uncorrected / VCCC / V-trace. log2(1 + lag) axes with the lags run as ticks;
    errors below 1e-10 (VCCC's, float64 zero) in the error panel's "exact" strip. Returns a
    Figure."""
    fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMN, 2.9), layout="constrained")
    methods = ["uncorrected", "vccc", "vtrace"] + [f"brace_n{n}" for n in BRACE_NS]
    series = {(metric, m): _series(rows, m, law, metric) for m in methods
              for metric in ("fp_err_rms", "target_var")}
    series = {k: v for k, v in series.items() if len(v[0])}
    band = zero_band(axes[0], [y for (metric, _), (_, v) in series.items()
                               if metric == "fp_err_rms" for y in v])
    lags = sorted({float(x) for _, (lg, _) in series.items() for x in lg})
    for ax, (metric, label) in zip(axes, [("fp_err_rms", ERR_LABEL), ("target_var", VAR_LABEL)]):
        for m in methods:
            if (metric, m) not in series:
                continue
            x, v = series[metric, m]
            if m.startswith("brace_n"):
                n = int(m[len("brace_n"):])
                lab, col, mk = f"BRACE n={n}", _brace_color(n), method_style("brace").marker
            else:
                lab, col, mk = method_style(m)
            if metric == "fp_err_rms":
                band_line(ax, band, x, v, color=col, ls=method_linestyle(m), marker=mk, label=lab)
            else:
                ax.plot(x, v, marker=mk, color=col, label=lab, ls=method_linestyle(m))
        lag_axis(ax, lags)
        ax.set_xlabel(f"mean lag (versions; {law} law)")
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    log_ticks(axes[1], "y")
    axes[0].set_title("bias: error of the exact fixed point")
    axes[1].set_title("variance of the target at the fixed point")
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=4, frameon=False)
    return fig


@styled
def fig_brace_nlag(rows: list[dict], law: str = "geometric"):
    """(n, lag) heat maps: log10 fixed-point error and log10 target variance of BRACE.
    Returns a Figure."""
    fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMN, 2.4), layout="constrained")
    for ax, (metric, title) in zip(axes, [("fp_err_rms", "log10 fixed-point RMS error"),
                                          ("target_var", "log10 target variance")]):
        grid, lags = [], None
        for n in BRACE_NS:
            lags, v = _series(rows, f"brace_n{n}", law, metric)
            grid.append(np.log10(np.maximum(v, 1e-16)))
        grid = np.array(grid)
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                       vmin=max(grid.min(), -5) if metric == "fp_err_rms" else None)
        ax.set_xticks(range(len(lags)), [f"{int(x)}" for x in lags])
        ax.set_yticks(range(len(BRACE_NS)), [str(n) for n in BRACE_NS])
        ax.set_xlabel(f"mean lag ({law} law)")
        ax.set_ylabel("prefix n")
        ax.set_title(title)
        ax.grid(False)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=6,
                        color="white" if im.norm(grid[i, j]) < 0.5 else "black")
        fig.colorbar(im, ax=ax, shrink=0.9)
    return fig


@styled
def fig_decoupled_routes(study: dict, noise: float = 0.3):
    """Per pi_old route vs lag (MDP means, one inference-noise level): actor-update bias vs
    the exact route, actor variance, critic-target bias vs exact; plus the threshold grid
    (P[PPO clip fires] at lag 0 over clip x eps, per route). log2(1 + lag) axes at the lags
    run; a bias that is exactly 0 (the exact route itself; a route equal to it at some lag)
    sits in the panel's "exact" strip. ``noise`` not in the grid: the nearest one run.
    Returns a Figure."""
    noises = sorted({r["noise"] for r in study["rows"]})
    if noise not in noises and noises:  # a grid without the threshold noise: the nearest run
        noise = min(noises, key=lambda x: abs(x - noise))
    rows = [r for r in study["rows"] if r["noise"] == noise]
    fig, axes = plt.subplots(1, 4, figsize=(TWO_COLUMN, 2.6), layout="constrained")
    panels = [("actor_bias_vs_exact", "actor bias vs exact route", "bias (norm)"),
              ("actor_variance", "actor update variance", "variance"),
              ("critic_bias_vs_exact", "critic-target bias vs exact", "bias (RMS)")]
    lags = sorted({r["lag"] for r in rows})
    for ax, (metric, title, ylabel) in zip(axes[:3], panels):
        vals = {route: [np.mean([r[metric] for r in rows if r["route"] == route and r["lag"] == lag])
                        for lag in lags] for route in _ROUTE_STYLE}
        band = zero_band(ax, [v for vs in vals.values() for v in vs]) if "bias" in metric else None
        for route, (lab, col, mk) in _ROUTE_STYLE.items():
            if band is not None:
                band_line(ax, band, lags, vals[route], color=col, marker=mk, label=lab)
            else:
                ax.plot(lags, vals[route], marker=mk, color=col, label=lab)
        lag_axis(ax, lags)
        ax.set_xlabel("lag (updates)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    ax = axes[3]
    ax_ = study["threshold_axes"]
    names = list(_ROUTE_STYLE)
    eps = list(ax_["epsilons"])
    j = eps.index(0.2) if 0.2 in eps else len(eps) // 2  # the PPO epsilon shown
    vals = np.array([np.array(study["threshold"][f"lag=0/{r}"]["ppo"])[:, j] for r in names])
    x = np.arange(len(ax_["clips"]))
    for i, r in enumerate(names):
        ax.bar(x + (i - 1) * 0.27, vals[i], 0.27, color=_ROUTE_STYLE[r][1], label=_ROUTE_STYLE[r][0])
        for xi, v in zip(x + (i - 1) * 0.27, vals[i]):
            if v == 0:  # an empty bar is a measured 0, not a missing one
                ax.text(xi, 0, "0", ha="center", va="bottom", fontsize=5.5, color="0.3")
    ax.set_xticks(x, [str(c) for c in ax_["clips"]])
    ax.set_xlabel(f"discrepancy mask c (eps = {eps[j]:g})")
    ax.set_ylabel("probability")
    ax.set_title("P[PPO clip fires], lag 0")
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=3, frameon=False)
    fig.suptitle(f"pi_old routes, exact (mean over MDPs; inference noise {noise:g})")
    return fig


def brace_table(rows: list[dict], law: str = "geometric", metric: str = "fp_err_rms") -> str:
    """Markdown table: ``metric`` (MDP mean) per method (rows) and mean lag (columns), the
    README's BRACE vs VCCC / V-trace / uncorrected table. Methods without rows are left out."""
    methods = ["uncorrected", "vccc", "vtrace"] + [f"brace_n{n}" for n in BRACE_NS]
    series = {m: _series(rows, m, law, metric) for m in methods}
    series = {m: s for m, s in series.items() if len(s[0])}
    lags = sorted({float(x) for lags, _ in series.values() for x in lags})
    head = f"| {metric} ({law} law) | " + " | ".join(f"lag {x:g}" for x in lags) + " |"
    lines = [head, "|" + "---|" * (len(lags) + 1)]
    for m, (ls, v) in series.items():
        by = dict(zip(ls.tolist(), v.tolist()))
        label = f"BRACE n={m[len('brace_n'):]}" if m.startswith("brace_n") else method_style(m).label
        lines.append(f"| {label} | " + " | ".join(f"{by[x]:.2g}" if x in by else "" for x in lags) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- RAC

RAC_CAP = 1e6        # bias-cut ratios above this (RAC unbiased to float: the clip never binds)
ABSTRACT_CUT = 47.9  # the abstract's "up to 47.9x"
GREY_LINE = "#777777"


def _rac_combos(rows):
    return list(dict.fromkeys((r["cell"]["clip"], r["cell"]["mass"], r["cell"]["lag"]) for r in rows))


def _combo_label(combo) -> str:
    clip, mass, lag = combo
    return f"clip {clip:g}\nmass {mass:g}\n{lag}" if clip else f"no clip\nmass {mass:g}\n{lag}"


def _ratio(x) -> float:
    return RAC_CAP if x is None or not x < RAC_CAP else float(x)


@styled
def fig_rac_bias_cut(rows: list[dict]):
    """RAC bias cut (``results/rac_two_channel.jsonl``): left, per MDP the exact bias norms of
    drop and RAC for the first grid combination (MDPs sorted by the ratio); right, the ratio
    ||bias drop|| / ||bias rac|| per MDP for every (clip, mass, lag law) combination, median
    marked, the abstract's 47.9x dashed. Returns a Figure."""
    combos = _rac_combos(rows)
    fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMN, 2.9), layout="constrained",
                             gridspec_kw={"width_ratios": [1.0, max(1.0, 0.3 * len(combos))]})
    ax = axes[0]
    first = sorted((r for r in rows if (r["cell"]["clip"], r["cell"]["mass"], r["cell"]["lag"]) == combos[0]),
                   key=lambda r: _ratio(r["metrics"]["ratio"]))
    x = np.arange(len(first))
    band = zero_band(ax, [r["metrics"][m] for r in first for m in ("drop", "rac")])
    for m in ("drop", "rac"):
        st = method_style(m)
        ax.plot(x, band([r["metrics"][m] for r in first]), marker="o" if m == "drop" else "s",
                ls="none", color=st.color, label=st.label)
    ax.set_xticks(x, [str(r["cell"]["mdp"]) for r in first], fontsize=6)
    ax.set_xlabel("MDP (sorted by drop / RAC)")
    ax.set_ylabel(r"$\|$expected update $- \nabla J(\pi_K)\|_2$")
    ax.set_title(f"exact bias per MDP ({_combo_label(combos[0]).replace(chr(10), ', ')})", fontsize=8)
    ax.legend(loc="lower right", fontsize=7)
    ax = axes[1]
    for i, combo in enumerate(combos):
        ratios = np.array([_ratio(r["metrics"]["ratio"]) for r in rows
                           if (r["cell"]["clip"], r["cell"]["mass"], r["cell"]["lag"]) == combo])
        jitter = np.linspace(-0.18, 0.18, len(ratios)) if len(ratios) > 1 else np.zeros(1)
        capped = ratios >= RAC_CAP
        ax.plot(i + jitter[~capped], ratios[~capped], "o", ms=3, color=method_style("rac").color, alpha=0.7)
        ax.plot(i + jitter[capped], ratios[capped], "^", ms=4, color=method_style("rac").color,
                mfc="none", label=f"$\\geq$ {RAC_CAP:.0e}: RAC unbiased to float" if capped.any() else None)
        med = np.median(ratios)
        ax.plot([i - 0.3, i + 0.3], [med, med], color="black", lw=1.2)
        if med < RAC_CAP:
            ax.text(i, med * 1.35, f"{med:.3g}x", fontsize=6.5, ha="center", va="bottom",
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
    ax.axhline(ABSTRACT_CUT, ls="--", color=GREY_LINE, lw=0.9, label=f"abstract: up to {ABSTRACT_CUT}x")
    ax.set_yscale("log")
    ax.set_xticks(range(len(combos)), [_combo_label(c) for c in combos], fontsize=6)
    ax.set_xlim(-0.6, len(combos) - 0.2)
    ax.set_ylabel("bias cut  drop / RAC")
    ax.set_title("bias cut per MDP (dots) and median (bar), per (clip, kernel mass, lag law)",
                 fontsize=8)
    h, lab = ax.get_legend_handles_labels()
    uniq = dict(zip(lab, h))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", fontsize=6.5)
    return fig


_RAC_METHODS = ("drop", "wait", "rac")


def _fraction_on_grid(metrics: dict, grid: np.ndarray) -> np.ndarray:
    """(J - J0) / (J* - J0) of a run as a step function of wall-clock on ``grid`` (hours): at
    time t the policy is that of the last update finished by t (held to the budget's end)."""
    t = np.asarray(metrics["times"]) / 3600
    f = (np.asarray(metrics["returns"]) - metrics["j0"]) / (metrics["jstar"] - metrics["j0"])
    return f[np.maximum(np.searchsorted(t, grid, side="right") - 1, 0)]


@styled
def fig_rac_wallclock(rows: list[dict], fraction: float | None = None):
    """RAC vs wait-for-slow vs drop in simulated wall-clock (``results/rac_wallclock.jsonl``,
    first (clip, mass) of the grid): left, (J - J0) / (J* - J0) vs hours, median over MDPs
    with the interquartile band; right, per MDP the hours to reach ``fraction`` (default the
    largest stored) for wait against RAC, with the per-update speed ratio dashed. Returns a
    Figure."""
    c0 = rows[0]["cell"]
    rows = [r for r in rows if r["cell"]["clip"] == c0["clip"] and r["cell"]["mass"] == c0["mass"]]
    fraction = max(c0["fractions"]) if fraction is None else fraction
    hours = c0["hours"]
    grid = np.linspace(0, hours, 400)
    fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMN, 2.8), layout="constrained")
    ax = axes[0]
    methods = [m for m in _RAC_METHODS if any(r["cell"]["method"] == m for r in rows)]
    for m in methods:
        st = method_style(m)
        f = np.array([_fraction_on_grid(r["metrics"], grid) for r in rows if r["cell"]["method"] == m])
        lo, med, hi = np.percentile(f, [25, 50, 75], axis=0)
        ax.plot(grid, med, color=st.color, label=f"{st.label} (median)")
        ax.fill_between(grid, lo, hi, color=st.color, alpha=0.18, lw=0)
    ax.axhline(fraction, ls=":", color=GREY_LINE, lw=0.8)
    ax.text(hours, fraction, f"{fraction:g} ", ha="right", va="bottom", fontsize=6.5, color=GREY_LINE)
    ax.set_xlabel("simulated wall-clock (hours)")
    ax.set_ylabel(r"$(J(\pi_K) - J_0) / (J^* - J_0)$")
    ax.set_ylim(max(-0.5, ax.get_ylim()[0]), 1.05)
    clip = "no clip" if not c0["clip"] else f"clip {c0['clip']:g}"
    ax.set_title(f"{len({r['cell']['mdp'] for r in rows})} MDPs, {clip}, kernel mass {c0['mass']:g}; "
                 "band: quartiles", fontsize=8)
    ax.legend(loc="lower right", fontsize=7)
    ax = axes[1]
    by = {}
    for r in rows:
        by.setdefault(r["cell"]["mdp"], {})[r["cell"]["method"]] = r["metrics"]
    if "wait" in methods and "rac" in methods:
        pts = []
        for m, x in by.items():
            tw, tr = (x[k]["time_to"].get(str(fraction)) for k in ("wait", "rac"))
            pts.append((np.inf if tr is None else tr / 3600, np.inf if tw is None else tw / 3600))
        pts = np.array(pts)
        reached = np.isfinite(pts).all(1)
        lo = 0.7 * np.min(pts[np.isfinite(pts)]) if np.isfinite(pts).any() else hours / 100
        edge = hours * 1.25  # runs that never get there are drawn on this edge
        shown = np.minimum(pts, edge)
        col = method_style("rac").color
        ax.plot(shown[reached, 0], shown[reached, 1], "o", ms=4, color=col, label="MDP")
        if (~reached).any():
            ax.plot(shown[~reached, 0], shown[~reached, 1], "o", ms=4, mfc="none", color=col,
                    label=f"not within {hours:g} h (drawn at the edge)")
        spu = {k: np.mean([r["metrics"]["trace"]["s_per_update"] for r in rows if r["cell"]["method"] == k])
               for k in ("wait", "rac")}
        s = spu["wait"] / spu["rac"]
        line = np.array([lo, edge])
        ax.plot(line, line, ":", color=GREY_LINE, lw=0.8, label="equal time")
        ax.plot(line, s * line, "--", color=GREY_LINE, lw=0.9,
                label=f"s / update ratio {s:.2f}x ({spu['wait']:.0f} vs {spu['rac']:.0f} s)")
        ok = pts[reached]
        if len(ok):
            ax.text(0.03, 0.97, f"median wait / RAC: {np.median(ok[:, 1] / ok[:, 0]):.2f}x\n"
                    f"({len(ok)} MDPs where both get there)", transform=ax.transAxes, ha="left",
                    va="top", fontsize=7)
        ticks = [t for t in (0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= edge]
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
            axis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlim(lo, edge * 1.1)
        ax.set_ylim(lo, edge * 1.1)
        ax.set_xlabel(f"RAC: hours to $J_0 + {fraction:g}\\,(J^* - J_0)$")
        ax.set_ylabel(f"wait for slow: hours to {fraction:g}")
        ax.set_title("time to reach it, per MDP", fontsize=8)
        ax.legend(loc="lower right", fontsize=6.5)
    return fig
