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
# # Comparators: BRACE, decoupled correction, PS-PPO, RAC (issues 13, 14)
# * BRACE (n = 1, 2, 4, 8) vs VCCC, V-trace and the uncorrected target across lag: exact fixed-point
#   error and target variance on Garnet MDPs (`vccc sweep --config experiments/brace_tabular.toml`
#   -> `brace_tabular.jsonl`).
# * Decoupled correction, per pi_old route (exact snapshot, PPO-EWMA, naive pi_old := mu): exact
#   actor / critic bias and variance, and when the PPO clip and the discrepancy mask fire
#   (`vccc sweep --config experiments/decoupled_routes.toml` -> `decoupled_routes.json`).
# * GRPO vs PS-PPO on the token env: exact return per learner row (`vccc sweep --config
#   experiments/ps_ppo.toml` -> `ps_ppo.jsonl`).
# * RAC with delayed reward channels: the exact bias cut drop / RAC per MDP (`vccc sweep --config
#   experiments/rac_two_channel.toml` -> `rac_two_channel.jsonl`) and exact training coupled to
#   the simulated cluster, return vs wall-clock for drop / wait-for-slow / RAC (`vccc sweep
#   --config experiments/rac_wallclock.toml` -> `rac_wallclock.jsonl`).
#
# Each input is looked up in `results` and then in its subfolders; a missing one is skipped.

# %% tags=["parameters"]
results = "results"  # stored results (vccc sweep / train / bench); relative: from the repo root
out = "figures"      # where PDF + PNG figures go (relative: from the repo root)
gallery = ""         # optional: small README PNGs (docs/figures)

# %%
from vccc_jax.plotting.style import repo_path

results, out, gallery = repo_path(results), repo_path(out), repo_path(gallery)  # any cwd works

# %%
import json
from pathlib import Path

from IPython.display import Markdown, display

from vccc_jax.plotting import comparators
from vccc_jax.plotting.style import publish
from vccc_jax.runs import rac, rac_wallclock
from vccc_jax.runs.decoupled import summary_table
from vccc_jax.runs.store import is_store, read_rows


def find(name):
    """results/<name>, else the first results/*/<name>; None if absent."""
    hits = [Path(results) / name] + sorted(Path(results).glob(f"*/{name}"))
    return next((p for p in hits if p.is_file() or is_store(p)), None)


paths = {n: find(n) for n in ("brace_tabular.jsonl", "decoupled_routes.json", "ps_ppo.jsonl",
                             "rac_two_channel.jsonl", "rac_wallclock.jsonl")}
print({n: str(p) if p else "missing" for n, p in paths.items()})

# %% [markdown]
# ## BRACE across lag
# Exact fixed points (mean over MDPs). VCCC's error is at float precision at every lag; BRACE's
# bias grows with lag and shrinks with the prefix length n.

# %%
if paths["brace_tabular.jsonl"]:
    brace = read_rows(paths["brace_tabular.jsonl"])
    for law in sorted({r["cell"]["law"] for r in brace}):
        display(Markdown(comparators.brace_table(brace, law)))
        publish(comparators.fig_brace_lag(brace, law), out, f"brace_lag_{law}", gallery)
    law = "fixed" if any(r["cell"]["law"] == "fixed" for r in brace) else brace[0]["cell"]["law"]
    publish(comparators.fig_brace_nlag(brace, law), out, "brace_n_lag", gallery)

# %% [markdown]
# ## Decoupled correction: pi_old routes
# Bias against the exact route (snapshots of pi_{K-lag}) at inference noise 0.3, and the fire
# probabilities of the discrepancy mask and the PPO clip at lag 0.

# %%
if paths["decoupled_routes.json"]:
    routes = json.loads(paths["decoupled_routes.json"].read_text())
    print(routes["setup"])
    print(summary_table(routes))
    publish(comparators.fig_decoupled_routes(routes, noise=routes["threshold_axes"]["noise"]),
            out, "decoupled_routes", gallery)

# %% [markdown]
# ## GRPO vs PS-PPO (token env)

# %%
try:
    from vccc_jax.plotting.comparators2 import fig_ps_ppo
except ImportError:  # Comparators II figures not in this checkout
    fig_ps_ppo = None
if paths["ps_ppo.jsonl"] and fig_ps_ppo is not None:
    ps = read_rows(paths["ps_ppo.jsonl"])
    laws = {r["cell"]["law"] for r in ps}
    full = {lag for lag in {r["cell"]["lag"] for r in ps}  # lag panels with every law (a grid in progress)
            if {r["cell"]["law"] for r in ps if r["cell"]["lag"] == lag} == laws}
    print(f"ps_ppo: {len(ps)} runs; lag panels drawn: {sorted(full)}")
    ps = [r for r in ps if r["cell"]["lag"] in full]
    if ps:
        publish(fig_ps_ppo(ps), out, "ps_ppo", gallery)

# %% [markdown]
# ## RAC: bias cut with two slow reward channels
# Exact bias norms of the expected actor update at pi_K (float64) for dropping late rewards and
# for RAC (kernel reinjection, ratio clipped at reinjection), per MDP; the ratio drop / RAC per
# (clip, kernel mass, behaviour-lag law). Without a binding clip RAC is exactly unbiased.

# %%
if paths["rac_two_channel.jsonl"]:
    cut = read_rows(paths["rac_two_channel.jsonl"])
    print(rac.bias_cut_table(cut))
    publish(comparators.fig_rac_bias_cut(cut), out, "rac_two_channel", gallery)

# %% [markdown]
# ## RAC vs wait-for-slow in wall-clock
# Exact expected-update policy gradient, each update's behaviour lags, reward arrival steps and
# end time taken from a simulated cluster: drop and RAC on the asynchronous schedule, wait on
# the schedule that waits for every reward channel. Return (fraction of J* - J0) against
# simulated hours, and the time each MDP needs to reach 90 % of the way.

# %%
if paths["rac_wallclock.jsonl"]:
    wall = read_rows(paths["rac_wallclock.jsonl"])
    print(rac_wallclock.wallclock_table(wall))
    publish(comparators.fig_rac_wallclock(wall), out, "rac_wallclock", gallery)
