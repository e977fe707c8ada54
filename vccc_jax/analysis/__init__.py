"""Layer 4: numpy/scipy statistics over result rows and table formatting to strings.

No plotting, no printing: functions return numbers, rows or strings.
"""

from vccc_jax.analysis.stats import ci_dict, mean_ci, t_quantile

__all__ = ["ci_dict", "mean_ci", "t_quantile"]
