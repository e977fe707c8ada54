"""``vccc bench commands``: wall and CPU time of the documented ``vccc`` commands, with the load.

Every time the docs state for a command comes from this table, not from memory: each row runs
one command line as a fresh subprocess (``python -m vccc_jax.cli ...``, cold: a new
interpreter, imports and compiles included, results into an empty temporary directory so
nothing is resumed) and records

    wall s     elapsed time of the command
    CPU s      user + system CPU seconds of the command and its children (getrusage)
    CPU/wall   how many cores it kept busy on average (< 1: it waited for a shared CPU)
    load       the 1-minute load average at its start and end (os.getloadavg); on a
               shared machine wall time grows with the load, CPU time much less

Rows are grouped: ``start`` (the commands of a newcomer's first ten minutes: help, list,
verify, the smoke and default sweeps, the simulator, the Sec 3.4 demo, the README's first
``vccc train``, figures of one store) and ``comparators`` (the comparator studies). Run
``vccc bench commands --out docs/command_times.md`` to refresh the table the README cites.

Flags and printing live in :mod:`vccc_jax.commands.bench`; this module returns rows and
strings only.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]


class Row(NamedTuple):
    """One documented command: ``argv`` after ``vccc`` ({tmp} is the run's scratch dir)."""

    name: str
    group: str
    argv: tuple


ROWS = (
    Row("help", "start", ("--help",)),
    Row("list-critics", "start", ("list", "critics")),
    Row("verify-quick", "start", ("verify", "--quick")),
    Row("verify", "start", ("verify",)),
    Row("sweep-smoke", "start", ("sweep", "--config", "experiments/tabular_smoke.toml",
                                 "--results", "{tmp}/results", "--figures", "{tmp}/figures",
                                 "--no-progress")),
    Row("sweep-default", "start", ("sweep", "--results", "{tmp}/results", "--figures",
                                   "{tmp}/figures", "--no-progress")),  # = make sweep
    Row("figures-store", "start", ("figures", "--store", "{tmp}/results/tabular_default.jsonl",
                                   "--out", "{tmp}/figures")),
    Row("simulate", "start", ("simulate", "--config", "experiments/pipeline_default.toml",
                              "--compare")),
    Row("async-mc", "start", ("async-mc",)),
    Row("train-readme", "start", ("train", "--env", "CartPole-v1", "--lag", "geometric:8",
                                  "--critic", "vccc", "--actor", "centered-mask", "--seeds", "8",
                                  "--out", "{tmp}/train", "--quiet", "--no-figure")),
    Row("brace-tabular", "comparators", ("sweep", "--config", "experiments/brace_tabular.toml",
                                         "--results", "{tmp}/results", "--no-figures",
                                         "--no-progress")),
    Row("decoupled-routes", "comparators", ("sweep", "--config",
                                            "experiments/decoupled_routes.toml", "--results",
                                            "{tmp}/results", "--no-figures", "--no-progress")),
    Row("ps-ppo", "comparators", ("sweep", "--config", "experiments/ps_ppo.toml", "--results",
                                  "{tmp}/results", "--no-figures", "--no-progress")),
    Row("rac-bias-cut", "comparators", ("sweep", "--config", "experiments/rac_two_channel.toml",
                                        "--results", "{tmp}/results", "--no-figures",
                                        "--no-progress")),
    Row("rac-wallclock", "comparators", ("sweep", "--config", "experiments/rac_wallclock.toml",
                                         "--results", "{tmp}/results", "--no-figures",
                                         "--no-progress")),
)
GROUPS = ("start", "comparators")


def select(names: Optional[str] = None, group: Optional[str] = "start") -> list[Row]:
    """Rows named in ``names`` (comma-separated; any group), else those of ``group`` (None:
    all). Unknown names raise ValueError listing the known ones."""
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        known = {r.name: r for r in ROWS}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise ValueError(f"unknown command row(s) {unknown}; known: {', '.join(known)}")
        return [known[n] for n in wanted]
    if group is not None and group not in GROUPS:
        raise ValueError(f"--group must be one of {', '.join(GROUPS)}, got {group!r}")
    return [r for r in ROWS if group is None or r.group == group]


def command_line(row: Row) -> str:
    """The row as the docs write it (scratch paths shown relative: ``--results results``)."""
    return "vccc " + " ".join(a.replace("{tmp}/", "") for a in row.argv)


def measure(row: Row, tmp: Path, *, python: str = sys.executable,
            timeout: Optional[float] = None) -> dict:
    """Run one row as a subprocess in the repository root; its wall and CPU seconds, exit
    status, the load average before and after, and the last line of its stderr on failure."""
    argv = [a.replace("{tmp}", str(tmp)) for a in row.argv]
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "vccc_jax.cli", *argv], cwd=ROOT, timeout=timeout,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.strip().splitlines()
    return {"name": row.name, "group": row.group, "command": command_line(row),
            "wall_s": wall, "cpu_s": cpu, "returncode": proc.returncode,
            "load_start": load0, "load_end": os.getloadavg()[0],
            "error": err[-1] if proc.returncode and err else ""}


def run(rows: Sequence[Row], progress: Callable[[str], None] = lambda s: None,
        timeout: Optional[float] = None) -> list[dict]:
    """Measure ``rows`` in order, sharing one scratch directory (``figures-store`` draws
    the store ``sweep-default`` wrote)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="vccc_bench_commands_") as tmp:
        for row in rows:
            progress(f"{row.name}: {command_line(row)} ...")
            r = measure(row, Path(tmp), timeout=timeout)
            progress(f"{row.name}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
                     f"exit {r['returncode']}")
            out.append(r)
    return out


def header() -> str:
    now = _dt.datetime.now().astimezone().isoformat(timespec="minutes")
    return (f"vccc bench commands: {now}, {platform.node()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}; load average at start "
            + "/".join(f"{x:.1f}" for x in os.getloadavg()))


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of measured rows."""
    lines = ["| command | wall s | CPU s | CPU/wall | load start-end | exit |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["cpu_s"] / r["wall_s"] if r["wall_s"] > 0 else float("nan")
        lines.append(f"| `{r['command']}` | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{ratio:.2f} | {r['load_start']:.1f}-{r['load_end']:.1f} | "
                     f"{r['returncode']} |")
    return "\n".join(lines)


def footer(rows: Sequence[dict]) -> str:
    failed = [f"{r['name']}: {r['error']}" for r in rows if r["returncode"]]
    lines = ["Each command ran cold (fresh interpreter, imports and XLA compiles included, "
             "empty result directory). Wall time grows with the load on a shared machine; "
             "CPU time is the steadier number."]
    return "\n".join(lines + [f"FAILED {f}" for f in failed])
