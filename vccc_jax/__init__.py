"""vccc_jax: Version Centered Critic Correction for asynchronous actor-critic RL.

Layers (a module imports only lower ranks; tests/test_layering.py enforces it):
0 ``estimators`` (pure math) < 1 ``tabular``, ``pipeline`` < 2 ``envs`` < 3 ``train``, ``verify``
< 4 ``analysis`` < 5 ``plotting``, ``runs``, ``benchmarks`` < 6 ``commands`` < 7 ``cli``.
Users who want the estimators in their own trainer import from ``vccc_jax.estimators``.
"""

__version__ = "0.1.0"
