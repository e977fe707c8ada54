"""``vccc bench device`` (issue 22 section 5) on CPU at small sizes: the JSON and table it
writes, per-section budgets, skip-with-reason, and the partial JSON written as it goes.
(The whole small run, trainer and scaling included: the slow test at the end.)"""

import json

import pytest

from vccc_jax.benchmarks import device
from vccc_jax.commands import bench


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(device.SMALL, "vtrace_sizes", ((16, 128),))
    monkeypatch.setitem(device.SMALL, "ceiling_mib", 4)


def test_cheap_sections_write_json_and_table(tmp_path, tiny):
    res = device.run(tmp_path, sections=["host", "bandwidth", "vtrace", "compile"])
    saved = json.loads((tmp_path / "device.json").read_text())
    assert saved["meta"]["small"] is True  # automatic on CPU
    assert [saved["sections"][s]["status"] for s in ("host", "bandwidth", "vtrace")] == ["ok"] * 3
    assert saved["sections"]["host"]["result"]["platform"] == "cpu"
    ceiling = saved["sections"]["bandwidth"]["result"]["vtrace_ceiling_mts"]
    assert ceiling > 0
    (row,) = saved["sections"]["vtrace"]["result"]["rows"]
    assert {"ours", "inplace", "assoc"} <= set(row) and (row["T"], row["B"]) == (16, 128)
    assert row["ours_of_ceiling"] == pytest.approx(row["ours"] / ceiling)
    if saved["sections"]["vtrace"]["result"]["rlax"]:
        assert row["ours_vs_rlax_bm"] == pytest.approx(row["ours"] / row["rlax-BM"])
    assert res["sections"].keys() == saved["sections"].keys()
    # the loop-vs-associative grid behind vtrace.ASSOCIATIVE_WINS, both timed per cell
    cross = saved["sections"]["vtrace"]["result"]["crossover"]
    assert [(c["T"], c["B"]) for c in cross] == [(8, 1), (8, 16), (64, 1), (64, 16)]
    assert all(c["scan_s"] > 0 and c["assoc_s"] > 0 for c in cross)
    md = (tmp_path / "device.md").read_text()
    assert "## vtrace: ok" in md and "| 16 | 128 |" in md and "GB/s" in md
    assert "loop vs associative scan" in md and "T \\ B" in md


def test_failures_are_skipped_with_reason_and_json_is_written_as_it_goes(
        tmp_path, tiny, monkeypatch):
    seen = {}

    def boom(cfg, clock, log):
        raise RuntimeError("no such accelerator")

    def peek(cfg, clock, log, ceiling=None):  # runs third: the JSON on disk has the first two
        seen.update(json.loads((tmp_path / "device.json").read_text())["sections"])
        return {"rows": [], "variants": [], "skipped": ["T=1 B=1: section time budget spent"]}

    monkeypatch.setattr(device, "bandwidth", boom)
    monkeypatch.setattr(device, "vtrace", peek)
    res = device.run(tmp_path, sections=["host", "bandwidth", "vtrace"])
    assert set(seen) == {"host", "bandwidth"} and seen["host"]["status"] == "ok"
    bw = res["sections"]["bandwidth"]
    assert bw["status"] == "skipped" and bw["reason"] == "RuntimeError: no such accelerator"
    assert res["sections"]["vtrace"]["status"] == "partial"
    md = (tmp_path / "device.md").read_text()
    assert "skipped: RuntimeError: no such accelerator" in md
    assert "- skipped T=1 B=1: section time budget spent" in md
    # No time left: every section is skipped, saying why, and nothing is measured.
    res = device.run(tmp_path / "late", sections=["bandwidth", "vtrace"], budget_s=0)
    assert {e["status"] for e in res["sections"].values()} == {"skipped"}
    assert "time budget (0s) is spent" in res["sections"]["vtrace"]["reason"]


def test_sections_flag_is_checked_first(capsys, tmp_path):
    assert device.select(None) == list(device.SECTIONS)
    assert device.select("scale, host") == ["host", "scale"]  # run order, not flag order
    assert bench.main(["device", "--out", str(tmp_path), "--sections", "host,gpu"]) == 2
    assert "vccc bench: --sections: unknown ['gpu']" in capsys.readouterr().err
    assert bench.main(["device", "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_whole_small_run(tmp_path):
    res = device.run(tmp_path, budget_s=900)
    assert all(e["status"] == "ok" for e in res["sections"].values()), {
        k: e["reason"] for k, e in res["sections"].items()}
    rows = res["sections"]["trainer"]["result"]["rows"]
    assert {r["row"].split()[0] for r in rows} == {"reference", "lag8-vccc"}
    assert all(r["vs_reference"] > 0 for r in rows)
    assert any(r["warm_compile_s"] is not None for r in rows)
    assert res["sections"]["compile"]["result"]["rows"]
