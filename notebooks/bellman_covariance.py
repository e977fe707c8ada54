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
# # Eq 3: the Bellman covariance identity, state by state
# T_pi V(s) - T_mu V(s) against Cov_mu(rho, H_V | s) on random MDPs, exact and Monte-Carlo
# (`results/examples/covariance.json`, from `runs.examples`).

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
import numpy as np

from vccc_jax.plotting.examples import fig_covariance
from vccc_jax.plotting.style import publish
from vccc_jax.runs.examples import read_example

data = read_example(results, "covariance")
rows = data["rows"]
gap = max(abs(r["diff"] - r["cov_exact"]) for r in rows)
z = np.array([(r["cov_mc"] - r["cov_exact"]) / r["cov_mc_se"] for r in rows])
print(f"{len(rows)} states: max |(T_pi - T_mu)V - Cov| = {gap:.1e}; MC z-scores: mean {z.mean():+.2f}, sd {z.std():.2f}")

# %%
publish(fig_covariance(data), out, "bellman_covariance", gallery)
