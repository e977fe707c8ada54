"""Every count a doc states is a marked number equal to what ``vccc bench counts`` recorded
in docs/counts.json (issue 45: "1889 passed" against 1888 collected and 17 slow tests
unmentioned; verify "126/126" against 139 rows printed). Reads files only: no suite run."""

import json

import pytest

from vccc_jax.benchmarks import counts as c


def test_every_marked_count_in_the_docs_is_the_recorded_one():
    recorded = c.read_record()
    assert set(recorded) == set(c.NAMES)
    seen = set()
    for path in c.docs():
        for name, stated in c.marked(path.read_text()):
            assert name in c.NAMES, f"{path.name}: unknown count {name!r}"
            assert stated == str(recorded[name]), (
                f"{path.name} states {name} = {stated}, docs/counts.json {recorded[name]}: "
                "run `vccc bench counts`")
            seen.add(name)
    assert seen == set(c.NAMES)  # every count is stated somewhere, so a drift is caught


def test_the_docs_state_no_unmarked_test_or_row_count():
    """A count written by hand ("1889 passed", "126/126 rows") would drift unnoticed. Outputs
    quoted in code blocks (a dated run's printout) are what they were, and are skipped."""
    import re

    for path in c.docs():
        text = re.sub(r"```.*?```", "", c.MARK.sub("", path.read_text()), flags=re.S)
        text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented code blocks too
        for pattern in (r"\d+ passed", r"\d+ tests? collected", r"\d+/\d+ rows"):
            assert not re.search(pattern, text), f"{path.name}: {re.search(pattern, text)[0]!r}"


@pytest.mark.parametrize("out, want", [
    # a test id may quote a summary line (this file's did): only the last line counts
    ("a.py::t[7/9 tests collected (2 deselected)]\n\n31/40 tests collected (9 deselected) in "
     "31.20s\n", (31, 9)),
    ("12 tests collected in 0.5s\n", (12, 0)),
    ("1 test collected in 0.1s\n", (1, 0)),
], ids=["deselected", "plain", "one"])
def test_pytest_collection_lines_parse(out, want):
    got = c.parse_collection(out)
    assert (got["tests_collected"], got["tests_slow"]) == want
    with pytest.raises(ValueError, match="tests collected"):
        c.parse_collection("ERROR: no tests ran")
    with pytest.raises(ValueError, match="could not collect 2 test files"):
        c.parse_collection("31/40 tests collected (9 deselected), 2 errors in 40.1s")


def test_with_counts_rewrites_marked_numbers_only(tmp_path):
    text = ("runs <!-- count:tests_collected -->10<!-- /count --> tests, 10 others; "
            "<!-- count:nope -->3<!-- /count -->")
    got = c.with_counts(text, {"tests_collected": 1888})
    assert got == ("runs <!-- count:tests_collected -->1888<!-- /count --> tests, 10 others; "
                   "<!-- count:nope -->3<!-- /count -->")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(text)
    (tmp_path / "docs" / "a.md").write_text("no counts")
    assert c.rewrite_docs({"tests_collected": 5}, tmp_path) == [tmp_path / "README.md"]
    assert c.marked((tmp_path / "README.md").read_text())[0] == ("tests_collected", "5")
    rec = tmp_path / "counts.json"
    c.record({"tests_collected": 5}, rec)
    assert json.loads(rec.read_text())["command"] == "vccc bench counts"
    assert c.read_record(rec) == {"tests_collected": 5}


def test_the_readme_reads_in_five_minutes():
    """Issue 45: at most 250 lines, in this order: what the project is, the two commands, a
    first run, where results go; measurements live in docs/ (no load averages or commit
    hashes in the README)."""
    import re

    text = c.docs()[0].read_text()
    assert len(text.splitlines()) <= 250
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[:3] == ["Install and the two commands", "A first run", "Where results go"]
    assert "make test" in text and "make sweep" in text
    assert not re.search(r"\bload (average )?~?\d|\b[0-9a-f]{7}\b \(|CPU-min", text)


def test_a_whole_suite_run_collects_the_recorded_number_of_tests(request):
    """In `make test` (pytest on tests/, `-m 'not slow'`, no -k) this session's items are the
    suite: their number must be the one docs/counts.json records, so a test added or removed
    without `vccc bench counts` fails here. Any narrower run skips (it sees part of the suite)."""
    from pathlib import Path

    cfg = request.config
    whole = [Path(a).resolve() for a in cfg.args] in ([c.ROOT / "tests"], [c.ROOT])
    narrowed = (cfg.option.keyword or cfg.option.markexpr != "not slow" or cfg.option.ignore
                or cfg.option.ignore_glob or cfg.option.deselect)
    if not whole or narrowed:
        pytest.skip("not a whole-suite run (`make test`)")
    assert len(request.session.items) == c.read_record()["tests_collected"], (
        "the suite's size changed: run `vccc bench counts`")
