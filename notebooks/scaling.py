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
# # Scaling: the sharded trainer across devices (issue 10)
# Every bench JSON under `results/bench/` (format: `vccc_jax.plotting.scaling`): throughput and
# scaling efficiency against the device count, weak and strong regimes, plus the table.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
from pathlib import Path

from IPython.display import Markdown, display

from vccc_jax.plotting.scaling import bench_table, fig_scaling, read_bench
from vccc_jax.plotting.style import publish

files = sorted(Path(results).glob("bench/*.json"))
print("bench files:", [f.name for f in files] or "none")

# %%
for f in files:
    doc = read_bench(f)
    display(Markdown(bench_table(doc)))
    publish(fig_scaling(doc), out, f"scaling_{f.stem}", gallery)
