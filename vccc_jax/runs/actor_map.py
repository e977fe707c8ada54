"""The staleness-tolerance map of the actor-correction table x the critic corrections (issue 21,
parts 2-3; kind ``actor_map``, ``experiments/actor_map.toml``, ``experiments/actor_map_regime.toml``).

    vccc sweep --config experiments/actor_map.toml            # resumable
    vccc sweep --config experiments/actor_map.toml --shard 3/8   # one shard (any scheduler)

Results and the reduced / full / part-3 settings: docs/actor_map.md.

Problems (float64). Task table ``t`` of ``[[base.tasks]]``, instance m = 0..num_seeds-1:
``tabular.mdp.random_mdp(fold_in(PRNGKey(seed), m), 1, ...)`` (kind tabular) or
``tabular.token.make_task(fold_in(PRNGKey(seed), m), ...)`` (kind token), initial logits
``init_scale * N(0, 1)`` (key ``fold_in(PRNGKey(seed + 1), m)``), the same instances for every
row, critic, lag and sampler (so every comparison is paired by seed).

Studies (one store row per (study, task, row); lags x samplers x seeds x critics inside):

* ``exact``: the policy history pi_0..pi_K of each instance by exact NPG (step ``history_step``,
  K = max lag; ``envs.actor_map.npg_versions``); learner pi_K, behaviour = the sampler applied
  to pi_{K - lag}; per critic the exact expected update of the row against Eq 12 and the
  policy gradient, and its drift / critic / weight / state decomposition
  (``envs.actor_map.lane_update``). A row with no closed form on the task (a sequence row at
  a long or infinite horizon) is stored as ``{"na": ...}``, never sampled.
* ``train`` (rows ``grid.train_rows``, lags ``grid.train_lags``; empty: the exact study's):
  whole runs of ``train_updates`` exact expected updates from the instance's initial
  logits at learning rate ``lr`` (``envs.actor_map_train.train_run``): normalised return AUC,
  final normalised return, the return curve (33 points), mean cosines along the run and, with
  ``train_decomposition``, the time-averaged bias parts (as ``analysis.async_ac``: mean
  |part| over mean |Eq 12|; the state part over mean |pg|).

Samplers: ``temperature`` (temperature ``base.temperature``, no top-p) and ``top_p`` (top-p
``base.top_p`` at temperature 1). Critics: ``envs.actor_map.CRITICS`` (truncated at
``critic_clip``, V-trace at ``vtrace_rhobar``). Metric arrays are nested lists indexed
[seed][sampler][lag][critic] (context metrics [seed][sampler][lag]).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.schema import Experiment, as_dict
from vccc_jax.runs.schema_kinds import ACTOR_MAP_TASK_KEYS

STUDIES = ("exact", "train")
SAMPLERS = ("temperature", "top_p")
TASK_DEFAULTS = {"history_step": 0.01, "init_scale": 1.0, "lr": 1.0, "train": True}
CURVE_POINTS = 33
EXACT_METRICS = ("cos_eq12", "rel_eq12", "cos_pg", "rel_pg", "drift_part", "critic_part",
                 "weight_part", "state_part", "g_norm", "critic_err")
PARTS = ("drift_part", "critic_part", "weight_part", "state_part")
CONTEXT_METRICS = ("kl", "support", "j_pi")

__all__ = ["STUDIES", "SAMPLERS", "EXACT_METRICS", "CONTEXT_METRICS", "cells", "validate",
           "run_cell", "run_study", "task_of", "sampler_settings"]


def task_of(cell: dict) -> dict:
    """The cell's task table with the map's defaults filled in."""
    return {**TASK_DEFAULTS, **cell["task"]}


def sampler_settings(cell: dict) -> list[tuple[float, float]]:
    """(temperature, top_p) of each of the cell's samplers."""
    table = {"temperature": (float(cell["temperature"]), 1.0), "top_p": (1.0, float(cell["top_p"]))}
    return [table[s] for s in cell["samplers"]]


def cells(exp: Experiment) -> list[dict]:
    """Cells in run order: study x task x row (grid order). Each carries everything it
    depends on (its store id)."""
    b, g = as_dict(exp.base), exp.grid
    tasks = {t["name"]: t for t in b["tasks"]}
    from vccc_jax.estimators import actor_registry

    out = []
    for study in g.studies:
        rows, lags = (g.train_rows or g.rows, g.train_lags or g.lags) if study == "train" else (
            g.rows, g.lags)
        for name in g.tasks:
            if study == "train" and not {**TASK_DEFAULTS, **tasks[name]}["train"]:
                continue
            for row in rows:
                spec = actor_registry.get_actor_correction(row)
                per_state = spec.level != "sequence" and (
                    tasks[name]["kind"] == "token" or tasks[name].get("horizon") is None)
                cell = dict(study=study, task=tasks[name], row=spec.name,
                            row_params=spec.resolve(b["row_params"].get(row)),
                            lags=[int(x) for x in lags], samplers=list(g.samplers),
                            seed=b["seed"], num_seeds=b["num_seeds"],
                            temperature=b["temperature"], top_p=b["top_p"],
                            critic_clip=b["critic_clip"], vtrace_rhobar=b["vtrace_rhobar"],
                            centred=bool(b["centred"] and per_state))
                if study == "train":
                    cell["train_updates"] = b["train_updates"]
                    cell["train_decomposition"] = bool(b["train_decomposition"])
                out.append(cell)
    return out


def validate(exp: Experiment) -> list[dict]:
    """Cells after the semantic checks (ValueError naming the key): known tasks, rows and
    their parameters, samplers, studies, lags, sizes."""
    from vccc_jax.estimators import actor_registry

    b, g, where = exp.base, exp.grid, exp.path or "config"
    names = [t["name"] for t in b.tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: base.tasks names must be unique, got {names}")
    for key, values, known in (("grid.tasks", g.tasks, names), ("grid.samplers", g.samplers, SAMPLERS),
                               ("grid.studies", g.studies, STUDIES)):
        bad = [v for v in values if v not in known]
        if bad or not values:
            raise ValueError(f"{where}: {key} must be a non-empty list of {list(known)}; bad: {bad}")
    if not g.rows:
        raise ValueError(f"{where}: grid.rows must be a non-empty list of actor rows")
    for row in [*g.rows, *g.train_rows]:
        try:
            actor_registry.get_actor_correction(row).resolve(b.row_params.get(row))
        except ValueError as e:
            raise ValueError(f"{where}: grid.rows / base.row_params.{row}: {e}") from None
    for row, params in b.row_params.items():  # rows the grid leaves out are still checked
        try:
            actor_registry.get_actor_correction(row).resolve(params)
        except ValueError as e:
            raise ValueError(f"{where}: base.row_params.{row}: {e}") from None
    for key, lags in (("grid.lags", g.lags), ("grid.train_lags", g.train_lags or [0])):
        if not lags or min(lags) < 0 or sorted(set(lags)) != list(lags):
            raise ValueError(f"{where}: {key} must be increasing integers >= 0, got {lags}")
    for key in ("num_seeds", "train_updates"):
        if getattr(b, key) < 1:
            raise ValueError(f"{where}: base.{key} must be >= 1, got {getattr(b, key)}")
    if not b.temperature > 0 or not 0 < b.top_p <= 1:
        raise ValueError(f"{where}: base.temperature must be > 0 and base.top_p in (0, 1], got "
                         f"{b.temperature}, {b.top_p}")
    if not (b.critic_clip > 0 and b.vtrace_rhobar > 0):
        raise ValueError(f"{where}: base.critic_clip and base.vtrace_rhobar must be > 0")
    for t in b.tasks:
        t = {**TASK_DEFAULTS, **t}
        if t["history_step"] <= 0 or t["lr"] <= 0 or t["init_scale"] < 0:
            raise ValueError(f"{where}: task {t['name']!r}: history_step and lr must be > 0, "
                             "init_scale >= 0")
        if b.centred and t["kind"] == "tabular" and t.get("horizon") is not None and t["name"] in g.tasks:
            raise ValueError(f"{where}: base.centred: task {t['name']!r} is a finite-horizon tabular "
                             "MDP, whose rows are enumerated path by path (no per-state centring)")
    return cells(exp)


# ------------------------------------------------------------------------- problems


def _generator_keywords(task: dict) -> dict:
    return {k: v for k, v in task.items() if k not in ACTOR_MAP_TASK_KEYS}


@functools.lru_cache(maxsize=8)
def _instances(task_json: str, seed: int, num_seeds: int):
    """(kind, envs [num_seeds], initial logits [num_seeds, ...]) in float64 (call inside
    ``jax.enable_x64``)."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.tabular import token as tk
    from vccc_jax.tabular.mdp import random_mdp

    task = json.loads(task_json)
    kind, gen = task["kind"], _generator_keywords(task)
    keys = jax.vmap(lambda m: jax.random.fold_in(jax.random.PRNGKey(seed), m))(jnp.arange(num_seeds))
    if kind == "tabular":
        envs = jax.vmap(lambda k: random_mdp(k, 1, dtype=jnp.float64, **gen)[0])(keys)
        shape = (envs.num_states, envs.num_actions)
    else:
        envs = jax.vmap(lambda k: tk.make_task(k, dtype=jnp.float64, **gen))(keys)
        shape = (envs.num_prompts, envs.horizon, envs.num_states, envs.num_tokens)
    init = jax.vmap(lambda m: task["init_scale"] * jax.random.normal(
        jax.random.fold_in(jax.random.PRNGKey(seed + 1), m), shape, jnp.float64))(jnp.arange(num_seeds))
    return kind, envs, init


@functools.lru_cache(maxsize=8)
def _history(task_json: str, seed: int, num_seeds: int, versions: tuple):
    """Logits of the NPG history versions ``versions`` [num_seeds, len(versions), ...]."""
    import jax

    from vccc_jax.envs import actor_map as am

    kind, envs, init = _instances(task_json, seed, num_seeds)
    step = json.loads(task_json)["history_step"]
    return jax.jit(jax.vmap(lambda e, th: am.npg_versions(kind, e, th, step, versions)))(envs, init)


@functools.lru_cache(maxsize=8)
def _j_star(task_json: str, seed: int, num_seeds: int):
    """J* of every instance [num_seeds]."""
    import jax

    from vccc_jax.envs import actor_map as am

    kind, envs, _ = _instances(task_json, seed, num_seeds)
    return jax.jit(jax.vmap(lambda e: am.optimal_start_value(kind, e)))(envs)


def _key(cell: dict) -> tuple:
    return json.dumps(task_of(cell), sort_keys=True), int(cell["seed"]), int(cell["num_seeds"])


def _na(cell: dict) -> Optional[str]:
    """Why the cell's row has no exact answer on its task, or None (decided from instance 0's
    shapes)."""
    import jax

    from vccc_jax.envs import actor_map as am

    task = task_of(cell)
    with jax.enable_x64(True):
        kind, envs, _ = _instances(*_key(cell))
        env = jax.tree_util.tree_map(lambda x: x[0], envs)
        if am.row_is_exact(kind, env, cell["row"]):
            return None
        n = am.num_paths(kind, env)
    return (f"n/a (no closed form): sequence row on {task['name']} "
            + ("(infinite horizon)" if n is None else f"({n:.3g} paths > {am.MAX_PATHS})"))


# ------------------------------------------------------------------------- compute


@functools.lru_cache(maxsize=64)
def _exact_fn(kind: str, row: str, params_json: str, clip: float, rhobar: float, centred: bool):
    import jax
    import jax.numpy as jnp

    from vccc_jax.envs import actor_map as am

    params = json.loads(params_json)

    def lane(env, logits_pi, logits_mu, temperature, top_p, lag):
        u = am.lane_update(kind, env, row, params, logits_pi, logits_mu, temperature, top_p, lag,
                           clip=clip, rhobar=rhobar, centred=centred)
        n12 = jnp.linalg.norm(u.eq12.reshape(-1))
        npg = jnp.linalg.norm(u.pg.reshape(-1))
        per = jax.vmap(lambda g, d, c, w, s: dict(
            cos_eq12=am.cosine(g, u.eq12), rel_eq12=jnp.linalg.norm((g - u.eq12).reshape(-1)) / n12,
            cos_pg=am.cosine(g, u.pg), rel_pg=jnp.linalg.norm((g - u.pg).reshape(-1)) / npg,
            drift_part=jnp.linalg.norm(d.reshape(-1)) / n12,
            critic_part=jnp.linalg.norm(c.reshape(-1)) / n12,
            weight_part=jnp.linalg.norm(w.reshape(-1)) / n12,
            state_part=jnp.linalg.norm(s.reshape(-1)) / npg,
            g_norm=jnp.linalg.norm(g.reshape(-1)) / n12,
            sum_err=jnp.max(jnp.abs(d + c + w + s - (g - u.pg))),
        ))(u.g, u.drift, u.critic, u.weight, u.state)
        per["critic_err"] = u.critic_err
        return per, dict(kl=u.kl, support=u.support, j_pi=u.j_pi)

    def seed_fn(env, hist, temps, tops, lags):
        pi = hist[-1]

        def one_sampler(t, p):
            return jax.vmap(lambda i, lag: lane(env, pi, hist[i], t, p, lag))(
                jnp.arange(lags.shape[0]), lags)

        return jax.vmap(one_sampler)(temps, tops)

    return jax.jit(jax.vmap(seed_fn, in_axes=(0, 0, None, None, None)))


@functools.lru_cache(maxsize=64)
def _train_fn(kind: str, row: str, params_json: str, clip: float, rhobar: float, centred: bool,
              num_updates: int, ring: int, lr: float, decompose: bool):
    import jax
    import jax.numpy as jnp

    from vccc_jax.envs import actor_map as am
    from vccc_jax.envs import actor_map_train as amt

    params = json.loads(params_json)

    def run(env, logits0, critic, temperature, top_p, lag):
        return amt.train_run(kind, env, row, params, logits0, critic, temperature, top_p, lag,
                             num_updates=num_updates, ring=ring, lr=lr, clip=clip,
                             rhobar=rhobar, centred=centred, decompose=decompose)

    crit = jnp.arange(len(am.CRITICS))
    over_critics = jax.vmap(run, in_axes=(None, None, 0, None, None, None))
    over_samplers = jax.vmap(lambda e, th, t, p, lag: over_critics(e, th, crit, t, p, lag),
                             in_axes=(None, None, 0, 0, None))
    return jax.jit(jax.vmap(over_samplers, in_axes=(0, 0, None, None, None)))


def _tolist(x) -> list:
    return np.asarray(x, np.float64).tolist()


def run_cell(cell: dict) -> dict:
    """One cell's metrics (module docstring), exact in float64."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.envs import actor_map as am
    from vccc_jax.envs import actor_map_train as amt

    reason = _na(cell)
    if reason is not None:
        return {"na": reason}
    task = task_of(cell)
    lags = [int(x) for x in cell["lags"]]
    key = (json.dumps(cell["row_params"], sort_keys=True), float(cell["critic_clip"]),
           float(cell["vtrace_rhobar"]), bool(cell["centred"]))
    with jax.enable_x64(True):
        temps, tops = (jnp.asarray(x, jnp.float64) for x in zip(*sampler_settings(cell)))
        if cell["study"] == "exact":
            K = max(lags)
            versions = tuple(sorted({K - lag for lag in lags}))
            kind, envs, _ = _instances(*_key(cell))
            hist = _history(*_key(cell), versions)
            order = jnp.asarray([versions.index(K - lag) for lag in lags] + [versions.index(K)])
            per, ctx = _exact_fn(kind, cell["row"], *key)(envs, hist[:, order], temps, tops,
                                                          jnp.asarray(lags))
            out = {k: _tolist(per[k]) for k in EXACT_METRICS}
            out.update({k: _tolist(ctx[k]) for k in CONTEXT_METRICS})
            out["decomposition_max_err"] = float(jnp.max(per["sum_err"]))
            out["critics"] = list(am.CRITICS)
            return out
        N = int(cell["train_updates"])
        kind, envs, init = _instances(*_key(cell))
        j_star = _j_star(*_key(cell))
        decompose = bool(cell.get("train_decomposition", False))
        fn = _train_fn(kind, cell["row"], *key, N, amt.ring_size(max(lags), N), float(task["lr"]),
                       decompose)
        pts = np.unique(np.round(np.linspace(0, N, CURVE_POINTS)).astype(int))
        auc, final, curve, c12, cpg, parts = [], [], [], [], [], []
        for lag in lags:  # [seed, sampler, critic, ...] per lag
            res = fn(envs, init, temps, tops, jnp.asarray(lag))
            ret = np.asarray(res.returns)
            js = np.asarray(j_star)[:, None, None]
            auc.append(np.asarray(amt.normalised_auc(ret, js)))
            final.append((ret[..., -1] - ret[..., 0]) / (js - ret[..., 0]))
            curve.append(ret[..., pts])
            c12.append(np.asarray(res.cos_eq12).mean(-1))
            cpg.append(np.asarray(res.cos_pg).mean(-1))
            n = np.asarray(res.norms).mean(-2)  # time averages [seed, sampler, critic, 6]
            with np.errstate(invalid="ignore", divide="ignore"):
                parts.append(np.concatenate([n[..., 2:5] / n[..., :1], n[..., 5:] / n[..., 1:2]], -1))
        lag_axis = lambda xs: np.moveaxis(np.stack(xs), 0, 2)  # noqa: E731  [seed, sampler, lag, ...]
        out = {"auc": _tolist(lag_axis(auc)), "final": _tolist(lag_axis(final)),
               "curve": _tolist(lag_axis(curve)), "curve_updates": pts.tolist(),
               "cos_eq12_run": _tolist(lag_axis(c12)), "cos_pg_run": _tolist(lag_axis(cpg)),
               "j0": _tolist(np.asarray(res.returns)[:, 0, 0, 0]), "j_star": _tolist(j_star),
               "critics": list(am.CRITICS)}
        if decompose:  # time-averaged |part| over time-averaged |eq12| (state: over |pg|)
            p = lag_axis(parts)
            out.update({f"{k}_run": _tolist(p[..., i]) for i, k in enumerate(PARTS)})
        return out


def _note(cell: dict, metrics: dict) -> str:
    return f"{cell['study']} {cell['task']['name']} {cell['row']}"


def run_study(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
              on_cell: Optional[Callable[[int, int, dict], None]] = None) -> tuple[Path, list[dict]]:
    """Compute every missing cell into ``<results_dir>/<name>.jsonl`` -> (store path, rows of
    this grid in cell order)."""
    path = Path(results_dir) / f"{exp.name}.jsonl"
    rows = run_cells(path, validate(exp), run_cell, label=exp.name, note=_note,
                     progress=progress, on_cell=on_cell)
    return path, rows

