"""analysis.train.whole_run_summary / format_whole_run_table and plotting.train.error_curves
on hand-computed small tables."""

import math

import numpy as np
import pytest

from vccc_jax.analysis.train import (
    checkpoint_index,
    clip_at_lag,
    format_whole_run_table,
    gt_curve,
    largest_lag,
    whole_run_per_seed,
    whole_run_summary,
)

NAN = float("nan")


def _rows():
    """8 updates x 2 seeds, ground truth at updates 1, 3, 5, 7 (gt_every 2)."""
    err = {1: (4.0, 2.0), 3: (3.0, 1.0), 5: (2.0, 1.0), 7: (1.0, 0.0)}
    rows = []
    for u in range(8):
        for s in range(2):
            r = {"update": u, "seed": s, "env_steps": 10 * (u + 1), "return": float(u + s),
                 "ess": 0.5 + 0.5 * s, "kl_pi_mu": 0.1 * s, "clip_frac": 0.0, "lag_mean": 1.0,
                 "exact_err_pi": err[u][s] if u in err else NAN,
                 "exact_gap": 0.5 if u in err else NAN,
                 "count_lag0": 4, "count_lag1": 2 if u >= 4 else 0, "count_lag2": 0,
                 "clip_frac_lag0": 0.0, "clip_frac_lag1": 0.25 * (u >= 6) + 0.5 * s,
                 "clip_frac_lag2": 0.0}
            rows.append(r)
    return rows


def test_gt_curve_and_checkpoints():
    upd, g = gt_curve(_rows(), "exact_err_pi")
    np.testing.assert_array_equal(upd, [1, 3, 5, 7])
    np.testing.assert_array_equal(g[:, 0], [4, 3, 2, 1])
    # 25% of 8 updates = update index <= 1 -> update 1; 50% -> update 3; 100% -> update 7
    assert [checkpoint_index(upd, 8, c) for c in (0.25, 0.5, 1.0)] == [0, 1, 3]
    assert checkpoint_index(np.array([3, 7]), 8, 0.25) == 0  # none that early: the first one


def test_whole_run_per_seed_hand_computed():
    p = whole_run_per_seed(_rows())
    np.testing.assert_allclose(p["exact_err_pi_auc"], [2.5, 1.0])  # (4+3+2+1)/4, (2+1+1+0)/4
    np.testing.assert_allclose(p["exact_err_pi@25"], [4.0, 2.0])
    np.testing.assert_allclose(p["exact_err_pi@50"], [3.0, 1.0])
    np.testing.assert_allclose(p["exact_err_pi@100"], [1.0, 0.0])
    np.testing.assert_allclose(p["exact_gap_auc"], [0.5, 0.5])
    np.testing.assert_allclose(p["ess"], [0.5, 1.0])
    np.testing.assert_allclose(p["kl_pi_mu"], [0.0, 0.1])
    np.testing.assert_allclose(p["return_auc"], [3.5, 4.5])
    np.testing.assert_allclose(p["return_final"], [7.0, 8.0])  # last 10% of 8 updates = 1 update
    assert "exact_grad_rel_bias_auc" not in p and "gt_rel_err_auc" not in p
    # largest populated lag is 1 (lag 2 has no data); count-weighted clip rate at lag 1:
    # updates 4..7 with equal counts, clip 0,0,.25,.25 (+.5 for seed 1)
    assert largest_lag(_rows()) == 1
    np.testing.assert_allclose(p["clip_at_max_lag"], [0.125, 0.625])
    np.testing.assert_allclose(clip_at_lag(_rows(), 2), [NAN, NAN])
    np.testing.assert_allclose(p["max_lag"], [1.0, 1.0])


def test_mc_relative_error():
    rows = [{"update": u, "seed": s, "return": 0.0, "gt_mae": (1.0 + s) if u == 1 else NAN,
             "gt_value": -2.0 if u == 1 else NAN} for u in range(2) for s in range(3)]
    p = whole_run_per_seed(rows)
    np.testing.assert_allclose(p["gt_rel_err_auc"], [0.5, 1.0, 1.5])
    np.testing.assert_allclose(p["gt_rel_err@100"], [0.5, 1.0, 1.5])
    assert "max_lag" not in p


def test_summary_stats_and_table():
    s = whole_run_summary(_rows())
    a = s["exact_err_pi_auc"]
    assert a["per_seed"] == [2.5, 1.0] and a["n"] == 2
    assert a["mean"] == pytest.approx(1.75)
    # t interval, 1 dof: 12.706 * sd / sqrt(2), sd = 1.5 / sqrt(2)
    assert a["ci95"] == pytest.approx(12.7062047 * 0.75, rel=1e-6)
    assert a["iqm_lo"] <= a["iqm"] <= a["iqm_hi"]
    assert a["iqm"] == pytest.approx(1.75)  # trimming 25% of 2 values removes none
    res = [{"config": {"env": "tabular:S=4", "lag": "fixed:1", "critic": "truncated", "clip": 2.0},
            "summary": s}]
    t = format_whole_run_table(res, cols=["exact_err_pi_auc", "clip_at_max_lag", "missing"])
    lines = t.splitlines()
    assert lines[0] == "| env | lag | sampler | critic | n | exact_err_pi_auc | clip_at_max_lag | missing |"
    # 2 seeds: their range, not the t half-width 9.5 (issue 45 row 8)
    assert lines[2].startswith("| tabular:S=4 | fixed:1 | - | truncated c=2 | 2 | 1.75 [1, 2.5] |")
    assert lines[2].endswith("| - |")
    ti = format_whole_run_table(res, cols=["exact_err_pi_auc"], stat="iqm")
    assert "1.75 [" in ti
    with pytest.raises(ValueError):
        format_whole_run_table(res, stat="median")


def test_one_seed_nan_ci():
    rows = [r for r in _rows() if r["seed"] == 0]
    a = whole_run_summary(rows)["exact_err_pi_auc"]
    assert a["mean"] == 2.5 and math.isnan(a["ci95"]) and a["iqm_lo"] == a["iqm_hi"] == 2.5
    assert "2.5 |" in format_whole_run_table([{"config": {"critic": "vccc"}, "summary":
                                               whole_run_summary(rows)}], cols=["exact_err_pi_auc"])


def test_error_curves_renders(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from vccc_jax.plotting.style import publish
    from vccc_jax.plotting.train import error_curves

    d = {("fixed:1", "vccc"): _rows(), ("fixed:1", "truncated c=2"): _rows(),
         ("fixed:4", "uncorrected"): _rows()}
    fig = error_curves(d, "exact_err_pi")
    ax = fig.axes[0]
    assert ax.get_title() == "fixed:1" and ax.get_yscale() == "log"
    lines = [ln for ln in ax.get_lines()]
    np.testing.assert_allclose(lines[0].get_ydata(), [3.0, 2.0, 1.5, 0.5])  # mean over 2 seeds
    assert any(ln.get_linestyle() == "--" for ln in lines)  # the exact-gap reference
    paths = publish(fig, tmp_path, "err")
    assert all(p.stat().st_size > 0 for p in paths)
    fig = error_curves({"vccc": _rows()}, "exact_err_pi", gap="per_method", log=False)
    assert len(fig.axes[0].get_lines()) == 2
    with pytest.raises(ValueError):
        error_curves({"vccc": _rows()}, gap="bad")


def _fits(fig) -> bool:
    """The suptitle lies inside the figure (nothing clipped at its edges)."""
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    return box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height


def test_grid_figures_state_n_and_statistic_and_promise_only_what_they_draw(tmp_path):
    """Issue 45 row 9: the error-curve figure of Monte Carlo runs (no exact gap) promised
    "dashed: exact gap" and drew none; panels sharing a y axis took the last panel's range
    (a panel's lines could lie outside it); the lag-sweep figure had error bars without n or
    statistic and a clipped suptitle."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vccc_jax.analysis.train import summarize
    from vccc_jax.plotting.train import error_curves, plot_lag_sweep

    mc = [{k: v for k, v in r.items() if k != "exact_gap"} for r in _rows()]
    far = [dict(r, exact_err_pi=r["exact_err_pi"] * 1e3) for r in mc]
    fig = error_curves({("fixed:0", "vccc"): mc, ("fixed:8", "vccc"): far}, "exact_err_pi",
                       title="a grid with a rather long name: exact_err_pi over the whole run")
    title = fig._suptitle.get_text()
    assert "dashed" not in title and "n = 2 seeds" in title and "smallest to largest seed" in title
    for ax in fig.axes[:2]:  # each panel's mean line inside the shared range
        lo, hi = ax.get_ylim()
        y = ax.get_lines()[0].get_ydata()
        assert lo <= np.nanmin(y) and np.nanmax(y) <= hi
    assert _fits(fig)
    plt.close(fig)
    assert "dashed: exact gap" in error_curves({"vccc": _rows()}, "exact_err_pi")._suptitle.get_text()
    plt.close("all")

    cells = [{"config": {"env": env, "lag": f"fixed:{lag}", "critic": c},
              "summary": summarize(_rows())}
             for env in ("CartPole-v1", "Acrobot-v1") for lag in (0, 8) for c in ("gae", "vccc")]
    closed = []
    orig = plt.close
    try:
        plt.close = lambda fig=None: closed.append(fig)
        plot_lag_sweep(cells, tmp_path / "g.png", "train_lag_quick")
    finally:
        plt.close = orig
    fig = closed[-1]
    title = fig._suptitle.get_text().replace("\n", " ")
    assert ("n = 2 seeds per point; mean; bars: smallest to largest seed. Current-policy return: "
            "the last 3 evaluations; behaviour return: the last 10% of updates") in title
    assert _fits(fig)
    # 2 seeds (final returns 7 and 8): each bar runs from the smaller seed to the larger
    assert cells[0]["summary"]["final_return"]["per_seed"] == [7.0, 8.0]
    bars = fig.axes[0].containers[0].lines[2][0].get_segments()
    assert all(np.allclose(seg[:, 1], [7.0, 8.0]) for seg in bars)
    plt.close(fig)
