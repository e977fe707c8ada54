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
# # Sec 4.1: the variance-minimising baseline on a two-action bandit
# Loads `results/examples/bandit.json` (`vccc figures` writes it: `runs.examples`), prints the
# write-up's variance table and draws Var(Y_b) against b. Exact numbers, no sampling.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
from IPython.display import Markdown, display

from vccc_jax.plotting.examples import bandit_table, fig_bandit
from vccc_jax.plotting.style import publish
from vccc_jax.runs.examples import read_example

data = read_example(results, "bandit")
display(Markdown(bandit_table(data)))

# %%
publish(fig_bandit(data), out, "bandit_variance", gallery)
