"""Critic error vs lag with a Gaussian actor on Pendulum-v1 (issue 31, section 4; Pendulum half).

For each lag law and critic target: the trainer (``train.trainer``, Gaussian head) on
Pendulum-v1 (MLP Gaussian actor, MLP critic), and the RMS error of the critic against a
Monte-Carlo V^{pi_k} (``train.truth.monte_carlo_truth``: ``gt_rollouts`` rollouts of pi_k from
``gt_states`` saved rollout states, time limit lifted; sqrt of ``gt_mse``) every ``gt_every``
updates, over seeds. Prints a markdown table (mean and 95% t half-width over seeds of the last update's
error and of the mean over the evaluated updates) and writes the rows to ``OUT`` (JSON, for
``plotting.continuous.fig_continuous_lag``).

Run: ``.venv/bin/python experiments/continuous_pendulum_lag.py [updates] [seeds] [out.json]``.
"""

import json
import sys
import time

import numpy as np
from scipy import stats

from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import train as train_states


def train(cfg: TrainConfig) -> list[dict]:
    """One row per (seed, update): critic_error (sqrt gt_mse) and its MC s.e. at the
    evaluated updates, ESS, the behaviour return (NaN before the first finished episode)."""
    _, m = train_states(cfg)
    m = {k: np.asarray(v) for k, v in m.items()}
    rows = []
    for s in range(cfg.num_seeds):
        for u in range(cfg.num_updates):
            row = dict(seed=s, update=u + 1, ess=float(m["ess"][u, s]),
                       episode_return=float(m["return"][u, s]) if u else float("nan"))
            if np.isfinite(m["gt_mse"][u, s]):
                row.update(critic_error=float(np.sqrt(m["gt_mse"][u, s])),
                           critic_error_mc_se=float(m["gt_stderr"][u, s]))
            rows.append(row)
    return rows

LAGS = ("fixed:0", "uniform:7", "uniform:15")
CRITICS = ("uncorrected", "vccc", "truncated", "vtrace")


def ci(x) -> str:
    x = np.asarray(x, float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return f"{x.mean():.3g} ± {half:.2g}"


def main(updates: int = 30, seeds: int = 3, out: str = "results/continuous_pendulum_lag.json") -> None:
    every = max(1, updates // 3)
    print("| lag | critic | critic error (MC RMS, last update) | mean over updates "
          f"{every},{2 * every},..,{updates} | MC s.e. | ESS (mean) | return (last 10%) | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    all_rows = []
    for lag in LAGS:
        for critic in CRITICS:
            cfg = TrainConfig(env="Pendulum-v1", num_envs=16, num_steps=32,
                              total_timesteps=16 * 32 * updates, num_minibatches=4, update_epochs=2,
                              lag=lag, critic=critic, gamma=0.95, num_seeds=seeds, gt_every=every,
                              gt_states=8, gt_rollouts=16, critic_lr=3e-3, actor_lr=3e-3,
                              anneal_lr=False, eval_envs=0)
            t0 = time.perf_counter()
            rows = train(cfg)
            secs = time.perf_counter() - t0
            for r in rows:
                r.update(lag=lag, critic=critic, env=cfg.env)
            all_rows += rows
            ev = [r for r in rows if "critic_error" in r]
            last = [r["critic_error"] for r in ev if r["update"] == updates]
            mean = [np.mean([r["critic_error"] for r in ev if r["seed"] == s]) for s in sorted({r["seed"] for r in ev})]
            se = np.mean([r["critic_error_mc_se"] for r in ev])
            rho = np.mean([r["ess"] for r in rows])
            ret = np.nanmean([r["episode_return"] for r in rows if r["update"] > updates - max(1, updates // 10)])
            print(f"| {lag} | {critic} | {ci(last)} | {ci(mean)} | {se:.2g} | {rho:.3g} | {ret:.4g} | {secs:.0f} |",
                  flush=True)
    if out:
        from pathlib import Path

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(all_rows))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *sys.argv[3:4])
