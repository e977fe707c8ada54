"""Layer 5: experiment schema (TOML), result store, progress, provenance and the runners of
the three kinds of experiment (tabular sweeps, async actor-critic grids, training grids).

Never imports plotting: a runner returns rows; commands/ draw them.
"""
