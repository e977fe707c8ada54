"""The one per-transition record every critic target reads (docs/method.md, Eq 3-11).

:class:`Transitions` is the single declaration of the five fields a one-step (or, stacked
time-major, a multi-step) critic target needs. Testbeds build it from their own data — an
enumerated [S, A, S'] grid (``tabular``), sampled replay [B], or a rollout [T, B]
(``train``) — and pass per-method extras separately (``estimators.registry.TargetExtras``).
"""

from __future__ import annotations

from typing import NamedTuple

import chex

Array = chex.Array


class Transitions(NamedTuple):
    """Per-transition inputs of a critic target, all of one shape.

    rewards: r_t. discounts: gamma_t = gamma (1 - terminal_{t+1}) (a time-limit cut keeps
    its discount). values: Vbar(s_t), the frozen bootstrap at the visited state.
    next_values: Vbar(s_{t+1}) (the final observation's value at a time-limit cut).
    log_rhos: log pi(a_t|s_t) - log mu(a_t|s_t), the log importance ratio (Eq 3).
    """

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    log_rhos: Array
