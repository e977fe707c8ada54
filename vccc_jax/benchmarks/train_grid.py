"""``vccc bench train --grid``: the trainer rows at several seed and env counts (issue 28).

A grid is a list of cells (seeds, envs); every cell is one ``vccc bench train`` measurement
(:mod:`vccc_jax.benchmarks.train`: rows compiled cold one after the other, then timed
round-robin, best of ``--repeats`` per placement, median over ``--placements`` compiles of
the program, each with its own input state, wall and process CPU time) at ``envs`` envs x 128 steps
and ``seeds`` vmapped seeds. The issue's grid (``--grid``):

  rows   reference (the in-process PureJaxRL-style PPO), sync-gae (``fixed:0``, K = 1),
         lag8-vccc (``uniform:7``, K = 8, VCCC critic), lag32-vtrace (``uniform:31``,
         K = 32, V-trace critic)
  cells  1 and 8 seeds x 4, 64 and 512 envs

Each cell runs a whole number of updates (:data:`UPDATES`: chosen so that a timed sync-gae
run takes about 1-3 s on the project's 2-core CPU; lagged rows take longer where they are
slower); the table records updates and env steps per seed. Cells are measured and recorded
one at a time: ``--out FILE.jsonl`` gets one JSON line per finished cell (an interrupted grid
loses only the cell it was in; ``--resume`` skips cells FILE already holds with the same
settings), and ``--docs FILE.md`` rewrites the block between FILE's ``bench-train`` markers
with the table of the newest record of every cell (:func:`with_block`).

Targets (issue 28): lag8-vccc and lag32-vtrace within 10% of sync-gae (>= 0.90x its env
steps/s) in every cell; sync-gae >= 1.0x the reference at 1 seed and >= 1.1x at 8 seeds;
compile time (cold) no worse than before. The footer checks each in wall clock and in CPU
time (on a shared machine the CPU-time ratio is the steadier one); the compile target needs
the record of a run on the code before (``--baseline OLD.jsonl``: :func:`compare`, new / old
per row, median over the cells).

Pure: rows in, strings out; flags and printing live in :mod:`vccc_jax.commands.bench`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from vccc_jax.benchmarks.train import Timing

NUM_STEPS = 128
GRID_ROWS = ("reference", "sync-gae", "lag8-vccc", "lag32-vtrace")
GRID_SEEDS = (1, 8)
GRID_ENVS = (4, 64, 512)
#: updates per (seeds, envs) cell of the issue's grid: ~1-2 CPU seconds per timed sync-gae
#: run on the project's 2-core CPU (sync-gae used 110-170k env steps per CPU second at 1x4,
#: 1x64 and 8x512 on 2026-12-02). 8 seeds x 512 envs is one update (524,288 env steps,
#: ~4.5 CPU s): no whole number of updates is shorter. Other cells: :func:`default_updates`
UPDATES = {(1, 4): 256, (1, 64): 32, (1, 512): 4, (8, 4): 32, (8, 64): 4, (8, 512): 1}
#: env steps per CPU second assumed by :func:`default_updates` for cells not in UPDATES
_ASSUMED_STEPS_PER_S = 1.2e5
#: the targets: lagged rows vs sync-gae, and sync-gae vs the reference by seed count
LAG_ROWS = ("lag8-vccc", "lag32-vtrace")
LAG_TARGET = 0.90
REF_TARGET = {1: 1.0, 8: 1.1}
BEGIN, END = "<!-- bench-train:begin -->", "<!-- bench-train:end -->"


class Cell(NamedTuple):
    seeds: int
    envs: int
    updates: int

    @property
    def timesteps(self) -> int:
        """Env steps per seed (whole updates of envs x 128 steps)."""
        return self.updates * self.envs * NUM_STEPS


def default_updates(seeds: int, envs: int) -> int:
    """Updates of a cell: :data:`UPDATES`, else ~1.5 s at :data:`_ASSUMED_STEPS_PER_S`."""
    if (seeds, envs) in UPDATES:
        return UPDATES[(seeds, envs)]
    return max(1, round(1.5 * _ASSUMED_STEPS_PER_S / (seeds * envs * NUM_STEPS)))


def plan(seeds: Sequence[int], envs: Sequence[int],
         timesteps: Optional[int] = None) -> list[Cell]:
    """The cells, seeds outer, envs inner. ``timesteps`` (env steps per seed) overrides
    :func:`default_updates`, rounded down to whole updates; ValueError when that is less
    than one update of a cell."""
    cells = []
    for s in seeds:
        for e in envs:
            if timesteps is None:
                n = default_updates(s, e)
            else:
                n = timesteps // (e * NUM_STEPS)
                if n < 1:
                    raise ValueError(f"--timesteps {timesteps} is less than one update "
                                     f"({e} envs x {NUM_STEPS} steps = {e * NUM_STEPS})")
            cells.append(Cell(s, e, n))
    return cells


def parse_ints(text: str, flag: str) -> tuple[int, ...]:
    """``"1,8"`` -> (1, 8): positive integers, no repeats; else ValueError naming ``flag``."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{flag} {text!r}: expected comma-separated positive integers")
    values = tuple(int(p) for p in parts)
    if len(set(values)) != len(values):
        raise ValueError(f"{flag} {text!r}: a value is repeated")
    return values


# -- the record: one JSON line per measured cell ---------------------------------------


# What a placement is in the records written now (``benchmarks.train.prepare``: a fresh
# compile with its own input state); records without the field copied the input state.
PLACEMENT = "compile"


def key(rec: dict) -> tuple:
    """What makes two records the same measurement (resume skips a cell with this key)."""
    return (rec["seeds"], rec["envs"], rec["updates"], tuple(rec["rows"]), rec["repeats"],
            rec["actor"], rec.get("placements", 1), rec.get("placement", "copy"))


def make_record(cell: Cell, timings: Sequence[Timing], *, repeats: int, actor: str,
                load_start: float, load_end: float, meta: dict, placements: int = 1) -> dict:
    """One cell's JSON record: the cell, settings, loads (1-minute average at start and end)
    and every row's timing; ``meta``: date, command, jax version, host, git revision..."""
    return dict(meta, seeds=cell.seeds, envs=cell.envs, updates=cell.updates,
                num_steps=NUM_STEPS, timesteps=cell.timesteps, repeats=repeats,
                placements=placements, placement=PLACEMENT, actor=actor,
                rows=[t.name.split(" ")[0] for t in timings], load_start=load_start,
                load_end=load_end, timings=[t._asdict() for t in timings])


def timings(rec: dict) -> list[Timing]:
    return [Timing(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()})
            for t in rec["timings"]]


def read_record(path: str | os.PathLike) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def append_record(path: str | os.PathLike, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def newest(records: Sequence[dict]) -> list[dict]:
    """The newest record of every (seeds, envs) cell (later lines win), seeds then envs."""
    last = {(r["seeds"], r["envs"]): r for r in records}
    return [last[k] for k in sorted(last)]


# -- ratios and targets ------------------------------------------------------------------


def _by_name(rec: dict) -> dict:
    return {t.name.split(" ")[0]: t for t in timings(rec)}


def ratio(a: Timing, b: Timing, cpu: bool = False) -> Optional[float]:
    """env steps/s of ``a`` over ``b``: wall clock, or (``cpu``) process CPU time."""
    if cpu:
        if a.cpu_s is None or b.cpu_s is None:
            return None
        return a.cpu_steps_per_s / b.cpu_steps_per_s
    return a.steps_per_s / b.steps_per_s


def _pair(a: Timing, b: Optional[Timing]) -> str:
    if b is None or a is b:
        return "1.00x" if a is b else "-"
    cpu = ratio(a, b, cpu=True)
    return f"{ratio(a, b):.2f}x / " + ("-" if cpu is None else f"{cpu:.2f}x")


def format_grid(records: Sequence[dict]) -> str:
    """A markdown table: one line per (cell, row): env steps/s, the ratios (wall / CPU) vs
    sync-gae and vs the reference, cold compile s, run s wall and CPU (medians over the
    placements; the CPU column adds the placements' range, the noise a ratio has to beat),
    final return."""
    lines = ["| seeds | envs | updates (steps/seed) | row | env steps/s (wall) | vs sync-gae "
             "(wall / CPU) | vs reference (wall / CPU) | compile s | run s | cpu s "
             "(placements' range) | final return |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rec in records:
        by = _by_name(rec)
        sync, ref = by.get("sync-gae"), by.get("reference")
        for name, t in by.items():
            cpu = "-" if t.cpu_s is None else f"{t.cpu_s:.2f}"
            if t.placement_cpu_s:
                cpu += f" ({min(t.placement_cpu_s):.2f}-{max(t.placement_cpu_s):.2f})"
            lines.append(
                f"| {rec['seeds']} | {rec['envs']} | {rec['updates']} ({rec['timesteps']:,}) "
                f"| {name} | {t.steps_per_s / 1e3:,.1f}k | {_pair(t, sync)} | {_pair(t, ref)} "
                f"| {t.compile_s:.1f} | {t.run_s:.2f} | {cpu} | {t.final_return:.1f} |")
    return "\n".join(lines)


class Check(NamedTuple):
    """One target: what, the worst value found (wall, CPU; None: not measured), where it
    was found, and whether it is met in wall clock and in CPU time."""

    what: str
    wall: Optional[float]
    cpu: Optional[float]
    where: str
    target: float

    @property
    def met(self) -> tuple[Optional[bool], Optional[bool]]:
        # (a relative 1e-9 slack: a ratio of exactly the target is met despite float rounding)
        return tuple(None if v is None else v >= self.target * (1 - 1e-9)
                     for v in (self.wall, self.cpu))


def _worst(what: str, pairs: list[tuple[str, Timing, Timing]], target: float) -> Check:
    walls = [(ratio(a, b), where) for where, a, b in pairs]
    cpus = [(ratio(a, b, cpu=True), where) for where, a, b in pairs]
    cpus = [c for c in cpus if c[0] is not None]
    wall, where = min(walls)
    cpu, cwhere = min(cpus) if cpus else (None, "")
    where = where if not cpus or cwhere == where else f"wall {where}, CPU {cwhere}"
    return Check(what, wall, cpu, where, target)


def checks(records: Sequence[dict]) -> list[Check]:
    """The issue-28 targets over the cells: the worst cell of each (no line for a target
    whose rows were not run)."""
    out = []
    for lag in LAG_ROWS:
        pairs = [(f"{r['seeds']}x{r['envs']}", by[lag], by["sync-gae"])
                 for r in records for by in [_by_name(r)] if lag in by and "sync-gae" in by]
        if pairs:
            out.append(_worst(f"{lag} vs sync-gae", pairs, LAG_TARGET))
    for seeds, target in REF_TARGET.items():
        pairs = [(f"{r['seeds']}x{r['envs']}", by["sync-gae"], by["reference"])
                 for r in records if r["seeds"] == seeds
                 for by in [_by_name(r)] if "sync-gae" in by and "reference" in by]
        if pairs:
            out.append(_worst(f"sync-gae vs reference, {seeds} seed(s)", pairs, target))
    return out


def _mark(ok: Optional[bool]) -> str:
    return "-" if ok is None else "met" if ok else "NOT met"


def format_checks(records: Sequence[dict]) -> str:
    """The targets, worst cell first-hand, then the cold compile seconds of every row
    (largest over the cells) for the compile-time target."""
    lines = ["targets (worst cell; wall clock / CPU time):"]
    for c in checks(records):
        wm, cm = c.met
        cpu = "-" if c.cpu is None else f"{c.cpu:.2f}x"
        lines.append(f"  {c.what}: {c.wall:.2f}x / {cpu} at {c.where} (target >= "
                     f"{c.target:.2f}x): {_mark(wm)} / {_mark(cm)}")
    worst: dict = {}
    for rec in records:
        for name, t in _by_name(rec).items():
            if t.compile_s > worst.get(name, (0.0, ""))[0]:
                worst[name] = (t.compile_s, f"{rec['seeds']}x{rec['envs']}")
    lines.append("  compile s (cold, largest cell): " + ", ".join(
        f"{n} {s:.1f} ({w})" for n, (s, w) in worst.items()) + " -- target: no worse than "
        "the same command on the code before")
    return "\n".join(lines)


def _median(xs: list) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def compare(records: Sequence[dict], baseline: Sequence[dict]) -> str:
    """Every row against the same row and cell of a ``baseline`` record (its newest record
    per cell; e.g. the grid run on the code before a change): cold compile seconds and env
    steps/s (CPU time, wall clock) new / old, the median over the cells both hold and the
    range. The compile-time target ("no worse than before") is judged on the median, met
    at <= 1.00x. Empty when no cell is in both."""
    old = {(r["seeds"], r["envs"]): _by_name(r) for r in newest(baseline)}
    found: dict = {}
    for rec in records:
        before = old.get((rec["seeds"], rec["envs"]), {})
        for name, t in _by_name(rec).items():
            if name in before:
                b = before[name]
                cpu = ratio(t, b, cpu=True)
                found.setdefault(name, []).append(
                    (t.compile_s / b.compile_s, ratio(t, b), float("nan") if cpu is None else cpu))
    if not found:
        return ""

    def spread(xs):
        return f"{_median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]"

    lines = ["against the baseline record (new / old; median [range] over the cells in both):"]
    for name, rs in found.items():
        comp, wall, cpu = ([r[i] for r in rs] for i in range(3))
        lines.append(f"  {name} ({len(rs)} cells): compile {spread(comp)} "
                     f"({'met' if _median(comp) <= 1.0 else 'NOT met'}: <= 1.00x), env steps/s "
                     f"CPU {spread(cpu)}, wall {spread(wall)}")
    return "\n".join(lines)


# -- the docs block ---------------------------------------------------------------------


def _loads(records: Sequence[dict]) -> str:
    vals = [v for r in records for v in (r["load_start"], r["load_end"])]
    return f"{min(vals):.1f}-{max(vals):.1f}" if vals else "-"


_PLACEMENT = {"compile": "compiles of a row's program, each with its own input state",
              "copy": "copies of a row's input state at fresh addresses"}


def _placements(records: Sequence[dict]) -> str:
    """How many placements the records' rows had, and what a placement was: records before
    2026-12-03 copied the input state; newer ones compile the program again as well."""
    kinds = sorted({(r.get("placements", 1), r.get("placement", "copy")) for r in records})
    return "; ".join(f"{n} placement(s) ({_PLACEMENT[k]})" for n, k in kinds)


def block(records: Sequence[dict], baseline: Sequence[dict] = ()) -> str:
    """The generated docs block: date, command, jax version, machine, load, the table and the
    targets of the newest record of every cell (and :func:`compare` with ``baseline``)."""
    if not records:
        return "(no `vccc bench train` record yet)"
    dates = sorted({r.get("date", "")[:10] for r in records})
    commands = sorted({r.get("command", "") for r in records})
    jaxes = sorted({str(r.get("jax", "?")) for r in records})
    hosts = sorted({f"{r.get('platform', '?')}, {r.get('cpus', '?')} CPUs" for r in records})
    revs = sorted({str(r.get("git", "?")) for r in records})
    wall = sum(r.get("wall_s", 0.0) for r in records)
    head = (f"Generated by `vccc bench train ... --out <record>.jsonl --docs <this file>` from the "
            f"newest record of every cell; do not edit by hand. Measured {', '.join(dates)} "
            f"on {'; '.join(hosts)} (jax {', '.join(jaxes)}, git {', '.join(revs)}), "
            f"1-minute load average {_loads(records)} over the cells, {wall / 60:.1f} min wall "
            f"for these cells (compiles included). Command: "
            + "; ".join(f"`{c}`" for c in commands)
            + f". CartPole-v1, envs x {NUM_STEPS} steps, 4 epochs x 4 minibatches, 64-unit tanh "
            "MLPs; rows compiled cold one after the other, then timed round-robin (odd rounds "
            f"reversed), best of the repeats on each of {_placements(records)}; one "
            "program's best times differ by up to ~10% from one compile or copy to "
            "another, so a row's time is the median over its placements; env steps of all seeds "
            "counted; ratios are env steps/s over the named row's, in wall clock and in process "
            "CPU time.")
    loads = [v for r in records for v in (r["load_start"], r["load_end"])]
    cpus = min((r.get("cpus") or 0) for r in records)
    if cpus and max(loads) > cpus:
        head += (f" The load exceeded the {cpus} CPUs: the wall clock measured waiting for a "
                 "core, so read the CPU-time ratios.")
    versus = compare(records, baseline)
    if versus:
        base = sorted({f"{r.get('date', '')[:10]}, git {r.get('git', '?')}" for r in baseline})
        head += f" Baseline: the record of {'; '.join(base)}."
    checks_text = format_checks(records) + (f"\n{versus}" if versus else "")
    return f"{head}\n\n{format_grid(records)}\n\n```\n{checks_text}\n```"


def with_block(text: str, records: Sequence[dict], baseline: Sequence[dict] = ()) -> str:
    """``text`` (a docs page) with :func:`block` between the ``bench-train`` markers;
    ValueError when the markers are missing."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {BEGIN} ... {END} markers to put the table between")
    return text[: i + len(BEGIN)] + "\n" + block(records, baseline) + "\n" + text[j:]
