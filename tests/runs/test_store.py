"""The append-only result store: atomic rows, partial-tail repair, dedupe, locking, shard
files and their union with the unsharded file."""

import json

import numpy as np
import pytest

from vccc_jax.runs import provenance as prov
from vccc_jax.runs import store as st


def _row(i, **metrics):
    cell = {"method": "vccc", "mean_lag": float(i), "clip": None}
    return {"id": st.cell_id(cell), "cell": cell, "metrics": {"x": float(i), **metrics},
            "meta": {"t": 0.1 * i}}


def test_cell_id_is_stable_and_order_independent():
    a = {"b": 1, "a": [1.5, None, "x"], "c": {"y": 2, "x": 1}}
    b = {"c": {"x": 1, "y": 2}, "a": [1.5, None, "x"], "b": 1}
    assert st.cell_id(a) == st.cell_id(b)
    assert len(st.cell_id(a)) == 16
    assert st.cell_id(a) != st.cell_id(dict(a, b=2))
    # Pinned: a change of serialisation would silently orphan every stored result.
    assert st.cell_id({"a": 1}) == "015abd7f5cc57a2d"


def test_canonical_json_converts_numpy_and_non_finite():
    out = json.loads(st.canonical_json({"a": np.float64(1.5), "b": np.arange(3),
                                        "c": float("nan"), "d": np.inf}))
    assert out == {"a": 1.5, "b": [0, 1, 2], "c": None, "d": None}
    with pytest.raises(TypeError, match="cannot store"):
        st.canonical_json({"a": object()})


def test_append_and_reopen_roundtrip(tmp_path):
    path = tmp_path / "s.jsonl"
    with st.ResultStore(path) as s:
        assert s.append(_row(1))
        assert s.append(_row(2, y=[1.0, 2.0]))
        assert not s.append(_row(1))  # duplicate id: refused, nothing written
    assert s.file == path  # the unsharded writer's file is the store's name
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2
    with st.ResultStore(path) as s:
        assert len(s) == 2 and s.has(_row(2)["id"])
        assert s.row(_row(2)["id"])["metrics"]["y"] == [1.0, 2.0]
    assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0, 2.0]


def test_row_id_must_match_cell(tmp_path):
    with st.ResultStore(tmp_path / "s.jsonl") as s:
        bad = dict(_row(1), id="0" * 16)
        with pytest.raises(ValueError, match="does not match"):
            s.append(bad)
        with pytest.raises(ValueError, match="'id' and 'cell'"):
            s.append({"metrics": {}})


def test_partial_trailing_line_is_ignored_then_truncated(tmp_path):
    path = tmp_path / "s.jsonl"
    with st.ResultStore(path) as s:
        s.append(_row(1))
    f = s.file
    full = f.read_bytes()
    # A kill in the middle of the second append leaves a prefix of its line.
    partial = (st.canonical_json(_row(2)) + "\n").encode()[:37]
    f.write_bytes(full + partial)
    with pytest.warns(st.StoreWarning, match=r"s.jsonl: ignored a partial last line \(37 by"):
        assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0]
    assert f.read_bytes() == full + partial  # a reader changes nothing (and says so)
    with pytest.warns(st.StoreWarning, match=r"s.jsonl: dropped a partial last line \(37 bytes"):
        s = st.ResultStore(path).open()  # never silently: the repair is announced
    try:
        assert len(s) == 1
        assert f.read_bytes() == full  # the partial tail was cut before appending
        s.append(_row(2))
    finally:
        s.close()
    assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0, 2.0]
    assert f.read_bytes().count(b"\n") == 2


def test_bad_complete_lines_are_skipped_with_a_warning_naming_them(tmp_path):
    """Issue 30: a line that is not a row (text, JSON that is no object with an id) is
    skipped and named in one warning; the rows around it are read, the file is unchanged,
    and a writer appends after it."""
    path = tmp_path / "s.jsonl"
    data = (st.canonical_json(_row(1)) + "\nnot json\n[1, 2]\n{\"x\": 1}\n"
            + st.canonical_json(_row(2)) + "\n").encode()
    path.write_bytes(data)
    with pytest.warns(st.StoreWarning, match=r"skipped 3 lines .* \(lines 2, 3, 4\)"):
        assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0, 2.0]
    assert path.read_bytes() == data
    with pytest.warns(st.StoreWarning, match="s.jsonl: skipped 3 lines"):
        with st.ResultStore(path) as s:
            assert len(s) == 2
            s.append(_row(3))
    assert path.read_bytes() == data + (st.canonical_json(_row(3)) + "\n").encode()


def test_duplicate_ids_in_file_keep_first(tmp_path):
    path = tmp_path / "s.jsonl"
    r1 = _row(1)
    r1b = dict(r1, metrics={"x": 99.0})
    path.write_text(st.canonical_json(r1) + "\n" + st.canonical_json(r1b) + "\n")
    rows = st.read_rows(path)
    assert len(rows) == 1 and rows[0]["metrics"]["x"] == 1.0


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    with st.ResultStore(path):
        with pytest.raises(st.StoreLockedError, match="another process"):
            st.ResultStore(path).open()
    with st.ResultStore(path) as s:  # released on close
        assert len(s) == 0
    # Same for a shard file; writers of other shards of the same store never wait.
    with st.ResultStore(path, shard=st.Shard(1, 3)) as a:
        with pytest.raises(st.StoreLockedError, match="shard 1/3"):
            st.ResultStore(path, shard=st.Shard(1, 3)).open()
        with st.ResultStore(path, shard=st.Shard(2, 3)) as b, st.ResultStore(path) as c:
            assert a.file != b.file != c.file


def test_table_rows_drop_meta_and_sort():
    rows = [_row(2), _row(1)]
    t = st.table_rows(rows)
    assert [r["id"] for r in t] == sorted(r["id"] for r in rows)
    assert all(set(r) == {"id", "cell", "metrics"} for r in t)


def test_load_results_directory(tmp_path):
    for name, i in (("a.jsonl", 1), ("b.jsonl", 2)):
        with st.ResultStore(tmp_path / name) as s:
            s.append(_row(i))
    with st.ResultStore(tmp_path / "sh.jsonl", shard=st.Shard(1, 2)) as s:  # shards only
        s.append(_row(3))
    (tmp_path / "notes").mkdir()  # a directory without shard files is not a store
    assert st.find_stores(tmp_path) == [tmp_path / n for n in ("a.jsonl", "b.jsonl", "sh.jsonl")]
    assert st.find_stores(tmp_path, "s*") == [tmp_path / "sh.jsonl"]
    assert sorted(r["metrics"]["x"] for r in st.load_results(tmp_path)) == [1.0, 2.0, 3.0]
    assert [r["metrics"]["x"] for r in st.load_results(tmp_path / "sh")] == [3.0]
    assert st.load_results(tmp_path / "missing.jsonl") == []


def test_shard_of_is_stable_and_partitions():
    # Pinned: sha256-based, so every machine and Python process agrees (not hash()).
    assert st.shard_of("015abd7f5cc57a2d", 1000) == 794
    assert st.shard_of("015abd7f5cc57a2d", 7) == 5
    keys = [st.cell_id({"i": i}) for i in range(400)]
    owners = [[st.Shard(i, 4).owns(k) for i in range(4)] for k in keys]
    assert all(sum(o) == 1 for o in owners)  # each key has exactly one owner
    # Balanced: each of 4 shards gets 100 +- 30 of 400 keys (binomial sd 8.7: > 3 sd).
    assert all(70 <= sum(o[i] for o in owners) <= 130 for i in range(4))
    assert all(st.Shard().owns(k) for k in keys[:5])
    assert st.parse_shard(" 2/8 ") == st.Shard(2, 8) and str(st.Shard(2, 8)) == "2/8"
    for bad in ("8/8", "1", "a/b", "-1/2", "1/0"):
        with pytest.raises(ValueError, match="--shard must be i/N"):
            st.parse_shard(bad)


def test_shards_union_equals_one_writer(tmp_path):
    rows = [_row(i) for i in range(12)]
    one = tmp_path / "one.jsonl"  # one writer: the reference
    with st.ResultStore(one) as s:
        for r in rows:
            assert s.owns(r["id"]) and s.append(r)
    path = tmp_path / "many.jsonl"  # three shard writers, each appending what it owns
    for i in range(3):
        with st.sharded(st.Shard(i, 3)), st.ResultStore(path) as s:
            assert s.shard == st.Shard(i, 3)
            for r in rows:
                if s.owns(r["id"]):
                    s.append(r)
    files = st.store_files(path)
    assert files == [tmp_path / "many" / f"shard-{i}-of-3.jsonl" for i in range(3)]
    per_file = [[json.loads(x)["id"] for x in f.read_text().splitlines()] for f in files]
    assert sum(map(len, per_file)) == 12 and len(set().union(*per_file)) == 12  # disjoint
    assert all(per_file)  # (12 keys: P(some shard empty) = 3 (2/3)^12 < 0.008)
    assert st.table_rows(st.read_rows(path)) == st.table_rows(st.read_rows(one))
    # Sharding an existing single-file store: its rows count as done for every shard.
    with st.ResultStore(one, shard=st.Shard(1, 2)) as s:
        assert len(s) == 12 and not s.append(rows[0])
        assert s.append(_row(12))
    assert st.store_files(one) == [one, tmp_path / "one" / "shard-1-of-2.jsonl"]
    assert len(one.read_text().splitlines()) == 12
    assert len(st.read_rows(tmp_path / "one")) == 13  # the store by its directory name
    # An id in two files (another shard count later): the unsharded file wins, then (N, i).
    dup = dict(rows[0], metrics={"x": -1.0})
    (tmp_path / "one" / "shard-0-of-5.jsonl").write_text(st.canonical_json(dup) + "\n")
    assert st.rows_by_id(one)[rows[0]["id"]]["metrics"]["x"] == 0.0


def test_file_system_without_locks_still_writes(tmp_path, monkeypatch):
    import errno

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(st.fcntl, "flock", no_locks)
    with st.ResultStore(tmp_path / "s.jsonl", shard=st.Shard(0, 2)) as s:
        assert s.append(_row(1))
    assert len(st.read_rows(tmp_path / "s.jsonl")) == 1

    def broken(fd, op):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(st.fcntl, "flock", broken)
    with pytest.raises(OSError, match="I/O error"):
        st.ResultStore(tmp_path / "s.jsonl").open()


def test_provenance_records_versions_and_git():
    p = prov.provenance()
    assert p["packages"]["jax"] is not None and p["packages"]["numpy"] is not None
    assert set(p["git"]) == {"rev", "dirty"}
    assert p["python"].count(".") == 2
