"""The append-only result store: atomic rows, partial-tail repair, dedupe, locking."""

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
    full = path.read_bytes()
    # A kill in the middle of the second append leaves a prefix of its line.
    partial = (st.canonical_json(_row(2)) + "\n").encode()[:37]
    path.write_bytes(full + partial)
    assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0]
    with st.ResultStore(path) as s:
        assert len(s) == 1
        assert path.read_bytes() == full  # the partial tail was cut before appending
        s.append(_row(2))
    assert [r["metrics"]["x"] for r in st.read_rows(path)] == [1.0, 2.0]
    assert path.read_bytes().count(b"\n") == 2


def test_corrupt_complete_line_raises_naming_it(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"id": "a", "cell": {}}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        st.read_rows(path)


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


def test_table_rows_drop_meta_and_sort():
    rows = [_row(2), _row(1)]
    t = st.table_rows(rows)
    assert [r["id"] for r in t] == sorted(r["id"] for r in rows)
    assert all(set(r) == {"id", "cell", "metrics"} for r in t)


def test_load_results_directory(tmp_path):
    for name, i in (("a.jsonl", 1), ("b.jsonl", 2)):
        with st.ResultStore(tmp_path / name) as s:
            s.append(_row(i))
    assert sorted(r["metrics"]["x"] for r in st.load_results(tmp_path)) == [1.0, 2.0]
    assert st.load_results(tmp_path / "missing.jsonl") == []


def test_provenance_records_versions_and_git():
    p = prov.provenance()
    assert p["packages"]["jax"] is not None and p["packages"]["numpy"] is not None
    assert set(p["git"]) == {"rev", "dirty"}
    assert p["python"].count(".") == 2
