"""plotting.continuous: the per-seed cells the figure draws (last update / mean over the
evaluated updates) against a NumPy reference, and the figure's error bars at those means."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from vccc_jax.plotting.continuous import fig_continuous_lag, lag_cells  # noqa: E402


def _rows():
    rng = np.random.default_rng(0)
    rows, table = [], {}
    for lag in ("fixed:0", "uniform:7"):
        for critic in ("vccc", "vtrace"):
            for seed in range(3):
                errs = rng.uniform(1, 10, 3)
                table[(lag, critic, seed)] = errs
                for u in range(1, 7):
                    r = dict(lag=lag, critic=critic, seed=seed, update=u)
                    if u % 2 == 0:
                        r.update(critic_error=float(errs[u // 2 - 1]), critic_error_mc_se=0.5)
                    rows.append(r)
    return rows, table


def test_cells_are_last_and_mean_per_seed_and_the_figure_draws_their_means():
    rows, table = _rows()
    last, mean = lag_cells(rows, "last"), lag_cells(rows, "mean")
    for (lag, critic, seed), errs in table.items():
        assert last[(lag, critic)][seed] == errs[-1]
        np.testing.assert_allclose(mean[(lag, critic)][seed], errs.mean(), rtol=1e-12)
    fig = fig_continuous_lag(rows)
    drawn = sorted(round(float(y), 9) for c in fig.axes[0].containers for y in c.lines[0].get_ydata())
    want = sorted(round(float(np.mean([table[(lag, c, s)][-1] for s in range(3)])), 9)
                  for lag in ("fixed:0", "uniform:7") for c in ("vccc", "vtrace"))
    assert drawn == want
