"""Programs for comparisons of two *different* programs at bitwise or few-ulp tolerance.

The suite compiles with XLA:CPU's legacy elemental emitters (tests/conftest.py: a trainer
compiles in about a third of the time). Two programs that compute the same numbers by
different HLO (``rho * x`` with ``rho == 1`` at run time vs ``x``) are fused differently, and
the legacy emitters then round them differently: the lag-0 V-trace run and its on-policy form
differed in the actor loss by 6e-9 at the first update and by 2.6e-5 at the 24th (2026-12-03).
Under the default fusion emitters, which users run, they agree bit for bit, so those
comparisons compile both sides with them."""

from vccc_jax.train import trainer as trainer_lib

DEFAULT_EMITTERS = {"xla_cpu_use_fusion_emitters": True}


def with_default_emitters(tr: trainer_lib.Trainer) -> trainer_lib.Trainer:
    """``tr`` with its init and train programs compiled under the default CPU emitters."""
    tr.programs = trainer_lib.compile_programs(tr.setup, DEFAULT_EMITTERS)
    return tr
