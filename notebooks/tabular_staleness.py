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
# # Staleness sweeps on tabular MDPs
# Every `tabular_*.jsonl` store under `results` (`vccc sweep`): fixed-point error vs mean lag per
# method and law, and the stochastically trained critics. Exact fixed points: the y axis is log
# because errors span 1e-15 (exact corrections) to 1 (stale critics); lag 0 is on a linear x axis.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%

from vccc_jax.plotting import Rows, fig_error_vs_lag, fig_trained_curves
from vccc_jax.plotting.style import publish
from vccc_jax.runs.store import find_stores, read_rows

stores = find_stores(results, "tabular_*")  # unsharded files and shard directories
print("stores:", [s.name for s in stores] or "none")

# %%
for store in stores:
    R = Rows(read_rows(store))
    for fam in R.families:
        publish(fig_error_vs_lag(R, family=fam), out, f"{store.stem}_{fam}_error_vs_lag", gallery)
        if any("tc_curve_rms" in r["metrics"] for r in R.rows):
            publish(fig_trained_curves(R, family=fam), out, f"{store.stem}_{fam}_trained_curves", gallery)
