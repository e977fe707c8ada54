"""Figures of Comparators I (issue 13): BRACE's (n, lag) bias-variance picture and the
decoupled-correction route comparison. Inputs are result rows (``results/brace_tabular.jsonl``
of ``experiments/brace_tabular.toml``) and the route-study dict (``results/decoupled_routes.json``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.plotting.style import ERR_LABEL, FLOOR, TWO_COLUMN, VAR_LABEL, method_style, styled

BRACE_NS = (1, 2, 4, 8)
_ERR_BOTTOM = 1e-5
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
    """Fixed-point error and target variance vs mean lag (symlog x), BRACE n in BRACE_NS
    (light to dark green) vs uncorrected / VCCC / V-trace. Returns a Figure."""
    fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMN, 2.9), layout="constrained")
    methods = ["uncorrected", "vccc", "vtrace"] + [f"brace_n{n}" for n in BRACE_NS]
    below = []  # methods whose error never reaches the axis (exact corrections)
    for ax, (metric, label) in zip(axes, [("fp_err_rms", ERR_LABEL), ("target_var", VAR_LABEL)]):
        for m in methods:
            lags, v = _series(rows, m, law, metric)
            if not len(lags):
                continue
            if metric == "fp_err_rms" and np.max(v) < _ERR_BOTTOM:
                below.append(f"{method_style(m).label}: max {np.max(v):.0e}")
            if m.startswith("brace_n"):
                n = int(m[len("brace_n"):])
                lab, col, mk = f"BRACE n={n}", _brace_color(n), method_style("brace").marker
            else:
                lab, col, mk = method_style(m)
            ax.plot(np.maximum(lags, 0.5), np.maximum(v, FLOOR) if metric == "fp_err_rms" else v,
                    marker=mk, color=col, label=lab)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"mean lag (versions; {law} law; lag 0 drawn at 0.5)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[0].set_ylim(bottom=_ERR_BOTTOM)
    if below:
        axes[0].text(0.03, 0.97, "below the axis at every lag:\n" + "\n".join(below),
                     transform=axes[0].transAxes, ha="left", va="top", fontsize=6.5)
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
    (P[PPO clip fires] at lag 0 over clip x eps, per route). Returns a Figure."""
    rows = [r for r in study["rows"] if r["noise"] == noise]
    fig, axes = plt.subplots(1, 4, figsize=(TWO_COLUMN, 2.3), layout="constrained")
    panels = [("actor_bias_vs_exact", "actor bias vs exact route"),
              ("actor_variance", "actor update variance"),
              ("critic_bias_vs_exact", "critic-target bias vs exact")]
    lags = sorted({r["lag"] for r in rows})
    for ax, (metric, title) in zip(axes[:3], panels):
        for route, (lab, col, mk) in _ROUTE_STYLE.items():
            v = [np.mean([r[metric] for r in rows if r["route"] == route and r["lag"] == lag]) for lag in lags]
            ax.plot(np.maximum(lags, 0.5), np.maximum(v, 1e-16) if "bias" in metric else v,
                    marker=mk, color=col, label=lab)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("lag (lag 0 at 0.5)")
        ax.set_title(title)
        if "bias" in metric:
            ax.set_yscale("log")
            ax.set_ylim(bottom=1e-4)
    ax = axes[3]
    ax_ = study["threshold_axes"]
    names = list(_ROUTE_STYLE)
    eps = list(ax_["epsilons"])
    j = eps.index(0.2) if 0.2 in eps else len(eps) // 2  # the PPO epsilon shown
    vals = np.array([np.array(study["threshold"][f"lag=0/{r}"]["ppo"])[:, j] for r in names])
    x = np.arange(len(ax_["clips"]))
    for i, r in enumerate(names):
        ax.bar(x + (i - 1) * 0.27, vals[i], 0.27, color=_ROUTE_STYLE[r][1], label=_ROUTE_STYLE[r][0])
    ax.set_xticks(x, [str(c) for c in ax_["clips"]])
    ax.set_xlabel(f"discrepancy mask c (eps = {eps[j]:g})")
    ax.set_title("P[PPO clip fires], lag 0")
    axes[0].text(0.03, 0.03, "exact route: 0 (reference)", transform=axes[0].transAxes,
                 fontsize=6.5, ha="left", va="bottom")
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=3, frameon=False)
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
