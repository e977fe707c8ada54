"""vccc_jax: Version Centered Critic Correction for asynchronous actor-critic RL.

Layers (imports flow one way): ``estimators`` (pure math) <- ``tabular``, ``envs`` <-
``train`` <- ``sweeps``, ``benchmarks``, ``cli``, ``plotting``.
"""

__version__ = "0.1.0"
