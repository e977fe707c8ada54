"""Figures from a real (small) result store: every figure draws labelled axes and a legend,
is written as PNG and PDF, and `vccc figures` regenerates them from the store."""

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from vccc_jax import plotting  # noqa: E402
from vccc_jax.commands import figures  # noqa: E402
from vccc_jax.runs import tabular_config as grid  # noqa: E402
from vccc_jax.runs.tabular_sweep import run_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke sweep's store (computed once per session; xdist workers share it)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    cfg = grid.load_config(ROOT / "experiments" / "tabular_smoke.toml")
    path, rows = run_sweep(cfg, base / "smoke_results", progress=False, wait_for_lock=True)
    return path, rows


@pytest.mark.parametrize("name", list(plotting.FIGURES))
def test_each_figure_has_labelled_axes_and_a_legend(smoke, name):
    _, rows = smoke
    fig = plotting.FIGURES[name](rows)
    try:
        axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        assert axes
        for ax in axes:
            assert ax.get_xlabel() and ax.get_title()
        assert axes[0].get_ylabel()
        if name == "clip_heatmap":
            assert len(axes[0].images) == 1 and fig.axes[-1].get_ylabel()  # colour bar label
        else:
            legend = fig.legends[0] if fig.legends else axes[0].get_legend()
            labels = [t.get_text() for t in legend.get_texts()]
            assert len(labels) >= 3 and all(labels)
        if name in ("error_vs_lag", "bias_variance", "trained_curves", "variance_vs_clip"):
            assert axes[0].get_yscale() == "log"
    finally:
        plt.close(fig)


def test_error_vs_lag_draws_every_method_on_every_law(smoke):
    _, rows = smoke
    R = plotting.Rows(rows)
    fig = plotting.fig_error_vs_lag(R)
    try:
        assert len(fig.axes) == len(R.laws)
        for ax in fig.axes:
            assert len(ax.get_lines()) == len(R.methods)
            for line in ax.get_lines():
                assert list(line.get_xdata()) == R.lags
    finally:
        plt.close(fig)


def test_figures_cli_writes_png_and_pdf_of_every_figure(smoke, tmp_path):
    """`vccc figures --store FILE --out DIR` (commands.figures -> plotting.make_figures)."""
    path, rows = smoke
    assert figures.main(["--store", str(path), "--out", str(tmp_path)]) == 0
    written = sorted((tmp_path / path.stem).iterdir())
    families = plotting.Rows(rows).families
    assert [p.name for p in written] == sorted(
        f"{fam}_{name}.{ext}" for fam in families for name in plotting.FIGURES
        for ext in ("png", "pdf"))
    for p in written:
        assert p.stat().st_size > 1000
        assert p.read_bytes()[:4] in (b"\x89PNG", b"%PDF")
    assert figures.main(["--store", str(tmp_path / "nothing"), "--out", str(tmp_path)]) == 2


def test_rows_index_and_errors(smoke):
    _, rows = smoke
    R = plotting.Rows(rows)
    assert R.default_law() == "geometric" and R.default_lag() in R.lags
    assert R.clips("masked") == [2.0, 4.0, 8.0] and R.clips("vccc") == []
    assert R.get("garnet", "vccc", "fixed", 2, None)["fp_err_max"] < 1e-8
    assert R.get("garnet", "vccc", "fixed", 2, 4.0) is None
    with pytest.raises(ValueError, match="no result rows"):
        plotting.Rows([])
    with pytest.raises(ValueError, match="no clipped methods"):
        plotting.fig_clip_heatmap(rows, methods=("nonexistent",))


def test_importing_plotting_loads_no_jax_gymnax_or_optax():
    """plotting imports analysis (numpy/scipy) only: no cycle back into runs, no JAX stack."""
    import subprocess
    import sys

    code = ("import sys, vccc_jax.plotting; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'gymnax', 'optax', 'flax'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


REGISTRY_NAMES = ("uncorrected", "gae", "vccc", "vccc_bstar", "truncated", "masked",
                  "naive_baseline", "centered_baseline", "vtrace", "brace", "decoupled", "rac",
                  "ps_ppo", "grpo")


def test_every_method_has_one_fixed_distinct_colour():
    from vccc_jax.estimators.registry import CRITIC_TARGETS
    from vccc_jax.plotting import style

    names = set(REGISTRY_NAMES) | set(CRITIC_TARGETS)
    colours = {n: style.method_style(n).color for n in names}
    assert all(n in style.METHODS for n in names), sorted(names - set(style.METHODS))
    assert len(set(style.METHODS[n].color for n in style.METHODS)) == len(style.METHODS)
    assert style.method_style("td") == style.METHODS["uncorrected"]      # old name -> same colour
    assert colours["vccc"] == style.method_style("vccc").color == style.STYLE["vccc"][1]
    assert style.method_style("unknown_x").label == "unknown_x"


def test_paper_sizes_and_save_writes_vector_pdf_and_png(tmp_path):
    from vccc_jax.plotting import style

    assert style.figsize("one")[0] == style.ONE_COLUMN == 3.4
    assert style.figsize("two")[0] == style.TWO_COLUMN == 7.0
    with pytest.raises(ValueError):
        style.figsize("three")
    fig, ax = plt.subplots(figsize=style.figsize("one"))
    ax.plot([0, 1], [0, 1])
    png, pdf = style.save(fig, tmp_path / "f.v1")
    assert png.name == "f.v1.png" and pdf.read_bytes()[:4] == b"%PDF"
    from PIL import Image

    w, h = Image.open(png).size
    assert abs(w / style.DPI - 3.4) < 0.5 and h > 100                  # 300 dpi at 3.4 in
