"""``vccc train``: run the lagged actor-critic trainer and save tidy results + figures.

Single run::

    vccc train --env CartPole-v1 --lag geometric:8 --critic vccc --actor centered-mask --seeds 8

writes ``<out>/`` (default ``results/train/<env>_<lag>_<critic>_<actor>_s<seeds>``):

    metrics.csv   tidy table, one row per (update, seed): env_steps, return, lag_mean, ESS,
                  clip rates (overall and clip_frac_lag<j>), log-ratio quantiles, KL(pi||mu),
                  losses, and at ground-truth updates the critic error vs MC V^{pi_k}
    summary.json  per-seed summaries with 95% confidence intervals across seeds
    config.json   the frozen TrainConfig + provenance (git revision, package versions)
    curves.png    learning curves (mean and 95% CI across seeds)
    checkpoint/   the final train state (``--checkpoint-every N`` also saves every N updates;
                  ``--resume`` continues from it)

Config files (``--config file.json``): either a dict of TrainConfig fields (flags given on
the command line override it) or an experiment ``{"name": ..., "base": {...}, "grid":
{field: [values, ...]}}``, whose cells (the product of the grid) run one after the other
into ``<out>/<name>/<cell id>/`` with one summary row per cell in the resumable result
store ``<out>/<name>.jsonl`` (a rerun skips finished cells), then a summary table and a
figure of return / critic error against mean lag.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from vccc_jax.train.trainer import CRITIC_TARGETS, ENVS, TrainConfig

QUANTILE_NAMES = ("q01", "q10", "q50", "q90", "q99")


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------

ALIASES = {"num_seeds": ["--seeds"], "total_timesteps": ["--timesteps"]}


def _parse_value(text: str, default: Any):
    if text.lower() in ("none", "null"):
        return None
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")
    if isinstance(default, int):
        return int(float(text))
    if isinstance(default, float):
        return float(text)
    if default is None:  # Optional numeric fields
        try:
            return int(text)
        except ValueError:
            return float(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vccc train",
        description="Asynchronous actor-critic with simulated policy lag on gymnax "
        f"({', '.join(ENVS)}). Critics: {', '.join(sorted(CRITIC_TARGETS))}. Actors: "
        "[centered-]ratio|truncate|mask. Lags: fixed:L uniform:M geometric:m zipf:a "
        "trace:l0,l1,...",
    )
    p.add_argument("--config", help="JSON file: TrainConfig fields, or an experiment grid")
    p.add_argument("--out", help="output directory (default results/train/...)")
    p.add_argument("--chunk", type=int, default=0,
                   help="updates per jitted call (progress granularity; 0: about 20 calls)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="also checkpoint every N updates (0: only the final state)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint")
    p.add_argument("--no-figure", action="store_true", help="skip the PNG figure")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    for f in dataclasses.fields(TrainConfig):
        default = f.default
        flags = ["--" + f.name.replace("_", "-")] + ALIASES.get(f.name, [])
        p.add_argument(*flags, dest=f.name, default=None,
                       type=lambda t, d=default: _parse_value(t, d),
                       help=f"(default {default})")
    return p


def _overrides(args) -> dict:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


# --------------------------------------------------------------------------------------
# Tidy tables
# --------------------------------------------------------------------------------------


def metrics_to_rows(metrics: dict, config: TrainConfig, start_update: int = 0) -> list[dict]:
    """Metrics [U, S, ...] -> one dict per (update, seed); vector metrics get one column each."""
    m = {k: np.asarray(v) for k, v in metrics.items()}
    num_updates, num_seeds = next(iter(m.values())).shape[:2]
    rows = []
    for u in range(num_updates):
        update = start_update + u
        for s in range(num_seeds):
            row = {"update": update, "seed": s,
                   "env_steps": (update + 1) * config.batch_size}
            for k, v in m.items():
                x = v[u, s]
                if x.ndim == 0:
                    row[k] = x.item()
                elif k == "log_rho_q":
                    row.update({f"log_rho_{q}": float(xi) for q, xi in zip(QUANTILE_NAMES, x)})
                elif k == "clip_frac_by_lag":
                    row.update({f"clip_frac_lag{j}": float(xi) for j, xi in enumerate(x)})
                elif k == "count_by_lag":
                    row.update({f"count_lag{j}": int(xi) for j, xi in enumerate(x)})
                else:
                    row.update({f"{k}{j}": float(xi) for j, xi in enumerate(x)})
            rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    fields = list(rows[0])
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        conv = {}
        for k, v in r.items():
            try:
                conv[k] = int(v) if k in ("update", "seed", "env_steps") else float(v)
            except ValueError:
                conv[k] = v
        out.append(conv)
    return out


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


def mean_ci(x: np.ndarray, axis: int = -1, level: float = 0.95):
    """Mean and half-width of a Student-t confidence interval across ``axis`` (NaN-aware)."""
    from scipy import stats

    x = np.asarray(x, np.float64)
    n = np.sum(np.isfinite(x), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(x, axis=axis) if np.any(n) else np.full(np.shape(n), np.nan)
        sd = np.nanstd(x, axis=axis, ddof=1) if np.all(n > 1) else np.full(np.shape(n), np.nan)
        half = stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(n)
    return mean, half


def summarize(rows: list[dict]) -> dict:
    """Per-seed summaries of a run and their mean / 95% CI across seeds.

    final_return: mean behaviour-episode return over the last 10% of updates.
    final_eval_return: the current policy's return, mean of the last 3 evaluations.
    gt_mse / gt_rel_err: critic error vs Monte-Carlo V^{pi_k} (squared; |error| / |V|),
      averaged over the evaluations in the second half of training.
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
    summary = {}
    for k, v in per_seed.items():
        mean, half = mean_ci(v[None], axis=-1) if v.ndim == 0 else mean_ci(v)
        summary[k] = {"mean": float(mean), "ci95": float(half), "per_seed": v.tolist()}
    return summary


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------


def default_out(cfg: TrainConfig) -> Path:
    name = f"{cfg.env}_{cfg.lag}_{cfg.critic}_{cfg.actor}_s{cfg.num_seeds}".replace(":", "-")
    return Path("results") / "train" / name.replace("/", "-").replace(",", "-")


def _chunk_size(num_updates: int, requested: int, checkpoint_every: int) -> int:
    """Updates per jitted call; a divisor of num_updates when possible (one compile)."""
    if requested > 0:
        size = requested
    else:
        target = max(1, num_updates // 20)
        divisors = [d for d in range(1, target + 1) if num_updates % d == 0]
        size = divisors[-1] if divisors and divisors[-1] * 4 >= target else target
    if checkpoint_every > 0:
        size = min(size, checkpoint_every)
    return max(1, min(size, num_updates))


def provenance() -> dict:
    """Git revision, package versions, platform (the sweeps' provenance record)."""
    from vccc_jax.sweeps.store import provenance as _provenance

    return _provenance()


def run_one(cfg: TrainConfig, out: Path, *, chunk: int = 0, checkpoint_every: int = 0,
            resume: bool = False, figure: bool = True, quiet: bool = False) -> dict:
    """Train one configuration (all its seeds) and write the run directory. Returns summary."""
    import jax

    from vccc_jax.train import checkpoint
    from vccc_jax.train.trainer import Trainer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg)
    total = trainer.num_updates
    ckpt_dir = out / "checkpoint"
    rows: list[dict] = []
    start = 0
    state = trainer.init()
    if resume and checkpoint.exists(ckpt_dir):
        meta = checkpoint.read_meta(ckpt_dir)
        if meta.get("config") != cfg.to_dict():
            raise ValueError(f"--resume: {ckpt_dir} was written by a different config")
        state = checkpoint.load(ckpt_dir, state)
        start = int(meta["update"])
        if (out / "metrics.csv").exists():
            rows = [r for r in read_csv(out / "metrics.csv") if r["update"] < start]
    (out / "config.json").write_text(json.dumps(
        {"config": cfg.to_dict(), "num_updates": total, "num_versions": trainer.num_versions,
         "mean_lag_law": cfg.lag_law.mean(trainer.num_versions),
         "gt_horizon": trainer.gt_horizon, "provenance": provenance()}, indent=1))
    size = _chunk_size(total, chunk, checkpoint_every)
    progress = None
    if not quiet:
        from vccc_jax.sweeps.progress import Progress

        progress = Progress(total, done=start, label="updates", min_interval=10.0)
    t0 = time.time()
    t_first, steps_after_first = None, 0  # throughput excludes the first call (compile)
    update = start
    while update < total:
        n = min(size, total - update)
        state, metrics = trainer.train(state, n, start=update)
        metrics = jax.device_get(metrics)
        rows.extend(metrics_to_rows(metrics, cfg, update))
        update += n
        if t_first is None:
            t_first = time.time()
        else:
            steps_after_first += n * cfg.batch_size * cfg.num_seeds
        if checkpoint_every > 0 and (update % checkpoint_every == 0) and update < total:
            checkpoint.save(ckpt_dir, state, {"config": cfg.to_dict(), "update": update})
            write_csv(rows, out / "metrics.csv")
        if progress is not None:
            ret = np.nanmean(np.asarray(metrics["return"])[-1])
            note = f"return {ret:7.1f}"
            if steps_after_first:
                rate = steps_after_first / max(time.time() - t_first, 1e-9)
                note += f"  {rate / 1e3:6.1f}k steps/s"
            else:
                note += f"  (compiled + first {n} updates in {t_first - t0:.1f}s)"
            progress.advance(n, note=note)
    if progress is not None:
        progress.close()
    checkpoint.save(ckpt_dir, state, {"config": cfg.to_dict(), "update": update})
    write_csv(rows, out / "metrics.csv")
    summary = summarize(rows)
    summary["wall_seconds"] = {"mean": time.time() - t0, "ci95": 0.0, "per_seed": []}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if figure:
        from vccc_jax import plotting  # top layer; matplotlib loads lazily

        plotting.plot_learning_curves(rows, out / "curves.png",
                             f"{cfg.env}  lag {cfg.lag}  critic {cfg.critic}  actor {cfg.actor}"
                             f"  ({cfg.num_seeds} seeds)")
    return summary


def _grid_cells(spec: dict, overrides: dict) -> list[TrainConfig]:
    base = dict(spec.get("base", {}))
    base.update(overrides)
    grid = spec.get("grid", {})
    keys = list(grid)
    cells = []
    for values in itertools.product(*(grid[k] for k in keys)):
        d = dict(base)
        d.update(dict(zip(keys, values)))
        cells.append(TrainConfig.from_dict(d))
    return cells


def run_grid(spec: dict, overrides: dict, out: Path, *, figure: bool = True,
             quiet: bool = False) -> list[dict]:
    """Run every cell of an experiment spec into a resumable result store."""
    from vccc_jax.sweeps.store import ResultStore, cell_id

    name = spec.get("name", "train_grid")
    cells = _grid_cells(spec, overrides)
    store_path = out / f"{name}.jsonl"
    results = []
    with ResultStore(store_path) as store:
        for i, cfg in enumerate(cells):
            cell = cfg.to_dict()
            cid = cell_id(cell)
            if store.has(cid):
                results.append({"config": cell, "summary": store.row(cid)["metrics"]})
                continue
            if not quiet:
                print(f"[{i + 1}/{len(cells)}] {cfg.env} lag={cfg.lag} critic={cfg.critic} "
                      f"actor={cfg.actor} seeds={cfg.num_seeds}", file=sys.stderr, flush=True)
            t0 = time.time()
            summary = run_one(cfg, out / name / cid, figure=False, quiet=quiet)
            store.append({"id": cid, "cell": cell, "metrics": summary,
                          "meta": {"seconds": time.time() - t0, **provenance()}})
            results.append({"config": cell, "summary": summary})
    print(format_grid_table(results))
    if figure:
        from vccc_jax import plotting  # top layer; matplotlib loads lazily

        path = plotting.plot_lag_sweep(results, out / f"{name}.png", name)
        print(f"figure: {path}")
    return results


def format_grid_table(results: list[dict]) -> str:
    """Markdown table: env, lag, critic, mean lag, returns and critic error with 95% CIs."""
    def fmt(s, key, digits=1):
        if key not in s:
            return "-"
        m, h = s[key]["mean"], s[key]["ci95"]
        if not math.isfinite(m):
            return "-"
        return f"{m:.{digits}f} ± {h:.{digits}f}"

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


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = _overrides(args)
    spec: dict = {}
    if args.config:
        spec = json.loads(Path(args.config).read_text())
    if "grid" in spec:
        out = Path(args.out) if args.out else Path("results") / "train"
        run_grid(spec, overrides, out, figure=not args.no_figure, quiet=args.quiet)
        return 0
    fields = dict(spec)
    fields.update(overrides)
    cfg = TrainConfig.from_dict(fields)
    out = Path(args.out) if args.out else default_out(cfg)
    summary = run_one(cfg, out, chunk=args.chunk, checkpoint_every=args.checkpoint_every,
                      resume=args.resume, figure=not args.no_figure, quiet=args.quiet)
    keys = ("final_return", "final_eval_return", "gt_mse", "gt_rel_err", "lag_mean", "ess")
    for k in keys:
        if k in summary:
            print(f"{k:>18}: {summary[k]['mean']:.4g} ± {summary[k]['ci95']:.2g} (95% CI)")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
