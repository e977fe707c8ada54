"""Benchmarks behind ``vccc bench NAME`` (layer 5): speed measured against a reference in the
same process. Each module returns rows and formatted strings; the flags and the printing are
:mod:`vccc_jax.commands.bench`'s. None of this runs in the tests.

  estimators   V-trace throughput against rlax and a memory-bandwidth ceiling
  tabular      exact V^pi for batches of MDPs against NumPy
  train        the full trainer (lagged VCCC) against a PureJaxRL-style PPO
  scale        the sharded trainer at 1, 2, 4, 8 ... devices (issue 10)
"""
