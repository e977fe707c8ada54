"""Tidy training tables -> per-seed summaries with t intervals, and the grid's markdown table.

Rows are the trainer's tidy ``metrics.csv`` rows: one dict per (update, seed).
"""

from __future__ import annotations

import math

import numpy as np

from vccc_jax.analysis.seeds import MIN_INTERVAL_SEEDS, seed_interval, stratified_bootstrap_ci
from vccc_jax.analysis.stats import mean_ci


def metric_column(rows: list[dict], key: str) -> np.ndarray:
    """[U, S] array of a metric (NaN where missing)."""
    updates = sorted({r["update"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    ui = {u: i for i, u in enumerate(updates)}
    si = {s: i for i, s in enumerate(seeds)}
    out = np.full((len(updates), len(seeds)), np.nan)
    for r in rows:
        v = r.get(key)
        if v is not None and v != "":
            out[ui[r["update"]], si[r["seed"]]] = float(v)
    return out


def summarize(rows: list[dict]) -> dict:
    """Per-seed summaries of a run and their mean and interval across seeds, each with the
    ``window`` it averages over in words (the console prints it next to the number).

    final_return: mean behaviour-episode return over the last 10% of updates.
    final_eval_return: the current policy's return, mean of the last 3 evaluations.
    gt_mse / gt_rel_err: critic error vs Monte-Carlo V^{pi_k} (squared; |error| / |V|),
      averaged over the evaluations in the second half of training.
    exact_err_pi: (``tabular:`` / ``token:`` envs) critic RMSE to the exact V^{pi_k}, averaged
      over the exact evaluations in the second half of training.

    Each entry: ``mean``, ``lo`` / ``hi`` / ``n`` / ``interval`` (the one interval rule of the
    console, this summary and curves.png: :func:`analysis.seeds.seed_interval`), ``ci95``
    (the Student-t half-width the grid tables use; NaN for one seed) and ``per_seed``.
    """
    ret = metric_column(rows, "return")
    num_updates = ret.shape[0]
    tail = max(1, num_updates // 10)
    per_seed = {"final_return": np.nanmean(ret[-tail:], axis=0),
                "mean_return": np.nanmean(ret, axis=0),
                "lag_mean": np.nanmean(metric_column(rows, "lag_mean"), axis=0),
                "ess": np.nanmean(metric_column(rows, "ess"), axis=0),
                "clip_frac": np.nanmean(metric_column(rows, "clip_frac"), axis=0),
                "kl_pi_mu": np.nanmean(metric_column(rows, "kl_pi_mu"), axis=0)}
    ev = metric_column(rows, "eval_return")
    gt_rows = np.where(np.any(np.isfinite(ev), axis=1))[0]
    with np.errstate(invalid="ignore"):
        if gt_rows.size:
            per_seed["final_eval_return"] = np.nanmean(ev[gt_rows[-3:]], axis=0)
        mse = metric_column(rows, "gt_mse")
        mae = metric_column(rows, "gt_mae")
        val = metric_column(rows, "gt_value")
        late = np.arange(mse.shape[0]) >= mse.shape[0] // 2
        keep = late[:, None] & np.isfinite(mse)
        if np.any(keep):
            per_seed["gt_mse"] = np.nanmean(np.where(keep, mse, np.nan), axis=0)
            per_seed["gt_rel_err"] = np.nanmean(np.where(keep, mae / np.abs(val), np.nan), axis=0)
        err = metric_column(rows, "exact_err_pi")  # all NaN where the env has no exact truth
        keep = late[:, None] & np.isfinite(err)
        if np.any(keep):
            per_seed["exact_err_pi"] = np.nanmean(np.where(keep, err, np.nan), axis=0)
    windows = _windows(num_updates, tail, gt_rows, late, mse, err)
    summary = {}
    for k, v in per_seed.items():
        mean, half = mean_ci(v[None], axis=-1) if v.ndim == 0 else mean_ci(v)
        summary[k] = {**seed_interval(v), "mean": float(mean), "ci95": float(half),
                      "per_seed": v.tolist(), "window": windows[k]}
    return summary


def _windows(num_updates: int, tail: int, gt_rows, late, mse, err) -> dict[str, str]:
    """What each :func:`summarize` number averages over, in words (the console and
    summary.json state it next to the number: a curve's last point is another number)."""
    def evals(x) -> str:
        at = np.where(late & np.any(np.isfinite(x), axis=1))[0]
        return (f"mean over the {at.size} evaluations in the second half of the run (updates "
                f"{num_updates // 2}-{num_updates - 1} of 0-{num_updates - 1})")

    every = f"mean over all {num_updates} updates"
    last = gt_rows[-3:]
    return {"final_return": f"behaviour return, mean over the last {tail} of {num_updates} "
                            "updates",
            "mean_return": every, "lag_mean": every, "ess": every, "clip_frac": every,
            "kl_pi_mu": every,
            "final_eval_return": f"mean of the last {len(last)} evaluations (updates "
                                 f"{', '.join(map(str, last))})",
            "gt_mse": evals(mse), "gt_rel_err": evals(mse), "exact_err_pi": evals(err)}


def format_interval(s: dict, digits: int = 4) -> str:
    """The console's text of a :func:`summarize` entry: ``mean [lo, hi] (method)`` with at
    least ``MIN_INTERVAL_SEEDS`` seeds, ``mean (n = 2 seeds: a, b; ...)`` with fewer, or
    ``mean (n = 1: no interval)`` (the method: :func:`analysis.seeds.interval_method`)."""
    if s["n"] < 2:
        return f"{s['mean']:.{digits}g} ({s['interval']})"
    if s["n"] < MIN_INTERVAL_SEEDS and "per_seed" in s:
        values = ", ".join(f"{x:.{digits}g}" for x in s["per_seed"] if math.isfinite(x))
        return (f"{s['mean']:.{digits}g} (n = {s['n']} seeds: {values}; fewer than "
                f"{MIN_INTERVAL_SEEDS}: no 95% interval)")
    return f"{s['mean']:.{digits}g} [{s['lo']:.{digits}g}, {s['hi']:.{digits}g}] ({s['interval']})"


def format_grid_table(results: list[dict]) -> str:
    """Markdown table: env, lag, critic, mean lag, returns and critic error: mean ± 95% t
    half-width over seeds, or with fewer than ``MIN_INTERVAL_SEEDS`` seeds mean [min, max]
    of the seeds (:func:`_spread`; :data:`GRID_TABLE_NOTE` says so, and the windows)."""
    def fmt(s, key, digits=1):
        if key not in s or not math.isfinite(s[key]["mean"]):
            return "-"
        return _spread(s[key], digits, "f")

    lines = ["| env | lag | critic | mean lag | eval return | behaviour return | "
             "critic rel. err | critic MSE | ESS |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["config"]["env"], r["summary"]["lag_mean"]["mean"],
                                            r["config"]["critic"])):
        c, s = r["config"], r["summary"]
        lines.append(
            f"| {c['env']} | {c['lag']} | {c['critic']} | {s['lag_mean']['mean']:.2f} | "
            f"{fmt(s, 'final_eval_return')} | {fmt(s, 'final_return')} | "
            f"{fmt(s, 'gt_rel_err', 3)} | {fmt(s, 'gt_mse', 2)} | {fmt(s, 'ess', 3)} |")
    return "\n".join(lines)


# --- whole-run summaries (issue 11 §3: staleness shows early, a second-half mean hides it) ---

ERROR_KEYS = ("gt_rel_err", "exact_err_pi", "exact_err_mix", "exact_gap", "exact_rel_err_pi",
              "exact_grad_rel_bias", "exact_grad_bias", "exact_grad_cos")
CHECKPOINTS = (0.25, 0.5, 1.0)
MEAN_KEYS = ("ess", "kl_pi_mu", "clip_frac", "lag_mean",
             # decoupled pi_old routes (train.route_metrics; NaN off the gt cycle, so these
             # are means over the ground-truth updates)
             "route_grad_rel_bias", "route_grad_cos", "route_grad_rel_var", "exact_grad_rel_var",
             "route_ppo_clip_frac", "exact_ppo_clip_frac", "route_w_clip_frac",
             "exact_w_clip_frac")


GRID_TABLE_NOTE = (
    f"mean ± 95% t half-width over seeds (n >= {MIN_INTERVAL_SEEDS}; fewer: mean [smallest, "
    "largest seed]). Eval return: the last 3 evaluations; behaviour return: the last 10% of "
    "updates; critic errors: the evaluations in the second half of the run; mean lag, ESS: "
    "all updates")


def _spread(s: dict, digits: int, kind: str = "g") -> str:
    """``mean ± t half-width`` of a per-seed summary with n >= MIN_INTERVAL_SEEDS, else
    ``mean [min, max]`` of its finite seeds (one seed: the mean alone)."""
    m = f"{s['mean']:.{digits}{kind}}"
    if s.get("n", 0) >= MIN_INTERVAL_SEEDS and math.isfinite(s.get("ci95", math.nan)):
        return f"{m} ± {s['ci95']:.{digits if kind == 'f' else 2}{kind}}"
    seeds = [x for x in s.get("per_seed", []) if math.isfinite(x)]
    if len(seeds) < 2:
        return m
    return f"{m} [{min(seeds):.{digits}{kind}}, {max(seeds):.{digits}{kind}}]"


def gt_curve(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(updates [G], values [G, S]) of a metric at the ground-truth updates: the updates where
    it is finite for some seed. ``gt_rel_err`` is the MC relative error gt_mae / |gt_value|."""
    updates = np.array(sorted({r["update"] for r in rows}), np.int64)
    if key == "gt_rel_err" and key not in rows[0]:
        with np.errstate(invalid="ignore", divide="ignore"):
            m = metric_column(rows, "gt_mae") / np.abs(metric_column(rows, "gt_value"))
    else:
        m = metric_column(rows, key)
    keep = np.isfinite(m).any(axis=1)
    return updates[keep], m[keep]


def checkpoint_index(updates: np.ndarray, num_updates: int, frac: float) -> int:
    """Index of the value "at ``frac`` of the run": the last ground-truth update u with
    u + 1 <= frac * num_updates (the first one when none is that early)."""
    ok = np.nonzero(updates + 1 <= frac * num_updates + 1e-9)[0]
    return int(ok[-1]) if ok.size else 0


def largest_lag(rows: list[dict]) -> int | None:
    """The largest lag j with data (count_lag<j> > 0 anywhere); None without lag columns."""
    lags = [int(k[len("count_lag"):]) for k in rows[0] if k.startswith("count_lag")]
    populated = [j for j in lags if np.nansum(metric_column(rows, f"count_lag{j}")) > 0]
    return max(populated) if populated else None


def clip_at_lag(rows: list[dict], lag: int) -> np.ndarray:
    """Per seed, the clip rate of the data at ``lag``: clip_frac_lag<lag> averaged over the
    updates weighted by count_lag<lag> (NaN for a seed with no such data)."""
    c = np.nan_to_num(metric_column(rows, f"count_lag{lag}"))
    f = np.nan_to_num(metric_column(rows, f"clip_frac_lag{lag}"))
    n = c.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (c * f).sum(axis=0) / n, np.nan)


def whole_run_per_seed(rows: list[dict]) -> dict[str, np.ndarray]:
    """Per-seed whole-run numbers of one run (one array [S] per name).

    For each error metric of :data:`ERROR_KEYS` the run has: ``<key>_auc`` (mean over every
    ground-truth update = area under the error curve / its length) and ``<key>@25``,
    ``@50``, ``@100`` (the value at the last ground-truth update within that share of the
    run, :func:`checkpoint_index`). Also ``return_auc``, ``return_final`` (last 10% of
    updates), ``ess``, ``kl_pi_mu``, ``clip_frac``, ``lag_mean`` (means over all updates),
    ``clip_at_max_lag`` (:func:`clip_at_lag` at :func:`largest_lag`, whose value is
    ``max_lag``) and ``eval_final`` (mean of the last 3 evaluations) when present."""
    seeds = len({r["seed"] for r in rows})
    num_updates = len({r["update"] for r in rows})
    out: dict[str, np.ndarray] = {}
    for key in ERROR_KEYS:
        if key != "gt_rel_err" and key not in rows[0]:
            continue
        if key == "gt_rel_err" and "gt_mae" not in rows[0] and key not in rows[0]:
            continue
        upd, g = gt_curve(rows, key)
        if g.size == 0:
            continue
        with np.errstate(invalid="ignore"), _quiet():
            out[f"{key}_auc"] = np.nanmean(g, axis=0)
        for c in CHECKPOINTS:
            out[f"{key}@{int(round(c * 100))}"] = g[checkpoint_index(upd, num_updates, c)]
    ret = metric_column(rows, "return")
    with _quiet():
        if np.isfinite(ret).any():
            out["return_auc"] = np.nanmean(ret, axis=0)
            out["return_final"] = np.nanmean(ret[-max(1, num_updates // 10):], axis=0)
        if "eval_return" in rows[0]:
            _, ev = gt_curve(rows, "eval_return")
            if ev.size:
                out["eval_final"] = np.nanmean(ev[-3:], axis=0)
        for key in MEAN_KEYS:
            if key in rows[0]:
                out[key] = np.nanmean(metric_column(rows, key), axis=0)
    lag = largest_lag(rows)
    if lag is not None:
        out["clip_at_max_lag"] = clip_at_lag(rows, lag)
        out["max_lag"] = np.full(seeds, float(lag))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


class _quiet:
    """Silence numpy's all-NaN-slice warnings (a seed without data is NaN on purpose)."""

    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def seed_stats(x) -> dict:
    """Statistics over seeds of a per-seed sample (NaN seeds dropped): ``mean`` and ``ci95``
    (Student-t half-width, :func:`analysis.stats.mean_ci`; NaN for one seed), ``iqm`` with its
    percentile bootstrap ``iqm_lo`` / ``iqm_hi`` (:func:`analysis.seeds.stratified_bootstrap_ci`),
    ``n`` and ``per_seed`` (all seeds, NaN kept)."""
    x = np.asarray(x, np.float64).ravel()
    f = x[np.isfinite(x)]
    out = {"n": int(f.size), "per_seed": x.tolist()}
    if f.size == 0:
        return dict(out, mean=np.nan, ci95=np.nan, iqm=np.nan, iqm_lo=np.nan, iqm_hi=np.nan)
    mean, half = mean_ci(f)
    p, lo, hi = stratified_bootstrap_ci(f)
    return dict(out, mean=float(mean), ci95=float(half), iqm=p, iqm_lo=lo, iqm_hi=hi)


def whole_run_summary(rows: list[dict]) -> dict:
    """Whole-run critic-error summary of one run (``metrics.csv`` rows, one per update and
    seed): ``{name: seed_stats(per seed)}`` for every name of :func:`whole_run_per_seed`.
    Same ``mean`` / ``ci95`` / ``per_seed`` fields as :func:`summarize` (so
    ``plotting.seeds`` can read it), plus ``iqm`` / ``iqm_lo`` / ``iqm_hi`` / ``n``."""
    return {k: seed_stats(v) for k, v in whole_run_per_seed(rows).items()}


def cell_label(config: dict) -> str:
    """Short label of a train cell: critic, clip level when it matters, baseline, protocol."""
    s = str(config.get("critic", "?"))
    if s in ("truncated", "masked", "centered_baseline", "naive_baseline"):
        s += f" c={float(config.get('clip', 0.0)):g}"
    if s in ("vtrace", "brace"):  # trace thresholds rhobar / cbar, not ``clip``
        rho, c = (float(config.get(k, 1.0)) for k in ("rho_bar", "c_bar"))
        if (rho, c) != (1.0, 1.0):
            s += f" rhobar={rho:g} cbar={c:g}"
    if s.startswith("brace"):
        s += f" n={int(config.get('brace_n', 4))}"
    if config.get("baseline", "value") not in ("value", None):
        s += f" b={config['baseline']}"
    if config.get("critic_first"):
        s += " (critic first)"
    if config.get("pi_old_route"):
        s += f" route={config['pi_old_route']}"
    if config.get("actor", "truncate") != "truncate":
        s += f" actor={config['actor']}"
    return s


def format_whole_run_table(results: list[dict], cols=None, stat: str = "mean",
                           digits: int = 3) -> str:
    """Markdown table, one line per cell, of whole-run summaries.

    ``results``: ``[{"config": TrainConfig dict, "summary": whole_run_summary(rows)}]``;
    ``cols``: summary names (default: every name of the first cell except ``lag_mean`` /
    ``max_lag``); ``stat``: "mean" (mean ± 95% t half-width; fewer than MIN_INTERVAL_SEEDS
    seeds: mean [min, max] of the seeds, :func:`_spread`) or "iqm" (IQM [bootstrap lo, hi])."""
    if stat not in ("mean", "iqm"):
        raise ValueError(f"stat must be 'mean' or 'iqm', got {stat!r}")
    if not results:
        return "(no cells)"
    cols = list(cols or [c for c in results[0]["summary"] if c not in ("lag_mean", "max_lag")])

    def fmt(s):
        if s is None or not math.isfinite(s["mean"]):
            return "-"
        if stat == "mean":
            return _spread(s, digits)
        return f"{s['iqm']:.{digits}g} [{s['iqm_lo']:.{digits}g}, {s['iqm_hi']:.{digits}g}]"

    head = ["env", "lag", "sampler", "critic", "n"] + cols
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        c, s = r["config"], r["summary"]
        n = max((v["n"] for v in s.values()), default=0)
        row = [str(c.get("env", "")), str(c.get("lag", "")), c.get("sampler") or "-", cell_label(c),
               str(n)] + [fmt(s.get(k)) for k in cols]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
