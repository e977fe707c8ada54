"""Every notebook (jupytext percent script in notebooks/) runs headless on the tiny committed
result set in tests/data/results, through the same path as `vccc figures` (papermill
parameters, nbclient), sharing one kernel, from a working directory outside the repository;
each writes its PNG + PDF figures and is saved as an executed .ipynb (`--ipynb`)."""

import tempfile
from pathlib import Path

import nbformat
import pytest

from vccc_jax.commands import figures

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "results"
NOTEBOOKS = figures.notebooks()
# figures each notebook must write from tests/data/results (name prefixes)
EXPECTED = {
    "bandit": ["bandit_variance"],
    "bellman_covariance": ["bellman_covariance"],
    "tabular_staleness": ["tabular_smoke_garnet_error_vs_lag", "tabular_smoke_garnet_trained_curves"],
    "clipping": ["tabular_smoke_garnet_clip_heatmap", "tabular_smoke_garnet_variance_vs_clip",
                 "tabular_smoke_garnet_bias_variance"],
    "vtrace_tradeoffs": ["vtrace_tradeoffs"],
    "async_actor_critic": ["async_ac_tiny_expected_truncate"],
    "neural_lag": ["train_tiny_CartPole-v1_lag_curves", "train_tiny_CartPole-v1_paired_return",
                   "regime_tabular_error_curves"],  # tests/data/results/regime/
    "scaling": ["scaling_scale_cpu_fake8"],
    "comparators": ["brace_lag_fixed", "brace_lag_geometric", "brace_n_lag", "decoupled_routes",
                    "ps_ppo", "rac_two_channel", "rac_wallclock"],  # tests/data/results/comparators/
}


@pytest.fixture(scope="module")
def kernel():
    km = figures.start_kernel()
    yield km
    km.shutdown_kernel(now=True)


def test_the_kernel_talks_over_ipc_not_tcp():
    """Issue 45 row 11: a TCP kernel printed "Kernel is running over TCP without encryption"
    on every `make figures`; an IPC kernel (sockets in a temporary directory) does not."""
    km = figures.kernel_manager()
    assert km.transport == "ipc" and Path(km.ip).parent.is_dir()
    assert str(Path(km.ip).parent).startswith(tempfile.gettempdir())


def test_every_notebook_is_listed_and_paired_as_percent_script():
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(EXPECTED)
    for p in NOTEBOOKS:
        text = p.read_text()
        assert "format_name: percent" in text and '# %% tags=["parameters"]' in text
        # defaults are repo-root relative (resolved by repo_path), never "../" from notebooks/
        assert 'results = "results"' in text and "../" not in text and "repo_path(results)" in text


def test_repo_path_resolves_from_the_repository_root(tmp_path, monkeypatch):
    from vccc_jax.plotting.style import repo_path

    monkeypatch.chdir(tmp_path)
    assert repo_path("results") == ROOT / "results" and repo_path("") == ""
    assert repo_path(tmp_path / "x") == tmp_path / "x"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_tiny_results(path, kernel, tmp_path):
    out, gallery, saved = tmp_path / "figures", tmp_path / "gallery", tmp_path / "ipynb"
    figures.run_notebooks(DATA, out, gallery, names=[path.stem], km=kernel,
                          write_examples=False, log=lambda *_: None, ipynb=saved, cwd=tmp_path)
    for name in EXPECTED[path.stem]:
        png, pdf, small = out / f"{name}.png", out / f"{name}.pdf", gallery / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF", name
        assert small.stat().st_size < 200_000, f"gallery PNG {name} over 200 KB"
    if path.stem == "neural_lag":  # a single run directory (results/train/readme_run, issue 30)
        assert (out / "train_run_readme_run_curves.png").read_bytes()[:4] == b"\x89PNG"
    nb = nbformat.read(saved / f"{path.stem}.ipynb", as_version=4)  # what Jupyter opens
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3" and "jupytext" not in nb.metadata  # unpaired
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not code[0].source.startswith("%reset")  # the kernel-reuse cell is not saved
    assert any("injected-parameters" in c.metadata.get("tags", []) and str(DATA) in c.source
               for c in code)
    assert all(c.execution_count for c in code)  # every cell ran
    assert any(o.output_type == "display_data" for c in code for o in c.outputs)  # a figure


def test_figures_command_rejects_unknown_notebook_and_missing_results(tmp_path, capsys):
    assert figures.main(["--results", str(tmp_path / "none")]) == 2
    assert figures.main(["--results", str(DATA), "--only", "nope"]) == 2
    assert "unknown notebook" in capsys.readouterr().err
