"""Comparators II figures (issue 14): GRPO vs PS-PPO on the token env.

:func:`fig_ps_ppo` reads the rows of ``runs.critic_free`` (``vccc sweep --config
experiments/ps_ppo.toml``): exact return J against the learner rows backpropagated so far
(the learner's compute), one line per cutoff law, one panel per lag law, mean and 95%
t-interval band over seeds (``analysis.stats.mean_ci``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.analysis.stats import mean_ci
from vccc_jax.plotting.style import OKABE_ITO, figsize, stats_note, styled

LAW_STYLE = {  # law -> (label, color, linestyle)
    "full": ("GRPO (full)", "#000000", "-"),
    "uniform": ("PS-PPO uniform", OKABE_ITO["orange"], "-"),
}
_OTHER = [OKABE_ITO["blue"], OKABE_ITO["green"], OKABE_ITO["vermillion"], OKABE_ITO["purple"]]


def law_style(law: str, i: int) -> tuple:
    """(label, color, linestyle) of a cutoff law; unknown laws take the next free color."""
    if law in LAW_STYLE:
        return LAW_STYLE[law]
    return (f"PS-PPO {law}", _OTHER[i % len(_OTHER)], "--")


def _lag_title(lag: str) -> str:
    return "no lag (on-policy)" if lag in ("fixed:0", "0") else f"lag {lag}"


def curves(rows: list[dict], lag: str, law: str) -> tuple:
    """(learner rows, mean J, CI half-width, n seeds) at the evaluated updates of one cell."""
    runs = [r["metrics"]["history"] for r in rows
            if r["cell"]["lag"] == lag and r["cell"]["law"] == law]
    evals = [[(h["compute_rows"], h["exact_return"]) for h in hist
              if h["exact_return"] is not None and h["exact_return"] == h["exact_return"]]
             for hist in runs]
    k = min(len(e) for e in evals)
    x = np.array([c for c, _ in evals[0][:k]], float)
    j = np.array([[v for _, v in e[:k]] for e in evals])
    if len(runs) > 1:
        m, h = mean_ci(j, axis=0)
    else:
        m, h = j[0], np.zeros(k)
    return x, m, h, len(runs)


@styled
def fig_ps_ppo(rows: list[dict]):
    """Exact return J vs cumulative learner rows, one panel per lag law, one line per cutoff
    law (mean and 95% t-interval band over seeds; the caption states n)."""
    lags = list(dict.fromkeys(r["cell"]["lag"] for r in rows))
    laws = list(dict.fromkeys(r["cell"]["law"] for r in rows))
    fig, axes = plt.subplots(1, len(lags), figsize=figsize("two", height=2.6), sharey=True,
                             squeeze=False, layout="constrained")
    n_seeds = set()
    for ax, lag in zip(axes[0], lags):
        for i, law in enumerate(laws):
            label, color, ls = law_style(law, i)
            x, m, h, n = curves(rows, lag, law)
            n_seeds.add(n)
            ax.plot(x / 1e3, m, color=color, ls=ls, marker="o", ms=3, label=label)
            ax.fill_between(x / 1e3, m - h, m + h, color=color, alpha=0.18, lw=0)
        ax.set_title(_lag_title(lag))
        ax.set_xlabel("learner rows backpropagated (thousands)")
    axes[0, 0].set_ylabel(r"exact return $J(\pi)$")
    r0 = rows[0]["cell"]
    note = stats_note("/".join(map(str, sorted(n_seeds))), "seeds per line",
                      "bands: 95% t-interval of the mean over seeds")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(laws), frameon=False,
               title=f"{r0['env']}; points every {r0['eval_every']} updates; {note}",
               title_fontsize=6.5)
    fig.suptitle(f"GRPO vs PS-PPO: exact return per unit of learner compute "
                 f"({r0['groups']}x{r0['group_size']} rollouts per update, {r0['updates']} updates)")
    return fig
