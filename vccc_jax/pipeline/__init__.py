"""Asynchronous-pipeline simulator (layer 1, NumPy): lags and wall-clock from a described
cluster (DESIGN.md §6, issue 14). See config.py, simulate.py, stats.py."""

from vccc_jax.pipeline.config import (
                                      SCHEDULES,
                                      PipelineConfig,
                                      RewardChannel,
                                      config_from_dict,
                                      grid_configs,
                                      load_config,
                                      load_experiment,
)
from vccc_jax.pipeline.simulate import PipelineTrace, simulate
from vccc_jax.pipeline.stats import (
                                      format_lag_trace,
                                      lag_pmf,
                                      lag_stats,
                                      reward_delay_stats,
                                      wallclock_stats,
                                      write_lag_trace,
)

__all__ = [
    "SCHEDULES", "PipelineConfig", "RewardChannel", "config_from_dict", "load_config",
    "load_experiment", "grid_configs",
    "PipelineTrace", "simulate", "format_lag_trace", "lag_pmf", "lag_stats",
    "reward_delay_stats", "wallclock_stats", "write_lag_trace",
]
