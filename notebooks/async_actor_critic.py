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
# # Score centering x critic grid (async tabular actor-critic)
# Every `async_ac*.jsonl` store (`vccc sweep --config experiments/async_ac.toml`): return gap,
# gradient bias and its parts, critic error against mean lag, per actor weight; then the
# paired ratio table (same random MDPs across variants).

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%

from IPython.display import Markdown, display

from vccc_jax.analysis.async_ac import ratio_table
from vccc_jax.plotting import fig_async_ac
from vccc_jax.plotting.style import publish
from vccc_jax.runs.store import find_stores, read_rows

stores = find_stores(results, "async_ac*")  # unsharded files and shard directories
print("stores:", [s.name for s in stores] or "none")

# %%
for store in stores:
    rows = read_rows(store)
    for mode in sorted({r["cell"]["mode"] for r in rows}):
        sel = [r for r in rows if r["cell"]["mode"] == mode]
        for kind in sorted({r["cell"]["actor_kind"] for r in sel}):
            publish(fig_async_ac(rows, mode=mode, actor_kind=kind), out, f"{store.stem}_{mode}_{kind}", gallery)
    display(Markdown(ratio_table(rows)))
