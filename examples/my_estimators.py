"""Estimators written the way a user writes them, to show ``vccc verify --target``.

    vccc verify --target examples/my_estimators.py:corrected_target
    vccc verify --target examples/my_estimators.py:clipped_with_baseline --claim clipped:2

Each is a plain JAX function in the library's one-step style: arguments named after
``vccc_jax.estimators.Transitions`` (rewards, discounts, values, next_values, log_rhos),
plus an optional state ``baseline`` and ``clip`` that the verifier supplies.
"""

import jax
import jax.numpy as jnp


def corrected_target(rewards, discounts, values, next_values, log_rhos, baseline):
    """Eq 4: H + (rho - 1)(H - b), a constant for the critic's regression."""
    h = rewards + discounts * next_values
    return jax.lax.stop_gradient(h + (jnp.exp(log_rhos) - 1.0) * (h - baseline))


def clipped_with_baseline(rewards, discounts, values, next_values, log_rhos, baseline, clip):
    """Eq 4 with the ratio truncated at c -- a natural way to bound its variance, and wrong:
    E[w] = Z(s) < 1, so the baseline no longer cancels (the fix is w - Z(s), Sec 4.2)."""
    h = rewards + discounts * next_values
    w = jnp.minimum(jnp.exp(log_rhos), clip)
    return jax.lax.stop_gradient(h + (w - 1.0) * (h - baseline))
