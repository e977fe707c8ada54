"""Layer 5: figure functions (matplotlib), one style; import ``analysis`` and lower only.

Every figure function is pure: rows in, a matplotlib Figure out (``save`` writes PNG + PDF).
Importing this package loads matplotlib and numpy only (no jax, gymnax or optax).
"""

from vccc_jax.plotting.async_ac import ASYNC_VARIANT_STYLE, fig_async_ac
from vccc_jax.plotting.style import DPI, RC, STYLE, save
from vccc_jax.plotting.tabular import (
    FIGURES,
    Rows,
    fig_bias_variance,
    fig_clip_heatmap,
    fig_error_vs_lag,
    fig_trained_curves,
    fig_variance_vs_clip,
    make_figures,
)
from vccc_jax.plotting.train import plot_lag_sweep, plot_learning_curves

__all__ = [
    "ASYNC_VARIANT_STYLE", "DPI", "FIGURES", "RC", "STYLE", "Rows", "fig_async_ac",
    "fig_bias_variance", "fig_clip_heatmap", "fig_error_vs_lag", "fig_trained_curves",
    "fig_variance_vs_clip", "make_figures", "plot_lag_sweep", "plot_learning_curves", "save",
]
