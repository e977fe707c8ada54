"""The critic targets real asynchronous pipelines train, named (issue 48).

In an actor-learner pipeline the rollout of update k was made by pi_{k-L}, and two critic
versions are at hand: the actor's copy V_{k-L} (the values it stored while acting) and the
learner's V_k. The field's schemes differ only in which one enters the GAE(gamma, lambda)
lambda-return (computed here by the library's V-trace with rho = 1, which ``vccc verify``
checks equal to the GAE recursion pathwise), and none corrects for mu != pi:

* ``cleanba_mixed``: Cleanba's PPO — V(s_t) from the actor's critic copy (k - 1), the
  bootstrap V(s_T) from the learner's critic (k); uncorrected.
* ``recompute_no_ratio``: NeMo-RL's async PPO — every value recomputed with the learner's
  current critic, no importance ratio.
* ``stale_gae``: verl / OpenRLHF's default — GAE as the actor computed it, values and
  bootstrap from its stale copy.

Their expected targets under mu, minus the learner's on-policy lambda-return of V_k, are the
``vccc verify`` rows of ``verify.sections.async_critics``.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from vccc_jax.estimators.vtrace import vtrace

Array = chex.Array

FIELD_CRITICS = ("cleanba_mixed", "recompute_no_ratio", "stale_gae")
# the schemes that read the actor's critic copy V_{k-L} (a trainer logs it only for these)
NEEDS_ACTOR_CRITIC = ("cleanba_mixed", "stale_gae")

__all__ = ["FIELD_CRITICS", "NEEDS_ACTOR_CRITIC", "field_critic_target", "gae_lambda_return"]


def gae_lambda_return(rewards: Array, discounts: Array, values: Array, bootstrap_value: Array,
                      lambda_) -> Array:
    """The GAE(gamma, lambda) value target values + advantages (time-major [T, ...])."""
    return vtrace(jnp.zeros_like(rewards), discounts, rewards, values, bootstrap_value,
                  lambda_=lambda_).vs


def field_critic_target(name: str, rewards: Array, discounts: Array, actor_values: Array,
                        learner_values: Array, actor_bootstrap: Array,
                        learner_bootstrap: Array, lambda_) -> Array:
    """The value target of scheme ``name`` (:data:`FIELD_CRITICS`) on one rollout: values
    [T, ...] and bootstrap [...] of the actor's critic copy and of the learner's critic."""
    if name == "cleanba_mixed":
        values, boot = actor_values, learner_bootstrap
    elif name == "recompute_no_ratio":
        values, boot = learner_values, learner_bootstrap
    elif name == "stale_gae":
        values, boot = actor_values, actor_bootstrap
    else:
        raise ValueError(f"field critic must be one of {FIELD_CRITICS}, got {name!r}")
    return gae_lambda_return(rewards, discounts, values, boot, lambda_)
