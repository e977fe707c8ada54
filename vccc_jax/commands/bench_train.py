"""``vccc bench train``: flags and printing of the trainer benchmark (issues 10, 28).

    vccc bench train [--seeds 1,8] [--envs 4,64,512] [--grid] [--timesteps N] [--repeats N]
                     [--rows a,b] [--actor K] [--out FILE.jsonl [--resume] [--docs FILE.md]]
                     [--baseline OLD.jsonl]
    vccc bench train --continuous [--seeds N] [--timesteps N] [--repeats N] [--rows a,b]

One cell per (seeds, envs) pair (:mod:`vccc_jax.benchmarks.train_grid`): each prints its
table when it is done and, with ``--out``, appends its JSON record; after the last cell the
grid table and the issue-28 targets. ``--grid`` = the issue's rows and cells (explicit
flags win). ``--docs`` rewrites the generated block of a docs page from the newest record of
every cell in ``--out``; ``--baseline`` compares every row with a record of the same grid on
other code (compile and env steps/s, new / old). The measurements are :mod:`vccc_jax.benchmarks.train` (no printing
there); bad input: one line ``vccc bench: <what is wrong>``, exit status 2.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

from vccc_jax.commands.common import Parser


def _out(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


_positive_int.__name__ = "positive int"


def train_parser() -> Parser:
    from vccc_jax.benchmarks import train as b
    from vccc_jax.benchmarks import train_grid as g

    p = Parser(prog="vccc bench train", description=b.__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default=None,
                   help="comma-separated vmapped seed counts, one cell each (default 1; "
                        f"--grid: {','.join(map(str, g.GRID_SEEDS))})")
    p.add_argument("--envs", default=None,
                   help="comma-separated env counts (x 128 steps), one cell each (default 4; "
                        f"--grid: {','.join(map(str, g.GRID_ENVS))})")
    p.add_argument("--grid", action="store_true",
                   help="the issue-28 grid: rows " + ",".join(g.GRID_ROWS) + " at every "
                        "(seeds, envs) of the two defaults above, best of 3")
    p.add_argument("--timesteps", type=_positive_int, default=None,
                   help="env steps per seed, rounded down to whole updates (default 500000 "
                        "for one cell; several cells: the updates of train_grid.UPDATES)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="round-robin rounds; the best run of each placement is kept (default 5; "
                        "--grid 3)")
    p.add_argument("--placements", type=_positive_int, default=None,
                   help="compiles of each row's program, each with its own input state, timed "
                        "apart; a row's time is the median over them (default 1; --grid 3)")
    p.add_argument("--rows", default=None,
                   help="comma-separated subset of: " + ",".join(b.ROW_NAMES))
    p.add_argument("--actor", default="truncate", help="actor weight of our trainer rows")
    p.add_argument("--out", default=None,
                   help="append one JSON line per finished cell to this file (.jsonl)")
    p.add_argument("--resume", action="store_true",
                   help="skip the cells --out already holds with the same settings")
    p.add_argument("--docs", default=None,
                   help="rewrite the block between this page's bench-train markers from the "
                        "newest record of every cell in --out (docs/results.md)")
    p.add_argument("--baseline", default=None,
                   help="a record (.jsonl) of the same grid on other code: compile time and "
                        "env steps/s new / old per row (the compile-time target)")
    p.add_argument("--continuous", action="store_true",
                   help="Pendulum-v1: the continuous trainer vs PureJaxRL's continuous PPO "
                        "(rows: reference, sync-gae, lag8-gae, lag8-vccc; one cell)")
    return p


def _continuous(args) -> Callable[[], int]:
    from vccc_jax.benchmarks import train as b
    from vccc_jax.benchmarks import train_continuous as bc

    seeds = int(args.seeds or "1") if (args.seeds or "1").isdigit() else 0
    if (args.grid or args.envs or args.out or args.docs or args.resume or args.baseline
            or seeds <= 0):
        raise ValueError("--continuous runs one cell: a single --seeds N, and none of --grid, "
                         "--envs, --out, --resume, --docs, --baseline")
    timesteps = args.timesteps or 500_000
    repeats = args.repeats or 5
    wanted = b.select_names(args.rows or ",".join(bc.ROW_NAMES), bc.ROW_NAMES)
    for name in wanted:
        if name != "reference":
            bc.train_config(name, seeds, timesteps, args.actor)  # refuses what cannot run

    def bench() -> int:
        _out(bc.header(timesteps, seeds, repeats))
        prepared = bc.prepare(wanted, seeds, timesteps, actor=args.actor, progress=_err,
                              placements=args.placements or 1)
        results = b.time_rows(prepared, repeats)
        _out(b.format_table(results))
        tail = b.footer(results, ref_target=1.0)
        if tail:
            _out(tail)
        return 0

    return bench


def settings(args) -> tuple[list, list, int, int]:
    """(rows, cells, repeats, placements) of parsed flags (``--grid`` fills what was not given);
    ValueError on bad values."""
    from vccc_jax.benchmarks import train as b
    from vccc_jax.benchmarks import train_grid as g

    seeds = g.parse_ints(args.seeds, "--seeds") if args.seeds else (
        g.GRID_SEEDS if args.grid else (1,))
    envs = g.parse_ints(args.envs, "--envs") if args.envs else (
        g.GRID_ENVS if args.grid else (4,))
    rows = b.select_rows(args.rows) if args.rows is not None else list(
        g.GRID_ROWS if args.grid else b.ROW_NAMES)
    timesteps = args.timesteps
    if timesteps is None and len(seeds) * len(envs) == 1 and not args.grid:
        timesteps = 500_000
    repeats = args.repeats or (3 if args.grid else 5)
    placements = args.placements or (3 if args.grid else 1)
    return rows, g.plan(seeds, envs, timesteps), repeats, placements


def _meta(argv: list) -> dict:
    import jax

    from vccc_jax.runs.provenance import git_revision

    git = git_revision()
    rev = "?" if git["rev"] is None else git["rev"][:10] + ("+dirty" if git["dirty"] else "")
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["vccc", "bench", "train", *argv]), "jax": jax.__version__,
            "platform": jax.devices()[0].platform, "cpus": os.cpu_count(), "git": rev}


def train(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import train as b
    from vccc_jax.benchmarks import train_grid as g
    from vccc_jax.commands.common import output_file
    from vccc_jax.train.config import TrainConfig

    args = train_parser().parse_args(argv)
    if args.continuous:
        return _continuous(args)
    rows, cells, repeats, placements = settings(args)
    for cell in cells:  # the trainer's own validation, before anything compiles
        for name in rows:
            if name != "reference":
                TrainConfig(total_timesteps=cell.timesteps, num_seeds=cell.seeds,
                            num_envs=cell.envs, actor=args.actor, **b.ROWS[name])
    if (args.resume or args.docs) and not args.out:
        raise ValueError("--resume and --docs need --out (the record they read)")
    if args.out:
        output_file(args.out, "--out")
    if args.docs:
        page = Path(args.docs)
        if not page.is_file():
            raise ValueError(f"--docs {page}: no such file")
        g.with_block(page.read_text(), [])  # the markers are there (checked before running)
    baseline = []
    if args.baseline:
        if not Path(args.baseline).is_file():
            raise ValueError(f"--baseline {args.baseline}: no such file")
        baseline = g.read_record(args.baseline)

    def bench() -> int:
        meta = _meta(argv)
        done = {g.key(r): r for r in g.read_record(args.out)} if args.resume else {}
        _out(f"# vccc bench train: CartPole-v1, {len(cells)} cell(s) (seeds x envs x 128 steps)"
             f", rows {','.join(rows)}, best of {repeats} round-robin rounds, median of "
             f"{placements} placement(s); jax "
             f"{meta['jax']} on {meta['platform']}, {meta['cpus']} CPUs, git {meta['git']}, "
             "load average " + "/".join(f"{x:.1f}" for x in os.getloadavg()))
        records = []
        for i, cell in enumerate(cells):
            what = (f"{cell.seeds} seed(s) x {cell.envs} envs, {cell.updates} updates "
                    f"({cell.timesteps:,} env steps/seed)")
            probe = dict(seeds=cell.seeds, envs=cell.envs, updates=cell.updates,
                         rows=[r.split(" ")[0] for r in rows], repeats=repeats, actor=args.actor,
                         placements=placements, placement=g.PLACEMENT)
            if g.key(probe) in done:
                _err(f"# cell {i + 1}/{len(cells)}: {what}: in {args.out}, skipped (--resume)")
                records.append(done[g.key(probe)])
                continue
            _err(f"# cell {i + 1}/{len(cells)}: {what}: compiling")
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            prepared = b.prepare(rows, cell.seeds, cell.timesteps, actor=args.actor,
                                 progress=_err, num_envs=cell.envs, warm=len(cells) == 1,
                                 placements=placements)
            _err(f"# cell {i + 1}/{len(cells)}: timing, best of {repeats} x {placements} "
                 "placement(s)")
            results = b.time_rows(prepared, repeats)
            rec = g.make_record(cell, results, repeats=repeats, placements=placements,
                                actor=args.actor,
                                load_start=load0, load_end=os.getloadavg()[0],
                                meta=dict(meta, wall_s=time.perf_counter() - t0))
            if args.out:
                g.append_record(args.out, rec)
            records.append(rec)
            _out(f"\n## {what}\n{b.format_table(results)}"
                 + b.footer(results, ref_target=g.REF_TARGET.get(cell.seeds, 1.1)))
        if len(cells) > 1:
            _out("\n" + g.format_grid(records))
        _out("\n" + g.format_checks(records))
        versus = g.compare(records, baseline)
        if versus:
            _out(versus)
        if args.docs:
            page = Path(args.docs)
            page.write_text(g.with_block(page.read_text(), g.newest(g.read_record(args.out)),
                                         baseline))
            _out(f"\nwritten: the bench-train block of {page}")
        return 0

    return bench
