"""``vccc bench commands``: wall and CPU time of the documented ``vccc`` commands, with the load.

Every time the docs state for a command comes from this table, not from memory: each row runs
one command line as a fresh subprocess (``python -m vccc_jax.cli ...``, cold: a new
interpreter, imports and compiles included, results into an empty temporary directory so
nothing is resumed; JAX's compilation cache starts empty there too, so the first command
that compiles a program pays for it, as on a fresh clone) and records

    wall s     elapsed time of the command
    CPU s      user + system CPU seconds of the command and its children (getrusage)
    CPU/wall   how many cores it kept busy on average (< 1: it waited for a shared CPU)
    load       the 1-minute load average at its start and end (os.getloadavg); on a
               shared machine wall time grows with the load, CPU time much less

Rows are grouped: ``start`` (the commands of a newcomer's first ten minutes: help, list,
verify, the smoke and default sweeps, the simulator, the Sec 3.4 demo, the README's first
``vccc train``, figures of one store) and ``comparators`` (the comparator studies).

Every measurement is kept: ``--out docs/command_times.md`` appends the rows just measured to
``docs/command_times.jsonl`` (one JSON line each, with date, host and CPU count) and rewrites
the page from the newest measurement of every row, so rerunning one row (``--only verify``)
keeps the others; ``--readme FILE.md`` puts the same table between that file's
``<!-- command-times:begin -->`` / ``<!-- command-times:end -->`` markers (the README links
docs/command_times.md instead: issue 45 moved its measurements out).

Flags and printing live in :mod:`vccc_jax.commands.bench`; this module returns rows and
strings only.
"""

from __future__ import annotations

import datetime as _dt
import json
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
    """One documented command: ``argv`` after ``vccc`` ({tmp} is the run's scratch dir) and
    what it does, in a few words (the table's second column)."""

    name: str
    group: str
    argv: tuple
    what: str = ""


ROWS = (
    Row("help", "start", ("--help",), "list the commands"),
    Row("list-critics", "start", ("list", "critics"), "list critics (also envs, actors, ...)"),
    Row("verify-quick", "start", ("verify", "--quick"), "every identity, fewer MDPs"),
    Row("verify", "start", ("verify",), "every identity of the write-up, exact + sampled"),
    Row("sweep-smoke", "start", ("sweep", "--config", "experiments/tabular_smoke.toml",
                                 "--results", "{tmp}/results", "--figures", "{tmp}/figures",
                                 "--no-progress"), "small tabular sweep"),
    Row("sweep-default", "start", ("sweep", "--results", "{tmp}/results", "--figures",
                                   "{tmp}/figures", "--no-progress"),
        "`make sweep`: 1080 exact cells, trained critics, figures"),
    Row("figures-store", "start", ("figures", "--store", "{tmp}/results/tabular_default.jsonl",
                                   "--out", "{tmp}/figures"), "the sweep's figures from its store"),
    Row("simulate", "start", ("simulate", "--config", "experiments/pipeline_default.toml",
                              "--compare"), "cluster simulator, three schedules"),
    Row("async-mc", "start", ("async-mc",), "Sec 3.4 switching-policy demo"),
    Row("train-readme", "start", ("train", "--env", "CartPole-v1", "--lag", "geometric:8",
                                  "--critic", "vccc", "--actor", "centered-mask", "--seeds", "8",
                                  "--out", "{tmp}/results/train/readme", "--quiet"),
        "one neural run: 8 seeds x 5e5 env steps, Monte-Carlo ground truth 10 times, curves.png"),
    Row("brace-tabular", "comparators", ("sweep", "--config", "experiments/brace_tabular.toml",
                                         "--results", "{tmp}/results", "--no-figures",
                                         "--no-progress"), "BRACE vs VCCC / V-trace, exact"),
    Row("decoupled-routes", "comparators", ("sweep", "--config",
                                            "experiments/decoupled_routes.toml", "--results",
                                            "{tmp}/results", "--no-figures", "--no-progress"),
        "pi_old routes, exact"),
    Row("ps-ppo", "comparators", ("sweep", "--config", "experiments/ps_ppo.toml", "--results",
                                  "{tmp}/results", "--no-figures", "--no-progress"),
        "GRPO vs PS-PPO on the token env"),
    Row("rac-bias-cut", "comparators", ("sweep", "--config", "experiments/rac_two_channel.toml",
                                        "--results", "{tmp}/results", "--no-figures",
                                        "--no-progress"), "RAC vs dropping late rewards, exact"),
    Row("rac-wallclock", "comparators", ("sweep", "--config", "experiments/rac_wallclock.toml",
                                         "--results", "{tmp}/results", "--no-figures",
                                         "--no-progress"),
        "RAC vs wait-for-slow on a simulated cluster"),
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
    status, the load average before and after, the date and machine, and the last line of its
    stderr on failure."""
    argv = [a.replace("{tmp}", str(tmp)) for a in row.argv]
    date = _dt.datetime.now().astimezone().isoformat(timespec="minutes")
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # JAX's compilation cache in the scratch dir: empty when run() starts, as on a fresh clone
    # (later rows reuse what earlier rows compiled, as a newcomer's session would)
    env = {**os.environ, "VCCC_COMPILE_CACHE": str(tmp / "jax_cache")}
    proc = subprocess.run([python, "-m", "vccc_jax.cli", *argv], cwd=ROOT, timeout=timeout,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.strip().splitlines()
    return {"name": row.name, "group": row.group, "command": command_line(row),
            "wall_s": wall, "cpu_s": cpu, "returncode": proc.returncode,
            "load_start": load0, "load_end": os.getloadavg()[0],
            "error": err[-1] if proc.returncode and err else "",
            "date": date, "host": platform.node(), "cpus": os.cpu_count(),
            "python": platform.python_version()}


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


# -- the record: every measurement, one JSON line each -----------------------------------


def record_path(page: str | os.PathLike) -> Path:
    """The JSON-lines record kept next to a page: ``docs/command_times.md`` ->
    ``docs/command_times.jsonl``."""
    return Path(page).with_suffix(".jsonl")


def read_record(path: str | os.PathLike) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def append_record(path: str | os.PathLike, rows: Sequence[dict]) -> None:
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def newest(records: Sequence[dict]) -> list[dict]:
    """The newest successful measurement of every row (later lines win), in ``ROWS`` order;
    rows no longer in ``ROWS`` are dropped, a failed run never replaces a good one."""
    last = {r["name"]: r for r in records if r["returncode"] == 0}
    return [last[row.name] for row in ROWS if row.name in last]


# -- rendering ---------------------------------------------------------------------------


def _duration(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of measured rows: command, what it does, wall and CPU time, cores kept
    busy, the load average at start and end, and the date (failed rows: :func:`footer`)."""
    what = {row.name: row.what for row in ROWS}
    lines = ["| command | what it does | wall | CPU | CPU/wall | load start-end | date |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = r["cpu_s"] / r["wall_s"] if r["wall_s"] > 0 else float("nan")
        lines.append(f"| `{r['command']}` | {what.get(r['name'], '')} | "
                     f"{_duration(r['wall_s'])} | {_duration(r['cpu_s'])} | {ratio:.2f} | "
                     f"{r['load_start']:.1f}-{r['load_end']:.1f} | {r.get('date', '')[:10]} |")
    return "\n".join(lines)


def machines(rows: Sequence[dict]) -> str:
    """"host (N CPUs)" of every machine the rows were measured on."""
    seen = sorted({f"{r.get('host', '?')} ({r.get('cpus', '?')} CPUs)" for r in rows})
    return ", ".join(seen)


def footer(rows: Sequence[dict]) -> str:
    failed = [f"{r['name']}: {r['error']}" for r in rows if r["returncode"]]
    lines = ["Each command ran cold (fresh interpreter, imports and XLA compiles included, "
             "empty result directory; the compilation cache starts empty and later rows reuse "
             "what earlier ones compiled). Wall time grows with the load on a shared machine (the "
             "load average is that of the whole machine; its CPU count is one job per core); "
             "CPU time (user + system) is the steadier number."]
    return "\n".join(lines + [f"FAILED {f}" for f in failed])


def page(rows: Sequence[dict]) -> str:
    """docs/command_times.md from the newest measurement of every row."""
    return (f"# Command times\n\nWritten by `vccc bench commands --group all --out "
            f"docs/command_times.md` from `docs/command_times.jsonl` (every "
            f"measurement; the newest of each row is shown), measured on {machines(rows)}.\n\n"
            f"{format_table(rows)}\n\n{footer(rows)}\n")


BEGIN, END = "<!-- command-times:begin -->", "<!-- command-times:end -->"


def with_table(text: str, rows: Sequence[dict]) -> str:
    """``text`` (a README) with the table of ``rows`` between the ``command-times`` markers;
    ValueError when the markers are missing."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {BEGIN} ... {END} markers to put the table between")
    block = (f"Measured on {machines(rows)} by `vccc bench commands` (newest of "
             f"[docs/command_times.md](docs/command_times.md)), in this order from a fresh "
             f"interpreter with imports and compiles included; JAX's compilation cache starts "
             f"empty and later rows reuse what earlier ones compiled (so `vccc verify` after "
             f"`vccc verify --quick` compiles less). Load = 1-minute load average of the whole "
             f"machine.\n\n{format_table(rows)}")
    return text[: i + len(BEGIN)] + "\n" + block + "\n" + text[j:]
