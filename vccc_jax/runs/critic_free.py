"""The GRPO vs PS-PPO grid (issue 14; kind ``critic_free``, ``experiments/ps_ppo.toml``).

One cell = one training run of ``train.critic_free`` (cutoff law x lag law x seed, the rest
from ``[base]``). Runs go one after the other into the resumable store
``<results>/<name>.jsonl`` (``runs.store``: one fsynced line per finished run, keyed by the
cell's content, so an interrupted grid resumes where it stopped and never duplicates a row).
Runs sharing (law, lag) share one compiled trainer.

Each row's ``metrics``: ``history`` (one dict per update: return, exact_return every
``eval_every`` updates else None, kept_fraction, packed_rows, compute_rows, ...), the
trainer's static row budget ``capacity`` and the compiled learner's cost
(``train.critic_free.learner_cost``: temp/argument/output bytes, median learn seconds).
:func:`summarize` / :func:`format_table` give the README table (CIs over seeds).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.analysis.stats import mean_ci
from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.schema import Experiment, as_dict

_RUN_KEYS = ("updates", "eval_every", "cost_repeats")


def cells(exp: Experiment) -> list[dict]:
    """The grid's cells in run order (lag, then law, then seed): base fields + law/lag/seed."""
    base = as_dict(exp.base)
    return [dict(base, law=law, lag=lag, seed=seed)
            for lag in exp.grid.lags for law in exp.grid.laws for seed in exp.grid.seeds]


def validate(exp: Experiment) -> list[dict]:
    """Cells after checking laws, lags and sizes (``ValueError`` naming the bad value)."""
    from vccc_jax.envs.lag import LagLaw
    from vccc_jax.estimators.related.ps_ppo import CutoffLaw

    b = exp.base
    for key in ("groups", "group_size", "hidden", "updates", "eval_every", "cost_repeats"):
        if getattr(b, key) < (0 if key == "cost_repeats" else 1):
            raise ValueError(f"{exp.path}: base.{key} must be >= 1, got {getattr(b, key)}")
    for law in exp.grid.laws:
        try:
            CutoffLaw.parse(law)
        except ValueError as e:
            raise ValueError(f"{exp.path}: grid.laws: {law!r}: {e}") from None
    for lag in exp.grid.lags:
        try:
            LagLaw.parse(lag)
        except ValueError as e:
            raise ValueError(f"{exp.path}: grid.lags: {lag!r}: {e}") from None
    return cells(exp)


def cf_config(cell: dict):
    """The ``train.critic_free.CFConfig`` of a cell."""
    from vccc_jax.train.critic_free import CFConfig

    return CFConfig(**{k: v for k, v in cell.items() if k not in _RUN_KEYS})


@functools.lru_cache(maxsize=8)
def _trainer(cfg):
    """One compiled trainer per config with seed 0 (the seed only enters through ``train``)."""
    from vccc_jax.train.critic_free import CriticFree

    return CriticFree(cfg)


def run_cell(cell: dict) -> dict:
    """Train one cell -> its metrics (history, capacity, learner cost)."""
    import jax

    from vccc_jax.train import critic_free as cf

    cfg = cf_config(cell)
    tr = _trainer(cfg.replace(seed=0))
    state, hist = cf.train(cfg, cell["updates"], trainer=tr, eval_every=cell["eval_every"])
    cost = {}
    if cell["cost_repeats"] > 0:  # 0: skip (it compiles the learner once more)
        key = jax.random.PRNGKey(100 + cfg.seed)
        cost = cf.learner_cost(tr, state, tr.rollout(state, key), key, repeats=cell["cost_repeats"])
    return {"history": hist, "capacity": tr.capacity, **cost}


def run_grid(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
             on_cell: Optional[Callable[[int, int, dict], None]] = None) -> tuple[Path, list[dict]]:
    """Run every missing cell into ``<results_dir>/<exp.name>.jsonl`` -> (path, rows in cell
    order). ``on_cell(i, n, cell)`` is called before a cell is computed."""
    path = Path(results_dir) / f"{exp.name}.jsonl"

    def note(cell: dict, metrics: dict) -> str:
        final = _last_exact(metrics["history"])
        return f"{cell['law']} {cell['lag']} seed {cell['seed']}: J {final:.3f}"

    rows = run_cells(path, validate(exp), run_cell, label="runs", note=note,
                     progress=progress, min_interval=10.0, on_cell=on_cell)
    return path, rows


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
