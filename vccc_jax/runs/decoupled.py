"""The decoupled-correction route study (issue 13; kind ``decoupled``,
``experiments/decoupled_routes.toml``), exact in float64.

Per random MDP m (``tabular.mdp.random_mdp`` with key ``seed``; S states, A actions) a policy
history pi_0..pi_K (``tabular.history.policy_history``, theta_0 = init_scale * N(0, 1) with key
``seed + 10 + m``). pi = pi_K is the learner; the behaviour version is pi_{K-lag} and the
sampler's mu is its logits plus N(0, noise^2) (key ``seed + 99 + m``) rounded to ``quantum``
(``tabular.decoupled.inference_policy``). The critic is Vbar = 0. EWMA decay beta = L / (1 + L),
L = max(lag, 1) (``estimators.related.decoupled.ewma_decay_for_lag``).

Cells (one store row each, resumable: ``runs.store``):

* ``routes`` cells, one per (MDP, noise): ``tabular.decoupled.route_comparison`` at every grid
  lag -> ``metrics.rows`` = [{lag, route, actor_bias_vs_exact, ..., critic_variance}].
* ``threshold`` cells, one per MDP: ``tabular.decoupled.threshold_interaction`` at
  ``threshold_noise`` for every ``threshold_lags`` entry over clips x epsilons ->
  ``metrics.threshold`` = {"lag=L/route": {"discrepancy": [C][E], "ppo": [C][E]}}.

:func:`study` folds the rows into the dict ``plotting.comparators.fig_decoupled_routes`` reads
(setup, rows, threshold = MDP mean, threshold_axes); :func:`run_study` writes it to
``<results>/<name>.json`` next to the store ``<results>/<name>.jsonl``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.schema import Experiment, as_dict

_THRESHOLD_KEYS = ("threshold_noise", "threshold_lags", "threshold_clips", "threshold_epsilons",
                   "threshold_kind")


def cells(exp: Experiment) -> list[dict]:
    """The cells in run order: per MDP, its ``routes`` cells (one per noise), then its
    ``threshold`` cell. Each carries the base fields it depends on (its store id)."""
    base = as_dict(exp.base)
    shared = {k: v for k, v in base.items() if k not in _THRESHOLD_KEYS}
    out = []
    for m in range(base["num_mdps"]):
        for noise in exp.grid.noises:
            out.append(dict(shared, study="routes", mdp=m, noise=float(noise),
                            lags=[int(x) for x in exp.grid.lags]))
        out.append(dict(base, study="threshold", mdp=m))
    return out


def validate(exp: Experiment) -> list[dict]:
    """Cells after checking sizes, lags, kinds and thresholds (``ValueError`` naming the key)."""
    from vccc_jax.estimators.importance import WEIGHT_KINDS

    b, where = exp.base, exp.path or "config"
    for key in ("num_mdps", "num_states", "num_actions", "num_versions"):
        if getattr(b, key) < 1:
            raise ValueError(f"{where}: base.{key} must be >= 1, got {getattr(b, key)}")
    if not 0 < b.gamma < 1:
        raise ValueError(f"{where}: base.gamma must lie in (0, 1), got {b.gamma}")
    if b.quantum < 0:
        raise ValueError(f"{where}: base.quantum must be >= 0 (0 = no rounding), got {b.quantum}")
    for key in ("kind", "threshold_kind"):
        if getattr(b, key) not in WEIGHT_KINDS:
            raise ValueError(f"{where}: base.{key} must be one of {WEIGHT_KINDS}, "
                             f"got {getattr(b, key)!r}")
    for key, lags in (("grid.lags", exp.grid.lags), ("base.threshold_lags", b.threshold_lags)):
        bad = [x for x in lags if not 0 <= x < b.num_versions]
        if bad or not lags:
            raise ValueError(f"{where}: {key} must be non-empty, in [0, {b.num_versions - 1}]; "
                             f"bad: {bad}")
    if not exp.grid.noises or min(exp.grid.noises) < 0 or b.threshold_noise < 0:
        raise ValueError(f"{where}: noises must be non-empty and >= 0")
    return cells(exp)


@functools.lru_cache(maxsize=16)
def _history(seed: int, num_mdps: int, S: int, A: int, gamma: float, algorithm: str,
             step_size: float, num_versions: int, init_scale: float, m: int):
    """(MDP m, logits [K+1, S, A]) in float64 (call inside ``jax.enable_x64``)."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.tabular.history import HistoryConfig, policy_history
    from vccc_jax.tabular.mdp import random_mdp

    mdps = random_mdp(jax.random.PRNGKey(seed), num_mdps, S, A, gamma=gamma, dtype=jnp.float64)
    mdp = jax.tree_util.tree_map(lambda x: x[m] if hasattr(x, "shape") and x.ndim > 0 else x, mdps)
    theta0 = init_scale * jax.random.normal(jax.random.PRNGKey(seed + 10 + m), (S, A), jnp.float64)
    cfg = HistoryConfig(algorithm=algorithm, step_size=step_size, num_versions=num_versions)
    return mdp, policy_history(mdp, theta0, cfg).logits


def _mu(cell: dict, logits, lag: int, noise: float):
    import jax

    from vccc_jax.tabular.decoupled import inference_policy

    K = logits.shape[0] - 1
    return inference_policy(logits[K - lag], noise_scale=noise,
                            key=jax.random.PRNGKey(cell["seed"] + 99 + cell["mdp"]),
                            quantum=cell["quantum"] or None)


def run_cell(cell: dict) -> dict:
    """One cell's metrics (module docstring), exact in float64."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.estimators.related.decoupled import ewma_decay_for_lag
    from vccc_jax.tabular import decoupled as td

    with jax.enable_x64(True):
        mdp, logits = _history(cell["seed"], cell["num_mdps"], cell["num_states"],
                               cell["num_actions"], float(cell["gamma"]), cell["algorithm"],
                               float(cell["step_size"]), cell["num_versions"],
                               float(cell["init_scale"]), cell["mdp"])
        if cell["study"] == "routes":
            vbar = jnp.zeros(cell["num_states"], jnp.float64)
            rows = []
            for lag in cell["lags"]:
                res = td.route_comparison(mdp, logits, lag, _mu(cell, logits, lag, cell["noise"]),
                                          vbar, decay=ewma_decay_for_lag(max(lag, 1)),
                                          kind=cell["kind"], clip=cell["clip"],
                                          ppo_epsilon=cell["ppo_epsilon"])
                rows += [dict(lag=lag, route=r, **d) for r, d in res.items()]
            return {"rows": rows}
        out = {}
        for lag in cell["threshold_lags"]:
            ti = td.threshold_interaction(
                mdp, logits, lag, _mu(cell, logits, lag, cell["threshold_noise"]),
                decay=ewma_decay_for_lag(max(lag, 1)), kind=cell["threshold_kind"],
                clips=tuple(cell["threshold_clips"]), epsilons=tuple(cell["threshold_epsilons"]))
            for r, g in ti.items():
                out[f"lag={lag}/{r}"] = {k: np.asarray(v).tolist() for k, v in g.items()}
        return {"threshold": out}


def setup_text(base: dict) -> str:
    """One line describing the study (stored in the JSON as ``setup``)."""
    K = base["num_versions"] - 1
    return (f"random MDPs S={base['num_states']} A={base['num_actions']} gamma={base['gamma']}, "
            f"{base['algorithm'].upper()} step {base['step_size']} history of "
            f"{base['num_versions']} versions, pi = pi_{K}; mu = inference_policy(logits of "
            f"pi_{{{K}-lag}}, noise_scale, quantum {base['quantum']}); {base['kind']} clip "
            f"{base['clip']}, PPO eps {base['ppo_epsilon']}; EWMA beta = L/(1+L), L = lag (min 1); "
            f"mean over {base['num_mdps']} MDPs")


def study(exp: Experiment, rows: list[dict]) -> dict:
    """The study dict of the stored rows: setup, rows (one per MDP x noise x lag x route),
    threshold (MDP mean per "lag=L/route"), threshold_axes."""
    base = as_dict(exp.base)
    out = {"setup": setup_text(base), "rows": [], "threshold": {}}
    thresholds = []
    for row in rows:
        c = row["cell"]
        if c["study"] == "routes":
            out["rows"] += [dict(mdp=c["mdp"], noise=c["noise"], **r) for r in row["metrics"]["rows"]]
        else:
            thresholds.append(row["metrics"]["threshold"])
    for key in (thresholds[0] if thresholds else {}):
        out["threshold"][key] = {k: np.mean([np.asarray(t[key][k]) for t in thresholds], 0).tolist()
                                 for k in ("discrepancy", "ppo")}
    out["threshold_axes"] = {"clips": base["threshold_clips"], "epsilons": base["threshold_epsilons"],
                             "kind": base["threshold_kind"], "noise": base["threshold_noise"]}
    return out


def run_study(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
              on_cell: Optional[Callable[[int, int, dict], None]] = None) -> tuple[Path, dict]:
    """Compute every missing cell into ``<results_dir>/<name>.jsonl``, then write the study
    dict to ``<results_dir>/<name>.json`` -> (json path, study)."""
    results_dir = Path(results_dir)

    def note(cell: dict, metrics: dict) -> str:
        what = f"noise {cell['noise']}" if cell["study"] == "routes" else "thresholds"
        return f"MDP {cell['mdp']} {what}"

    rows = run_cells(results_dir / f"{exp.name}.jsonl", validate(exp), run_cell, note=note,
                     progress=progress, on_cell=on_cell)
    result = study(exp, rows)
    path = results_dir / f"{exp.name}.json"
    path.write_text(json.dumps(result, indent=1))
    return path, result


def summary_table(result: dict, noise: Optional[float] = None) -> str:
    """Route x lag table of MDP-mean actor / critic bias vs the exact route (one noise level;
    default: the threshold noise), plus the lag-0 fire probabilities at the middle epsilon."""
    noise = result["threshold_axes"]["noise"] if noise is None else noise
    noises = sorted({r["noise"] for r in result["rows"]})
    if noise not in noises and noises:  # a grid without the threshold noise: the nearest run
        noise = min(noises, key=lambda x: abs(x - noise))
    rows = [r for r in result["rows"] if r["noise"] == noise]
    lags = sorted({r["lag"] for r in rows})
    routes = list(dict.fromkeys(r["route"] for r in rows))
    head = f"noise {noise}: bias vs exact route (actor / critic), MDP mean"
    lines = [head, f"{'route':<10}" + "".join(f"{'lag ' + str(g):>18}" for g in lags)]
    for route in routes:
        cells_ = []
        for g in lags:
            sel = [r for r in rows if r["route"] == route and r["lag"] == g]
            a = np.mean([r["actor_bias_vs_exact"] for r in sel])
            c = np.mean([r["critic_bias_vs_exact"] for r in sel])
            cells_.append(f"{a:8.2g} /{c:8.2g}")
        lines.append(f"{route:<10}" + "".join(f"{x:>18}" for x in cells_))
    axes = result["threshold_axes"]
    j = len(axes["epsilons"]) // 2
    lines.append(f"\nP[fires] at lag 0 ({axes['kind']}, eps {axes['epsilons'][j]}): "
                 "discrepancy / PPO clip per mask c")
    for key, g in result["threshold"].items():
        if key.startswith("lag=0/"):
            pairs = [f"c={c}: {g['discrepancy'][i][j]:.3f}/{g['ppo'][i][j]:.3f}"
                     for i, c in enumerate(axes["clips"])]
            lines.append(f"{key[6:]:<10} " + "  ".join(pairs))
    return "\n".join(lines)


__all__ = ["cells", "validate", "run_cell", "study", "run_study", "summary_table", "setup_text"]
