"""vccc_jax: Version Centered Critic Correction for asynchronous actor-critic RL.

Layers (a module imports only lower ranks; tests/test_layering.py enforces it):
0 ``estimators`` (pure math) < 1 ``tabular``, ``pipeline`` < 2 ``envs`` < 3 ``train`` < 4 ``verify``
(it checks the trainer too), ``analysis`` < 5 ``testing``, ``plotting``, ``runs``, ``benchmarks``
< 6 ``commands`` < 7 ``cli``.
Users who want the estimators in their own trainer import from ``vccc_jax.estimators``; to
check their own estimator exactly, ``vccc verify --target module:function`` or
``vccc_jax.verify.check`` (pytest: ``vccc_jax.testing.assert_unbiased_target``).
"""

__version__ = "0.1.0"
