"""Measure the README's table of `vccc` commands: wall time, CPU time and the load, per command.

    .venv/bin/python docs/time_commands.py                  # run every row, then rewrite README
    .venv/bin/python docs/time_commands.py --rows help,sweep-default
    .venv/bin/python docs/time_commands.py --render         # only rewrite the README table

Each row runs cold as a subprocess (``python -m vccc_jax.cli ...`` in the repository root: a
fresh interpreter, imports and XLA compiles included) and writes into ``results/`` and
``figures/`` as a user's run would (remove them first for a cold sweep: a sweep resumes). Per
row it appends one JSON line to ``results/command_times.jsonl``: wall seconds, CPU seconds
(user + system of the command and its children, from ``getrusage``), the 1-minute load
average at the start and the end, the exit status and the date. ``--render`` puts the newest
measurement of every row between the ``command-times`` markers of README.md.

On a shared machine wall time grows with the load and CPU time much less, so the table shows
both. (`vccc bench commands`, when present, measures the same rows; this script is the
stand-in until then.) Command output goes to ``results/command_logs/<row>.log``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- command-times:begin -->", "<!-- command-times:end -->"

# (name, argv after `vccc`, what it does) in run order; rows that make results come first.
ROWS = (
    ("help", ("--help",), "list the commands"),
    ("sweep-default", ("sweep", "--no-progress"),
     "`make sweep`: 1080 exact cells + trained critics + figures"),
    ("figures-store", ("figures", "--store", "results/tabular_default.jsonl", "--out", "figures"),
     "the sweep's figures from its store"),
    ("async-ac", ("sweep", "--config", "experiments/async_ac.toml", "--no-figures",
                  "--no-progress"), "async tabular actor-critic grid"),
    ("brace-tabular", ("sweep", "--config", "experiments/brace_tabular.toml", "--no-figures",
                       "--no-progress"), "BRACE vs VCCC / V-trace, exact"),
    ("decoupled-routes", ("sweep", "--config", "experiments/decoupled_routes.toml",
                          "--no-figures", "--no-progress"), "pi_old routes, exact"),
    ("rac-bias-cut", ("sweep", "--config", "experiments/rac_two_channel.toml", "--no-figures",
                      "--no-progress"), "RAC vs drop late rewards, exact"),
    ("rac-wallclock", ("sweep", "--config", "experiments/rac_wallclock.toml", "--no-figures",
                       "--no-progress"), "RAC vs wait-for-slow on a simulated cluster"),
    ("ps-ppo", ("sweep", "--config", "experiments/ps_ppo.toml", "--no-figures", "--no-progress"),
     "GRPO vs PS-PPO on the token env"),
    ("train-readme", ("train", "--env", "CartPole-v1", "--lag", "geometric:8", "--critic", "vccc",
                      "--actor", "centered-mask", "--seeds", "8", "--out",
                      "results/train_readme", "--quiet"),
     "one neural run: 8 seeds x 5e5 steps, curves.png"),
    ("simulate", ("simulate", "--config", "experiments/pipeline_default.toml", "--compare"),
     "cluster simulator, three schedules"),
    ("async-mc", ("async-mc",), "Sec 3.4 switching-policy demo"),
    ("sweep-smoke", ("sweep", "--config", "experiments/tabular_smoke.toml", "--results",
                     "results/smoke", "--figures", "figures/smoke", "--no-progress"),
     "small tabular sweep"),
    ("figures", ("figures", "--results", "results", "--out", "figures", "--gallery",
                 "docs/figures", "--ipynb", "notebooks"),
     "`make figures` + `make notebooks`: every notebook on `results/`"),
    ("verify-quick", ("verify", "--quick"), "every identity, fewer MDPs"),
    ("verify", ("verify",), "every identity of the write-up, exact + sampled"),
)


def measure(name: str, argv: tuple, log_dir: Path) -> dict:
    """Run one row; its wall / CPU seconds, exit status and the load before and after."""
    log_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log_dir / f"{name}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "vccc_jax.cli", *argv], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"name": name, "command": "vccc " + " ".join(argv), "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "load_start": load0, "load_end": os.getloadavg()[0],
            "returncode": rc, "date": dt.datetime.now().astimezone().isoformat(timespec="minutes"),
            "host": f"{platform.node()}, {os.cpu_count()} CPUs"}


def _minutes(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


QUIET = (" --no-progress", " --no-figures", " --quiet")  # left out of the table's command text


def render(records: list[dict]) -> str:
    """The README block: one line per row (newest measurement), in ROWS order."""
    newest = {r["name"]: r for r in records}
    what = {n: w for n, _, w in ROWS}
    lines = ["| command | what it does | wall | CPU | load (start-end) |",
             "|---|---|---:|---:|---:|"]
    dates, hosts = set(), set()
    for name, _, _ in ROWS:
        r = newest.get(name)
        if r is None or r["returncode"] != 0:
            continue
        dates.add(r["date"][:10])
        hosts.add(r["host"])
        command = r["command"]
        for flag in QUIET:
            command = command.replace(flag, "")
        lines.append(f"| `{command}` | {what[name]} | {_minutes(r['wall_s'])} | "
                     f"{_minutes(r['cpu_s'])} | {r['load_start']:.0f}-{r['load_end']:.0f} |")
    head = (f"Measured {', '.join(sorted(dates))} on {', '.join(sorted(hosts))} (x86-64, no "
            "GPU) by `docs/time_commands.py`, each command cold (imports and compiles "
            "included; sweeps ran with `--no-progress`, the comparator sweeps with "
            "`--no-figures`, the train run with `--quiet`). The machine was shared with other "
            "jobs (load average in the last column; 2 would be one job per core), so wall "
            "times are several times what an idle machine gives; CPU time (user + system) is "
            "the steadier number.")
    return "\n".join([head, "", *lines])


def write_readme(block: str, readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"time_commands: no {BEGIN} ... {END} markers in {readme}")
    readme.write_text(text[: i + len(BEGIN)] + "\n" + block + "\n" + text[j:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=None, help="comma-separated row names (default: all)")
    p.add_argument("--render", action="store_true", help="only rewrite the README table")
    p.add_argument("--json", default=str(ROOT / "results" / "command_times.jsonl"))
    args = p.parse_args()
    store = Path(args.json)
    if not args.render:
        known = {n: a for n, a, _ in ROWS}
        names = args.rows.split(",") if args.rows else list(known)
        unknown = [n for n in names if n not in known]
        if unknown:
            print(f"time_commands: unknown row(s) {unknown}; known: {', '.join(known)}",
                  file=sys.stderr)
            return 2
        store.parent.mkdir(parents=True, exist_ok=True)
        for name in names:
            r = measure(name, known[name], store.parent / "command_logs")
            print(f"{name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU, load "
                  f"{r['load_start']:.1f}-{r['load_end']:.1f}, exit {r['returncode']}", flush=True)
            with open(store, "a") as f:
                f.write(json.dumps(r) + "\n")
    records = [json.loads(line) for line in store.read_text().splitlines() if line.strip()]
    write_readme(render(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
