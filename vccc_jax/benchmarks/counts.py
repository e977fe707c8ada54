"""The counts the docs state, measured by a command and tied to the docs by a test (issue 45).

A doc states a count only as a marked number, ``<!-- count:NAME -->1888<!-- /count -->``
(invisible when rendered). ``vccc bench counts`` measures every count of :data:`NAMES`
(``pytest --collect-only`` for the tests; ``vccc verify --quick --json`` for its rows),
records them with the commit and the date in ``docs/counts.json`` and rewrites every marked
number in README.md and docs/*.md from it (:func:`with_counts`).
``tests/benchmarks/test_counts.py`` fails when a marked number differs from
``docs/counts.json`` or names no count (it reads files; it runs nothing).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "counts.json"
NAMES = {
    "tests_collected": "tests `make test` runs (pytest collects them, `-m 'not slow'`)",
    "tests_slow": "tests marked slow: collected but deselected by `make test`",
    "verify_quick_rows": "rows `vccc verify --quick` prints (exact and sampled)",
}
MARK = re.compile(r"<!-- count:(\w+) -->([^<]*)<!-- /count -->")


def parse_collection(text: str) -> dict:
    """``{"tests_collected", "tests_slow"}`` from the last line of ``pytest --collect-only
    -q`` (``1888/1905 tests collected (17 deselected) in 31.2s`` or ``12 tests collected``);
    ValueError when there is none, or when files failed to collect (a count that leaves
    them out is no count)."""
    lines = [line for line in text.splitlines() if re.match(r"^\d+(/\d+)? tests? collected", line)]
    if not lines:  # the summary line, not a test id that happens to quote one
        raise ValueError(f"no 'tests collected' line in pytest's output: {text[-300:]!r}")
    line = lines[-1]
    errors = re.search(r"(\d+) errors?", line)
    if errors:
        raise ValueError(f"pytest could not collect {errors[1]} test files: {line!r}")
    m = re.match(r"(\d+)/(\d+) tests? collected \((\d+) deselected\)", line)
    if m:
        return {"tests_collected": int(m[1]), "tests_slow": int(m[3])}
    return {"tests_collected": int(re.match(r"(\d+)", line)[1]), "tests_slow": 0}


def collect(root: Path = ROOT, timeout: float = 900.0) -> dict:
    """The test counts of ``root``'s suite, as ``make test`` selects it (pyproject's
    addopts: ``-m 'not slow'``)."""
    got = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"],
                         cwd=root, capture_output=True, text=True, timeout=timeout)
    return parse_collection(got.stdout + got.stderr)


def verify_rows(quick: bool = True, timeout: float = 1800.0) -> int:
    """How many rows ``vccc verify [--quick]`` prints (from its ``--json``)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "verify.json"
        cmd = [sys.executable, "-m", "vccc_jax.cli", "verify", "--json", str(path)]
        subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True,
                       timeout=timeout, check=False)
        if not path.is_file():
            raise RuntimeError(f"`{' '.join(cmd[2:])}` wrote no JSON")
        return len(json.loads(path.read_text())["rows"])


def measure(progress: Optional[Callable[[str], None]] = None) -> dict:
    """Every count of :data:`NAMES`."""
    say = progress or (lambda line: None)
    say("collecting the tests (pytest --collect-only) ...")
    counts = collect()
    say("running vccc verify --quick ...")
    counts["verify_quick_rows"] = verify_rows(quick=True)
    return counts


def record(counts: dict, path: Path = RECORD) -> dict:
    """Write ``counts`` with the commit and the date to ``path`` (JSON); return the record."""
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, check=False).stdout.strip() or None
    rec = {"counts": dict(counts), "git": git,
           "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "vccc bench counts"}
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def read_record(path: Path = RECORD) -> dict:
    """The counts ``docs/counts.json`` records."""
    return json.loads(Path(path).read_text())["counts"]


def marked(text: str) -> list[tuple[str, str]]:
    """(name, stated number) of every marked count in ``text``."""
    return MARK.findall(text)


def with_counts(text: str, counts: dict) -> str:
    """``text`` with every marked number replaced by its count (names without one: kept)."""
    return MARK.sub(lambda m: (f"<!-- count:{m[1]} -->{counts[m[1]]}<!-- /count -->"
                               if m[1] in counts else m[0]), text)


def docs(root: Path = ROOT) -> list[Path]:
    """The files whose marked numbers :func:`with_counts` keeps: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def rewrite_docs(counts: dict, root: Path = ROOT) -> list[Path]:
    """Rewrite every marked number of :func:`docs`; returns the files that changed."""
    changed = []
    for path in docs(root):
        text = path.read_text()
        new = with_counts(text, counts)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
