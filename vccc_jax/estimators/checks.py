"""Input validation shared by the estimators: errors name the offending argument.

Shapes and ranks are static and always checked. Values (a discount outside [0, 1], a
positive log-probability) can only be checked on concrete arrays: under ``jit`` the check
is skipped, and data-dependent problems are reported through diagnostics instead.
"""

from __future__ import annotations

import jax
import numpy as np


def is_concrete(x) -> bool:
    """True when ``x`` holds values (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def check_same_shape(**arrays) -> None:
    """Raise ValueError naming the first argument whose shape differs from the first one's."""
    items = [(k, v) for k, v in arrays.items() if v is not None]
    name0, ref = items[0]
    for name, x in items[1:]:
        if np.shape(x) != np.shape(ref):
            raise ValueError(
                f"{name} has shape {np.shape(x)} but {name0} has shape {np.shape(ref)}"
            )


def check_nonempty(name: str, x) -> None:
    """Raise ValueError naming ``x`` when it has no elements (an empty time axis or batch):
    a mean over nothing, or a trajectory of no steps, has no value."""
    if np.size(x) == 0:
        raise ValueError(f"{name} must be non-empty (no zero-length axis), got shape {np.shape(x)}")


def check_rank_at_least(name: str, x, rank: int) -> None:
    if np.ndim(x) < rank:
        raise ValueError(f"{name} must have rank >= {rank}, got shape {np.shape(x)}")


def check_unit_interval(name: str, x) -> None:
    """Values in [0, 1] (discounts, lambda, probabilities), when concrete."""
    if x is None or not is_concrete(x):
        return
    a = np.asarray(x)
    if a.size and (np.any(a < 0) | np.any(a > 1) | np.any(np.isnan(a))):
        raise ValueError(f"{name} must lie in [0, 1]; got values in [{a.min()}, {a.max()}]")


def check_log_probs(name: str, x) -> None:
    """Log-probabilities must be <= 0 (a positive one means probabilities were passed)."""
    if x is None or not is_concrete(x):
        return
    a = np.asarray(x)
    if a.size and np.any(a > 1e-6):
        raise ValueError(
            f"{name} must be log-probabilities (<= 0); got a maximum of {a.max()} "
            "(were probabilities or logits passed?)"
        )
