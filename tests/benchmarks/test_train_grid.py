"""``vccc bench train --grid`` (issue 28): cells, the per-cell record, the grid table, the
target checks and the generated docs block, on hand-made Timing rows (numbers written here,
ratios worked out by hand). Nothing is compiled or timed."""

import pytest

from vccc_jax import cli
from vccc_jax.benchmarks import train_grid as g
from vccc_jax.benchmarks.train import Timing
from vccc_jax.commands import bench_train

META = {"date": "2026-12-02T07:00:00+00:00", "command": "vccc bench train --grid",
        "jax": "0.10.2", "platform": "cpu", "cpus": 2, "git": "abc", "wall_s": 90.0}


def _rec(seeds, envs, updates, rows, loads=(1.0, 2.0), meta=META):
    """A record of hand-made rows: (name, compile s, run s, cpu s) at the cell's env steps."""
    cell = g.Cell(seeds, envs, updates)
    steps = cell.timesteps * seeds
    timings = [Timing(n, c, r, steps, 20.0, cpu_s=cpu) for n, c, r, cpu in rows]
    return g.make_record(cell, timings, repeats=3, actor="truncate", load_start=loads[0],
                         load_end=loads[1], meta=meta)


# 1 seed x 4 envs x 2 updates = 1024 env steps: sync 1024/s wall, 1280/s CPU
A = _rec(1, 4, 2, [("reference (PureJaxRL-style)", 10.0, 2.0, 1.0), ("sync-gae", 12.0, 1.0, 0.8),
                   ("lag8-vccc", 13.0, 1.25, 0.8), ("lag32-vtrace", 14.0, 1.0, 1.6)])
# 8 seeds x 64 envs x 1 update = 65536 env steps
B = _rec(8, 64, 1, [("reference (PureJaxRL-style)", 20.0, 1.0, 1.0), ("sync-gae", 22.0, 1.0, 1.0),
                    ("lag8-vccc", 23.0, 1.0, 1.1), ("lag32-vtrace", 30.0, 1.05, 1.05)],
       loads=(3.0, 0.5))


def test_plan_runs_whole_updates_of_envs_x_128_steps():
    cells = g.plan((1, 8), (4, 64), timesteps=100_000)
    # 100000 // (4 * 128) = 195 updates, // (64 * 128) = 12; seeds outer, envs inner
    assert cells == [g.Cell(1, 4, 195), g.Cell(1, 64, 12), g.Cell(8, 4, 195), g.Cell(8, 64, 12)]
    assert cells[1].timesteps == 12 * 64 * 128 == 98_304
    with pytest.raises(ValueError, match="less than one update"):
        g.plan((1,), (512,), timesteps=65_535)  # one update is 65536 steps
    assert [c.updates for c in g.plan((8,), (512,))] == [g.UPDATES[(8, 512)]]
    # an unlisted cell: ~1.5 s at the assumed rate, at least one update
    assert g.default_updates(2, 16) == round(1.5 * g._ASSUMED_STEPS_PER_S / (2 * 16 * 128))
    assert g.default_updates(64, 4096) == 1
    assert set(g.UPDATES) == {(s, e) for s in g.GRID_SEEDS for e in g.GRID_ENVS}


def test_parse_ints_rejects_bad_lists():
    assert g.parse_ints(" 1, 8,", "--seeds") == (1, 8)
    for bad in ("", "0", "4,x", "-4", "4,4"):
        with pytest.raises(ValueError, match="--envs"):
            g.parse_ints(bad, "--envs")


def test_record_round_trip_newest_and_key(tmp_path):
    path = tmp_path / "r.jsonl"
    older = _rec(1, 4, 2, [("sync-gae", 1.0, 9.0, 9.0)])
    for rec in (older, B, A):
        g.append_record(path, rec)
    back = g.read_record(path)
    assert back == [older, B, A] and g.timings(back[2]) == g.timings(A)
    assert A["rows"] == ["reference", "sync-gae", "lag8-vccc", "lag32-vtrace"]
    assert (A["timesteps"], A["num_steps"], A["load_start"], A["git"]) == (1024, 128, 1.0, "abc")
    # the newest record per (seeds, envs), in cell order; the older 1x4 record is replaced
    assert g.newest(back) == [A, B]
    assert g.key(A) != g.key(older)  # other rows: resume does not skip it
    assert g.key(A) == g.key(dict(A, date="later", timings=[]))
    assert g.read_record(tmp_path / "none.jsonl") == []
    # placements: in the key (a 3-placement grid does not resume from a 1-placement one);
    # records written before the field count as 1; per-placement CPU times come back as tuples
    placed = dict(A, placements=3)
    assert g.key(placed) != g.key(A) and g.key(A) == g.key({**A, "placements": 1})
    t = Timing("sync-gae", 1.0, 2.0, 1024, 20.0, cpu_s=2.0, placement_cpu_s=(1.9, 2.0, 2.4))
    rec = g.make_record(g.Cell(1, 4, 2), [t], repeats=3, placements=3, actor="truncate",
                        load_start=1.0, load_end=1.0, meta=META)
    g.append_record(path, rec)
    assert rec["placements"] == 3 and g.timings(g.read_record(path)[-1]) == [t]
    # a placement is now a compile: records of input copies (older, no field) never resume it
    assert rec["placement"] == g.PLACEMENT == "compile" and g.key(rec) != g.key(dict(rec, placement="copy"))
    assert g.key(dict(rec, placement="copy")) == g.key(
        {k: v for k, v in rec.items() if k != "placement"})
    assert "3 placement(s) (compiles of a row's program" in g.block([rec])
    old = {k: v for k, v in placed.items() if k != "placement"}  # written before the field
    assert "3 placement(s) (copies of a row's input state" in g.block([old])


def test_grid_table_ratios_wall_and_cpu():
    lines = g.format_grid([A, B]).splitlines()
    assert len(lines) == 2 + 8
    assert lines[0].startswith("| seeds | envs | updates (steps/seed) | row | env steps/s")
    # reference: 512/s wall vs sync 1024/s -> 0.50x; CPU 1024/s vs 1280/s -> 0.80x
    assert lines[2] == ("| 1 | 4 | 2 (1,024) | reference | 0.5k | 0.50x / 0.80x | 1.00x "
                        "| 10.0 | 2.00 | 1.00 | 20.0 |")
    assert lines[3] == ("| 1 | 4 | 2 (1,024) | sync-gae | 1.0k | 1.00x | 2.00x / 1.25x "
                        "| 12.0 | 1.00 | 0.80 | 20.0 |")
    # lag8: 1024 / 1.25 s = 819/s -> 0.80x wall, same CPU -> 1.00x; vs ref 1.60x / 1.25x
    assert lines[4] == ("| 1 | 4 | 2 (1,024) | lag8-vccc | 0.8k | 0.80x / 1.00x | 1.60x / 1.25x "
                        "| 13.0 | 1.25 | 0.80 | 20.0 |")
    # 8 x 64 x 128 = 65536 steps per run of 1 s; lag32 1.05 s wall and CPU -> 0.95x
    assert lines[9] == ("| 8 | 64 | 1 (8,192) | lag32-vtrace | 62.4k | 0.95x / 0.95x "
                        "| 0.95x / 0.95x | 30.0 | 1.05 | 1.05 | 20.0 |")
    # with placements, the CPU column adds their range (the median stays the number)
    t = Timing("sync-gae", 1.0, 2.0, 1024, 20.0, cpu_s=2.0, placement_cpu_s=(2.4, 1.9, 2.0))
    rec = g.make_record(g.Cell(1, 4, 2), [t], repeats=3, placements=3, actor="truncate",
                        load_start=1.0, load_end=1.0, meta=META)
    assert g.format_grid([rec]).splitlines()[2].endswith("| 2.00 (1.90-2.40) | 20.0 |")


def test_checks_report_the_worst_cell_in_wall_and_cpu():
    by = {c.what: c for c in g.checks([A, B])}
    lag8, lag32 = by["lag8-vccc vs sync-gae"], by["lag32-vtrace vs sync-gae"]
    # lag8: wall 0.80 (1x4) vs 1.00 (8x64); CPU 1.00 (1x4) vs 1/1.1 (8x64)
    assert lag8.wall == pytest.approx(0.8) and lag8.cpu == pytest.approx(1 / 1.1)
    assert lag8.where == "wall 1x4, CPU 8x64" and lag8.met == (False, True)
    # lag32: wall 1.00 (1x4) vs 1/1.05 (8x64); CPU 0.8/1.6 = 0.5 (1x4)
    assert lag32.wall == pytest.approx(1 / 1.05) and lag32.cpu == pytest.approx(0.5)
    assert lag32.met == (True, False)
    one, eight = by["sync-gae vs reference, 1 seed(s)"], by["sync-gae vs reference, 8 seed(s)"]
    assert (one.wall, one.cpu, one.target, one.met) == (2.0, 1.25, 1.0, (True, True))
    # 8 seeds: sync as fast as the reference, target 1.1x: not met
    assert (eight.wall, eight.cpu, eight.target, eight.met) == (1.0, 1.0, 1.1, (False, False))
    assert eight.where == "8x64"
    # the boundary itself: exactly 0.90x is within 10%
    edge = _rec(1, 4, 2, [("sync-gae", 1.0, 0.9, 0.9), ("lag8-vccc", 1.0, 1.0, 1.0)])
    assert g.checks([edge])[0].met == (True, True)
    text = g.format_checks([A, B])
    assert ("lag8-vccc vs sync-gae: 0.80x / 0.91x at wall 1x4, CPU 8x64 (target >= 0.90x): "
            "NOT met / met") in text
    assert "sync-gae vs reference, 8 seed(s): 1.00x / 1.00x at 8x64 (target >= 1.10x)" in text
    # cold compile, the largest cell of each row
    assert "reference 20.0 (8x64), sync-gae 22.0 (8x64), lag8-vccc 23.0 (8x64), " \
           "lag32-vtrace 30.0 (8x64)" in text
    only_sync = _rec(1, 4, 2, [("sync-gae", 1.0, 1.0, 1.0)])
    assert g.checks([only_sync]) == []  # no target whose rows were not run


def test_docs_block_between_markers():
    page = f"intro\n{g.BEGIN}\nstale table\n{g.END}\noutro\n"
    later = dict(B, date="2026-12-03T01:00:00+00:00", command="vccc bench train --seeds 8")
    out = g.with_block(page, [A, later])
    assert out.startswith(f"intro\n{g.BEGIN}\n") and out.endswith(f"\n{g.END}\noutro\n")
    assert "stale table" not in out and g.format_grid([A, later]) in out
    head = out.split("\n")[2]
    assert "Measured 2026-12-02, 2026-12-03 on cpu, 2 CPUs (jax 0.10.2, git abc)" in head
    # loads over both cells' starts and ends; wall = 90 s + 90 s
    assert "load average 0.5-3.0 over the cells, 3.0 min wall" in head
    assert "`vccc bench train --grid`; `vccc bench train --seeds 8`" in head
    assert "read the CPU-time ratios" in head  # load 3.0 > 2 CPUs
    quiet = [dict(r, load_start=0.5, load_end=2.0) for r in (A, later)]
    assert "CPU-time ratios" not in g.with_block(page, quiet)  # load <= CPUs: no warning
    assert g.with_block(out, [A]).count(g.BEGIN) == 1  # idempotent: rewrites its own block
    with pytest.raises(ValueError, match="markers"):
        g.with_block("no markers here", [A])


def _settings(argv):
    return bench_train.settings(bench_train.train_parser().parse_args(argv))


def test_flags_grid_cells_rows_and_repeats():
    rows, cells, repeats, placements = _settings(["--grid"])
    assert rows == ["reference", "sync-gae", "lag8-vccc", "lag32-vtrace"] and repeats == 3
    assert placements == 3
    assert [(c.seeds, c.envs) for c in cells] == [(1, 4), (1, 64), (1, 512), (8, 4), (8, 64),
                                                  (8, 512)]
    assert [c.updates for c in cells] == [g.UPDATES[(c.seeds, c.envs)] for c in cells]
    # explicit flags win over --grid
    rows, cells, repeats, placements = _settings(["--grid", "--seeds", "8", "--rows",
                                                  "sync-gae", "--repeats", "2",
                                                  "--placements", "2"])
    assert rows == ["sync-gae"] and repeats == 2 and [c.seeds for c in cells] == [8, 8, 8]
    assert placements == 2
    # one cell without --grid: the old default, 500k steps per seed at 4 envs, best of 5
    rows, cells, repeats, placements = _settings([])
    assert cells == [g.Cell(1, 4, 500_000 // 512)] and repeats == 5 and "lag8-gae" in rows
    assert placements == 1
    _, cells, _, _ = _settings(["--envs", "4,64"])  # several cells: per-cell updates
    assert [c.updates for c in cells] == [g.UPDATES[(1, 4)], g.UPDATES[(1, 64)]]


@pytest.mark.parametrize("argv, match", [
    (["--envs", "4,four"], "--envs '4,four'"),
    (["--seeds", "0"], "--seeds '0'"),
    (["--envs", "512", "--timesteps", "1000"], "less than one update"),
    (["--grid", "--resume"], "--resume and --docs need --out"),
    (["--grid", "--out", "{tmp}/r.jsonl", "--docs", "pyproject.toml"], "markers"),
    (["--grid", "--out", "{tmp}/r.jsonl", "--docs", "{tmp}/none.md"], "no such file"),
    (["--continuous", "--envs", "64"], "--continuous runs one cell"),
    (["--grid", "--baseline", "{tmp}/none.jsonl"], "--baseline"),
])
def test_bad_flags_are_one_line(argv, match, capsys, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = cli.main(["bench", "train", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("vccc bench: "), err
    assert match in err[0], err[0]


def test_compare_with_a_baseline_record():
    stale = _rec(1, 4, 2, [("sync-gae", 99.0, 9.0, 9.0)])  # replaced by the newer OLD_A
    old_a = _rec(1, 4, 2, [("reference (PureJaxRL-style)", 10.0, 2.0, 1.0),
                           ("sync-gae", 24.0, 1.0, 0.4), ("lag8-vccc", 13.0, 1.25, 0.8),
                           ("lag32-vtrace", 7.0, 1.0, 1.6)], meta=dict(META, git="old"))
    lines = g.compare([A, B], [stale, old_a, B]).splitlines()
    assert lines[0].startswith("against the baseline record")
    # sync-gae: compile 12/24 = 0.5 at 1x4 and 1.0 at 8x64 (median of two: 0.75); CPU time
    # 0.8 s now vs 0.4 s before -> 0.5x the env steps/s; wall unchanged
    assert lines[2] == ("  sync-gae (2 cells): compile 0.75x [0.50-1.00] (met: <= 1.00x), "
                        "env steps/s CPU 0.75x [0.50-1.00], wall 1.00x [1.00-1.00]")
    assert lines[1].startswith("  reference (2 cells): compile 1.00x [1.00-1.00] (met: <= 1.00x)")
    # lag32: compile 14/7 = 2.0 and 1.0 -> median 1.5: not met
    assert lines[4].startswith("  lag32-vtrace (2 cells): compile 1.50x [1.00-2.00] (NOT met")
    assert g.compare([A], [B]) == ""  # no cell in both
    page = f"{g.BEGIN}\n{g.END}\n"
    out = g.with_block(page, [A, B], [old_a, B])
    assert "Baseline: the record of 2026-12-02, git abc; 2026-12-02, git old." in out
    assert lines[2] in out


def test_resume_skips_the_cells_its_record_holds(tmp_path, monkeypatch, capsys):
    """``--out`` then ``--resume``: the second run finds the first one's cell under the same
    key (placements and what a placement is included) and compiles nothing; other
    placements are a new measurement. Compiling and timing are fakes here."""
    from vccc_jax.benchmarks import train as b

    compiled = []

    def prepare(rows, seeds, timesteps, placements=1, **kw):
        compiled.append(placements)
        return [b.Prepared(r, None, (), 1.0, timesteps * seeds, lambda o: 0.0) for r in rows
                for _ in range(placements)]

    monkeypatch.setattr(b, "prepare", prepare)
    monkeypatch.setattr(b, "time_rows", lambda rows, repeats: [
        Timing(r.name, 1.0, 0.5, r.env_steps, 20.0, cpu_s=0.5) for r in rows[::2]])
    out = tmp_path / "r.jsonl"
    argv = ["--seeds", "1", "--envs", "4", "--rows", "sync-gae", "--timesteps", "1024",
            "--placements", "2", "--out", str(out)]
    assert bench_train.train(argv)() == 0 and compiled == [2]
    assert bench_train.train([*argv, "--resume"])() == 0 and compiled == [2]  # skipped
    assert "skipped (--resume)" in capsys.readouterr().err
    assert bench_train.train([*argv[:-3], "3", "--out", str(out), "--resume"])() == 0
    assert compiled == [2, 3] and len(g.read_record(out)) == 2
