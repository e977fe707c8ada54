"""``vccc sweep --dry-run / --export csv / --track``, ``vccc list`` and ``vccc bench commands``
(no sweep computes here: the stores are written by the test, with known timings)."""

import csv
import io
import json
import sys

import pytest

from vccc_jax import cli
from vccc_jax.commands import sweep
from vccc_jax.runs import schema
from vccc_jax.runs.store import ResultStore, cell_id

SWEEP = {"name": "t", "kind": "tabular_sweep",
         "base": {"num_mdps": 2, "families": [{"name": "g", "kind": "garnet", "num_states": 4,
                                               "num_actions": 2, "branching": 2}],
                  "history": {"num_versions": 5}, "train": {"num_updates": 10}},
         "grid": {"laws": ["fixed", "uniform"], "mean_lags": [0, 1, 2],
                  "methods": ["uncorrected", "vccc"]}}  # 2 x 3 x 2 = 12 cells


def _store(directory, rows):
    directory.mkdir(exist_ok=True)
    with ResultStore(directory / "t.jsonl") as store:
        for r in rows:
            store.append(r)


def _config(tmp_path, table=SWEEP):
    path = tmp_path / "t.toml"
    path.write_text(schema.dumps(table))
    return path


def test_dry_run_counts_cells_and_times_the_rest(tmp_path, capsys):
    path = _config(tmp_path)
    _, _, cells = sweep.plan(schema.load(path))
    assert len(cells) == 12
    argv = ["sweep", "--config", str(path), "--results", str(tmp_path / "res"), "--figures",
            str(tmp_path / "figs"), "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "12 cells, 0 already in" in out and "12 to compute" in out
    assert "ETA unknown" in out
    # 4 cells stored: 2 from a tabular group (run_s 3.0 over 2 cells: 1.5 s each, compile
    # 10 s), 2 timed per cell (3 s, 5 s): median 2.25 s -> 8 x 2.25 = 18 s + 10 s compile
    timings = {"group": "g/vccc", "group_cells": 2, "run_s": 3.0, "compile_s": 10.0}
    metas = [{"timings": timings}, {"timings": timings}, {"timings": {"cell_s": 3.0}},
             {"seconds": 5.0}]
    rows = [{"id": cell_id(c), "cell": c, "metrics": {}, "meta": m}
            for c, m in zip(cells, metas)]
    assert not (tmp_path / "res").exists() and not (tmp_path / "figs").exists()  # made none
    _store(tmp_path / "res", rows)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "12 cells, 4 already in" in out and "8 to compute" in out
    assert "ETA 00:18 compute + 00:10 compile" in out and "8 cells x 2.25 s" in out


def test_export_csv_and_tracking_read_the_store(tmp_path, capsys, monkeypatch):
    path = _config(tmp_path)
    _, _, cells = sweep.plan(schema.load(path))
    ids = [cell_id(c) for c in cells]
    rows = [{"id": ids[i], "cell": cells[i], "metrics": {"err": 0.5 * i, "per_seed": [i, i + 1]},
             "meta": {"seconds": 1.0, "git": {"rev": "abc"}, "packages": {"jax": "x"}}}
            for i in range(3)]
    _store(tmp_path, rows)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert cli.main(["sweep", "--config", str(path), "--results", str(tmp_path),
                     "--export", "csv"]) == 0
    monkeypatch.undo()
    table = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["id"] for r in table] == ids[:3]
    assert table[2]["cell.family.num_states"] == "4" and table[2]["metrics.err"] == "1.0"
    assert table[2]["cell.law"] == cells[2]["law"] and table[2]["cell.method"] == "uncorrected"
    assert json.loads(table[1]["metrics.per_seed"]) == [1, 2]
    assert table[0]["meta.git.rev"] == "abc" and "meta.packages.jax" not in table[0]
    assert "exported 3 rows" in capsys.readouterr().err
    # --track: every stored cell of the grid becomes one HParams row (event files)
    args = sweep.build_parser().parse_args(["--results", str(tmp_path), "--track",
                                            f"tensorboard:{tmp_path / 'tb'}"])
    sweep._track(args, schema.load(path), ids, tmp_path / "t.jsonl")
    assert sorted(p.name for p in (tmp_path / "tb").iterdir() if p.is_dir()) == sorted(ids[:3])


def test_list_reads_the_registries(capsys):
    from vccc_jax.envs.make import ENVS
    from vccc_jax.estimators.registry import CRITIC_TARGETS

    out = {}
    for what in ("envs", "critics", "actors", "experiments"):
        assert cli.main(["list", what]) == 0
        out[what] = capsys.readouterr().out
    assert all(name in out["envs"] for name in ENVS) and "token:" in out["envs"]
    assert all(f"\n{name} " in out["critics"] for name in CRITIC_TARGETS)
    assert "truncate" in out["actors"]
    assert any(line.split()[:2] == ["tabular_default.toml", "tabular_sweep"]
               for line in out["experiments"].splitlines())


def test_bench_commands_measures_a_subprocess(tmp_path):
    from vccc_jax.benchmarks import commands as b

    assert [r.name for r in b.select("help,verify")] == ["help", "verify"]
    assert {r.group for r in b.select(group=None)} == set(b.GROUPS)
    row = b.Row("version", "start", ("--version",))
    r = b.measure(row, tmp_path)
    assert r["returncode"] == 0 and r["wall_s"] > 0 and r["cpu_s"] > 0
    assert r["command"] == "vccc --version" and r["load_start"] >= 0
    table = b.format_table([r])
    assert table.splitlines()[2].startswith("| `vccc --version` | ")
    assert b.command_line(b.select("sweep-smoke")[0]).startswith(
        "vccc sweep --config experiments/tabular_smoke.toml --results results")


def test_bench_commands_record_keeps_the_newest_good_row_and_fills_the_readme(tmp_path):
    from vccc_jax.benchmarks import commands as b

    def row(name, wall, rc=0):
        return {"name": name, "command": f"vccc {name}", "wall_s": wall, "cpu_s": wall / 2,
                "returncode": rc, "load_start": 1.0, "load_end": 2.0, "error": "boom" * rc,
                "date": "2026-12-01T20:00+00:00", "host": "h", "cpus": 2}

    record = b.record_path(tmp_path / "times.md")
    assert record == tmp_path / "times.jsonl"
    b.append_record(record, [row("verify", 100.0), row("help", 0.2)])
    b.append_record(record, [row("verify", 50.0), row("verify", 1.0, rc=1), row("gone", 1.0)])
    shown = b.newest(b.read_record(record))
    # ROWS order, the later good run of verify wins, a failure never replaces it, unknown dropped
    assert [(r["name"], r["wall_s"]) for r in shown] == [("help", 0.2), ("verify", 50.0)]
    assert "| `vccc verify` | every identity of the write-up" in b.page(shown)
    readme = "intro\n" + b.BEGIN + "\nstale\n" + b.END + "\nrest\n"
    out = b.with_table(readme, shown)
    assert out.startswith("intro\n" + b.BEGIN) and out.endswith(b.END + "\nrest\n")
    assert "stale" not in out and "| 50 s | 25 s | 0.50 | 1.0-2.0 | 2026-12-01 |" in out
    with pytest.raises(ValueError, match="markers"):
        b.with_table("no markers", shown)


def _with_bad_lines(src, dst):
    """``src`` with two bad lines put in as lines 5 and 10 (text, then JSON that is no row)."""
    lines = src.read_bytes().splitlines(keepends=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(b"".join(lines[:4] + [b"not json\n"] + lines[4:8] + [b"[1, 2]\n"]
                             + lines[8:]))
    return len(lines)


def test_every_store_reader_skips_bad_lines_with_one_warning(tmp_path, capsys, monkeypatch):
    """Issue 30 break 2: a garbage line in the middle of a store made every reader fail. Each
    reader now reads every good row, prints ONE warning line naming the file and the line
    numbers, and leaves the file as it is."""
    from pathlib import Path

    from vccc_jax import plotting

    data = Path(__file__).resolve().parents[1] / "data"
    res = tmp_path / "res"
    store = res / "async_ac_tiny.jsonl"
    n = _with_bad_lines(data / "results" / "async_ac_tiny.jsonl", store)
    smoke = res / "tabular_smoke.jsonl"
    n_smoke = _with_bad_lines(data / "results" / "tabular_smoke.jsonl", smoke)
    before = {p: p.read_bytes() for p in (store, smoke)}
    drawn = []
    monkeypatch.setattr(plotting, "make_figures", lambda rows, out: drawn.append(len(rows)) or [out])
    base = ["sweep", "--config", str(data / "experiments" / "async_ac_tiny.toml"), "--results",
            str(res), "--no-figures", "--no-progress"]
    cases = [(base + ["--dry-run"], f"{n} cells, {n} already in", "out"),
             (base + ["--export", "csv"], f"exported {n} rows", "err"),
             (base, f"{n}/{n} cells in", "out"),
             (["figures", "--store", str(smoke), "--out", str(tmp_path / "figs")],
              f"{smoke}: 1 files", "out")]
    for argv, says, where in cases:
        capsys.readouterr()
        assert cli.main(argv) == 0, argv
        got = capsys.readouterr()
        assert says in getattr(got, where), (argv, got)
        warned = [line for line in got.err.splitlines() if "warning" in line]
        path = smoke if argv[0] == "figures" else store
        assert warned == [f"vccc {argv[0]}: warning: {path}: skipped 2 lines that are not a "
                          "result row (lines 5, 10); the other rows are read, the file is left "
                          "as it is"], got.err
    assert drawn == [n_smoke]
    assert {p: p.read_bytes() for p in (store, smoke)} == before  # nothing rewritten


def test_a_torn_last_line_is_one_warning_in_every_reader(tmp_path, capsys, monkeypatch):
    """Issue 45 row 4: a store with a garbage line and a torn last line (a killed writer's
    prefix) gets the same two warning lines from ``vccc sweep --dry-run``, ``--export csv``,
    ``vccc figures --store`` and ``vccc figures --results`` (make figures: before the
    notebooks run in their kernel, whose warnings the console never sees); files unchanged."""
    from pathlib import Path

    from vccc_jax import plotting
    from vccc_jax.commands import figures

    data = Path(__file__).resolve().parents[1] / "data"
    res = tmp_path / "res"
    store = res / "async_ac_tiny.jsonl"
    n = _with_bad_lines(data / "results" / "async_ac_tiny.jsonl", store)
    torn = b'{"id": "abc", "cell": {"la'
    store.write_bytes(store.read_bytes() + torn)
    before = store.read_bytes()
    monkeypatch.setattr(plotting, "make_figures", lambda rows, out: [out])
    monkeypatch.setattr(figures, "run_notebooks", lambda *a, **k: {"x": {"figures": 1}})
    base = ["sweep", "--config", str(data / "experiments" / "async_ac_tiny.toml"), "--results",
            str(res), "--no-figures", "--no-progress"]
    for argv in (base + ["--dry-run"], base + ["--export", "csv"],
                 ["figures", "--store", str(store), "--out", str(tmp_path / "figs")],
                 ["figures", "--results", str(res), "--out", str(tmp_path / "nb")]):
        capsys.readouterr()
        assert cli.main(argv) == 0, argv
        got = capsys.readouterr()
        warned = [line for line in got.err.splitlines() if "warning" in line]
        assert warned == [
            f"vccc {argv[0]}: warning: {store}: skipped 2 lines that are not a result row "
            "(lines 5, 10); the other rows are read, the file is left as it is",
            f"vccc {argv[0]}: warning: {store}: ignored a partial last line ({len(torn)} bytes "
            "without a newline: a write cut short, or one still in progress); the complete "
            "rows are read, the file is left as it is"], (argv, got.err)
    assert n > 10 and store.read_bytes() == before


def test_make_figures_leaves_a_clean_tree_and_the_gallery_adds_nothing(tmp_path, capsys,
                                                                         monkeypatch):
    """Issue 45 row 10: `make figures` left 6 untracked PNGs in docs/figures. It now writes
    figures/ only; `make gallery` (--gallery) refreshes the PNGs the gallery holds and adds
    none, saying which it did not add."""
    import re
    from pathlib import Path

    from vccc_jax.commands import figures

    root = Path(__file__).resolve().parents[2]
    make = (root / "Makefile").read_text()
    recipe = re.search(r"^figures:.*\n\t(.*)$", make, re.M).group(1)
    assert "vccc figures" in recipe and "--gallery" not in recipe
    assert "--gallery docs/figures" in re.search(r"^gallery:.*\n\t(.*)$", make, re.M).group(1)

    def fake_run(results, out, gallery, names, **kw):  # draws two small PNGs
        for name in ("kept", "new"):
            (gallery / f"{name}.png").write_bytes(b"\x89PNG new")
        return {"nb": {"figures": 2, "why": ""}}

    monkeypatch.setattr(figures, "run_notebooks", fake_run)
    gallery = tmp_path / "docs_figures"
    gallery.mkdir()
    (gallery / "kept.png").write_bytes(b"\x89PNG old")
    (tmp_path / "res").mkdir()
    assert cli.main(["figures", "--results", str(tmp_path / "res"), "--out",
                     str(tmp_path / "figs"), "--gallery", str(gallery)]) == 0
    assert sorted(p.name for p in gallery.iterdir()) == ["kept.png"]
    assert (gallery / "kept.png").read_bytes() == b"\x89PNG new"
    assert (f"gallery: refreshed 1 PNGs in {gallery}; 1 drawn that it does not hold were not "
            "added (copy one there to add it): new.png") in capsys.readouterr().out


def test_doc_image_links_resolve():
    """Issue 45 row 10: docs/actor_map.md linked an image that is not in the repository."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", md.read_text()):
            if not target.startswith("http"):
                assert (md.parent / target).is_file(), f"{md.name}: {target}"


def test_figures_says_which_notebooks_drew_no_figure_and_why(tmp_path, capsys, monkeypatch):
    """Issue 30: 4 of 9 notebooks drew nothing and ``make figures`` did not say which or why.
    The kernel is faked: ``clipping`` writes one PNG, ``neural_lag`` prints that it found no
    stores (as the real one does on an empty results directory)."""
    import nbformat

    from vccc_jax.commands import figures
    from vccc_jax.runs import examples

    out = tmp_path / "figs"

    def fake_execute(stem, cwd, km=None, timeout=600):
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("")
        if stem == "clipping":
            (out / "clip.png").write_bytes(b"\x89PNG")
            text = "stores: ['tabular_default.jsonl']\n"
        else:
            text = "stores: none\nregime stores: none\n"
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
        return nb

    class Kernel:
        def shutdown_kernel(self, now=False):
            pass

    monkeypatch.setattr(examples, "write_examples", lambda results: None)
    monkeypatch.setattr(figures, "load_notebook", lambda path, params: path.stem)
    monkeypatch.setattr(figures, "execute", fake_execute)
    monkeypatch.setattr(figures, "start_kernel", Kernel)
    out.mkdir()
    (out / "earlier.png").write_bytes(b"\x89PNG")  # not drawn by this run: not counted
    rc = cli.main(["figures", "--results", str(tmp_path), "--out", str(out), "--only",
                   "clipping", "neural_lag"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines[0].startswith("clipping.py: ran in ") and lines[0].endswith("s, 1 figures")
    assert lines[1].startswith("neural_lag.py: ran in ") and lines[1].endswith(
        "s, drew no figure (stores: none; regime stores: none)")
    assert lines[2:] == [f"1 figures (PNG + PDF) drawn in {out}",
                         "1 of 2 notebooks drew no figure (results absent: the commands are in "
                         "each notebook's first cell): neural_lag (stores: none; regime stores: "
                         "none)"]
    nb = fake_execute("bandit", tmp_path)  # nothing absent said: its last line is the reason
    nb.cells[0].outputs[0]["text"] = "3 settings\nmax err 1e-9\n"
    assert figures.why_no_figure(nb) == "its last output: max err 1e-9"
