"""Run (or resume) a tabular staleness sweep: every group one compiled, vmapped program.

What it does: expands the config into cells (``runs.tabular_config``), skips every cell
already in ``<results>/<name>.jsonl`` (``runs.store``), evaluates the rest group by group --
each (family, method) group is one jitted, vmapped program over (law, lag, clip) x MDPs,
and one-step methods share a program (the method is a traced index), so the sweep compiles
a handful of times (once per array shape and method bank) -- and appends one row per cell.

Interrupt it at any point (Ctrl-C, SIGKILL) and run it again: finished cells are kept, a
group with missing cells is recomputed in full (same program, same keys, so its numbers are
bit-identical to an uninterrupted run) and only the missing rows are appended. Everything
runs in float64 (``jax.enable_x64``).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from functools import lru_cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.runs.distributed import agree, is_main, open_store
from vccc_jax.runs.progress import Progress
from vccc_jax.runs.provenance import provenance
from vccc_jax.runs.store import canonical_json, signals_deferred
from vccc_jax.runs.tabular_config import Group, expand
from vccc_jax.tabular import critic, history
from vccc_jax.tabular import mdp as mdp_mod
from vccc_jax.tabular.critic_sgd import CriticSGDConfig

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


def group_inputs(group: Group, cfg: dict) -> critic.CellInputs:
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


def _data_size(mesh) -> int:
    return 1 if mesh is None else int(mesh.shape["data"])


def _padded_size(size: int, data: int) -> int:
    """Elements after padding for ``data`` devices: every device gets a whole number of
    ``_chunk(size)`` chunks, so each element runs in a vmapped chunk of the same width as on
    one device (same program per chunk -> the same bits)."""
    if data == 1:
        return size
    per = data * _chunk(size)
    return -(-size // per) * per


def _compiled(names: tuple, options: tuple, train_cfg: dict, seed: int, xs: critic.CellInputs,
              mesh=None, chunk: int | None = None):
    """AOT-compiled bank evaluator ``f(index, xs)``, cached by (bank, options, training,
    seed, input shapes, mesh). With a mesh, ``xs`` is split over its "data" axis
    (``jax.shard_map``: every device maps its own slice, no collectives); ``chunk`` is the
    vmapped width (default ``_chunk`` of the batch). Returns (compiled, compile seconds;
    0 on a cache hit)."""
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype)), xs)
    E = xs.clip.shape[0]
    chunk = _chunk(E) if chunk is None else chunk
    mesh_key = None if mesh is None else (tuple(mesh.shape.items()),
                                          tuple(d.id for d in mesh.devices.flat))
    key = (names, canonical_json(list(options)), canonical_json(train_cfg), seed, str(shapes),
           mesh_key, chunk)
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    specs = tuple(critic.METHODS[m] for m in names)
    tcfg = CriticSGDConfig(**train_cfg)

    def run(index, xs):
        method = critic.resolve_bank(specs, options, index)
        xs = xs._replace(key=_element_keys(seed, xs.key))
        return jax.lax.map(lambda x: critic.evaluate(method, None, tcfg, x), xs,
                           batch_size=chunk)

    t0 = time.perf_counter()
    if mesh is None:
        compiled = jax.jit(run).lower(jnp.int32(0), xs).compile(critic.COMPILER_OPTIONS)
    else:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        split = NamedSharding(mesh, P("data"))
        fn = jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(P(), P("data")),
                                   out_specs=P("data"), check_vma=False))
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=split), xs)
        index = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
        compiled = fn.lower(index, abstract).compile(critic.COMPILER_OPTIONS)
    _COMPILED[key] = compiled
    return compiled, time.perf_counter() - t0


def _run_sharded(fn, index: int, xs, mesh):
    """Place host inputs over "data" (every process holds all of them and puts its own
    slices), run, and bring all outputs back to every process as numpy."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from vccc_jax.train.sharding import gather_to_host

    split = NamedSharding(mesh, P("data"))
    put = lambda x: jax.make_array_from_callback(x.shape, split, lambda i: x[i])  # noqa: E731
    dev_xs = jax.tree_util.tree_map(put, xs)
    dev_index = jax.make_array_from_callback((), NamedSharding(mesh, P()),
                                             lambda i: np.int32(index))
    return gather_to_host(fn(dev_index, dev_xs))


def evaluate_group(group: Group, cfg: dict, mesh=None) -> tuple[list[dict], dict]:
    """Metrics of every cell of a group (list aligned with group.cells) and timings.

    ``mesh``: split the group's batch over the mesh's "data" axis (padded to whole chunks
    per device; the padding's outputs are dropped). The rows equal the one-device rows."""
    t0 = time.perf_counter()
    xs = group_inputs(group, cfg)
    names, opts = bank_of(group.method, cfg)
    E = xs.clip.shape[0]
    size = _bank_size(names, cfg)
    padded = _padded_size(size, _data_size(mesh))
    if padded > E:  # pad with copies of the first element; their outputs are dropped
        xs = jax.tree_util.tree_map(
            lambda x: np.concatenate([x, np.repeat(x[:1], padded - E, axis=0)]), xs)
    index = names.index(group.method)
    t1 = time.perf_counter()
    if mesh is None:
        fn, compile_s = _compiled(names, opts, cfg["train"], cfg["seed"], xs)
        t1 = time.perf_counter()
        res = fn(jnp.int32(index), xs)
    else:
        fn, compile_s = _compiled(names, opts, cfg["train"], cfg["seed"], xs, mesh,
                                  chunk=_chunk(size))
        t1 = time.perf_counter()
        res = _run_sharded(fn, index, xs, mesh)
    out = jax.tree_util.tree_map(lambda v: np.asarray(v)[:E], res)
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
    diagnostics are stored by lag (index = lag) as MDP means. Curves are MDP means, plus
    ``tc_curve_rms_seeds`` (the RMS-error curve per MDP).
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
        m["tc_updates"] = CriticSGDConfig(**cell["train"]).checkpoints().tolist()
        m["tc_curve_rms"] = out["tc_curve_rms"].mean(0).tolist()
        m["tc_curve_rms_seeds"] = out["tc_curve_rms"].tolist()  # [MDP][checkpoint]: intervals
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
    mesh=None,
) -> tuple[Path, list[dict]]:
    """Run (or resume) a validated sweep config; returns (store path, the grid's rows).

    ``wait_for_lock``: if another process is running the same sweep into the same store,
    wait for it to finish (and then only compute what is still missing) instead of failing.
    ``mesh``: a ``train.sharding`` mesh; every group's batch is split over its "data" axis
    (issue 10), the rows are those of one device. In a multi-process run every process
    calls this; process 0 writes the store (``runs.distributed``).
    """
    stream = sys.stderr if stream is None else stream
    groups = expand(cfg)
    path = Path(results_dir) / f"{cfg['name']}.jsonl"
    prov = provenance()
    if mesh is not None and mesh.devices.size == 1 and jax.process_count() == 1:
        mesh = None  # one device: the plain program
    main = is_main()
    with jax.enable_x64(True), open_store(path, wait=wait_for_lock) as store:
        # a group (one compiled program) is the unit of work a shard owns, by its first cell
        mine = [store.owns(g.cells[0][0]) for g in groups]
        total = sum(len(g.cells) for g, m in zip(groups, mine) if m)
        done = sum(store.has(cid) for g, m in zip(groups, mine) if m for cid, _ in g.cells)
        show = progress and main
        bar = Progress(total, done=done, stream=stream, show=show)
        todo = agree([m and any(not store.has(cid) for cid, _ in g.cells)
                      for g, m in zip(groups, mine)])
        for g, run in zip(groups, todo):
            if not run:
                continue
            bar.set_note(g.key)
            metrics, timings = evaluate_group(g, cfg, mesh)
            per_cell = timings["total_s"] / len(g.cells)
            added = 0
            for (cid, cell), m in zip(g.cells, metrics):
                if store.has(cid):
                    continue
                meta = dict(prov, timings=dict(timings, cell_s=round(per_cell, 4)))
                with signals_deferred():
                    store.append({"id": cid, "cell": cell, "metrics": m, "meta": meta})
                added += 1
            # ETA from compute only: compile and one-off setup (inputs, the family's policy
            # history programs) are total_s - run_s
            bar.advance(added, compile_s=timings["total_s"] - timings["run_s"])
        bar.close()
        rows = [store.row(cid) for g in groups for cid, _ in g.cells if store.has(cid)]
    return path, rows
