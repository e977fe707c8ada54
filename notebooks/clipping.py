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
# # Clipping: fixed points and the bias-variance frontier
# From the tabular sweep stores: fixed-point error over (lag, c) for truncation, masking and
# V-trace; the exact target variance against c; and bias against variance across c.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%

from vccc_jax.plotting import Rows, fig_bias_variance, fig_clip_heatmap, fig_variance_vs_clip
from vccc_jax.plotting.style import publish
from vccc_jax.runs.store import find_stores, read_rows

stores = find_stores(results, "tabular_*")  # unsharded files and shard directories
print("stores:", [s.name for s in stores] or "none")

# %%
for store in stores:
    R = Rows(read_rows(store))
    if not R.clips():
        continue
    for fam in R.families:
        publish(fig_clip_heatmap(R, family=fam), out, f"{store.stem}_{fam}_clip_heatmap", gallery)
        publish(fig_variance_vs_clip(R, family=fam), out, f"{store.stem}_{fam}_variance_vs_clip", gallery)
        publish(fig_bias_variance(R, family=fam), out, f"{store.stem}_{fam}_bias_variance", gallery)
