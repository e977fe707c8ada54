"""Figures from a real (small) result store: every figure draws labelled axes and a legend,
is written as PNG and PDF, `vccc figures` regenerates them from the store, and each figure
keeps the fixes a reviewer asked for (issue 23): intervals that stay in the metric's range,
an explicit "exact" strip instead of log axes down to 1e-14, lag axes at the lags run, no
hidden or missing series."""

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from vccc_jax import plotting  # noqa: E402
from vccc_jax.commands import figures  # noqa: E402
from vccc_jax.plotting import style as plotting_style  # noqa: E402
from vccc_jax.runs.store import read_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "results"


@pytest.fixture(scope="module")
def smoke():
    """The smoke sweep's store (`vccc sweep --config experiments/tabular_smoke.toml`,
    committed under tests/data/results: drawing needs no sweep run)."""
    path = DATA / "tabular_smoke.jsonl"
    return path, read_rows(path)


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


def _series(ax):
    """The labelled marker series of an axes: {label: Line2D}."""
    return {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_error_vs_lag_every_method_visible_exact_strip_and_lag_ticks(smoke):
    _, rows = smoke
    R = plotting.Rows(rows)
    fig = plotting.fig_error_vs_lag(R)
    try:
        assert len(fig.axes) == len(R.laws)
        for ax in fig.axes:
            series = _series(ax)
            assert len(series) == len(R.methods)
            # methods sharing a fixed point are dodged apart: at each lag, distinct x positions
            # within 10% of the lag's log2(1 + lag) spacing
            xs = np.array([ln.get_xdata() for ln in series.values()])
            for j, lag in enumerate(R.lags):
                assert len(set(np.round(xs[:, j], 9))) == len(series)
                assert np.all(np.abs(np.log2(1 + np.abs(xs[:, j])) - np.log2(1 + lag)) < 0.15)
            assert list(ax.get_xticks()) == R.lags
            # exact fixed points (VCCC, < 1e-10) sit on the "exact" tick, below every other tick
            ticks, labels = ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]
            exact = ticks[labels.index("exact")]
            assert exact == min(ticks) and ax.get_ylim()[0] > 1e-8
            vccc = series[plotting.STYLE["vccc"][0]]
            np.testing.assert_allclose(vccc.get_ydata(), exact)
            stale = series[plotting.STYLE["uncorrected"][0]].get_ydata()
            assert stale[0] == exact and np.all(stale[1:] > 10 * exact)  # lag 0 exact, then not
        style = plotting.style
        assert len({style.method_linestyle(m) for m in ("truncated", "vtrace", "centered_baseline")}) == 3
    finally:
        plt.close(fig)


def test_clip_heatmap_shows_every_c_in_every_panel_and_marks_the_empty_mask(smoke):
    _, rows = smoke
    R = plotting.Rows(rows)
    assert 1.0 in R.clips("truncated") and 1.0 not in R.clips("masked")  # masked skips c = 1
    fig = plotting.fig_clip_heatmap(R)
    try:
        panels = [ax for ax in fig.axes if ax.images]
        cols = [[t.get_text() for t in ax.get_xticklabels()] for ax in panels]
        assert all(c == cols[0] for c in cols) and "1" in cols[0]
        masked = panels[[ax.get_title() for ax in panels].index(plotting.STYLE["masked"][0])]
        assert sum(t.get_text() == "empty\nmask" for t in masked.texts) == len(R.lags)
        assert "empty mask" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_bias_variance_has_readable_log_axes_and_no_colliding_text(smoke):
    _, rows = smoke
    fig = plotting.fig_bias_variance(rows)
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        lo, hi = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert len(shown) >= 3  # less than a decade of variance still gets 3+ labelled ticks
        # the sweep's garnet frontier spans 0.35-1.6 (2/3 of a decade): 1-2-5 ticks would
        # label only 0.5 and 1 there
        ax.set_xlim(0.35, 1.6)
        plotting_style.log_ticks(ax, "x")
        assert len([t for t in ax.get_xticks() if 0.35 <= t <= 1.6]) >= 3
        assert not ax.texts  # c values are marker sizes in the legend, not annotations
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert {f"c = {c:g}" for c in plotting.Rows(rows).clips()} <= set(labels)
    finally:
        plt.close(fig)


def test_trained_curves_have_bands_over_mdps(smoke):
    _, rows = smoke
    assert all(len(r["metrics"]["tc_curve_rms_seeds"]) == r["cell"]["num_mdps"] for r in rows)
    fig = plotting.fig_trained_curves(rows)
    try:
        ax = fig.axes[0]
        assert len(ax.collections) == len(_series(ax))  # one band per method
        for band in ax.collections:
            assert np.all(np.isfinite(band.get_paths()[0].vertices))
        assert "MDPs" in ax.get_title()
    finally:
        plt.close(fig)


def test_bootstrap_band_stays_in_the_metric_range():
    """Two seeds at ESS 0.95 and 1.0: a 95% t interval reaches 1.27; the bootstrap band stays
    in [0.95, 1] (a resampled mean lies between the smallest and largest seed)."""
    from vccc_jax.analysis.seeds import bootstrap_band
    from vccc_jax.analysis.stats import mean_ci

    y = np.array([[0.95, 1.0], [0.0, 12.0], [3.0, 3.0]])
    mean, half = mean_ci(y, axis=1)
    assert mean[0] + half[0] > 1.0 and mean[1] - half[1] < 0.0   # what curves.png drew before
    m, lo, hi = bootstrap_band(y, axis=1)
    np.testing.assert_allclose(m, mean)
    assert np.all(lo >= y.min(1)) and np.all(hi <= y.max(1)) and np.all(lo <= m) and np.all(m <= hi)
    assert lo[0] < 0.975 < hi[0] and lo[2] == hi[2] == 3.0


def test_learning_curves_label_axes_and_say_what_the_band_is(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    rng = np.random.default_rng(0)
    for seeds in (2, 8):
        rows = [{"update": u, "seed": s, "env_steps": 64 * (u + 1), "return": float(rng.random()),
                 "ess": 0.97 + 0.03 * rng.random(), "gt_mse": float("nan")}
                for u in range(6) for s in range(seeds)]
        plotting.plot_learning_curves(rows, tmp_path / "c.png", "t")
    for fig, seeds, word in zip(drawn, (2, 8), ("each seed", "bootstrap")):
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == ["behaviour-policy return", "effective sample size"]
        assert all(ax.get_ylabel() and ax.get_xlabel() == "env steps" for ax in axes)
        assert f"n = {seeds} seeds" in fig._suptitle.get_text() and word in fig._suptitle.get_text()
        ess = axes[1]
        assert ess.get_ylim()[1] <= 1.02
        for band in ess.collections:  # the interval never passes ESS = 1
            assert band.get_paths()[0].vertices[:, 1].max() <= 1.0


def test_lag_figures_put_fixed_lags_at_their_value_on_a_log2_axis():
    """fixed:4 ran with a mean lag of 3.375 (early updates have fewer versions): it is drawn at
    4, the axis ticks are the lags run, critics are dodged apart."""
    from vccc_jax.plotting.seeds import fig_lag_curves

    rows = read_rows(DATA / "train" / "train_tiny.jsonl")
    assert {r["cell"]["lag"] for r in rows} == {"fixed:0", "fixed:4"}
    fig = fig_lag_curves(rows, metrics=["final_return"])
    try:
        ax = fig.axes[0]
        assert list(ax.get_xticks()) == [0.0, 4.0] and ax.get_xscale() == "function"
        xs = [c[0].get_xdata() for c in ax.containers]  # one errorbar per critic
        assert len(xs) == 2 and not np.allclose(xs[0], xs[1])
        np.testing.assert_allclose(np.mean(xs, axis=0), [0.0, 4.0], atol=0.2)
    finally:
        plt.close(fig)


def test_bandit_prints_zero_variance_as_0_and_keeps_its_legend_off_the_data():
    from vccc_jax.plotting.examples import fig_bandit
    from vccc_jax.plotting.style import fmt_num

    assert fmt_num(1.34e-31) == "0" and fmt_num(3.6111) == "3.61" and fmt_num(-2e-13) == "0"
    data = json.loads((DATA / "examples" / "bandit.json").read_text())["data"]
    fig = fig_bandit(data)
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            leg = ax.get_legend()
            box, frame = leg.get_window_extent(), ax.get_window_extent()
            assert box.y1 <= frame.y0 + 1  # below the axes: covers no tick or data
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert any(lab.endswith("Var=0") for lab in labels)
        assert not any(re.search(r"\de-\d", lab) for lab in labels)  # no 1.34e-31
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
    assert R.get("garnet", "vccc", "geometric", 2, None)["fp_err_max"] < 1e-8
    assert R.get("garnet", "vccc", "geometric", 2, 4.0) is None
    assert R.get("garnet", "vccc", "no-such-law", 2, None) is None
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


def test_variance_vs_clip_labels_the_axis_where_the_references_sit(smoke):
    """Issue 30: the unclipped references sit at 0.7-0.85 on the smoke store; 1-2-5 ticks left
    them unlabelled (nearest labels 0.5 and 1). Now labelled ticks bracket them, each within a
    factor 1.25."""
    _, rows = smoke
    fig = plotting.fig_variance_vs_clip(rows)
    try:
        ax = fig.axes[0]
        refs = [ln.get_ydata()[0] for ln in ax.get_lines() if "(no clip)" in ln.get_label()]
        assert len(refs) == 3 and max(refs) < 1.0
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
        # labelled on both sides of the references, each within a factor 1.25
        assert min(refs) / max(t for t in ticks if t <= min(refs)) <= 1.25, (refs, ticks)
        assert min(t for t in ticks if t >= max(refs)) / max(refs) <= 1.25, (refs, ticks)
        fig.canvas.draw()
        shown = {t.get_text() for t in ax.get_yticklabels() if t.get_text()}
        assert any(float(s) < 1.0 for s in shown), shown
    finally:
        plt.close(fig)


def test_trained_curves_fixed_points_have_their_own_style_and_exact_ones_are_named(smoke):
    """Issue 30: the fixed-point lines used '--', V-trace's own curve style family; now no
    fixed-point line shares a dash pattern with any curve, and the exact ones (VCCC ~1e-14,
    off any useful scale) are named in a note instead of silently missing."""
    _, rows = smoke
    fig = plotting.fig_trained_curves(rows)
    try:
        ax = fig.axes[0]
        R = plotting.Rows(rows)
        curves = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        fixed = [ln for ln in ax.get_lines() if ln.get_label().startswith("_") and len(set(ln.get_ydata())) == 1
                 and ln.get_linestyle() != "None"]
        from matplotlib.lines import Line2D

        # every curve style a method can have (V-trace's (5, 2) included), and the plain ones
        styles = set(plotting_style.LINESTYLES.values()) | {"-", "--", ":", "-."}
        patterns = {tuple(ln._unscaled_dash_pattern[1] or ()) for ln in curves}
        patterns |= {tuple(Line2D([0], [0], ls=st)._unscaled_dash_pattern[1] or ()) for st in styles}
        assert fixed and all(tuple(ln._unscaled_dash_pattern[1]) not in patterns for ln in fixed)
        exact = [m for m in ("vccc", "vccc_bstar") if R.get(R.families[0], m, R.default_law(),
                                                           R.default_lag(), None)["fp_err_rms"] < 1e-6]
        note = " ".join(t.get_text() for t in ax.texts)
        assert exact and "below the axis" in note
        for m in exact:
            assert plotting.STYLE[m][0] in note
    finally:
        plt.close(fig)


def test_clip_heatmap_colourbar_extends_below_its_range(smoke):
    """Cells at 1e-14 lie below the colour range (floor 1e-6): the colourbar gets the
    extend='min' arrow and its label says so."""
    _, rows = smoke
    fig = plotting.fig_clip_heatmap(rows)
    try:
        images = [ax.images[0] for ax in fig.axes if ax.images]
        (cb,) = [im.colorbar for im in images if im.colorbar is not None]
        cells = np.concatenate([im.get_array().compressed() for im in images])
        assert cells.min() < cb.norm.vmin                 # 2e-14 cells under a -6 floor
        assert cb.extend == "min" and "below" in cb.ax.get_ylabel()
    finally:
        plt.close(fig)


def test_committed_doc_figures_are_under_200_kb():
    pngs = sorted((ROOT / "docs" / "figures").glob("*.png"))
    assert pngs
    big = [(p.name, p.stat().st_size) for p in pngs if p.stat().st_size >= 200_000]
    assert not big, big
