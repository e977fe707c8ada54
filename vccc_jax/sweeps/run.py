"""``vccc sweep``: staleness x clipping sweeps on tabular MDPs, resumable, with figures.

    vccc sweep                                    # the default sweep (experiments/tabular_default.toml)
    vccc sweep --config experiments/my.toml --results results --figures figures

What it does: expands the config into cells (``sweeps.grid``), skips every cell already
in ``<results>/<name>.jsonl`` (``sweeps.store``), evaluates the rest group by group --
each (family, method) group is one jitted, vmapped program over (law, lag, clip) x MDPs,
and one-step methods share a program (the method is a traced index), so the sweep compiles
a handful of times (once per array shape and method bank) -- appends one row per cell,
prints a one-screen summary and writes the figures (``vccc_jax.plotting``).

Interrupt it at any point (Ctrl-C, SIGKILL) and run the same command again: finished cells
are kept, a group with missing cells is recomputed in full (same program, same keys, so
its numbers are bit-identical to an uninterrupted run) and only the missing rows are
appended. Everything runs in float64 (``jax.enable_x64``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.sweeps import grid as grid_mod
from vccc_jax.sweeps.progress import Progress, format_seconds
from vccc_jax.sweeps.store import (
    ResultStore, StoreLockedError, canonical_json, cell_id, provenance, table_rows,
)
from vccc_jax.tabular import critic, history
from vccc_jax.tabular import mdp as mdp_mod

MAP_BATCH = 32  # elements per vmapped chunk inside lax.map (bounds memory)


# ----------------------------------------------------------------------------- inputs


def _stable_int(text: str) -> int:
    """A 28-bit integer from a string (for jax.random.fold_in), stable across runs."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:7], 16)


def make_family(family: dict, num_mdps: int, seed: int, hist_cfg: dict):
    """(mdps [num_mdps], History [num_mdps]) for a family config; deterministic in its inputs."""
    return _make_family(canonical_json(family), num_mdps, seed, canonical_json(hist_cfg))


@lru_cache(maxsize=16)
def _make_family(family_json: str, num_mdps: int, seed: int, hist_json: str):
    fam = json.loads(family_json)
    hcfg = history.HistoryConfig(**json.loads(hist_json))
    key = jax.random.fold_in(jax.random.PRNGKey(seed), _stable_int(family_json))
    k_mdp, k_pol = jax.random.split(key)
    kind = fam["kind"]
    opts = {k: v for k, v in fam.items() if k not in ("name", "kind")}
    try:
        # One jitted call rather than many eager ops (each eager op compiles on first use).
        if kind == "garnet":
            mdps = jax.jit(lambda k: mdp_mod.garnet_mdp(k, num_mdps, **opts))(k_mdp)
        elif kind == "random":
            mdps = jax.jit(lambda k: mdp_mod.random_mdp(k, num_mdps, **opts))(k_mdp)
        else:  # chain: deterministic; the MDPs differ only in pi_0
            one = mdp_mod.chain_mdp(**opts)
            mdps = jax.tree_util.tree_map(
                lambda x: jnp.broadcast_to(x, (num_mdps,) + jnp.shape(x)), one
            )
    except TypeError as e:
        raise ValueError(f"family {fam['name']!r}: bad options for kind {kind!r}: {e}") from e
    logits0 = history.initial_logits(
        k_pol, num_mdps, mdps.num_states, mdps.num_actions, hcfg.init_scale
    )
    return mdps, _history_fn(hcfg)(mdps, logits0)


@lru_cache(maxsize=16)
def _history_fn(hcfg: history.HistoryConfig):
    return jax.jit(jax.vmap(lambda m, th: history.policy_history(m, th, hcfg)),
                   compiler_options=critic.COMPILER_OPTIONS)


def _element_keys(seed: int, key_material):
    """Key of element (cell c, MDP i) = fold_in(fold_in(PRNGKey(seed), hash(cell id)), i),
    from ``key_material`` [E, 2] = (hash(cell id), i): independent of which other cells
    share the batch. Runs inside the compiled group program. [E, 2]"""
    base = jax.random.PRNGKey(seed)
    return jax.vmap(
        lambda km: jax.random.fold_in(jax.random.fold_in(base, km[0]), km[1])
    )(key_material)


def group_inputs(group: grid_mod.Group, cfg: dict) -> critic.CellInputs:
    """Batched host (numpy) inputs of a group: element e = cell_index * num_mdps + mdp_index.

    ``key`` holds key material (hash of the cell id, MDP index) [E, 2] uint32; the compiled
    program turns it into PRNG keys (:func:`_element_keys`). Built with numpy so that no
    eager JAX op is compiled per group shape.
    """
    n = cfg["num_mdps"]
    mdps, hist = make_family(group.family, n, cfg["seed"], cfg["history"])
    V = hist.log_probs.shape[1]
    cells = [c for _, c in group.cells]
    C = len(cells)
    weights = np.stack([history.version_weights(c["law"], c["mean_lag"], V) for c in cells])
    clips = np.array([np.inf if c["clip"] is None else c["clip"] for c in cells])
    material = np.stack([
        np.repeat(np.array([_stable_int(cid) for cid, _ in group.cells], np.uint32), n),
        np.tile(np.arange(n, dtype=np.uint32), C),
    ], axis=1)

    def tile(x):  # [n, ...] -> [C * n, ...]
        x = np.asarray(x)
        return np.tile(x, (C,) + (1,) * (x.ndim - 1))

    def repeat(x):  # [C, ...] -> [C * n, ...]
        return np.repeat(np.asarray(x), n, axis=0)

    return critic.CellInputs(
        mdp=jax.tree_util.tree_map(tile, mdps),
        log_probs=tile(hist.log_probs), values=tile(hist.values),
        visitation=tile(hist.visitation), weights=repeat(weights), clip=repeat(clips),
        key=material,
    )


# ------------------------------------------------------------------------- evaluation

_COMPILED: dict = {}


def bank_of(method: str, cfg: dict) -> tuple[tuple, tuple]:
    """(method names, their options) compiled together with ``method``.

    One-step methods that agree on ``uses_clip`` share one program (the method is a traced
    index, ``critic.resolve_bank``); a multi-step method is compiled on its own.
    """
    spec = critic.METHODS[method]

    def key(m):
        s = critic.METHODS[m]
        return (m,) if s.multi_step else ("one-step", s.uses_clip)

    names = tuple(m for m in cfg["grid"]["methods"] if key(m) == key(method))
    opts = tuple(critic.METHODS[m].options(cfg["methods"].get(m, {})) for m in names)
    assert method in names and spec is critic.METHODS[method]
    return names, opts


def _bank_size(names: tuple, cfg: dict) -> int:
    """Elements of the largest group of a bank: smaller groups are padded to it, so every
    group of the bank has the same shapes and reuses one compiled program."""
    grid = cfg["grid"]
    n_clips = lambda m: len(grid["method_clips"].get(m, grid["clips"])) if critic.METHODS[m].uses_clip else 1  # noqa: E731
    return max(n_clips(m) for m in names) * len(grid["laws"]) * len(grid["mean_lags"]) * cfg["num_mdps"]


def _chunk(n: int) -> int:
    """lax.map chunk: the largest divisor of n up to MAP_BATCH (no remainder program)."""
    best = max(d for d in range(1, min(n, MAP_BATCH) + 1) if n % d == 0)
    return best if best >= 8 or n <= MAP_BATCH else MAP_BATCH


def _compiled(names: tuple, options: tuple, train_cfg: dict, seed: int, xs: critic.CellInputs):
    """AOT-compiled bank evaluator ``f(index, xs)``, cached by (bank, options, training,
    seed, input shapes). Returns (compiled, compile seconds; 0 on a cache hit)."""
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype)), xs)
    key = (names, canonical_json(list(options)), canonical_json(train_cfg), seed, str(shapes))
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    specs = tuple(critic.METHODS[m] for m in names)
    tcfg = critic.TrainConfig(**train_cfg)
    E = xs.clip.shape[0]

    def run(index, xs):
        method = critic.resolve_bank(specs, options, index)
        xs = xs._replace(key=_element_keys(seed, xs.key))
        return jax.lax.map(lambda x: critic.evaluate(method, None, tcfg, x), xs,
                           batch_size=_chunk(E))

    t0 = time.perf_counter()
    compiled = jax.jit(run).lower(jnp.int32(0), xs).compile(critic.COMPILER_OPTIONS)
    _COMPILED[key] = compiled
    return compiled, time.perf_counter() - t0


def evaluate_group(group: grid_mod.Group, cfg: dict) -> tuple[list[dict], dict]:
    """Metrics of every cell of a group (list aligned with group.cells) and timings."""
    t0 = time.perf_counter()
    xs = group_inputs(group, cfg)
    names, opts = bank_of(group.method, cfg)
    E = xs.clip.shape[0]
    size = _bank_size(names, cfg)
    if size > E:  # pad with copies of the first element; their outputs are dropped
        xs = jax.tree_util.tree_map(
            lambda x: np.concatenate([x, np.repeat(x[:1], size - E, axis=0)]), xs)
    fn, compile_s = _compiled(names, opts, cfg["train"], cfg["seed"], xs)
    t1 = time.perf_counter()
    out = jax.tree_util.tree_map(lambda v: np.asarray(v)[:E],
                                 fn(jnp.int32(names.index(group.method)), xs))
    run_s = time.perf_counter() - t1
    n = cfg["num_mdps"]
    C = len(group.cells)
    out = {k: v.reshape((C, n) + v.shape[1:]) for k, v in out.items()}
    mdps, hist = make_family(group.family, n, cfg["seed"], cfg["history"])
    kl = np.asarray(hist.kl)
    metrics = [cell_metrics({k: v[j] for k, v in out.items()}, cell, kl) for j, (_, cell) in
               enumerate(group.cells)]
    timings = {
        "group": group.key, "bank": "+".join(names), "group_cells": C,
        "compile_s": round(compile_s, 4), "run_s": round(run_s, 4),
        "total_s": round(time.perf_counter() - t0, 4),
    }
    return metrics, timings


SCALARS = ("fp_err_max", "fp_err_rms", "target_var", "unidentified", "ess", "clip_rate",
           "tc_err_rms", "tc_err_max", "tc_err_to_fp", "tc_target_var")


def cell_metrics(out: dict, cell: dict, kl: np.ndarray) -> dict:
    """Row metrics from one cell's per-MDP outputs (arrays with a leading [num_mdps] axis).

    Scalars: the mean over MDPs, plus ``<name>_seeds`` (per MDP) and ``<name>_se`` (standard
    error). ``fp_err_max_worst``: the largest fixed-point error over MDPs. By-version
    diagnostics are stored by lag (index = lag) as MDP means. Curves are MDP means.
    """
    m: dict = {}
    n = next(iter(out.values())).shape[0]
    for name in SCALARS:
        if name not in out:
            continue
        v = out[name].astype(np.float64)
        m[name] = float(v.mean())
        m[name + "_seeds"] = v.tolist()
        m[name + "_se"] = float(v.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    m["fp_err_max_worst"] = float(out["fp_err_max"].max())
    m["ess_by_lag"] = out["ess_by_version"].mean(0)[::-1].tolist()
    m["clip_rate_by_lag"] = out["clip_by_version"].mean(0)[::-1].tolist()
    V = out["ess_by_version"].shape[-1]
    w = history.lag_weights(cell["law"], cell["mean_lag"], V - 1)
    m["lag_weights"] = w.tolist()
    m["mean_lag_actual"] = history.lag_mean(w)
    m["history_kl_mean"] = float(kl.mean()) if kl.size else 0.0
    m["history_kl_by_step"] = kl.mean(0).tolist()  # E_{d^{pi_i}} KL(pi_i || pi_{i-1}), i = 1..K
    if "tc_curve_rms" in out:
        m["tc_updates"] = critic.TrainConfig(**cell["train"]).checkpoints().tolist()
        m["tc_curve_rms"] = out["tc_curve_rms"].mean(0).tolist()
        m["tc_curve_var"] = out["tc_curve_var"].mean(0).tolist()
    return m


# ------------------------------------------------------------------------------ sweep


def run_sweep(
    cfg: dict,
    results_dir: str | Path,
    *,
    progress: bool = True,
    stream=None,
    wait_for_lock: bool = False,
) -> tuple[Path, list[dict]]:
    """Run (or resume) a validated sweep config; returns (store path, the grid's rows).

    ``wait_for_lock``: if another process is running the same sweep into the same store,
    wait for it to finish (and then only compute what is still missing) instead of failing.
    """
    stream = sys.stderr if stream is None else stream
    groups = grid_mod.expand(cfg)
    total = grid_mod.num_cells(groups)
    path = Path(results_dir) / f"{cfg['name']}.jsonl"
    prov = provenance()
    with jax.enable_x64(True), ResultStore(path, wait=wait_for_lock) as store:
        done = sum(store.has(cid) for g in groups for cid, _ in g.cells)
        bar = Progress(total, done=done, stream=stream, tty=None if progress else False,
                       min_interval=5.0 if progress else float("inf"))
        for g in groups:
            missing = [(cid, c) for cid, c in g.cells if not store.has(cid)]
            if not missing:
                continue
            bar.set_note(g.key)
            metrics, timings = evaluate_group(g, cfg)
            per_cell = timings["total_s"] / len(g.cells)
            for (cid, cell), m in zip(g.cells, metrics):
                if store.has(cid):
                    continue
                meta = dict(prov, timings=dict(timings, cell_s=round(per_cell, 4)))
                with _signals_deferred():
                    store.append({"id": cid, "cell": cell, "metrics": m, "meta": meta})
                bar.advance(1)
        bar.close()
        rows = [store.row(cid) for g in groups for cid, _ in g.cells if store.has(cid)]
    return path, rows


class _signals_deferred:
    """Hold SIGINT/SIGTERM while one row is written, so Ctrl-C lands between rows."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        try:
            self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        except (AttributeError, ValueError, OSError):
            self._old = None

    def __exit__(self, *exc):
        if self._old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


def run_async_ac_sweep(
    cfg: dict, results_dir: str | Path, *, progress: bool = True, stream=None
) -> tuple[Path, list[dict]]:
    """Run (or resume) an asynchronous actor-critic grid (``"kind": "async_ac"`` configs).

    One program per mode (expected / sampled updates) computes all of that mode's cells;
    a mode with any missing cell is recomputed with the same keys (results are identical)
    and only its missing rows are appended, so an interrupted sweep resumes at mode
    granularity.
    """
    from vccc_jax.tabular import async_ac

    stream = sys.stderr if stream is None else stream
    cells = async_ac.grid_cells(cfg)
    ids = [cell_id(dict(c, grid=cfg)) for c in cells]  # a cell's id covers the whole config
    path = Path(results_dir) / f"{cfg['name']}.jsonl"
    prov = provenance()
    with ResultStore(path) as store:
        bar = Progress(len(cells), done=sum(map(store.has, ids)), stream=stream,
                       tty=None if progress else False,
                       min_interval=5.0 if progress else float("inf"))
        for mode in cfg["modes"]:
            if all(store.has(i) for i, c in zip(ids, cells) if c["mode"] == mode):
                continue
            bar.set_note(mode)
            t_mode = time.perf_counter()
            rows = async_ac.run_grid(dict(cfg, modes=[mode]), stream=stream)
            per_cell = (time.perf_counter() - t_mode) / len(rows)
            for row in rows:
                cell = dict(row["cell"], grid=cfg)
                cid = cell_id(cell)
                if store.has(cid):
                    continue
                meta = dict(prov, timings={"cell_s": round(per_cell, 4)})
                with _signals_deferred():
                    store.append({**row, "id": cid, "cell": cell, "meta": meta})
                bar.advance(1)
        bar.close()
        rows = [store.row(i) for i in ids if store.has(i)]
    return path, rows


def _main_async_ac(cfg: dict, args, t0: float) -> int:
    from vccc_jax.tabular import async_ac

    path, rows = run_async_ac_sweep(cfg, args.results, progress=not args.no_progress)
    print(async_ac.summary_table(rows))
    print()
    print(async_ac.ratio_table(rows))
    wall = time.perf_counter() - t0
    print(f"\n{len(rows)}/{len(async_ac.grid_cells(cfg))} cells in {path} "
          f"({format_seconds(wall)} wall this run)")
    if not args.no_figures and rows:
        from vccc_jax import plotting  # top layer; imported late (matplotlib is slow to load)

        out = Path(args.figures) / cfg["name"]
        paths = []
        for mode in cfg["modes"]:
            for kind in cfg["actor_kinds"]:
                fig = plotting.fig_async_ac(rows, mode, kind)
                paths += plotting.save(fig, out / f"{mode}_{kind}")
        print(f"figures: {len(paths)} files in {out}")
    return 0


# ---------------------------------------------------------------------------- summary


def _fmt(x: Optional[float]) -> str:
    if x is None or not np.isfinite(x):
        return "     -"
    if x == 0:
        return "     0"
    if abs(x) < 1e-3 or abs(x) >= 1e4:
        return f"{x:6.0e}"
    return f"{x:6.3f}"


def summary_table(rows: list[dict], cfg: dict) -> str:
    """One screen: per family, fixed-point RMS error to V^{pi_K} by mean lag (one law, one
    clip for clipped methods), then the trained critic's error and the target variance at
    the largest lag."""
    grid = cfg["grid"]
    law = "geometric" if "geometric" in grid["laws"] else grid["laws"][0]
    clips = sorted(grid["clips"])
    clip = clips[len(clips) // 2] if clips else None
    lags = sorted(float(m) for m in grid["mean_lags"])
    top = lags[-1]
    idx = {}
    for r in table_rows(rows):
        c = r["cell"]
        idx[(c["family"]["name"], c["method"], c["law"], c["mean_lag"], c["clip"])] = r["metrics"]
    lines = [
        f"sweep {cfg['name']}: RMS error |V - V^pi_K| (d^pi_K-weighted) of the exact fixed point",
        f"by mean lag; law={law}; clipped methods at c={clip:g}; mean over {cfg['num_mdps']} MDPs.",
        "trained = stochastically trained critic's error; targetVar = exact target variance.",
    ] if clip is not None else [
        f"sweep {cfg['name']}: RMS error |V - V^pi_K| (d^pi_K-weighted) of the exact fixed point",
        f"by mean lag; law={law}; mean over {cfg['num_mdps']} MDPs",
    ]
    for fam in cfg["families"]:
        kl = next((r["metrics"].get("history_kl_by_step") for r in rows
                   if r["cell"]["family"]["name"] == fam["name"]), None)
        lines.append("")
        if kl:
            h = cfg["history"]
            lines += [f"{fam['name']}: pi_0..pi_{len(kl)} by {h['algorithm'].upper()} steps of "
                      f"{h['step_size']:g}; KL(pi_i || pi_i-1) per step: first {kl[0]:.3g}, "
                      f"mean {np.mean(kl):.3g}, last {kl[-1]:.3g}"]
        head = f"{fam['name']:<23}" + "".join(f" lag={m:<4g}" for m in lags)
        head += f" | trained@{top:g} targetVar@{top:g}"
        lines += [head, "-" * len(head)]
        for method in grid["methods"]:
            c = None
            if critic.METHODS[method].uses_clip:
                own = sorted(grid["method_clips"].get(method, clips))
                c = clip if clip in own else own[len(own) // 2]
            cells = [idx.get((fam["name"], method, law, m, c)) for m in lags]
            label = method if c is None else f"{method} c={c:g}"
            line = f"{label:<23}" + "".join(
                f" {_fmt(x['fp_err_rms']) if x else '     ?':>8}" for x in cells
            )
            last = cells[-1] or {}
            line += f" | {_fmt(last.get('tc_err_rms')):>10} {_fmt(last.get('target_var')):>10}"
            lines.append(line)
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vccc sweep",
        description="Staleness x clipping sweep on tabular MDPs (resumable: rerun the same "
        "command after an interruption).",
    )
    p.add_argument("--config", default=None,
                   help=f"sweep config .toml/.json (default: experiments/{grid_mod.DEFAULT_CONFIG_NAME})")
    p.add_argument("--results", default="results", help="result store directory (default: results)")
    p.add_argument("--figures", default="figures", help="figure directory (default: figures)")
    p.add_argument("--no-figures", action="store_true", help="skip writing figures")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    cfg_path = Path(args.config) if args.config else grid_mod.default_config_path()
    try:
        cfg = grid_mod.read_config(cfg_path)
        if cfg.get("kind") == "async_ac":
            from vccc_jax.tabular import async_ac

            cfg, body = async_ac.validate_grid_config(cfg), _main_async_ac
        else:
            cfg, body = grid_mod.validate_config(cfg), _main
    except (FileNotFoundError, ValueError) as e:
        print(f"vccc sweep: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        return body(cfg, args, t0)
    except KeyboardInterrupt:
        # The store is closed (every finished row is fsynced). Exit at once: interpreter
        # teardown after an XLA compile was interrupted can crash (seen: SIGSEGV at exit).
        print("\nvccc sweep: interrupted; finished cells are saved -- rerun the same command "
              "to resume.", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    except StoreLockedError as e:
        print(f"vccc sweep: {e}", file=sys.stderr)
        return 3


def _main(cfg: dict, args, t0: float) -> int:
    path, rows = run_sweep(cfg, args.results, progress=not args.no_progress)
    wall = time.perf_counter() - t0
    print(summary_table(rows, cfg))
    total = grid_mod.num_cells(grid_mod.expand(cfg))
    print(f"\n{len(rows)}/{total} cells in {path} ({format_seconds(wall)} wall this run)")
    if not args.no_figures and len(rows):
        from vccc_jax import plotting  # top layer; imported late (matplotlib is slow to load)

        out = Path(args.figures) / cfg["name"]
        paths = plotting.make_figures(rows, out)
        print(f"figures: {len(paths)} files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
