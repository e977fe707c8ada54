"""Figures of the write-up's exact small examples (``runs.examples`` JSON data):
the Sec 4.1 bandit, the Eq 3 Bellman covariance per state, V-trace trade-offs (Eq 11)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.plotting.style import (
    EXACT_COLOR,
    figsize,
    fmt_num,
    legend_below,
    log_ticks,
    method_style,
    styled,
)


def bandit_table(data: dict) -> str:
    """Markdown variance table of Sec 4.1 (targets per action, mean and variance under mu)."""
    lines = ["| baseline | b | Y(a0) | Y(a1) | E_mu[Y] | Var_mu(Y) |", "|---|---|---|---|---|---|"]
    for r in data["table"]:
        b = "-" if r["b"] is None else f"{r['b']:.3g}"
        lines.append(f"| {r['baseline']} | {b} | {r['y_a0']:.4g} | {r['y_a1']:.4g} | "
                     f"{r['mean']:.3g} | {r['var']:.3g} |")
    return "\n".join(lines)


@styled
def fig_bandit(data: dict):
    """Left: Var_mu(Y_b) against the baseline b (Eq 4 target; parabola, minimum at b* of
    Eq 9) with the write-up's three baselines marked. Right: the targets Y_b(a) per action
    for each baseline; every corrected target has mean V^pi (dashed)."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=figsize("two", 3.4), layout="constrained")
    c = data["curve"]
    ax.plot(c["b"], c["var"], color=method_style("vccc").color, label=r"$\mathrm{Var}_\mu(Y_b)$")
    marks = [r for r in data["table"] if r["b"] is not None]
    colors = [method_style("uncorrected").color, method_style("vccc").color,
              method_style("vccc_bstar").color]
    for r, col, mk in zip(marks, colors, ("o", "s", "D")):
        ax.plot([r["b"]], [r["var"]], marker=mk, color=col, ls="none", ms=6,
                label=f"{r['baseline']}: b={fmt_num(r['b'])}, Var={fmt_num(r['var'])}")
    ax.set_xlabel("baseline b")
    ax.set_ylabel(r"$\mathrm{Var}_\mu(Y_b)$")
    ax.set_title(r"variance of $Y_b = H + (\rho-1)(H-b)$ vs b")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=6.5)
    x = np.arange(2)
    rows = data["table"]
    width = 0.8 / len(rows)
    bar_colors = [method_style("uncorrected").color] + colors
    for i, (r, col) in enumerate(zip(rows, bar_colors)):
        bx.bar(x + (i - (len(rows) - 1) / 2) * width, [r["y_a0"], r["y_a1"]], width,
               color=col, alpha=0.85 if r["b"] is not None else 0.35,
               hatch=None if r["b"] is not None else "//", label=r["baseline"])
    bx.axhline(data["v_pi"], color=EXACT_COLOR, ls="--", lw=1, label=rf"$V^\pi$ = {data['v_pi']:g}")
    bx.axhline(data["v_mu"], color=EXACT_COLOR, ls=":", lw=1, label=rf"$V^\mu$ = {data['v_mu']:g}")
    mu, pi = data["mu"], data["pi"]
    bx.set_xticks(x, [f"$a_0$: r={data['rewards'][0]:g}, $\\rho$={data['rho'][0]:.3g}",
                      f"$a_1$: r={data['rewards'][1]:g}, $\\rho$={data['rho'][1]:.3g}"])
    bx.set_ylabel("target value Y(a)")
    bx.set_title(rf"targets per action ($\mu(a_1)$={mu[1]:g}, $\pi(a_1)$={pi[1]:g})")
    bx.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.suptitle("Sec 4.1 bandit: the baseline changes the variance, never the mean (exact)")
    return fig


@styled
def fig_covariance(data: dict):
    """Eq 3 per state: T_pi V(s) - T_mu V(s) (y) against Cov_mu(rho, H_V | s) (x), exact
    (filled) and Monte-Carlo estimates from ``num_samples`` transitions per state (open,
    bars: +-1.96 standard errors). Points on the diagonal = the identity holds."""
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=figsize("one", 3.1), layout="constrained")
    shifts = sorted({r["shift"] for r in rows})
    shades = [method_style("vccc").color, method_style("uncorrected").color,
              method_style("truncated").color, method_style("masked").color]
    for sh, col in zip(shifts, shades):
        rs = [r for r in rows if r["shift"] == sh]
        cov = np.array([r["cov_exact"] for r in rs])
        diff = np.array([r["diff"] for r in rs])
        mc = np.array([r["cov_mc"] for r in rs])
        se = np.array([r["cov_mc_se"] for r in rs])
        ax.errorbar(mc, diff, xerr=1.96 * se, fmt="o", mfc="none", color=col, alpha=0.55,
                    ms=3.5, elinewidth=0.7, label=f"MC, {data['num_samples']} samples (shift {sh:g})")
        ax.plot(cov, diff, "o", color=col, ms=3, label=f"exact (shift {sh:g})")
    lim = np.abs([r["diff"] for r in rows] + [r["cov_mc"] for r in rows]).max() * 1.1
    ax.plot([-lim, lim], [-lim, lim], color=EXACT_COLOR, lw=0.8, ls="--", label="y = x")
    ax.set_xlabel(r"$\mathrm{Cov}_\mu(\rho, H_{\bar V} \mid s)$")
    ax.set_ylabel(r"$T_\pi \bar V(s) - T_\mu \bar V(s)$")
    n_states = len(rows) // len(shifts)
    ax.set_title(f"Eq 3 per state ({n_states} states x {len(shifts)} policy shifts)")
    legend_below(fig, ax, ncol=2)
    return fig


def _fmt_bar(x):
    return r"$\infty$" if x is None else f"{x:g}"


@styled
def fig_vtrace_tradeoffs(data: dict, n: int | None = None):
    """V-trace trade-offs, exact (Eq 11, one random MDP): (a) bias of the fixed point vs
    rho_bar (c_bar, lambda, n leave it unchanged); (b) target variance vs lambda per n
    (rho_bar = c_bar = 1); (c) bias vs variance over (rho_bar, c_bar) at lambda = 1,
    rho_bar != c_bar included; (d) contraction factor vs lambda per c_bar."""
    rows = data["rows"]
    ns = sorted({r["n"] for r in rows})
    n = ns[-1] if n is None else n
    fig, axes = plt.subplots(1, 4, figsize=figsize("two", 2.5), layout="constrained")
    # (a) bias vs rho_bar
    ax = axes[0]
    rbs = sorted({r["rho_bar"] for r in rows if r["rho_bar"] is not None})
    bias = {rb: next(r["bias_rms"] for r in rows if r["rho_bar"] == rb) for rb in rbs + [None]}
    ax.plot(rbs, [bias[rb] for rb in rbs], marker="*", color=method_style("vtrace").color)
    ax.axhline(bias[None], color=method_style("vccc").color, ls="--", lw=1,
               label=r"$\bar\rho=\infty$ (IS)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(rbs, [f"{x:g}" for x in rbs])
    ax.minorticks_off()
    ax.set_xlabel(r"$\bar\rho$")
    ax.set_ylabel(r"RMS bias of fixed point to $V^\pi$")
    ax.set_title(r"(a) bias vs $\bar\rho$")
    ax.legend(fontsize=6.5)
    # (b) variance vs lambda per n at rho_bar = c_bar = 1
    ax = axes[1]
    for k, nn in enumerate(ns):
        pts = sorted((r["lam"], r["target_var"]) for r in rows
                     if r["n"] == nn and r["rho_bar"] == 1.0 and r["c_bar"] == 1.0)
        ax.plot(*zip(*pts), marker="o", color=plt.cm.cividis(k / max(1, len(ns) - 1) * 0.85),
                label=f"n = {nn}")
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1])
    ax.set_xlabel(r"$\lambda$")
    ax.set_ylabel("target variance (d-weighted)")
    ax.set_title(r"(b) variance vs $\lambda$ ($\bar\rho=\bar c=1$)")
    ax.legend(fontsize=6.5)
    # (c) bias vs variance over (rho_bar, c_bar)
    ax = axes[2]
    cbs = sorted({r["c_bar"] for r in rows}, key=lambda x: np.inf if x is None else x)
    for k, cb in enumerate(cbs):
        pts = [(r["target_var"], r["bias_rms"]) for r in rows
               if r["n"] == n and r["lam"] == 1.0 and r["c_bar"] == cb]
        ax.plot(*zip(*pts), marker="os^D"[k % 4], ls="-", lw=0.8,
                color=plt.cm.viridis(k / max(1, len(cbs) - 1) * 0.9),
                label=rf"$\bar c$ = {_fmt_bar(cb)}")
    ax.set_xscale("log")  # variance spans decades across c_bar
    log_ticks(ax, "x")
    ax.set_xlabel("target variance (log)")
    ax.set_ylabel("RMS bias")
    ax.set_title(rf"(c) bias vs variance, n={n}, $\lambda$=1" "\n" r"(points: $\bar\rho$ = 0.5..$\infty$)")
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    # (d) contraction vs lambda per c_bar
    ax = axes[3]
    for k, cb in enumerate(cbs):
        pts = sorted((r["lam"], r["contraction"]) for r in rows
                     if r["n"] == n and r["rho_bar"] is None and r["c_bar"] == cb)
        ax.plot(*zip(*pts), marker="os^D"[k % 4], color=plt.cm.viridis(k / max(1, len(cbs) - 1) * 0.9),
                label=rf"$\bar c$ = {_fmt_bar(cb)}")
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1])
    ax.set_xlabel(r"$\lambda$")
    ax.set_ylabel(r"contraction $\|M\|_\infty$")
    ax.set_title(rf"(d) contraction, n={n}, $\bar\rho=\infty$")
    fig.suptitle(f"V-trace trade-offs (exact; random MDP, {data['num_states']} states, "
                 f"{data['num_actions']} actions, $\\gamma$={data['gamma']:g}, max $\\rho$ = {data['max_rho']:.2g})")
    return fig
