"""Pure, jit/vmap/grad-safe estimators (imports nothing else of vccc_jax).

The curated public API: everything a trainer needs to correct its critic and actor for
stale behaviour data (docs/method.md gives the equations).

types          :class:`Transitions`, the one per-transition record (rewards, discounts,
               values, next_values, log_rhos)
importance     log-ratios -> ratios, truncation, double-sided masks, Z(s), diagnostics
critic_targets one-step targets: uncorrected, VCCC (Eq 4/8), clipped (Eq 10), naive and
               Z-centred general-baseline clipped (Sec 4.2), empirical b* (Eq 9)
vtrace         n-step / lambda V-trace (Eq 11): reverse scan (vtrace), associative scan
               (vtrace_associative), donating in-place variant (vtrace_inplace), and
               GAE(gamma, lambda) in the same loop without ratios (gae)
actor          PPO / IS surrogates with score centering (Eq 2, 13)
registry       the ONE critic-target table (name, weight kind, uses-clip, function)
actor_registry the ONE actor-correction table (issue 21): TIS / MIS / IcePop / sequence
               TIS-MIS / GSPO / TOPR / CISPO / PPO / AReaL / M2PO weights, one contract

Note: ``from vccc_jax.estimators import vtrace`` is the V-trace *function*; the module is
``vccc_jax.estimators.vtrace`` (import its names with ``from vccc_jax.estimators.vtrace
import ...``).
"""

from vccc_jax.estimators.actor import centering_term, centering_term_topk, policy_loss
from vccc_jax.estimators.actor_registry import (
    ACTOR_CORRECTIONS,
    ActorCorrection,
    get_actor_correction,
    register_actor_correction,
)
from vccc_jax.estimators.critic_targets import (
    bellman_sample,
    centered_clipped_target,
    clipped_target,
    naive_clipped_target,
    optimal_baseline,
    uncorrected_target,
    vccc_target,
)
from vccc_jax.estimators.importance import (
    MAX_LOG_RHO,
    WEIGHT_KINDS,
    RatioDiagnostics,
    expected_weight,
    importance_weights,
    log_ratios,
    ratio_diagnostics,
    safe_ratios,
)
from vccc_jax.estimators.registry import (
    CRITIC_TARGETS,
    CriticTarget,
    TargetExtras,
    get_critic_target,
    register_critic_target,
)
from vccc_jax.estimators.types import Transitions
from vccc_jax.estimators.vtrace import (
    GAEOutput,
    VTraceOutput,
    gae,
    vtrace,
    vtrace_associative,
    vtrace_inplace,
)

__all__ = [
    # types and the critic-target table
    "Transitions", "TargetExtras", "CriticTarget", "CRITIC_TARGETS",
    "register_critic_target", "get_critic_target",
    # importance weights (Eq 3, 10, 13; Sec 4.2)
    "WEIGHT_KINDS", "MAX_LOG_RHO", "log_ratios", "safe_ratios", "importance_weights",
    "expected_weight", "ratio_diagnostics", "RatioDiagnostics",
    # critic targets (Eq 4, 8, 9, 10; Sec 4.2)
    "bellman_sample", "uncorrected_target", "vccc_target", "clipped_target",
    "naive_clipped_target", "centered_clipped_target", "optimal_baseline",
    # V-trace (Eq 11)
    "vtrace", "vtrace_associative", "vtrace_inplace", "VTraceOutput",
    # GAE(gamma, lambda): Eq 11 with rho == 1, one pass
    "gae", "GAEOutput",
    # actor (Eq 2, 13)
    "policy_loss", "centering_term", "centering_term_topk",
    # the actor-correction table (issue 21)
    "ACTOR_CORRECTIONS", "ActorCorrection", "get_actor_correction", "register_actor_correction",
]
