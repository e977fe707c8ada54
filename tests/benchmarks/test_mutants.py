"""``vccc bench mutants``: the mutant list is valid against the tree, a stale snippet is a
clear error, the test-file selection, applying a mutant in a copy (and only there), the
verdicts read from pytest / verify output, and resuming. Nothing here runs a mutant's checks
(``_run`` / ``run_verify`` are replaced by fakes); the real run is ``vccc bench mutants``."""

import shutil
from pathlib import Path
from tempfile import mkdtemp

import pytest

from vccc_jax import cli
from vccc_jax.benchmarks import mutants as mb
from vccc_jax.benchmarks.mutant_list import MUTANTS, Mutant


def test_every_mutant_applies_to_the_tree_once_and_has_tests():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    for m in MUTANTS:
        text = mb.check_mutant(m)
        assert text.count(m.original) == 1, m.name
        assert mb.test_files(m), m.name
        assert m.breaks
    issue = [m for m in MUTANTS if m.origin == "issue 27"]
    ours = [m for m in MUTANTS if m.origin != "issue 27"]
    assert len(issue) == 12 and len(ours) >= 20
    layers = {Path(m.file).parts[1] for m in ours}
    assert {"train", "envs", "runs", "verify"} <= layers


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "vccc_jax" / "envs").mkdir(parents=True)
    (root / "tests" / "envs").mkdir(parents=True)
    (root / "vccc_jax" / "envs" / "lag.py").write_text("a = 1\nb = a - 1\nc = a - 1\n")
    for name in ("test_lag.py", "test_pins_lag.py", "test_rollout.py"):
        (root / "tests" / "envs" / name).write_text("def test_x():\n    pass\n")
    (root / "tests" / "other.py").write_text("")
    return root


def test_snippet_must_occur_exactly_once(tmp_path):
    root = _tree(tmp_path)
    ok = Mutant("ok", "vccc_jax/envs/lag.py", "b = a - 1", "b = a + 1", "sign")
    assert mb.check_mutant(ok, root).startswith("a = 1")
    with pytest.raises(ValueError, match=r"mutant twice: .* occurs 2 times in vccc_jax/envs/lag"):
        mb.check_mutant(ok._replace(name="twice", original="= a - 1"), root)
    with pytest.raises(ValueError, match=r"mutant gone: .* occurs 0 times"):
        mb.check_mutant(ok._replace(name="gone", original="d = 4"), root)
    with pytest.raises(ValueError, match="no file vccc_jax/envs/nope.py"):
        mb.check_mutant(ok._replace(file="vccc_jax/envs/nope.py"), root)
    with pytest.raises(ValueError, match="replacement equals"):
        mb.check_mutant(ok._replace(replacement="b = a - 1"), root)


def test_module_test_files(tmp_path):
    root = _tree(tmp_path)
    m = Mutant("m", "vccc_jax/envs/lag.py", "b = a - 1", "b = a + 1", "sign")
    assert mb.test_files(m, root) == ["tests/envs/test_lag.py", "tests/envs/test_pins_lag.py"]
    extra = m._replace(tests=("tests/envs/test_rollout.py", "tests/envs/test_lag.py"))
    assert mb.test_files(extra, root) == ["tests/envs/test_lag.py", "tests/envs/test_pins_lag.py",
                                          "tests/envs/test_rollout.py"]
    with pytest.raises(ValueError, match="no test file tests/envs/nope.py"):
        mb.test_files(m._replace(tests=("tests/envs/nope.py",)), root)
    (root / "vccc_jax" / "envs" / "make.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"no test file matches tests/envs/test_\*make\*\.py"):
        mb.test_files(m._replace(file="vccc_jax/envs/make.py"), root)


PYTEST_FAIL = """..F
=================================== FAILURES ===================================
___________________________ test_b ___________________________
E   assert 1 == 2
=========================== short test summary info ============================
FAILED tests/envs/test_lag.py::test_b[2-3] - assert 1 == 2
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed, 2 passed in 0.12s
"""


def test_verdicts():
    assert mb.tests_verdict(1, PYTEST_FAIL) == ("caught", "tests/envs/test_lag.py::test_b[2-3]")
    assert mb.tests_verdict(0, "3 passed") == ("survived", "")
    assert mb.tests_verdict(None, "") == ("timeout", "")
    assert mb.tests_verdict(2, "ERROR tests/x.py - ImportError: y\n1 error")[1] == "tests/x.py"
    rows = ("VCCC, arbitrary b   Eq 4/5   96   0.0000   0.0083  pass  (ok)\n"
            "IW-TD (b = Vbar)    Eq 8     96   0.3000   0.0083  FAIL  (480 z-scores)\n"
            "clipped, c=2        Eq 10    96   0.2000   0.0083  FAIL  (x)\n"
            "103/105 rows pass; 2 FAIL\n")
    assert mb.verify_verdict(1, rows) == ("caught", "2 rows fail, e.g. IW-TD (b = Vbar)")
    assert mb.verify_verdict(0, rows.replace("FAIL", "pass")) == ("survived", "")
    assert mb.verify_verdict(1, "Traceback\nValueError: boom\n") == (
        "caught", "exit 1: ValueError: boom")


def _fake_checks(monkeypatch, seen):
    """_run: 'tests fail' when the mutated line is in the copy; verify always passes."""

    def fake_run(argv, copy, timeout):
        text = (copy / "vccc_jax" / "envs" / "lag.py").read_text()
        seen.append(text)
        return (1, "FAILED tests/envs/test_lag.py::test_x - boom\n", 0.0) if "a + 1" in text \
            else (0, "1 passed", 0.0)

    monkeypatch.setattr(mb, "_run", fake_run)
    monkeypatch.setattr(mb, "run_verify", lambda copy, timeout: (0, "all pass", set(), 0.0))


def test_judge_mutates_the_copy_only_and_restores_it(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    before = (root / "vccc_jax" / "envs" / "lag.py").read_text()
    copy = mb.make_copy(root)
    seen = []
    _fake_checks(monkeypatch, seen)
    m = Mutant("m", "vccc_jax/envs/lag.py", "b = a - 1", "b = a + 1", "sign")
    loaded = {"vccc_jax/envs/lag.py"}
    rec = mb.judge(m, copy, ["tests/envs/test_lag.py"], loaded, fast=False, timeout=None)
    assert seen[0] == before.replace("b = a - 1", "b = a + 1")
    assert (rec["tests"], rec["test"], rec["verify"]) == ("caught", "tests/envs/test_lag.py::test_x",
                                                        "survived")
    assert (copy / m.file).read_text() == before and (root / m.file).read_text() == before
    assert (copy / "tests" / "other.py").is_file() and copy != root
    assert mb.judge(m, copy, [], loaded, fast=True, timeout=None)["verify"] == "skipped"
    assert mb.judge(m, copy, [], set(), fast=False, timeout=None)["verify"] == "not loaded"
    assert mb.judge(m._replace(replacement="b = a - 2"), copy, [], loaded, fast=None,
                    timeout=None)["verify"] == "skipped"  # --tests-only
    survivor = m._replace(replacement="b = a - 2")
    assert mb.judge(survivor, copy, [], loaded, fast=True, timeout=None)["tests"] == "survived"
    shutil.rmtree(copy.parent)


def test_run_writes_the_table_and_resumes(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    seen = []
    _fake_checks(monkeypatch, seen)
    monkeypatch.setattr(mb, "clean_verify", lambda *a, **k: {"vccc_jax/envs/lag.py"})
    copies = tmp_path / "copies"
    copies.mkdir()
    real_copy = mb.make_copy
    monkeypatch.setattr(mb.tempfile, "mkdtemp", lambda prefix: mkdtemp(prefix=prefix, dir=copies))
    monkeypatch.setattr(mb, "MUTANTS", (
        Mutant("plus", "vccc_jax/envs/lag.py", "b = a - 1", "b = a + 1", "sign"),
        Mutant("minus", "vccc_jax/envs/lag.py", "b = a - 1", "b = a - 2", "off by one")))
    out = tmp_path / "out"
    recs = mb.run(mb.MUTANTS, out, jobs=2, fast=True, root=root)
    assert [(r["name"], r["tests"], r["verify"]) for r in recs] == [
        ("plus", "caught", "skipped"), ("minus", "survived", "survived")]
    assert "1/2 caught (verify 0, module tests 1); 1 survive both" in (out / "mutants.md").read_text()
    n = len(seen)
    assert [r["name"] for r in mb.run(mb.MUTANTS, out, fast=True, root=root)] == ["plus", "minus"]
    assert len(seen) == n  # nothing re-judged
    mb.run(mb.MUTANTS, out, fast=False, root=root)  # "plus" ran no verify: only verify runs
    assert len(seen) == n and mb.load(out)["plus"]["verify"] == "survived"
    assert mb.load(out)["plus"]["test"] == "tests/envs/test_lag.py::test_x"
    (root / "tests" / "envs" / "test_lag.py").write_text("def test_y():\n    pass\n")
    mb.run(mb.MUTANTS, out, root=root)  # a test file changed: both judged again
    assert len(seen) == n + 2
    shown = mb.format_table([dict(r, verify="skipped") for r in mb.load(out).values()])
    assert shown.endswith("1/2 caught (verify 0, module tests 1); 1 survive (1 not yet run "
                          "against verify)")
    assert real_copy is mb.make_copy and not list(copies.iterdir())  # every copy removed


def test_cli_errors_are_one_line(capsys):
    assert cli.main(["bench", "mutants", "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vccc bench: --only: unknown mutants ['nope']") and "\n" not in err
    assert cli.main(["bench", "mutants", "--jobs", "0"]) == 2


def test_clean_verify_is_cached_until_an_imported_file_changes(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    (root / "vccc_jax" / "envs" / "make.py").write_text("x = 1\n")
    calls = []

    def fake_verify(copy, timeout):
        calls.append(copy)
        return 0, "all pass", {"vccc_jax/envs/lag.py"}, 0.0

    monkeypatch.setattr(mb, "run_verify", fake_verify)
    copies = mb.queue.Queue()
    copies.put(root)
    out = tmp_path / "out"
    out.mkdir()
    args = (copies, out, None, lambda s: None, root)
    assert mb.clean_verify(*args) == {"vccc_jax/envs/lag.py"} and len(calls) == 1
    (root / "vccc_jax" / "envs" / "make.py").write_text("x = 2\n")  # not imported by verify
    assert mb.clean_verify(*args) == {"vccc_jax/envs/lag.py"} and len(calls) == 1
    (root / "vccc_jax" / "envs" / "lag.py").write_text("a = 2\n")
    assert mb.clean_verify(*args, run=False) is None  # --tests-only never runs verify
    mb.clean_verify(*args)
    assert len(calls) == 2
    monkeypatch.setattr(mb, "run_verify", lambda copy, timeout: (1, "1 FAIL", set(), 0.0))
    (root / "vccc_jax" / "envs" / "lag.py").write_text("a = 3\n")
    with pytest.raises(RuntimeError, match="fails on the clean copy"):
        mb.clean_verify(*args)
