"""Execute every notebook headless against a small result store made here, so a notebook
that no longer runs fails CI. Notebooks read the store path from VCCC_RESULTS and write
figures to VCCC_FIGURES."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from vccc_jax.sweeps import grid
from vccc_jax.sweeps.run import run_sweep

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def smoke_store(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    cfg = grid.load_config(ROOT / "experiments" / "tabular_smoke.toml")
    path, _ = run_sweep(cfg, base / "smoke_results", progress=False, wait_for_lock=True)
    return path


def test_there_are_notebooks():
    assert any(p.name == "tabular_staleness.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_headless(path, smoke_store, tmp_path, monkeypatch):
    monkeypatch.setenv("VCCC_RESULTS", str(smoke_store))
    monkeypatch.setenv("VCCC_FIGURES", str(tmp_path / "figures"))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    pngs = sorted((tmp_path / "figures").glob("*.png"))
    assert len(pngs) >= 5 and len(list((tmp_path / "figures").glob("*.pdf"))) == len(pngs)
    # Every figure cell displayed an image.
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 5
