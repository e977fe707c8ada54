"""``jit`` for the verification graphs.

Compile time matters more than run time here (each group is a few dozen tiny MDPs), so the
verification graphs are compiled with XLA's backend optimisation level 0.
"""

from __future__ import annotations

import jax

FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def fast_jit(fn, **kw):
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kw)
