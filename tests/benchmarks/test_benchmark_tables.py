"""The benchmarks' pure parts: settings, row selection and the table strings (columns and
ratios), on hand-made rows. No timing and no compilation happens here."""

import jax
import jax.numpy as jnp
import pytest

from vccc_jax.benchmarks import estimators, tabular, train

EST_NAMES = ["ours", "inplace", "assoc", "rlax-BM", "rlax-TM", "stream"]
EST_ROWS = [{"T": 128, "B": 4096, "ours": 1200.0, "inplace": 2400.0, "assoc": 300.0,
             "rlax-BM": 600.0, "rlax-TM": 1000.0, "stream": 1500.0,
             "targets": {"iw-td": 600.0, "gae": 800.0, "gae-via-vtrace": 400.0,
                         "rlax-gae": 200.0}},
            {"T": 512, "B": 65536, "ours": 90.0, "inplace": 150.0, "assoc": 30.0,
             "rlax-BM": 60.0, "rlax-TM": 75.0, "stream": 100.0}]


def test_estimator_settings_defaults():
    assert estimators.settings(quick=True) == (estimators.QUICK_SIZES, 5, 64)
    assert estimators.settings() == (estimators.FULL_SIZES, 9, 512)
    assert estimators.settings(reps=3, sizes=[(8, 16)], ceiling_mib=2) == (((8, 16),), 3, 2)
    assert estimators.FULL_SIZES == ((128, 4096), (1024, 4096), (32, 65536), (512, 65536))
    assert estimators.bytes_per_transition() == estimators.BYTES_PER_TRANSITION == 24
    assert estimators.bytes_per_transition("float64", 5) == 40


def test_estimator_table_columns_and_ratios():
    lines = estimators.format_table(EST_ROWS, EST_NAMES, ceiling_mts=300.0).splitlines()
    head = lines[0].split()
    assert head[:2] == ["T", "B"] and "ours/BM" in head and head[-1] == "ours/stream"
    first = lines[1].split()
    assert first[:3] == ["128", "4096", "1200"]
    # ours/BM, ours/TM, inpl/BM, inpl/TM, ours %ceil, inpl %ceil, ours/stream
    assert first[-7:] == ["2.00x", "1.20x", "4.00x", "2.40x", "400%", "800%", "0.80"]
    widths = {len(line) for line in lines}
    assert len(widths) == 1  # right-aligned columns


def test_estimator_footer_reports_the_issue_targets():
    text = estimators.footer(EST_ROWS, ceiling_mts=300.0, have_rlax=True)
    assert "at (128, 4096): 2.00x (NOT met); >= 2x rlax-TM: 1.20x (NOT met)" in text
    assert "ours >= 50% of the ceiling at every size: worst 30% at (512, 65536) (NOT met)" in text
    assert "inplace >= 60% of the ceiling at every size: worst 50% at (512, 65536)" in text
    assert "reaches 500%, 33% of the ceiling" in text
    fast = [dict(EST_ROWS[0], **{"rlax-BM": 300.0, "rlax-TM": 600.0})]
    assert "4.00x (met); >= 2x rlax-TM: 2.00x (met)" in estimators.footer(fast, 300.0, True)
    assert "target" not in estimators.footer(EST_ROWS[:0], 300.0, True)


def test_estimator_targets_table_bytes_and_ratios():
    arrays = {"iw-td": 6, "gae": 5, "gae-via-vtrace": 5, "rlax-gae": 5}
    text = estimators.format_targets(EST_ROWS, arrays, ceiling_bps=24e9)
    lines = text.splitlines()
    assert lines[0].split() == ["T", "B", "target", "B/tr", "M/s", "%ceil", "vs",
                                "gae-via-vtrace", "vs", "rlax-gae"]
    rows = {line.split()[2]: line.split() for line in lines[1:]}
    assert set(rows) == set(arrays)  # only the size that has targets
    assert rows["iw-td"][3:6] == ["24", "600", "60%"]  # 600e6 * 24 B / 24 GB/s
    assert rows["gae"][3:] == ["20", "800", "67%", "2.00x", "4.00x"]
    f64 = estimators.format_targets(EST_ROWS, arrays, 24e9, "float64").splitlines()
    assert [r.split()[3] for r in f64[1:]][:2] == ["48", "40"]


def test_crossover_table_and_rule_text():
    rows = [{"T": 32, "B": 1, "scan_s": 1.0, "assoc_s": 2.0},
            {"T": 32, "B": 16, "scan_s": 3.0, "assoc_s": 1.0},
            {"T": 128, "B": 1, "scan_s": 1.0, "assoc_s": 4.0}]
    lines = estimators.format_crossover(rows).splitlines()
    assert lines[0].split() == ["T", "\\", "B", "1", "16"]
    assert lines[1].split() == ["32", "0.50", "3.00"] and lines[2].split() == ["128", "0.25", "-"]
    assert lines[-1].endswith("associative wins at (32, 16)")
    assert "wins nowhere" in estimators.format_crossover(rows[:1])


def test_tabular_rows_table():
    row = {"N": 4, "S": 3, "A": 2, "numpy f32": 100.0, "numpy f64": 80.0, "jax vmap": 50.0,
           "jax lapack": 200.0, "jax auto": 400.0, "jax auto err": 1e-7,
           "jax auto compile_s": 1.5}
    lines = tabular.format_rows([row]).splitlines()
    assert len(lines) == 2 and "auto/np32" in lines[0]
    assert lines[1].split()[-5:] == ["0.50x", "2.00x", "4.00x", "1.0e-07", "1.5s"]


def test_train_rows_and_table():
    assert train.select_rows(" reference, lag8-vccc ,") == ["reference", "lag8-vccc"]
    with pytest.raises(ValueError, match="unknown rows"):
        train.select_rows("sync-gae,bogus")
    timings = [train.Timing("sync-gae", 1.0, 2.0, 200_000, 500.0, warm_s=0.25),
               train.Timing("lag8-vccc", 1.5, 2.5, 200_000, 480.0)]
    table = train.format_table(timings).splitlines()
    assert "compile s cold | compile s warm" in table[0]
    assert table[2] == "| sync-gae | 100.0k | 1.00x | 1.00 | 0.25 | 2.00 | 500.0 |"
    assert table[3] == "| lag8-vccc | 80.0k | 0.80x | 1.50 | - | 2.50 | 480.0 |"
    assert "25.0%" in train.footer(timings)
    assert train.footer(timings[:1]) == ""
    assert train.as_rows(timings)[1]["steps_per_s"] == pytest.approx(80_000.0)


def test_compile_cold_then_warm_from_the_persistent_cache():
    import jax.numpy as jnp

    x = jnp.linspace(0.0, 1.0, 9)
    before = jax.config.jax_compilation_cache_dir
    compiled, cold, warm = train.compile_cold_warm(lambda v: jnp.cumsum(jnp.tanh(v)) * 2.0, (x,))
    assert cold > 0 and warm is not None and warm > 0  # warm: loaded from the cache (a hit)
    assert jnp.allclose(compiled(x), jnp.cumsum(jnp.tanh(x)) * 2.0)
    assert jax.config.jax_compilation_cache_dir == before  # the private cache is gone again


def test_continuous_rows_and_footer_target():
    from vccc_jax.benchmarks import train_continuous as tc

    assert tc.ROW_NAMES == ("reference", "sync-gae", "lag8-gae", "lag8-vccc")
    with pytest.raises(ValueError, match="unknown rows"):
        train.select_names("lag8-vtrace", tc.ROW_NAMES)
    cfg = tc.train_config("lag8-vccc", 1, 4096)
    assert (cfg.env, cfg.num_envs, cfg.num_steps, cfg.resolved_num_versions, cfg.critic) == (
        "Pendulum-v1", 4, 128, 8, "vccc")
    timings = [train.Timing("reference (x)", 1.0, 4.0, 200_000, 0.0, cpu_s=2.0),
               train.Timing("sync-gae", 1.0, 2.0, 200_000, 0.0, cpu_s=4.0)]
    text = train.footer(timings, ref_target=1.0)
    assert "sync-gae vs reference: 2.00x (target >= 1.0x); in CPU time 0.50x" in text


def test_cold_compile_ignores_a_cache_that_holds_the_program(tmp_path):
    """`vccc bench train --grid`'s compile column is a real compile even when `vccc`'s
    persistent cache already holds the program (it once read 0.5 s for cached programs):
    the control load from the same cache is a hit, compile_cold is not."""
    import types

    import jax.numpy as jnp

    from vccc_jax.train import compile_cache as cc

    def f(x):
        return jnp.cos(x) * 5.0 - jnp.cumsum(x)

    def fresh():  # the same code as a new function object: jit's in-memory caches miss
        return types.FunctionType(f.__code__, f.__globals__, f.__name__, None, f.__closure__)

    x = jnp.arange(5.0)
    hits = []

    def listen(event, **_):
        if event == train._HIT:
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        with cc.using(tmp_path):
            train._compile(fresh(), (x,))  # written to the cache
            train._compile(fresh(), (x,))
            assert len(hits) == 1  # control: a plain compile loads it back
            compiled, seconds = train.compile_cold(fresh(), (x,))
            assert len(hits) == 1 and seconds > 0
            assert jax.config.jax_compilation_cache_dir == str(tmp_path)  # restored
    finally:
        jax.monitoring.unregister_event_listener(listen)
    assert jnp.allclose(compiled(x), f(x))


def test_time_rows_medians_each_placements_best(monkeypatch):
    """A fake clock: each run of (row, placement, round) lasts a duration written here (CPU
    time half of it), so the best per placement and the median over placements are known.
    Placements are rows that share a name (``prepare``: separate compiles)."""
    dur = {("a", 0): [3.0, 2.0], ("a", 1): [5.0, 6.0], ("a", 2): [4.0, 9.0],
           ("b", 0): [1.0, 1.5], ("b", 1): [8.0, 7.0], ("b", 2): [2.0, 2.0]}
    clock, calls = [0.0], []

    def row(name, i, compile_s=0.0):
        def fn(x):
            k = sum(1 for c in calls if c == (name, i))
            calls.append((name, i))
            clock[0] += dur[(name, i)][k]
            return x
        return train.Prepared(name, fn, (jnp.zeros(1),), compile_s, 100, lambda out: 0.0)

    monkeypatch.setattr(train.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train.time, "process_time", lambda: clock[0] / 2)
    rows = [row("a", 0, 7.0), row("a", 1, 8.0), row("a", 2, 9.0),
            row("b", 0, 1.0), row("b", 1), row("b", 2)]
    a, b = train.time_rows(rows, repeats=2)
    # per placement best: a 2, 5, 4 -> median 4; b 1, 7, 2 -> median 2
    assert (a.run_s, a.cpu_s, a.placement_cpu_s) == (4.0, 2.0, (1.0, 2.5, 2.0))
    assert (b.run_s, b.cpu_s, b.placement_cpu_s) == (2.0, 1.0, (0.5, 3.5, 1.0))
    assert (a.compile_s, b.compile_s) == (7.0, 1.0)  # the first placement's compile
    order = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert calls == order + order[::-1]  # round-robin, odd rounds reversed
    calls.clear()
    (one,) = train.time_rows([row("a", 0)], repeats=1)  # one placement: no per-placement tuple
    assert one.placement_cpu_s is None and one.run_s == 3.0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        train.time_rows([row("a", 0)], repeats=0)


def test_prepare_compiles_each_placement_again(monkeypatch):
    """``--placements``: every placement is its own compile of the row (the trainer and
    the reference alike), under the row's name; only the first measures the warm compile."""
    made = []

    def fake(kind):
        def make(*args, warm=True, **kw):
            made.append((kind, warm))
            return train.Prepared(kind, object(), (), 1.0 + len(made), 10, lambda o: 0.0)
        return make

    monkeypatch.setattr(train, "prepare_trainer", lambda name, *a, **kw: fake(name)(**kw))
    monkeypatch.setattr(train, "prepare_reference", fake("reference"))
    lines = []
    rows = train.prepare(["reference", "sync-gae"], 1, 512, progress=lines.append,
                         placements=3)
    assert [r.name for r in rows] == ["reference"] * 3 + ["sync-gae"] * 3
    assert len({id(r.fn) for r in rows}) == 6  # six separate executables
    assert made == [("reference", True), ("reference", False), ("reference", False),
                    ("sync-gae", True), ("sync-gae", False), ("sync-gae", False)]
    assert lines[0] == "  compiled reference in 2.00s cold, then 3.00, 4.00s (placements)"
    with pytest.raises(ValueError, match="placements must be >= 1"):
        train.prepare(["sync-gae"], 1, 512, placements=0)


def test_continuous_prepare_compiles_each_placement_again(monkeypatch):
    """The continuous bench's rows take ``--placements`` the same way: fresh compiles under
    the row's name, the warm compile measured on the first only."""
    from vccc_jax.benchmarks import train_continuous as tc

    made = []

    def fake(name, *args):
        warm = args[-1]
        made.append((name, warm))
        return train.Prepared(name, object(), (), 1.0, 10, lambda o: 0.0)

    monkeypatch.setattr(tc, "prepare_trainer", lambda name, s, t, actor, warm: fake(name, warm))
    monkeypatch.setattr(tc, "prepare_reference", lambda s, t, warm: fake("reference", warm))
    rows = tc.prepare(["reference", "sync-gae"], 1, 512, placements=2)
    assert [r.name for r in rows] == ["reference", "reference", "sync-gae", "sync-gae"]
    assert made == [("reference", True), ("reference", False), ("sync-gae", True),
                    ("sync-gae", False)]
    with pytest.raises(ValueError, match="placements must be >= 1"):
        tc.prepare(["sync-gae"], 1, 512, placements=0)


def test_estimator_rows_with_their_own_ceiling():
    """A row timed with its own ceiling (GB/s) is judged against it, not the run's."""
    rows = [dict(EST_ROWS[0], ceiling_gbs=57.6)]  # 57.6 GB/s / 24 B = 2400 M transitions/s
    lines = estimators.format_table(rows, EST_NAMES, ceiling_mts=300.0).splitlines()
    first = lines[1].split()
    assert "stream M/s  ceil GB/s" in lines[0]
    assert first[8] == "57.6" and first[-3:] == ["50%", "100%", "0.80"]
    f64 = estimators.format_table(rows, EST_NAMES, 300.0, "float64").splitlines()[1].split()
    assert f64[-3:] == ["100%", "200%", "0.80"]  # 48 B a transition
    text = estimators.footer(rows, ceiling_mts=300.0, have_rlax=True)
    assert "worst 50% at (128, 4096) (met)" in text and "worst 100% at (128, 4096) (met)" in text
    targets = estimators.format_targets(rows, {"iw-td": 6, "gae": 5, "gae-via-vtrace": 5,
                                               "rlax-gae": 5}, ceiling_bps=1.0).splitlines()
    assert targets[1].split()[3:6] == ["24", "600", "25%"]  # 600e6 * 24 / 57.6e9


def test_estimator_rows_split_over_host_devices():
    """--host-devices 2 adds ours-2dev / inpl-2dev: each over its one-device row and as a
    fraction of the row's ceiling, after the usual columns."""
    rows = [dict(EST_ROWS[0], **{"ours-2dev": 1800.0, "inpl-2dev": 2400.0})]
    names = EST_NAMES + ["ours-2dev", "inpl-2dev"]
    lines = estimators.format_table(rows, names, ceiling_mts=3000.0).splitlines()
    assert lines[0].endswith("ours-2dev/1dev  ours-2dev %ceil  inpl-2dev/1dev  inpl-2dev %ceil")
    assert lines[1].split()[-4:] == ["1.50x", "60%", "1.00x", "80%"]
