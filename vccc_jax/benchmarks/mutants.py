"""``vccc bench mutants``: which checks catch realistic one-line bugs (issue 27, part 4).

Each mutant of :data:`vccc_jax.benchmarks.mutant_list.MUTANTS` replaces one exact snippet of
one library file (it must occur exactly once there: :func:`check_mutant` says which one does
not). A mutant is applied in a scratch copy of the repository (a temporary directory; the
working tree is never modified), alone, and judged by two checks:

    verify         ``vccc verify --quick`` in the copy (exit status != 0: caught). Skipped as
                   "not loaded" when the mutated module is not imported by a clean run of
                   that command (then no line of it can change the outcome).
    module tests   the test files of the mutated module: ``tests/<layer>/test_*<stem>*.py``
                   (the mirror file, the pins, every file naming the module) plus the
                   mutant's own ``tests``, run ``pytest -x -q -n 0`` (exit != 0: caught; the
                   first FAILED / ERROR id is recorded).

The copy imports its own ``vccc_jax`` (``PYTHONPATH`` first, no bytecode written, the
compile cache off). Judgements are kept in ``OUT/mutants.json`` keyed by a hash of the
mutant, the mutated file and its test files, so a re-run skips what is already judged;
``OUT/mutants.md`` is the table. ``--fast`` skips verify for a mutant the tests caught;
``--tests-only`` never runs it (the column says "skipped" until a later run fills it in).
Flags and printing live in :mod:`vccc_jax.commands.bench`.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

from vccc_jax.benchmarks.mutant_list import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
COPY_IGNORE = (".git", ".venv", "results", "figures", "__pycache__", "*.egg-info", "*.pyc",
               ".pytest_cache", "notebooks")
PYTEST = ("-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider")
# `vccc verify --quick`, then the vccc_jax files it imported (one per line) into argv[1].
_VERIFY = ("import sys\nfrom vccc_jax.cli import main\nout = sys.argv.pop(1)\n"
           "rc = main(['verify', '--quick'])\n"
           "files = sorted(getattr(m, '__file__', None) or '' for n, m in list(sys.modules.items())"
           " if n.startswith('vccc_jax'))\n"
           "open(out, 'w').write('\\n'.join(files))\nsys.exit(rc)\n")


def select(only: Optional[str]) -> list[Mutant]:
    """The mutants named in the comma-separated ``only`` (all when None), in list order."""
    if only is None:
        return list(MUTANTS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {m.name for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--only: unknown mutants {unknown} (known: {', '.join(sorted(known))})")
    return [m for m in MUTANTS if m.name in names]


def check_mutant(m: Mutant, root: Path = ROOT) -> str:
    """The mutated file's text; ValueError unless ``m.original`` occurs exactly once in it and
    the replacement differs."""
    path = root / m.file
    if not path.is_file():
        raise ValueError(f"mutant {m.name}: no file {m.file}")
    text = path.read_text()
    n = text.count(m.original)
    if n != 1:
        raise ValueError(f"mutant {m.name}: the original snippet {m.original!r} occurs {n} "
                         f"times in {m.file} (must be exactly once; update the mutant list)")
    if m.replacement == m.original:
        raise ValueError(f"mutant {m.name}: the replacement equals the original")
    return text


def test_files(m: Mutant, root: Path = ROOT) -> list[str]:
    """The mutated module's test files (paths relative to ``root``): every
    ``tests/<layer>/test_*<stem>*.py`` of the mirror folder, then ``m.tests``."""
    rel = Path(m.file).relative_to("vccc_jax")
    folder = root / "tests" / rel.parent
    found = sorted(p.relative_to(root).as_posix() for p in folder.glob(f"test_*{rel.stem}*.py"))
    for extra in m.tests:
        if not (root / extra).is_file():
            raise ValueError(f"mutant {m.name}: no test file {extra}")
        if extra not in found:
            found.append(extra)
    if not found:
        raise ValueError(f"mutant {m.name}: no test file matches tests/{rel.parent}/"
                         f"test_*{rel.stem}*.py and the mutant names none")
    return found


def fingerprint(m: Mutant, tests: Sequence[str], root: Path = ROOT) -> str:
    """sha256 of the mutant, the mutated file and its test files: a judgement is reused
    only while all of these are unchanged."""
    h = hashlib.sha256(json.dumps(m._asdict(), sort_keys=True).encode())
    for rel in (m.file, *tests):
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return h.hexdigest()[:16]


def make_copy(root: Path = ROOT) -> Path:
    """A scratch copy of the repository (sources, tests, docs; no .git / .venv / results)."""
    dest = Path(tempfile.mkdtemp(prefix="vccc-mutants-")) / "repo"
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*COPY_IGNORE))
    return dest


def _env(copy: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["VCCC_COMPILE_CACHE"] = "off"
    return env


def _run(argv: Sequence[str], copy: Path, timeout: Optional[float]):
    """(returncode or None on timeout, stdout + stderr, seconds)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *argv], cwd=copy, env=_env(copy), timeout=timeout,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return p.returncode, p.stdout, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, time.perf_counter() - t0


def run_verify(copy: Path, timeout: Optional[float]) -> tuple[Optional[int], str, set, float]:
    """``vccc verify --quick`` in ``copy``: (rc, output, imported vccc_jax files relative to
    the copy, seconds)."""
    listing = copy.parent / "verify_modules.txt"
    rc, out, sec = _run(("-c", _VERIFY, str(listing)), copy, timeout)
    loaded = set()
    if listing.is_file():
        for line in listing.read_text().splitlines():
            if line.startswith(str(copy)):
                loaded.add(Path(line).relative_to(copy).as_posix())
        listing.unlink()
    return rc, out, loaded, sec


def verify_verdict(rc: Optional[int], out: str) -> tuple[str, str]:
    """("caught" | "survived" | "timeout", detail: the failing rows or the exit status)."""
    if rc is None:
        return "timeout", ""
    if rc == 0:
        return "survived", ""
    rows = [line.split("  ")[0].strip() for line in out.splitlines()
            if re.search(r"\sFAIL(\s|$)", line) and "rows pass" not in line]
    if rc == 1 and rows:
        return "caught", f"{len(rows)} rows fail, e.g. {rows[0]}"
    tail = (out.strip().splitlines() or [""])[-1][:120]
    return "caught", f"exit {rc}: {tail}"


def tests_verdict(rc: Optional[int], out: str) -> tuple[str, str]:
    """("caught" | "survived" | "timeout", the first FAILED / ERROR test id)."""
    if rc is None:
        return "timeout", ""
    if rc == 0:
        return "survived", ""
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return "caught", line.split(" - ")[0].split(" ", 1)[1]
    tail = (out.strip().splitlines() or [""])[-1][:120]
    return "caught", f"exit {rc}: {tail}"


def judge(m: Mutant, copy: Path, tests: Sequence[str], verify_modules: Optional[set], *,
          fast: Optional[bool], timeout: Optional[float], known: Optional[dict] = None) -> dict:
    """Apply ``m`` in ``copy``, run its module tests then verify, restore the file; one record.
    ``verify_modules``: the files a clean verify imports (None: run verify regardless).
    ``fast``: True skips verify once the tests caught the mutant; None skips it always.
    ``known``: a record of the same mutant and hash whose verify was skipped (--fast): its
    test verdict is kept and only verify runs."""
    path = copy / m.file
    clean = path.read_text()
    t0 = time.perf_counter()
    try:
        path.write_text(clean.replace(m.original, m.replacement, 1))
        if known is not None:
            tests_v, test_id = known["tests"], known["test"]
        else:
            rc, out, _ = _run((*PYTEST, *tests), copy, timeout)
            tests_v, test_id = tests_verdict(rc, out)
        if verify_modules is not None and m.file not in verify_modules:
            verify_v, detail = "not loaded", ""
        elif fast is None or (fast and tests_v == "caught"):
            verify_v, detail = "skipped", ""
        else:
            rc, out, _, _ = run_verify(copy, timeout)
            verify_v, detail = verify_verdict(rc, out)
    finally:
        path.write_text(clean)
    return {"name": m.name, "file": m.file, "origin": m.origin, "breaks": m.breaks,
            "verify": verify_v, "verify_detail": detail, "tests": tests_v, "test": test_id,
            "test_files": list(tests), "seconds": round(time.perf_counter() - t0, 1)}


def load(out_dir: Path) -> dict:
    path = Path(out_dir) / "mutants.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def reusable(record: Optional[dict], digest: str, fast: bool) -> bool:
    """A stored judgement stands when its hash matches and it ran verify (or --fast)."""
    return (record is not None and record.get("hash") == digest
            and (fast or record.get("verify") != "skipped"))


def _files_hash(files, root: Path) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        path = root / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(gone)"))
    return h.hexdigest()[:16]


def clean_verify(copies: queue.Queue, out_dir: Path, timeout: Optional[float],
                 progress: Callable[[str], None], root: Path = ROOT,
                 run: bool = True) -> Optional[set]:
    """The vccc_jax files a clean ``vccc verify --quick`` imports (it must pass), cached in
    ``OUT/verify_modules.json`` with a hash of those files: while none of them changes, the
    same files are imported (a file that is not imported runs no code)."""
    cache = out_dir / "verify_modules.json"
    if cache.is_file():
        stored = json.loads(cache.read_text())
        if stored.get("hash") == _files_hash(stored["files"], root):
            return set(stored["files"])
    if not run:  # --tests-only: use the list if it is cached, never run verify for it
        return None
    copy = copies.get()
    try:
        rc, out, files, sec = run_verify(copy, timeout)
    finally:
        copies.put(copy)
    if rc != 0:
        raise RuntimeError(f"vccc verify --quick fails on the clean copy (exit {rc}):\n"
                           + "\n".join(out.splitlines()[-20:]))
    progress(f"clean verify --quick: pass in {sec:.0f} s, {len(files)} vccc_jax files imported")
    cache.write_text(json.dumps({"hash": _files_hash(files, root), "files": sorted(files)},
                                indent=1))
    return files


def run(mutants: Sequence[Mutant], out_dir: Path, *, jobs: int = 1, fast: Optional[bool] = False,
        timeout: Optional[float] = None, progress: Callable[[str], None] = lambda s: None,
        root: Path = ROOT) -> list[dict]:
    """Judge every mutant not already judged in ``out_dir`` (written after each one).
    ``fast``: False runs both checks, True skips verify once the tests caught the mutant,
    None never runs verify (module tests only; a later run without it fills verify in)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = []
    for m in mutants:
        check_mutant(m, root)
        tests = test_files(m, root)
        plan.append((m, tests, fingerprint(m, tests, root)))
    records = load(out_dir)
    todo = [p for p in plan if not reusable(records.get(p[0].name), p[2], fast is not False)]
    progress(f"{len(plan) - len(todo)} of {len(plan)} mutants already judged; {len(todo)} to run")
    if todo:
        copies = queue.Queue()
        for _ in range(min(jobs, len(todo))):
            copies.put(make_copy(root))
        verify_modules = clean_verify(copies, out_dir, timeout, progress, root,
                                      run=fast is not None)

        lock = threading.Lock()

        def one(item):
            m, tests, digest = item
            copy = copies.get()
            try:
                old = records.get(m.name)
                known = old if old and old.get("hash") == digest else None
                rec = judge(m, copy, tests, verify_modules, fast=fast, timeout=timeout,
                            known=known)
            finally:
                copies.put(copy)
            rec["hash"] = digest
            with lock:  # one writer of mutants.json at a time
                records[m.name] = rec
                write(out_dir, records)
            progress(f"{m.name}: verify {rec['verify']}, module tests {rec['tests']} "
                     f"({rec['seconds']:.0f} s)")

        try:
            with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                list(pool.map(one, todo))
        finally:
            while not copies.empty():
                shutil.rmtree(copies.get().parent, ignore_errors=True)
    return [records[m.name] for m, _, _ in plan]


def write(out_dir: Path, records: dict) -> None:
    """``mutants.json`` (every record) and ``mutants.md`` (the table) in ``out_dir``."""
    tmp = Path(out_dir) / "mutants.json.tmp"
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True))
    tmp.replace(Path(out_dir) / "mutants.json")
    rows = [records[m.name] for m in MUTANTS if m.name in records]
    (Path(out_dir) / "mutants.md").write_text(format_table(rows, markdown=True) + "\n")


def caught(rec: dict) -> bool:
    return rec["verify"] == "caught" or rec["tests"] == "caught"


def format_table(records: Sequence[dict], markdown: bool = False) -> str:
    """One row per mutant: name, file, verify, module tests, the test that caught it."""
    head = ("mutant", "file", "origin", "verify", "module tests", "caught by")
    rows = [(r["name"], r["file"].removeprefix("vccc_jax/"), r["origin"], r["verify"],
             r["tests"], r["test"] or r["verify_detail"] or "-") for r in records]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(f"`{c}`" if i == 0 else c.replace("|", "/")
                                    for i, c in enumerate(row)) + " |" for row in rows]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
                 for row in (head, *rows)]
    n = len(records)
    k = sum(caught(r) for r in records)
    unverified = sum(not caught(r) and r["verify"] == "skipped" for r in records)
    lines.append(f"\n{k}/{n} caught (verify {sum(r['verify'] == 'caught' for r in records)}, "
                 f"module tests {sum(r['tests'] == 'caught' for r in records)}); "
                 f"{n - k} survive" + (f" ({unverified} not yet run against verify)"
                                       if unverified else " both"))
    return "\n".join(lines)
