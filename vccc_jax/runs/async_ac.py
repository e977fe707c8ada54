"""Run (or resume) an asynchronous tabular actor-critic grid (``kind = "async_ac"``).

The simulation is ``tabular.async_ac`` (exact or sampled updates, one vmapped lane per
(cell, MDP)); this module validates the grid, expands it (``runs.grid.product``), runs every
mode's cells in one compiled program and keeps one row per cell in a resumable store.
Statistics and tables of the rows are ``analysis.async_ac``.

The experiment's ``[base]`` and ``[grid]`` become one flat config dict (:func:`config_of`) --
the layout each cell id hashes (a cell's id covers the whole config).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.analysis.async_ac import per_mdp_metrics
from vccc_jax.analysis.stats import CI_LEVEL, ci_dict
from vccc_jax.runs.grid import product
from vccc_jax.runs.progress import Progress
from vccc_jax.runs.provenance import provenance
from vccc_jax.runs.schema import Experiment, as_dict
from vccc_jax.runs.schema_fields import ConfigError
from vccc_jax.runs.store import ResultStore, cell_id, signals_deferred
from vccc_jax.tabular import async_ac as AC
from vccc_jax.tabular import history
from vccc_jax.tabular import mdp as mdp_mod


def config_of(exp: Experiment) -> dict:
    """The validated flat config dict of an ``async_ac`` experiment."""
    if exp.kind != "async_ac":
        raise ConfigError(f"{exp.path}: kind {exp.kind!r} is not an async_ac grid")
    cfg = {"kind": "async_ac", "name": exp.name}
    if exp.description:
        cfg["description"] = exp.description
    cfg.update(as_dict(exp.base))
    cfg.update(as_dict(exp.grid))
    return validate(cfg)


GRID_DEFAULTS = {
    "kind": "async_ac",  # lets a sweep runner dispatch this config here
    "name": "async_ac",
    "seed": 0,
    "num_mdps": 64,
    "family": {"kind": "random", "num_states": 8, "num_actions": 4, "gamma": 0.9},
    "init_scale": 1.0,
    "ac": {},
    "modes": ["expected"],
    "actor_kinds": ["truncate"],
    "actor_clip": 1.0,
    "mask_clip": 2.0,
    "critics": ["uncorrected", "vccc"],
    "centerings": ["none", "exact"],
    "law": "geometric",
    "mean_lags": [0, 1, 2, 4, 8],
    "lanes_per_call": 1024,
}


def validate(cfg: dict) -> dict:
    """Defaults filled, keys checked (errors name the key). Returns a new dict."""
    unknown = set(cfg) - set(GRID_DEFAULTS) - {"description"}
    if unknown:
        raise ValueError(f"async_ac config: unknown keys {sorted(unknown)}")
    out = json.loads(json.dumps(GRID_DEFAULTS))
    out.update(json.loads(json.dumps(cfg)))
    if out["kind"] != "async_ac":
        raise ValueError(f"async_ac config: kind must be 'async_ac', got {out['kind']!r}")
    if out["family"].get("kind") not in ("random", "garnet"):
        raise ValueError(f"async_ac config: family.kind must be 'random' or 'garnet', got {out['family'].get('kind')!r}")
    if not (isinstance(out["num_mdps"], int) and out["num_mdps"] >= 2):
        raise ValueError(f"async_ac config: num_mdps must be an int >= 2, got {out['num_mdps']!r}")
    for m in out["modes"]:
        if m not in ("expected", "sampled"):
            raise ValueError(f"async_ac config: modes must be 'expected' or 'sampled', got {m!r}")
    for k in out["actor_kinds"]:
        if k not in AC.ACTOR_KINDS:
            raise ValueError(f"async_ac config: actor_kinds has {k!r}; known {AC.ACTOR_KINDS}")
    for c in out["centerings"]:
        if c not in AC.CENTERINGS:
            raise ValueError(f"async_ac config: centerings has {c!r}; known {AC.CENTERINGS}")
    if "topk" not in out["centerings"] and "topk" not in out["ac"]:
        out["ac"]["topk"] = 0  # compile the top-k path out when no cell uses it
    ac = dict(out["ac"])
    ac["critic_methods"] = tuple(out["critics"])
    for bad in ("expected", "critic_options"):
        if bad in ac:
            raise ValueError(f"async_ac config: ac.{bad} is set by the grid, not the config")
    AC.ACConfig(**ac)  # validates
    for lag in out["mean_lags"]:
        history.lag_weights(out["law"], lag, AC.ACConfig(**ac).max_lag)
    return out


def _ac_config(cfg: dict, mode: str) -> AC.ACConfig:
    ac = dict(cfg["ac"])
    ac["critic_methods"] = tuple(cfg["critics"])
    return AC.ACConfig(**ac, expected=(mode == "expected"))


def grid_cells(cfg: dict) -> list[dict]:
    """Every cell of a validated grid config (mode x actor kind x critic x centering x lag)."""
    cells = product([("mode", cfg["modes"]), ("actor_kind", cfg["actor_kinds"]),
                     ("critic", cfg["critics"]), ("centering", cfg["centerings"]),
                     ("mean_lag", cfg["mean_lags"])])
    return [dict(c, mean_lag=float(c["mean_lag"])) for c in cells]


def make_problems(cfg: dict, dtype=None):
    """(mdps [N], initial logits [N, S, A]) of a grid config; deterministic in its seed."""
    fam = dict(cfg["family"])
    kind = fam.pop("kind")
    key = jax.random.PRNGKey(cfg["seed"])
    k_mdp, k_pol = jax.random.split(key)
    n = cfg["num_mdps"]
    gen = mdp_mod.random_mdp if kind == "random" else mdp_mod.garnet_mdp
    mdps = gen(k_mdp, n, dtype=dtype, **fam)
    logits = history.initial_logits(k_pol, n, mdps.num_states, mdps.num_actions,
                                    cfg["init_scale"], dtype=dtype)
    return mdps, logits


def run_grid(cfg: dict, *, on_chunk=None) -> list[dict]:
    """Run every cell of a grid config; one tidy row per cell (float64).

    Row: ``{"cell": {...}, "metrics": {name: {"mean", "ci", "per_mdp": [...]}, ...},
    "curves": {"ret", "bias", "critic_err": [num_chunks] MDP means}, "config": {...}}``
    with ``ci`` the half-width of a ``CI_LEVEL`` Student-t interval over MDPs. Sampled cells
    use one independent seed per MDP. ``on_chunk(mode, runs done, runs, seconds)`` is
    called after every compiled call (progress).
    """
    cfg = validate(cfg)
    cells = grid_cells(cfg)
    rows = []
    with jax.enable_x64(True):
        mdps, logits = make_problems(cfg, dtype=jnp.float64)
        n = cfg["num_mdps"]
        for mode in cfg["modes"]:
            acfg = _ac_config(cfg, mode)
            fn = AC.make_train_fn(acfg)
            mode_cells = [c for c in cells if c["mode"] == mode]
            variants = [
                AC.make_variant(
                    acfg, actor_kind=c["actor_kind"],
                    actor_clip=cfg["mask_clip"] if c["actor_kind"] == "mask" else cfg["actor_clip"],
                    centering=c["centering"], critic=c["critic"], law=cfg["law"],
                    mean_lag=c["mean_lag"], dtype=jnp.float64)
                for c in mode_cells
            ]
            lanes = len(mode_cells) * n
            tile = lambda x: jnp.concatenate([x] * len(mode_cells), axis=0)  # noqa: E731
            all_mdps = jax.tree_util.tree_map(tile, mdps)
            all_logits = tile(logits)
            all_vars = jax.tree_util.tree_map(lambda x: jnp.repeat(x, n, axis=0), AC.stack_variants(variants))
            base = jax.random.PRNGKey(cfg["seed"] + 1)
            keys = jnp.stack([jax.random.fold_in(base, i % n) for i in range(lanes)])
            per = int(cfg["lanes_per_call"])
            outs = []
            t0 = time.perf_counter()
            for start in range(0, lanes, per):
                idx = np.arange(start, start + per) % lanes  # pad the last call by wrapping
                take = lambda x: x[idx]  # noqa: E731
                r = fn(jax.tree_util.tree_map(take, all_mdps), all_logits[idx],
                       jax.tree_util.tree_map(take, all_vars), keys[idx])
                r = jax.tree_util.tree_map(np.asarray, r)
                keep = min(per, lanes - start)
                outs.append(jax.tree_util.tree_map(lambda x: x[:keep], r))
                if on_chunk is not None:
                    on_chunk(mode, start + keep, lanes, time.perf_counter() - t0)
            res = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *outs)
            pm = per_mdp_metrics(res)
            for j, cell in enumerate(mode_cells):
                sl = slice(j * n, (j + 1) * n)
                metrics = {k: dict(ci_dict(v[sl], CI_LEVEL), per_mdp=v[sl].tolist()) for k, v in pm.items()}
                curves = {
                    "ret_gap": ((res.optimal_return[sl, None] - res.curves.ret[sl])
                                / (res.optimal_return[sl] - res.uniform_return[sl])[:, None]).mean(0).tolist(),
                    "bias": (res.curves.bias_norm[sl] / np.maximum(res.curves.ref_norm[sl], 1e-300)).mean(0).tolist(),
                    "critic_err": res.curves.critic_err[sl].mean(0).tolist(),
                }
                rows.append({"cell": cell, "metrics": metrics, "curves": curves,
                             "config": {"grid": {k: v for k, v in cfg.items() if k != "ac"},
                                        "ac": acfg.to_dict()}})
    return rows


def run_sweep(
    cfg: dict, results_dir: str | Path, *, progress: bool = True, stream=None, on_chunk=None
) -> tuple[Path, list[dict]]:
    """Run (or resume) an asynchronous actor-critic grid (``"kind": "async_ac"`` configs).

    One program per mode (expected / sampled updates) computes all of that mode's cells;
    a mode with any missing cell is recomputed with the same keys (results are identical)
    and only its missing rows are appended, so an interrupted sweep resumes at mode
    granularity.
    """
    stream = sys.stderr if stream is None else stream
    cells = grid_cells(cfg)
    ids = [cell_id(dict(c, grid=cfg)) for c in cells]  # a cell's id covers the whole config
    path = Path(results_dir) / f"{cfg['name']}.jsonl"
    prov = provenance()
    with ResultStore(path) as store:
        # one program per mode: a mode is the unit of work a shard owns (by its first cell)
        unit = {c["mode"]: i for i, c in reversed(list(zip(ids, cells)))}
        mine = [store.owns(unit[c["mode"]]) for c in cells]
        bar = Progress(sum(mine), done=sum(store.has(i) for i, m in zip(ids, mine) if m),
                       stream=stream, show=progress)
        for mode in cfg["modes"]:
            if not store.owns(unit[mode]) or all(
                    store.has(i) for i, c in zip(ids, cells) if c["mode"] == mode):
                continue
            bar.set_note(mode)
            t_mode = time.perf_counter()
            rows = run_grid(dict(cfg, modes=[mode]), on_chunk=on_chunk)
            per_cell = (time.perf_counter() - t_mode) / len(rows)
            added = 0
            for row in rows:
                cell = dict(row["cell"], grid=cfg)
                cid = cell_id(cell)
                if store.has(cid):
                    continue
                meta = dict(prov, timings={"cell_s": round(per_cell, 4)})
                with signals_deferred():
                    store.append({**row, "id": cid, "cell": cell, "meta": meta})
                added += 1
            bar.advance(added)  # one step per mode (the first one, with its compile: warm-up)
        bar.close()
        rows = [store.row(i) for i in ids if store.has(i)]
    return path, rows
