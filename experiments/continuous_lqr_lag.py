"""Critic error vs lag with a Gaussian actor on the LQR testbed (issue 31, section 4; LQR half).

For each lag law and critic target: the trainer (``train.trainer``, Gaussian head) on
``lqr:dim=2,act=1`` (linear Gaussian actor, MLP critic), and the exact RMS error of the critic
against V^{pi_k} (``exact_err_pi``: ``tabular.lqr``, at the update's visited states) at the
last update, over seeds; printed as a markdown table (mean and 95%
t half-width). Run: ``.venv/bin/python experiments/continuous_lqr_lag.py [updates] [seeds] [lr]``
(``lr``: actor and critic learning rate; default 2.5e-4 actor, 1e-3 critic).
"""

import sys
import time

import numpy as np
from scipy import stats

from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import train

LAGS = ("fixed:0", "uniform:7")
CRITICS = ("uncorrected", "vccc", "truncated", "vtrace")


def main(updates: int = 40, seeds: int = 3, lr: float = 0.0) -> None:
    print("| lag | critic | critic error (exact RMS, last update) | ESS (mean) | seconds |")
    print("|---|---|---|---|---|")
    for lag in LAGS:
        for critic in CRITICS:
            cfg = TrainConfig(env="lqr:dim=2,act=1,gamma=0.9", num_envs=16, num_steps=32,
                              total_timesteps=16 * 32 * updates, num_minibatches=4, update_epochs=2,
                              lag=lag, critic=critic, gamma=0.9, num_seeds=seeds, gt_every=updates,
                              critic_lr=lr or 1e-3, actor_lr=lr or 2.5e-4, anneal_lr=False)
            t0 = time.perf_counter()
            _, m = train(cfg)
            secs = time.perf_counter() - t0
            err = np.asarray(m["exact_err_pi"])[-1]
            rho = float(np.mean(np.asarray(m["ess"])))
            half = stats.t.ppf(0.975, len(err) - 1) * err.std(ddof=1) / np.sqrt(len(err))
            print(f"| {lag} | {critic} | {err.mean():.3g} ± {half:.2g} | {rho:.3g} | {secs:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *(float(a) for a in sys.argv[3:4]))
