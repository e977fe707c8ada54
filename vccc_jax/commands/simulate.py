"""``vccc simulate``: lag and wall-clock statistics of a described RL pipeline (issue 14).

    vccc simulate --config experiments/pipeline_default.toml [--set base.num_workers=32]
                  [--schedule async]
                  [--partial-rollout | --no-partial-rollout] [--wait-for-slow]
                  [--num-updates N] [--seed S] [--trace-out lags.txt]
                  [--trace-weight episode|token] [--compare]

Prints a table of lag statistics (per token and per episode), wall-clock per update and
reward-channel delays in optimiser steps; ``--compare`` adds one row per schedule on the
same cluster. ``--trace-out`` writes a lag trace the trainer reads with ``--lag trace:@PATH``.
The config is a ``kind = "pipeline"`` experiment (``runs.schema``: unknown keys are named).
Bad input (flags, config keys and values, ``--set``, a ``--trace-out`` directory that cannot
be made): one line ``vccc simulate: <what is wrong>`` on stderr and exit status 2.
"""

from __future__ import annotations

from typing import Optional

from vccc_jax.commands.common import Parser, guarded, output_file
from vccc_jax.pipeline import (
    SCHEDULES,
    lag_stats,
    reward_delay_stats,
    simulate,
    wallclock_stats,
    write_lag_trace,
)
from vccc_jax.runs import schema

PROG = "vccc simulate"


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Simulate an asynchronous RL pipeline: lags, wall-clock.")
    p.add_argument("--config", required=True, help="pipeline TOML (experiments/pipeline_*.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override the config (base.FIELD=V; repeatable)")
    p.add_argument("--schedule", choices=SCHEDULES, help="override the config's schedule")
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--partial-rollout", dest="partial", action="store_true", default=None)
    pr.add_argument("--no-partial-rollout", dest="partial", action="store_false")
    p.add_argument("--wait-for-slow", action="store_true",
                   help="the trainer waits for every reward channel")
    p.add_argument("--num-updates", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--trace-out", help="write the lag trace here (trainer: --lag trace:@PATH)")
    p.add_argument("--trace-weight", choices=("episode", "token"), default="episode")
    p.add_argument("--compare", action="store_true", help="also run every schedule")
    return p


def _row(name, trace) -> str:
    tok, ep, wc = lag_stats(trace, "token"), lag_stats(trace, "episode"), wallclock_stats(trace)
    return (f"{name:<14}{tok['mean']:>9.3f}{tok['q50']:>5d}{tok['q90']:>5d}{tok['q99']:>5d}"
            f"{tok['max']:>5d}{ep['mean']:>9.3f}{wc['per_update_mean']:>10.2f}"
            f"{wc['total']:>11.1f}{wc['tokens_per_second']:>9.0f}")


def report(cfg, traces: dict) -> str:
    head = (f"{'schedule':<14}{'lag mean':>9}{'p50':>5}{'p90':>5}{'p99':>5}{'max':>5}"
            f"{'ep mean':>9}{'s/update':>10}{'total s':>11}{'tok/s':>9}")
    lines = [f"pipeline: {cfg.num_workers} workers, batch {cfg.batch_size}, "
             f"{cfg.num_updates} updates, partial_rollout={cfg.partial_rollout}, seed {cfg.seed}",
             "lags per token (ep mean: lag of each episode's first token)", head,
             "-" * len(head)]
    lines += [_row(name, tr) for name, tr in traces.items()]
    main = traces[cfg.schedule]
    lines += ["", f"reward channels ({cfg.schedule}): delay in optimiser steps after consumption",
              f"{'channel':<10}{'blocking':>9}{'latency s':>11}{'D mean':>8}{'D max':>7}{'censored':>9}"]
    for (name, st), chan in zip(reward_delay_stats(main).items(), cfg.channels):
        lines.append(f"{name:<10}{str(chan.blocking):>9}{st['latency_mean']:>11.2f}"
                     f"{st['delay_steps_mean']:>8.2f}{st['delay_steps_max']:>7d}{st['censored']:>9d}")
    hist = lag_stats(main, "token")["hist"]
    lines += ["", "lag histogram (" + cfg.schedule + ", token share): " +
              " ".join(f"{l}:{c / hist.sum():.3f}" for l, c in enumerate(hist) if c)]
    return "\n".join(lines)


@guarded("simulate")
def main(argv: Optional[list[str]] = None):
    args = build_parser().parse_args(argv)
    exp = schema.load(args.config, args.overrides)  # kind "pipeline" (runs/schema.py)
    if exp.kind != "pipeline":
        raise ValueError(f"{exp.path}: kind must be 'pipeline' for vccc simulate, got {exp.kind!r}")
    cfg = schema.pipeline_config(exp)
    changes = {k: v for k, v in dict(schedule=args.schedule, partial_rollout=args.partial,
                                     num_updates=args.num_updates, seed=args.seed).items()
               if v is not None}
    cfg = cfg.replace(**changes)
    if args.wait_for_slow:
        cfg = cfg.wait_for_slow()
    if args.trace_out:
        output_file(args.trace_out, "--trace-out")

    def run() -> int:
        names = SCHEDULES if args.compare else (cfg.schedule,)
        traces = {s: simulate(cfg.replace(schedule=s)) for s in names}
        print(report(cfg, traces))
        if args.trace_out:
            n = write_lag_trace(args.trace_out, traces[cfg.schedule], args.trace_weight)
            print(f"\nwrote {n} lags to {args.trace_out} (use --lag trace:@{args.trace_out})")
        return 0

    return run
