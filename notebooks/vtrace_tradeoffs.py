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
# # V-trace (Eq 11): reductions and multi-step trade-offs
# `results/examples/vtrace.json` (`runs.examples`): for every (n, lambda, rho-bar, c-bar) the exact
# fixed point's bias to V^pi, the target variance there, and the contraction factor. Checks the
# reductions first: the fixed point is V^{pi_rho-bar} whatever c-bar, lambda and n are.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
from vccc_jax.plotting.examples import fig_vtrace_tradeoffs
from vccc_jax.plotting.style import publish
from vccc_jax.runs.examples import read_example

data = read_example(results, "vtrace")
worst = max(r["closed_form_err"] for r in data["rows"])
print(f"{len(data['rows'])} settings; max |V_fixed_point - V^(pi_rho_bar)| = {worst:.1e}")
same = {}
for r in data["rows"]:
    same.setdefault(r["rho_bar"], set()).add(round(r["bias_rms"], 10))
print("bias depends on rho_bar only:", all(len(v) == 1 for v in same.values()))

# %%
publish(fig_vtrace_tradeoffs(data), out, "vtrace_tradeoffs", gallery)
