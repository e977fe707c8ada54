"""RAC against wait-for-slow in wall-clock: exact training coupled to a simulated pipeline
(issue 14; kind ``rac_wallclock``, ``experiments/rac_wallclock.toml``, through
``vccc sweep --config ...`` into the resumable store ``<results>/<name>.jsonl``). Problem
instances as in ``runs.rac`` (MDPs, channel split and initial logits from ``seed``).

The described cluster (``[base.pipeline]``; its channels are the MDP's reward channels,
blocking = fast) is simulated twice per MDP with pipeline seed ``pipeline.seed + m``: as
described (asynchronous; drop and rac train on it) and with the trainer waiting for every
channel (``PipelineConfig.wait_for_slow``; wait trains on it), each for the same budget of
``hours`` simulated hours (so the asynchronous methods make more updates). The trace fixes,
for update K, the versions that generated the consumed tokens and the step at which each
slow reward arrives (``tabular.rac_train.event_schedule``); training is exact expected-update
policy gradient on the logits (``tabular.rac_train.train``), update K ending at the trace's
``update_end[K]``. Metrics per (MDP, clip, mass, method): J(pi_K) and its wall-clock for the
updates that end within the budget, J* (value iteration), the time to reach
J0 + f (J* - J0) for each of ``fractions``, and the lag / delay statistics used.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.rac import (
    channel_kernels,
    check_clips_masses,
    check_problem,
    clip_value,
    group_rows,
    problems,
    stored_float,
)
from vccc_jax.runs.schema import Experiment, as_dict


def pipeline_of(cell_or_base: dict, m: int = 0):
    """The ``pipeline.PipelineConfig`` of MDP m: seed pipeline.seed + m, and enough updates to
    cover ``hours`` of simulated time in any schedule (hours / update_time + 1: no schedule
    finishes updates faster than the trainer's update time)."""
    import math

    from vccc_jax.pipeline import config_from_dict

    table = dict(cell_or_base["pipeline"])
    if not table.get("channels"):
        table.pop("channels", None)
    cfg = config_from_dict(table)
    if not cfg.update_time > 0:
        raise ValueError("update_time must be > 0 (it bounds the updates in the time budget)")
    n = int(math.floor(cell_or_base["hours"] * 3600 / cfg.update_time)) + 1
    return cfg.replace(num_updates=n, seed=cfg.seed + m)


def wallclock_cells(exp: Experiment) -> list[dict]:
    """Cells in run order: per MDP, per (clip, mass), per method."""
    base = as_dict(exp.base)
    return [dict(base, mdp=m, clip=float(c), mass=float(k), method=meth)
            for m in range(base["num_mdps"]) for c in exp.grid.clips for k in exp.grid.masses
            for meth in exp.grid.methods]


def validate_wallclock(exp: Experiment) -> list[dict]:
    """Cells after checking the pipeline, methods, clips, fractions (ValueError naming the key)."""
    from vccc_jax.tabular.rac import METHODS

    b, where = exp.base, exp.path or "config"
    try:
        cfg = pipeline_of(as_dict(b))
    except ValueError as e:
        raise ValueError(f"{where}: base.pipeline: {e}") from None
    check_problem(b, where, len(cfg.channels))
    if not b.hours > 0 or not b.lr > 0:
        raise ValueError(f"{where}: base.hours and base.lr must be > 0")
    if not b.fractions or not all(0 < f <= 1 for f in b.fractions):
        raise ValueError(f"{where}: base.fractions must lie in (0, 1], got {b.fractions}")
    bad = [m for m in exp.grid.methods if m not in METHODS]
    if bad or not exp.grid.methods:
        raise ValueError(f"{where}: grid.methods must be non-empty, from {METHODS}; bad: {bad}")
    check_clips_masses(exp.grid, where)
    return wallclock_cells(exp)


@functools.lru_cache(maxsize=64)
def _trace(cfg):
    from vccc_jax.pipeline import simulate

    return simulate(cfg)


def trace_schedule(trace, method: str, updates: int, kernels: list, batch_size: int) -> np.ndarray:
    """W [U, C, U] of ``tabular.rac_train.event_schedule`` from a ``PipelineTrace``."""
    from vccc_jax.tabular.rac_train import event_schedule

    return event_schedule(method, num_updates=updates, batch_size=batch_size,
                          consumed=trace.ep_consumed, seg_episode=trace.seg_episode,
                          seg_version=trace.seg_version, seg_tokens=trace.seg_tokens,
                          arrival=trace.ep_reward_update, kernels=kernels)


def _q90_max(x: np.ndarray) -> dict:
    return {"mean": float(x.mean()), "q90": int(np.quantile(x, 0.9, method="inverted_cdf")),
            "max": int(x.max())}


def trace_stats(trace, updates: int) -> dict:
    """Over the first ``updates`` updates of a trace: token and episode lags (mean, p90, max),
    seconds per update, and per channel the steps by which its reward arrives after the
    episode was consumed (mean, max; ``never``: arrives after the last simulated update)."""
    seg = trace.seg_consumed < updates
    ep = trace.ep_consumed < updates
    out = {"lag_token": _q90_max(np.repeat(trace.segment_lags()[seg], trace.seg_tokens[seg])),
           "lag_episode": _q90_max(trace.episode_lags()[ep]),
           "s_per_update": float(trace.wallclock_per_update()[:updates].mean()), "reward_delay": {}}
    for c, name in enumerate(trace.channel_names):
        ru = trace.ep_reward_update[ep, c]
        d = np.maximum(ru[ru >= 0] - trace.ep_consumed[ep][ru >= 0], 0)
        out["reward_delay"][name] = {"mean": float(d.mean()) if d.size else float("nan"),
                                     "max": int(d.max()) if d.size else -1,
                                     "never": int((ru < 0).sum())}
    return out


def run_wallclock_cell(cell: dict) -> dict:
    """One (MDP, clip, mass, method) training run (module docstring)."""
    import jax

    from vccc_jax.tabular import rac_train

    m = cell["mdp"]
    cfg = pipeline_of(cell, m)
    if cell["method"] == "wait":
        cfg = cfg.wait_for_slow()
    trace = _trace(cfg)
    C = len(cfg.channels)
    slow = [not c.blocking for c in pipeline_of(cell, m).channels]
    kernels = channel_kernels(C, slow, cell["kernel"], cell["mass"])
    U = cfg.num_updates  # the same for every method and MDP: one compiled training loop
    W = trace_schedule(trace, cell["method"], U, kernels, cfg.batch_size)
    mdps, th, ch = problems(cell["seed"], cell["num_mdps"], cell["num_states"], cell["num_actions"],
                             float(cell["gamma"]), float(cell["init_scale"]), C, tuple(cell["shares"]))
    with jax.enable_x64(True):
        traj = rac_train.train(mdps[m], ch[m], th[m], W, cell["lr"], clip=clip_value(cell["clip"]))
        jstar = float(rac_train.optimal_return(mdps[m], ch[m]))
    times = np.concatenate([[0.0], trace.update_end[:U]])
    keep = times <= cell["hours"] * 3600  # the wall-clock budget
    J, times = np.asarray(traj.returns, np.float64)[keep], times[keep]
    W = W[: int(keep.sum()) - 1]  # the updates that finished within the budget
    n = int(keep.sum()) - 1
    return {"updates": n, "returns": J.tolist(), "times": times.tolist(), "j0": float(J[0]),
            "jstar": jstar,
            "time_to": {str(f): rac_train.time_to_fraction(times, J, J[0], jstar, f)
                        for f in cell["fractions"]},
            "final_fraction": float((J[-1] - J[0]) / (jstar - J[0])),
            "schedule": {n: s for n, s in zip([c.name for c in cfg.channels],
                                              rac_train.schedule_stats(W)["channels"])},
            "trace": trace_stats(trace, n)}


def run_wallclock(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
                  on_cell: Optional[Callable[[int, int, dict], None]] = None) -> tuple[Path, list[dict]]:
    """Compute the missing runs into ``<results_dir>/<name>.jsonl`` -> (path, rows)."""
    path = Path(results_dir) / f"{exp.name}.jsonl"

    def note(cell, metrics):
        return f"MDP {cell['mdp']} {cell['method']}: J/J* path {metrics['final_fraction']:.3f}"

    return path, run_cells(path, validate_wallclock(exp), run_wallclock_cell, label="runs",
                           note=note, progress=progress, on_cell=on_cell)


def wallclock_summary(rows: list[dict], fraction: float = 0.9) -> list[dict]:
    """Per (clip, mass, MDP): per method the final fraction of J* - J0 reached and the time to
    ``fraction``, and wait / rac of those times (inf where rac never gets there)."""
    out = []
    for (clip, mass, m), rs in group_rows(rows, ("clip", "mass", "mdp")).items():
        by = {r["cell"]["method"]: r["metrics"] for r in rs}
        row = {"clip": clip, "mass": mass, "mdp": m, "jstar": rs[0]["metrics"]["jstar"],
               "j0": rs[0]["metrics"]["j0"]}
        for meth, x in by.items():
            row[f"{meth}_final"] = x["final_fraction"]
            row[f"{meth}_t"] = stored_float(x["time_to"].get(str(fraction)))
        if "wait_t" in row and "rac_t" in row:
            row["wait_over_rac"] = row["wait_t"] / row["rac_t"] if np.isfinite(row["rac_t"]) else float("nan")
        out.append(row)
    return out


def _finite_mean(values) -> float:
    """Mean of the stored values that are finite numbers (None = NaN / inf); NaN if none."""
    x = np.array([stored_float(v, np.nan) for v in values])
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def _ratio_line(summary: list[dict], fraction: float) -> str:
    """Median / range of wait / rac time to ``fraction`` over the MDPs where both get there
    within the budget, and how many MDPs only rac / neither / only wait reach it."""
    if not summary or not all("wait_over_rac" in s for s in summary):
        return f"(no wait / rac pair at {fraction:g})"
    tw = np.array([s["wait_t"] for s in summary])
    tr = np.array([s["rac_t"] for s in summary])
    both = np.isfinite(tw) & np.isfinite(tr)
    r = tw[both] / tr[both]
    text = (f"wait / rac time to J0 + {fraction:g} (J* - J0): median {np.median(r):.2f}x, "
            f"min {np.min(r):.2f}x, max {np.max(r):.2f}x over the {both.sum()} MDPs where both "
            "get there") if both.any() else f"wait / rac time to {fraction:g}: no MDP where both get there"
    counts = {"only rac": np.isfinite(tr) & ~np.isfinite(tw), "only wait": np.isfinite(tw) & ~np.isfinite(tr),
              "neither": ~np.isfinite(tw) & ~np.isfinite(tr)}
    extra = [f"{int(v.sum())} {k}" for k, v in counts.items() if v.any()]
    return text + (f" ({', '.join(extra)} within the budget)" if extra else "")


def wallclock_table(rows: list[dict], fraction: Optional[float] = None) -> str:
    """Per (clip, mass): the per-MDP table (time to ``fraction`` of the way from J0 to J* in
    simulated hours, default the largest of the run's fractions; final fraction per method;
    wait / rac), the ratio summary at every fraction, and the lag / delay statistics each
    method's schedule used (mean over MDPs)."""
    if not rows:
        return "(no runs)"
    fractions = rows[0]["cell"]["fractions"]
    fraction = max(fractions) if fraction is None else fraction
    lines = [f"budget {rows[0]['cell']['hours']:g} simulated hours per run; inf = not reached "
             "within it"]
    summ = wallclock_summary(rows, fraction)
    methods = list(dict.fromkeys(r["cell"]["method"] for r in rows))
    for (clip, mass), ss in group_rows([{"cell": s} for s in summ], ("clip", "mass")).items():
        ss = [s["cell"] for s in ss]
        lines += [f"clip {clip or 'none'}, kernel mass {mass}: hours to J0 + {fraction:g} (J* - J0) "
                  "[final fraction]",
                  f"{'MDP':>4} " + "".join(f"{m:>18}" for m in methods) + f"{'wait/rac':>10}"]
        for s in ss:
            cells_ = [f"{s[m + '_t'] / 3600:8.2f} [{s[m + '_final']:5.3f}]" for m in methods]
            ratio = s.get("wait_over_rac", float("nan"))
            lines.append(f"{s['mdp']:>4} " + "".join(f"{c:>18}" for c in cells_) + f"{ratio:10.2f}")
        for f in fractions:
            lines.append(_ratio_line(wallclock_summary(
                [r for r in rows if r["cell"]["clip"] == clip and r["cell"]["mass"] == mass], f), f))
        for meth in methods:
            sel = [r["metrics"] for r in rows if r["cell"]["method"] == meth
                   and r["cell"]["clip"] == clip and r["cell"]["mass"] == mass]
            t = [x["trace"] for x in sel]
            sched = {ch: _finite_mean([x["schedule"][ch]["age_mean"] for x in sel])
                     for ch in sel[0]["schedule"]}
            mass_rng = {ch: (min(x["schedule"][ch]["mass_min"] for x in sel),
                             max(x["schedule"][ch]["mass_max"] for x in sel)) for ch in sel[0]["schedule"]}
            ages = ", ".join(f"{ch} {a:.2f} [{mass_rng[ch][0]:.2f}..{mass_rng[ch][1]:.2f}]"
                             if np.isfinite(a) else f"{ch} unused" for ch, a in sched.items())
            late = [f"{ch} {_finite_mean([x['reward_delay'][ch]['mean'] for x in t]):.2f} "
                    f"(max {max(x['reward_delay'][ch]['max'] for x in t)})" for ch in t[0]["reward_delay"]
                    if max(x["reward_delay"][ch]["max"] for x in t) > 0]
            lines.append(
                f"  {meth:>5}: {np.mean([x['s_per_update'] for x in t]):.1f} s/update; token lag mean "
                f"{np.mean([x['lag_token']['mean'] for x in t]):.2f} (p90 {max(x['lag_token']['q90'] for x in t)}, "
                f"max {max(x['lag_token']['max'] for x in t)}); data age per channel (steps, mean [mass "
                "per step min..max]): " + ages
                + (f"; rewards arrive steps after consumption: {', '.join(late)}" if late else ""))
        lines.append("")
    return "\n".join(lines).rstrip()


__all__ = ["pipeline_of", "wallclock_cells", "validate_wallclock", "trace_schedule", "trace_stats",
           "run_wallclock_cell", "run_wallclock", "wallclock_summary", "wallclock_table"]
