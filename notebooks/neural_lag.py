# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Neural actor-critic: lag curves with ground truth
# Single runs (`vccc train --env CartPole-v1 ... --out results/train/NAME`, or no `--out`): each
# run's curves. Train grid stores (`vccc train --config experiments/train_lag_quick.toml --out results/train`):
# per env, return and critic error (Monte-Carlo V^pi; exact V^pi on tabular envs when stored)
# against the mean lag. Statistics over seeds only: IQM with stratified bootstrap CIs, paired
# per-seed differences against the uncorrected GAE critic, performance profiles across envs.
# Regime grid stores (`vccc train --config experiments/regime_*.toml --out results/regime`):
# critic error over the whole run (exact error vs V^{pi_k} when stored, else Monte-Carlo MAE),
# one panel per lag (and sampler / env), one band per critic, from each cell's metrics.csv.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
import re
from pathlib import Path

from vccc_jax.plotting.seeds import fig_lag_curves, fig_paired_differences, fig_performance_profile
from vccc_jax.plotting.style import publish
from vccc_jax.plotting.train import error_curves
from vccc_jax.runs.store import find_stores
from vccc_jax.runs.train import error_curve_rows, rows_with_whole_run

stores = find_stores(Path(results) / "train") + find_stores(results, "train_*")
print("stores:", [str(s) for s in stores] or "none")

# %%
for store in stores:
    rows = [r for r in rows_with_whole_run(store) if "env" in r["cell"]]
    envs = sorted({r["cell"]["env"] for r in rows})
    critics = {r["cell"]["critic"] for r in rows}
    for env in envs:
        tag = f"{store.stem}_{re.sub(r'[^A-Za-z0-9.-]+', '-', env).strip('-')}"
        # exact-truth envs (tabular:, token:): whole-run exact error; gymnax: MC truth
        metrics = (("final_return", "exact_err_pi_auc", "exact_gap_auc")
                   if env.startswith(("tabular", "token")) else
                   ("final_eval_return", "final_return", "gt_rel_err"))
        publish(fig_lag_curves(rows, metrics=metrics, env=env), out, f"{tag}_lag_curves", gallery)
        if "gae" in critics and len(critics) > 1:
            publish(fig_paired_differences(rows, env=env), out, f"{tag}_paired_return", gallery)
    if len(envs) > 1:
        publish(fig_performance_profile(rows), out, f"{store.stem}_profile", gallery)

# %% [markdown]
# ## Single runs: each run's curves
# Run directories directly under `results/train/` (`vccc train` without `--config`; the
# default `--out` is `results/train/<env>_..._<hash>_<time>`): behaviour and current-policy
# return, critic error against the ground truth when the run evaluated it (`--gt-every`), ESS.

# %%
import json

from vccc_jax.plotting.train import plot_learning_curves
from vccc_jax.runs.train import read_csv

runs = sorted(p.parent for p in (Path(results) / "train").glob("*/metrics.csv")
              if (p.parent / "config.json").exists())
print("single runs:", [r.name for r in runs] or "none")
for run in runs:
    c = json.loads((run / "config.json").read_text())["config"]
    Path(out).mkdir(parents=True, exist_ok=True)
    plot_learning_curves(read_csv(run / "metrics.csv"), Path(out) / f"train_run_{run.name}_curves.png",
                         f"{c['env']}  lag {c['lag']}  critic {c['critic']}  ({c['num_seeds']} seeds)")

# %% [markdown]
# ## Regime grids: critic error over the whole run

# %%
regime = find_stores(Path(results) / "regime")
print("regime stores:", [str(s) for s in regime] or "none")
for store in regime:
    by, key = error_curve_rows(store)
    if not by:
        continue
    fig = error_curves(by, key, title=f"{store.stem}: {key} over the whole run")
    publish(fig, out, f"{store.stem}_error_curves", gallery)
