"""The GRPO vs PS-PPO grid (issue 14; kind ``critic_free``, ``experiments/ps_ppo.toml``).

One cell = one training run of ``train.critic_free`` (cutoff law x lag law x seed, the rest
from ``[base]``). Runs go one after the other into the resumable store
``<results>/<name>.jsonl`` (``runs.store``: one fsynced line per finished run, keyed by the
cell's content, so an interrupted grid resumes where it stopped and never duplicates a row).
Runs sharing (law, lag) share one compiled trainer, and laws share its rollout / evaluate.
``vccc sweep --config`` and ``vccc train --config`` run such a grid; ``vccc train
--critic-free LAW`` runs a one-law grid built from flags (:func:`from_flags`).

Each row's ``metrics``: ``history`` (one dict per update: return, exact_return every
``eval_every`` updates else None, kept_fraction, packed_rows, compute_rows, ...), the
trainer's static row budget ``capacity`` and the compiled learner's cost
(``train.critic_free.learner_cost``: temp/argument/output bytes, median learn seconds).
:func:`summarize` / :func:`format_table` give the README table (CIs over seeds).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.schema import Experiment, as_dict

_RUN_KEYS = ("updates", "eval_every", "cost_repeats")


def cells(exp: Experiment) -> list[dict]:
    """The grid's cells in run order (lag, then law, then seed): base fields + law/lag/seed."""
    base = as_dict(exp.base)
    return [dict(base, law=law, lag=lag, seed=seed)
            for lag in exp.grid.lags for law in exp.grid.laws for seed in exp.grid.seeds]


def validate(exp: Experiment) -> list[dict]:
    """Cells after checking laws, lags, sizes and the env (``ValueError`` naming the bad value:
    ``<path>: base.<key>``, or the ``vccc train`` flag of an experiment built from flags)."""
    import jax

    from vccc_jax.envs.lag import LagLaw
    from vccc_jax.envs.token_env import make_token_env
    from vccc_jax.estimators.related.ps_ppo import CutoffLaw

    b, name = exp.base, functools.partial(_name, exp)
    for key in ("groups", "group_size", "hidden", "updates", "eval_every", "cost_repeats"):
        if getattr(b, key) < (0 if key == "cost_repeats" else 1):
            raise ValueError(f"{name(key)} must be >= {0 if key == 'cost_repeats' else 1}, "
                             f"got {getattr(b, key)}")
    for key in ("slack", "lr", "clip_eps"):
        if not getattr(b, key) > 0:
            raise ValueError(f"{name(key)} must be > 0, got {getattr(b, key)}")
    for law in exp.grid.laws:
        try:
            CutoffLaw.parse(law)
        except ValueError as e:
            raise ValueError(f"{name('laws', 'grid')}: {law!r}: {e}") from None
    for lag in exp.grid.lags:
        try:
            LagLaw.parse(lag)
        except ValueError as e:
            raise ValueError(f"{name('lags', 'grid')}: {lag!r}: {e}") from None
    if not b.env.startswith("token:"):
        raise ValueError(f"{name('env')}: critic-free runs (GRPO / PS-PPO) need a token env "
                         f"(e.g. token:V=16,H=12,Q=6,C=4,P=4), got {b.env!r}")
    try:  # traced only: the spec's checks without compiling the task's construction
        jax.eval_shape(lambda: make_token_env(b.env)[1])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name('env')}: {b.env!r}: {e}") from None
    return cells(exp)


def cf_config(cell: dict):
    """The ``train.critic_free.CFConfig`` of a cell."""
    from vccc_jax.train.critic_free import CFConfig

    return CFConfig(**{k: v for k, v in cell.items() if k not in _RUN_KEYS})


def _trainer(cfg, mesh=None):
    """One compiled trainer per config with seed 0 (the seed only enters through ``train``)
    and mesh; configs that differ only in learner fields (law, slack, ...) share one compiled
    init / rollout / evaluate (``CFConfig.sampling``), so a grid over laws compiles those once."""
    return _cached_trainer(cfg, mesh)


@functools.lru_cache(maxsize=16)
def _cached_trainer(cfg, mesh):
    from vccc_jax.train.critic_free import CriticFree

    ref = cfg.sampling()
    return CriticFree(cfg, like=None if ref == cfg else _cached_trainer(ref, mesh), mesh=mesh)


def run_cell(cell: dict, on_update: Optional[Callable[[int, int, dict], None]] = None,
             mesh=None) -> dict:
    """Train one cell -> its metrics (history, capacity, learner cost); ``on_update(u, n,
    row)`` after each update (``train.critic_free.train``); ``mesh``: a ``train.sharding``
    mesh (episodes over "data")."""
    import jax

    from vccc_jax.train import critic_free as cf

    cfg = cf_config(cell)
    tr = _trainer(cfg.replace(seed=0), mesh)
    state, hist = cf.train(cfg, cell["updates"], trainer=tr, eval_every=cell["eval_every"],
                           on_update=on_update)
    cost = {}
    if cell["cost_repeats"] > 0:  # 0: skip (it compiles the learner once more)
        key = jax.random.PRNGKey(100 + cfg.seed)
        cost = cf.learner_cost(tr, state, tr.rollout(state, key), key, repeats=cell["cost_repeats"])
    return {"history": hist, "capacity": tr.capacity, **cost}


def run_grid(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
             on_cell: Optional[Callable[[int, int, dict], None]] = None,
             on_update: Optional[Callable[[int, int, dict], None]] = None,
             mesh=None) -> tuple[Path, list[dict]]:
    """Run every missing cell into ``<results_dir>/<exp.name>.jsonl`` -> (path, rows in cell
    order). ``on_cell(i, n, cell)`` is called before a cell is computed, ``on_update(u, n,
    row)`` after each of its updates; ``mesh``: run every cell over a ``train.sharding``
    mesh."""
    path = Path(results_dir) / f"{exp.name}.jsonl"

    def note(cell: dict, metrics: dict) -> str:
        final = _last_exact(metrics["history"])
        return f"{cell['law']} {cell['lag']} seed {cell['seed']}: J {final:.3f}"

    rows = run_cells(path, validate(exp), functools.partial(run_cell, on_update=on_update,
                                                            mesh=mesh),
                     label="runs", note=note,
                     progress=progress, min_interval=10.0, on_cell=on_cell)
    return path, rows


# ------------------------------------------------------------------ vccc train flags

#: ``vccc train --critic-free`` flags of their own: (base field, type, help); the defaults
#: are ``schema_kinds.CriticFreeBase``'s.
FLAGS = (
    ("groups", int, "prompts per update"),
    ("group_size", int, "rollouts per prompt (the GRPO group)"),
    ("updates", int, "optimiser updates per run (one PPO step each)"),
    ("slack", float, "PS-PPO learner row budget = slack x expected kept tokens"),
    ("eval_every", int, "exact return J every N updates (--updates U alone: gcd(U, U // 2, default))"),
    ("cost_repeats", int, "timed learner calls per run for memory / time (0: skip)"),
)
#: TrainConfig flags a critic-free run takes: TrainConfig field -> base field
SHARED = {"env": "env", "actor_lr": "lr", "ppo_epsilon": "clip_eps", "hidden": "hidden"}
#: TrainConfig flags that set the grid: lag -> lags, seed / num_seeds -> seeds
GRID_FLAGS = ("lag", "seed", "num_seeds")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _name(exp: Experiment, key: str, part: str = "base") -> str:
    """How an error names a field: ``<path>: <part>.<key>``, or for an experiment built from
    ``vccc train`` flags (empty path) the flag that sets it."""
    if exp.path:
        return f"{exp.path}: {part}.{key}"
    by_base = {base: f for f, base in SHARED.items()}
    return {"laws": "--critic-free", "lags": "--lag"}.get(key, _flag(by_base.get(key, key)))


def wants(flags: dict, exp: Optional[Experiment]) -> bool:
    """Whether ``vccc train`` runs critic-free: ``--critic-free`` given, a ``critic_free``
    experiment, or one of :data:`FLAGS` set (``flags``: dest -> value of the flags given)."""
    return (flags.get("critic_free") is not None or (exp is not None and exp.kind == "critic_free")
            or any(k in flags for k, _, _ in FLAGS))


def from_flags(flags: dict, exp: Optional[Experiment] = None) -> Experiment:
    """The ``critic_free`` experiment of ``vccc train --critic-free LAW [flags]`` or of a
    ``critic_free`` ``--config`` with flag overrides; ``ValueError`` (one line, naming the
    flag) on a flag it does not use or a bad value.

    ``flags``: dest -> value of the flags given on the command line (besides --config, --out,
    --quiet, --no-figure). ``--critic-free`` sets the laws, ``--lag`` the lags, ``--seed S
    --num-seeds N`` the seeds S..S+N-1; :data:`SHARED` and :data:`FLAGS` override the base.
    Without a config the base is ``schema_kinds.CriticFreeBase`` (``CFConfig``'s defaults),
    the lag fixed:0, seed 0, one seed; results go to ``<out>/critic_free.jsonl``."""
    from vccc_jax.runs.schema_kinds import CriticFreeBase, CriticFreeGrid

    flags = dict(flags)
    law = flags.pop("critic_free", None)
    if exp is not None and exp.kind != "critic_free":
        raise ValueError(f"--critic-free: {exp.path} is a kind {exp.kind!r} experiment (give a "
                         "kind \"critic_free\" --config, or none)")
    if law is None and exp is None:
        given = [_flag(k) for k, _, _ in FLAGS if k in flags]
        raise ValueError(f"{', '.join(given)}: critic-free flags; add --critic-free LAW "
                         "(full | uniform | mixture:EPS | geometric:Q) or a kind "
                         "\"critic_free\" --config")
    if "critic" in flags:
        raise ValueError("--critic-free trains without a critic (group-normalised returns as "
                         "the baseline); drop --critic")
    own = {k for k, _, _ in FLAGS} | set(SHARED) | set(GRID_FLAGS)
    unused = [_flag(k) for k in flags if k not in own]
    if unused:
        raise ValueError(f"critic-free runs do not use {', '.join(unused)} (they take --env "
                         "token:..., --lag, --seed, --num-seeds, --actor-lr, --ppo-epsilon, "
                         f"--hidden, {', '.join(_flag(k) for k, _, _ in FLAGS)}; a rerun "
                         "reuses the finished runs in --out)")
    if "ppo_epsilon" in flags and flags["ppo_epsilon"] is None:
        raise ValueError("--ppo-epsilon: critic-free runs need a clip epsilon > 0, got none")
    if flags.get("num_seeds", 1) < 1:
        raise ValueError(f"--num-seeds must be >= 1, got {flags['num_seeds']}")
    base = exp.base if exp is not None else CriticFreeBase()
    grid = exp.grid if exp is not None else CriticFreeGrid(laws=[law], lags=["fixed:0"], seeds=[0])
    changes = {SHARED.get(k, k): v for k, v in flags.items() if k not in GRID_FLAGS}
    if "updates" in flags and "eval_every" not in flags:  # J at the last and the half update
        u = flags["updates"]
        changes["eval_every"] = math.gcd(u, u // 2, base.eval_every)
    grid_changes = {"laws": [law]} if law is not None else {}
    if "lag" in flags:
        grid_changes["lags"] = [flags["lag"]]
    if "seed" in flags or "num_seeds" in flags:
        seed = flags.get("seed", 0)
        grid_changes["seeds"] = list(range(seed, seed + flags.get("num_seeds", 1)))
    new = Experiment(
        name=exp.name if exp is not None else "critic_free", kind="critic_free",
        base=dataclasses.replace(base, **changes), grid=dataclasses.replace(grid, **grid_changes),
        description=exp.description if exp is not None else "vccc train --critic-free",
        path=exp.path if exp is not None else "")
    validate(new)
    return new


def footer(exp: Experiment, rows: list[dict], path: Path, seconds: float) -> str:
    """``<done>/<cells> runs in <store> (<wall> wall this run)`` under the table."""
    from vccc_jax.runs.progress import format_seconds

    return f"{len(rows)}/{len(cells(exp))} runs in {path} ({format_seconds(seconds)} wall this run)"


# ------------------------------------------------------------------------------ summary


def _ok(v) -> bool:
    return v is not None and v == v  # the store writes NaN as None


def _last_exact(history: list[dict], max_rows: float = np.inf) -> float:
    """The last evaluated exact return among updates with compute_rows <= max_rows."""
    vals = [h["exact_return"] for h in history
            if _ok(h["exact_return"]) and h["compute_rows"] <= max_rows]
    return float(vals[-1]) if vals else float("nan")


def _exact_at(history: list[dict], update: int) -> float:
    vals = [h["exact_return"] for h in history if h["update"] <= update and _ok(h["exact_return"])]
    return float(vals[-1]) if vals else float("nan")


def summarize(rows: list[dict]) -> list[dict]:
    """One dict per (lag, law), in first-seen order: J at the last update and at half the run
    (mean, 95% t half-width over seeds), kept fraction, learner rows / update, learner temp
    KB, median learn ms, and J at equal learner rows = the rows GRPO ("full", same lag) uses
    in half the run (NaN without a GRPO cell)."""
    from vccc_jax.analysis.stats import mean_ci  # scipy: not at import (vccc train's checks)

    groups: dict = {}
    for r in rows:
        groups.setdefault((r["cell"]["lag"], r["cell"]["law"]), []).append(r)
    out = []
    for (lag, law), rs in groups.items():
        n = rs[0]["cell"]["updates"]
        full = groups.get((lag, "full"))
        budget = n // 2 * full[0]["metrics"]["capacity"] if full else None
        j_end = np.array([_last_exact(r["metrics"]["history"]) for r in rs])
        j_half = np.array([_exact_at(r["metrics"]["history"], n // 2) for r in rs])
        j_eq = np.array([_last_exact(r["metrics"]["history"], budget) if budget else np.nan
                         for r in rs])
        (m, h), (mh, hh), (me, he) = (mean_ci(x) if len(x) > 1 else (x.mean(), np.nan)
                                      for x in (j_end, j_half, j_eq))
        hist = [h_ for r in rs for h_ in r["metrics"]["history"]]
        out.append({
            "lag": lag, "law": law, "seeds": len(rs), "updates": n,
            "J_end": float(m), "J_end_ci": float(h), "J_half": float(mh), "J_half_ci": float(hh),
            "J_equal_rows": float(me), "J_equal_rows_ci": float(he),
            "kept_fraction": float(np.mean([h_["kept_fraction"] for h_ in hist])),
            "rows_per_update": int(rs[0]["metrics"]["capacity"]),
            "temp_kb": float(np.mean([r["metrics"].get("temp_bytes", np.nan) for r in rs]) / 1024),
            "learn_ms": float(np.median([r["metrics"].get("learn_seconds", np.nan) for r in rs]) * 1e3),
        })
    return out


def format_table(summary: list[dict]) -> str:
    """The README table (markdown) of :func:`summarize`."""
    if not summary:
        return "(no runs)"
    n = summary[0]["updates"]
    head = (f"| lag | law | J@{n} (95% CI) | J@{n // 2} | kept / live | learner rows / update "
            f"| learner temp KB | learn ms | J at equal learner rows (= {n // 2} GRPO updates) |")
    lines = [head, "|" + "---|" * 9]
    for s in summary:
        law = "full (GRPO)" if s["law"] == "full" else s["law"]
        lines.append(
            f"| {s['lag']} | {law} | {s['J_end']:.3f} ± {s['J_end_ci']:.3f} | {s['J_half']:.3f} "
            f"| {s['kept_fraction']:.2f} | {s['rows_per_update']} | {s['temp_kb']:.0f} "
            f"| {s['learn_ms']:.2f} | {s['J_equal_rows']:.3f} ± {s['J_equal_rows_ci']:.3f} |")
    seeds = sorted({s["seeds"] for s in summary})
    lines.append(f"\n(± = 95% t-interval half-width over {'/'.join(map(str, seeds))} seeds)")
    return "\n".join(lines)
