"""``vccc bench estimators | tabular | train | scale | routes | device | commands | counts``: flags and
printing of the benchmarks.

    vccc bench estimators [--quick] [--reps N] [--sizes T,B ...] [--ceiling-mib M]
                          [--tuned-malloc] [--host-devices N]
    vccc bench tabular    [--repeats N] [--min-time S] [--small]
    vccc bench train      [--seeds 1,8] [--envs 4,64,512] [--grid] [--timesteps N] [--repeats N]
                          [--rows a,b] [--out F.jsonl [--resume] [--docs F.md]] [--continuous]
    vccc bench scale      [...]   (flags: ``vccc bench scale --help``)
    vccc bench routes     [--updates N] [--seeds N] [--repeats N] [--routes a,b] [--lag L] ...
    vccc bench device     [--out DIR] [--small | --full] [--sections a,b] [--budget S]
    vccc bench commands   [--group start|comparators|all] [--only a,b] [--out FILE.md]
                          [--readme FILE.md]
    vccc bench mutants    [--only a,b] [--jobs N] [--fast | --tests-only] [--out DIR] [--list]
    vccc bench counts     (docs/counts.json and every marked count in README.md, docs/*.md)

The measurements are :mod:`vccc_jax.benchmarks` (layer 5: rows and strings, no printing);
this module parses, validates, prints the header before the (long) measurements, progress
lines while they run, and the table after. Bad input: one line ``vccc bench: <what is
wrong>`` on stderr and exit status 2 (:mod:`vccc_jax.commands.common`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

from vccc_jax.commands.bench_async import bench_async
from vccc_jax.commands.bench_train import train, train_parser  # noqa: F401
from vccc_jax.commands.common import Parser, UsageError, fail, guarded

PROG = "vccc bench"
SUMMARY = {
    "estimators": "V-trace throughput against rlax and a memory-bandwidth ceiling",
    "tabular": "exact V^pi for batches of MDPs against NumPy",
    "train": "env steps/s of the full trainer, lagged VCCC vs synchronous GAE",
    "scale": "the sharded trainer at 1, 2, 4, 8 ... devices (weak and strong scaling)",
    "routes": "decoupled pi_old routes: trainer speed, compiled memory, extra state vs exact",
    "device": "everything a GPU/TPU host should measure, in one run: JSON + table in --out",
    "commands": "wall and CPU time of the documented vccc commands, with the load",
    "mutants": "which checks (verify, module tests) catch realistic one-line bugs",
    "counts": "the counts the docs state (tests, verify rows) into docs/counts.json and the docs",
    "async": "env steps/s of vccc train --async against the synchronous trainer",
}


def usage() -> str:
    rows = "\n".join(f"  {name:<11} {text}" for name, text in SUMMARY.items())
    return (f"usage: {PROG} {{{'|'.join(SUMMARY)}}} [ARGS]  (NAME --help for its flags)\n\n"
            f"benchmarks:\n{rows}\n")


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


_nonnegative_int.__name__ = "non-negative int"


def _size(text: str) -> tuple[int, int]:
    """``T,B`` -> (T, B), both positive."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected T,B (two positive integers), got {text!r}")
    return int(parts[0]), int(parts[1])


def _dtypes(text: str) -> list[str]:
    """``float32,float64`` -> ["float32", "float64"] (each at most once, at least one)."""
    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names or any(d not in ("float32", "float64") for d in names) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of float32,float64, got {text!r}")
    return names


def _out(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# estimators
# --------------------------------------------------------------------------------------


def estimators_parser() -> Parser:
    from vccc_jax.benchmarks import estimators as b

    p = Parser(prog=f"{PROG} estimators", description=b.__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"small sizes {b.QUICK_SIZES}")
    p.add_argument("--reps", type=_nonnegative_int, default=None,
                   help="timed repetitions (median)")
    p.add_argument("--sizes", nargs="+", type=_size, default=None, metavar="T,B",
                   help="override the (T, B) list, e.g. --sizes 128,4096 512,65536")
    p.add_argument("--ceiling-mib", type=_nonnegative_int, default=None,
                   help="buffer size of the bandwidth ceiling measurement (MiB)")
    p.add_argument("--dtypes", type=_dtypes, default=["float32", "float64"],
                   help="comma-separated precisions, each a full set of tables "
                        "(default float32,float64)")
    p.add_argument("--no-targets", action="store_true",
                   help="V-trace only (skip GAE and the one-step targets)")
    p.add_argument("--crossover", action="store_true",
                   help="also time the loop against the associative scan over a (T, B) grid")
    p.add_argument("--host-devices", type=_nonnegative_int, default=1, metavar="N",
                   help="also time vtrace / vtrace_inplace with the batch split over N "
                        "forced host CPU devices (rows ours-Ndev, inpl-Ndev)")
    p.add_argument("--tuned-malloc", action="store_true",
                   help="keep freed host memory (train.host_malloc.keep_freed_memory: one "
                        "glibc arena, no mmap, no trim) before JAX starts")
    return p


def _force_host_devices(n: int) -> None:
    """XLA_FLAGS for n CPU devices, before JAX starts (a count already there must be >= n)."""
    import jax

    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    if len(jax.devices()) < n:
        raise ValueError(f"--host-devices {n}: JAX sees {len(jax.devices())} devices "
                         f"(XLA_FLAGS={os.environ['XLA_FLAGS']!r})")


def estimators(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import estimators as b

    args = estimators_parser().parse_args(argv)
    sizes, reps, ceiling_mib = b.settings(args.quick, args.reps, args.sizes, args.ceiling_mib)
    if args.tuned_malloc:
        from vccc_jax.train.host_malloc import keep_freed_memory

        keep_freed_memory()  # before JAX runs anything; False (unchanged) off glibc
    if args.host_devices > 1:
        _force_host_devices(args.host_devices)

    dtypes = args.dtypes

    def bench() -> int:
        rlax = b.load_rlax()
        fns = b.build_functions(rlax, args.host_devices)
        tfns = None if args.no_targets else b.build_target_functions(rlax)
        names = list(fns)
        _out(b.header(reps, rlax is not None))
        ceiling = b.measure_ceiling(ceiling_mib * 2**20, reps=max(reps, 5))
        per_row = b.Ceiling(ceiling_mib * 2**20)
        for dtype in dtypes:
            ceiling_mts = ceiling / b.bytes_per_transition(dtype) / 1e6
            _out(b.ceiling_line(ceiling, ceiling_mib, dtype))
            rows = b.run_sizes(fns, sizes, reps, progress=_out, dtype=dtype, tfns=tfns,
                               ceiling=per_row)
            _out(f"V-trace, {dtype} (%ceil: each row's own ceiling, ceil GB/s):")
            _out(b.format_table(rows, names, ceiling_mts, dtype))
            _out(b.footer(rows, ceiling_mts, rlax is not None, dtype))
            if tfns:
                _out(f"GAE and one-step targets, {dtype}:")
                _out(b.format_targets(rows, {k: a for k, (_, a) in tfns.items()}, ceiling,
                                      dtype))
        if args.crossover:
            _out("loop vs associative scan (float32):")
            _out(b.format_crossover(b.crossover(reps, progress=_out)))
        _out(f"load average at end: {os.getloadavg()[0]:.1f}")
        return 0

    return bench


# --------------------------------------------------------------------------------------
# tabular
# --------------------------------------------------------------------------------------


def tabular_parser() -> Parser:
    from vccc_jax.benchmarks import tabular as b

    p = Parser(prog=f"{PROG} tabular", description=b.__doc__.split("\n")[0])
    p.add_argument("--repeats", type=_positive(int), default=5)
    p.add_argument("--min-time", type=_positive(float), default=0.2,
                   help="seconds per timing round")
    p.add_argument("--small", action="store_true", help="tiny sizes (smoke test)")
    return p


def tabular(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import tabular as b

    args = tabular_parser().parse_args(argv)
    sizes = b.SMALL_SIZES if args.small else b.SIZES

    def bench() -> int:
        _out(b.header())
        rows = b.run(sizes, repeats=args.repeats, min_time=args.min_time)
        _out(b.format_rows(rows))
        _out(b.footer())
        return 0

    return bench


# --------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------


# (flags and printing: vccc_jax/commands/bench_train.py)


# --------------------------------------------------------------------------------------
# scale
# --------------------------------------------------------------------------------------


def scale_parser() -> Parser:
    from vccc_jax.benchmarks import scale as b

    p = Parser(prog=f"{PROG} scale", description=b.__doc__.split("\n\n")[0])
    for flag, kind, default, help_ in b.FLAGS:
        p.add_argument(flag, type=_positive(kind) if kind is int and default else kind,
                       default=default, help=f"{help_} (default {default})")
    p.add_argument("--fsdp", action="store_true", help="shard params over the data axis")
    p.add_argument("--small", action="store_true",
                   help="a CPU / test size: " + ", ".join(f"--{k.replace('_', '-')} {v}"
                                                          for k, v in b.SMALL.items()))
    p.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    from vccc_jax.commands.train import add_distributed_flags

    add_distributed_flags(p)
    return p


def scale(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.commands.train import start_distributed

    start_distributed(argv)  # multi-host: before anything touches a jax backend
    import jax

    from vccc_jax.benchmarks import scale as b

    parser = scale_parser()
    args = parser.parse_args(argv)
    if args.small:
        given = {a.dest for a in parser._actions
                 if any(opt in argv or any(x.startswith(opt + "=") for x in argv)
                        for opt in a.option_strings)}
        b.apply_small(args, given)
    avail = jax.device_count()
    try:
        todo, skipped = b.plan(args, avail, jax.process_count())
    except ValueError as err:
        raise UsageError(str(err)) from None
    main = jax.process_index() == 0

    def bench() -> int:
        import json

        device = jax.devices()[0]
        say = _out if main else (lambda line: None)
        say(b.header(args, avail, device, jax.process_count(), jax.__version__))
        for line in skipped:
            say(line)
        rows = [b.measure(args, regime, n, envs, progress=_err if main else None)
                for regime, n, envs in todo]
        say(b.format_table(rows))
        say(b.loops_footer(rows, args))
        if args.json and main:
            with open(args.json, "w") as f:
                json.dump(b.as_json(rows, args, device, jax.process_count(), jax.__version__),
                          f, indent=1)
        return 0

    return bench


# --------------------------------------------------------------------------------------
# routes
# --------------------------------------------------------------------------------------


def routes_parser() -> Parser:
    from vccc_jax.benchmarks import routes as b

    d = b.DEFAULTS
    p = Parser(prog=f"{PROG} routes", description=b.__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=_positive(int), default=50, help="updates per run (default 50)")
    p.add_argument("--seeds", type=_positive(int), default=1, help="vmapped seeds (default 1)")
    p.add_argument("--repeats", type=_positive(int), default=3,
                   help="round-robin rounds; each route's best run is kept (default 3)")
    p.add_argument("--routes", default=",".join(b.ROW_NAMES),
                   help="comma-separated subset of: " + ",".join(b.ROW_NAMES))
    p.add_argument("--env", default=d["env"])
    p.add_argument("--num-envs", type=_positive(int), default=d["num_envs"])
    p.add_argument("--num-steps", type=_positive(int), default=d["num_steps"])
    p.add_argument("--update-epochs", type=_positive(int), default=d["update_epochs"])
    p.add_argument("--num-minibatches", type=_positive(int), default=d["num_minibatches"])
    p.add_argument("--hidden", type=_positive(int), default=d["hidden"])
    p.add_argument("--lag", default=d["lag"], help=f"lag law (default {d['lag']})")
    p.add_argument("--num-versions", type=_positive(int), default=d["num_versions"])
    p.add_argument("--sampler", default=d["sampler"], help=f"default {d['sampler']!r}")
    p.add_argument("--actor", default=d["actor"])
    p.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    return p


def routes(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import routes as b

    args = routes_parser().parse_args(argv)
    wanted = b.select_rows(args.routes)
    over = dict(env=args.env, num_envs=args.num_envs, num_steps=args.num_steps,
                update_epochs=args.update_epochs, num_minibatches=args.num_minibatches,
                hidden=args.hidden, lag=args.lag, num_versions=args.num_versions,
                sampler=args.sampler, actor=args.actor)
    for name in wanted:  # the trainer's own validation, before anything compiles
        b.config(name, args.updates, args.seeds, **over)

    def bench() -> int:
        import json

        _out(b.header(args.updates, args.seeds, args.repeats, **over))
        prepared = b.prepare(wanted, args.updates, args.seeds, progress=_err, **over)
        rows = b.measure(prepared, args.repeats)
        _out(b.format_table(rows))
        _out(b.footer())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(b.as_rows(rows), f, indent=1)
        return 0

    return bench


# --------------------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------------------


def device_parser() -> Parser:
    from vccc_jax.benchmarks import device as b

    p = Parser(prog=f"{PROG} device", description=b.__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/bench/device",
                   help="directory for device.json and device.md (default results/bench/device)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", default=None,
                      help="small sizes (the default on CPU): a smoke test of the script")
    size.add_argument("--full", dest="small", action="store_false",
                      help="full sizes even on CPU")
    p.add_argument("--sections", default=None,
                   help="comma-separated subset of: " + ",".join(b.SECTIONS))
    p.add_argument("--budget", type=_positive(float), default=b.BUDGET_S,
                   help=f"seconds for the whole run (default {b.BUDGET_S:.0f})")
    return p


def device(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import device as b

    args = device_parser().parse_args(argv)
    sections = b.select(args.sections)

    def bench() -> int:
        result = b.run(args.out, small=args.small, sections=sections, budget_s=args.budget,
                       log=_err)
        _out(b.format_report(result))
        _out(f"\nwritten: {args.out}/device.json, {args.out}/device.md")
        return 0

    return bench


# --------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------


def commands_parser() -> Parser:
    from vccc_jax.benchmarks import commands as b

    p = Parser(prog=f"{PROG} commands", description=b.__doc__.split("\n\n")[0])
    p.add_argument("--group", choices=(*b.GROUPS, "all"), default="start",
                   help="which rows (default: start, a newcomer's first commands)")
    p.add_argument("--only", default=None,
                   help="comma-separated rows instead: " + ",".join(r.name for r in b.ROWS))
    p.add_argument("--out", default=None,
                   help="append the measurements to FILE's .jsonl record and rewrite FILE.md "
                        "from the newest of every row (docs/command_times.md)")
    p.add_argument("--readme", default=None,
                   help="also put that table between the command-times markers of this file")
    p.add_argument("--timeout", type=_positive(float), default=None,
                   help="seconds per command (default: none)")
    return p


def commands(argv: list[str]) -> Callable[[], int]:
    from pathlib import Path

    from vccc_jax.benchmarks import commands as b
    from vccc_jax.commands.common import output_file

    args = commands_parser().parse_args(argv)
    rows = b.select(args.only, None if args.group == "all" else args.group)
    if args.out:
        output_file(args.out, "--out")
    if args.readme:
        readme = Path(args.readme)
        if not readme.is_file():
            raise ValueError(f"--readme {readme}: no such file")
        if not args.out:
            raise ValueError("--readme needs --out (the table comes from its record)")
        b.with_table(readme.read_text(), [])  # the markers are there (checked before running)

    def bench() -> int:
        _out(b.header())
        results = b.run(rows, progress=_err, timeout=args.timeout)
        _out(b.format_table(results))
        _out(b.footer(results))
        if args.out:
            record = b.record_path(args.out)
            b.append_record(record, results)
            shown = b.newest(b.read_record(record))
            Path(args.out).write_text(b.page(shown))
            if args.readme:
                readme = Path(args.readme)
                readme.write_text(b.with_table(readme.read_text(), shown))
        return 0 if all(r["returncode"] == 0 for r in results) else 1

    return bench


# --------------------------------------------------------------------------------------
# mutants
# --------------------------------------------------------------------------------------


def mutants_parser() -> Parser:
    from vccc_jax.benchmarks import mutants as b

    p = Parser(prog=f"{PROG} mutants", description=b.__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="comma-separated mutant names (default: all)")
    p.add_argument("--jobs", type=_positive(int), default=1,
                   help="mutants judged at once, each in its own scratch copy (default 1)")
    p.add_argument("--fast", action="store_true",
                   help="skip vccc verify for a mutant its module tests already caught")
    p.add_argument("--tests-only", action="store_true",
                   help="never run vccc verify (a later run without it fills that column in)")
    p.add_argument("--out", default="results/mutants",
                   help="mutants.json (kept: a re-run skips judged mutants) and mutants.md")
    p.add_argument("--timeout", type=_positive(float), default=1800.0,
                   help="seconds per check before it counts as a timeout (default 1800)")
    p.add_argument("--list", action="store_true", help="list the mutants and their test files")
    return p


def mutants(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import mutants as b
    from vccc_jax.commands.common import check_output_dir

    args = mutants_parser().parse_args(argv)
    chosen = b.select(args.only)
    for m in chosen:  # every snippet occurs exactly once, every mutant has tests
        b.check_mutant(m)
        b.test_files(m)
    out = check_output_dir(args.out, "--out")

    def bench() -> int:
        if args.list:
            for m in chosen:
                _out(f"{m.name:<34} {m.file:<36} {' '.join(b.test_files(m))}")
            return 0
        fast = None if args.tests_only else args.fast
        records = b.run(chosen, out, jobs=args.jobs, fast=fast, timeout=args.timeout,
                        progress=_err)
        _out(b.format_table(records))
        _out(f"\nwritten: {out}/mutants.json, {out}/mutants.md")
        return 0

    return bench


def counts(argv: list[str]) -> Callable[[], int]:
    from vccc_jax.benchmarks import counts as b

    Parser(prog=f"{PROG} counts", description=b.__doc__.split("\n\n")[0]).parse_args(argv)

    def bench() -> int:
        rec = b.record(b.measure(progress=_err))
        changed = b.rewrite_docs(rec["counts"])
        for name, value in rec["counts"].items():
            _out(f"{name:>18}: {value}  ({b.NAMES[name]})")
        _out(f"written: {b.RECORD}" + "".join(f", {p}" for p in changed))
        return 0

    return bench


BENCHMARKS = {"estimators": estimators, "tabular": tabular, "train": train, "scale": scale,
              "routes": routes, "device": device, "commands": commands, "mutants": mutants,
              "counts": counts}
BENCHMARKS["async"] = bench_async  # issue 48: vccc train --async vs the synchronous trainer


@guarded("bench")
def main(argv: Optional[list[str]] = None):
    """``vccc bench NAME [ARGS]``; an unknown NAME: one line on stderr, exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in BENCHMARKS:
        got = repr(argv[0]) if argv else "nothing"
        return fail("bench", f"expected one of {', '.join(BENCHMARKS)}, got {got}")
    return BENCHMARKS[argv[0]](argv[1:])
