"""The trainer's critic targets: an adapter of ``estimators.registry`` (same names).

Every one-step row of the critic-target table runs on a rollout [T, B] as is; the trainer
supplies its extras (the general baseline b(s): Vbar or 0; Z(s) = E_mu[w | s] from the
logged full behaviour log-probabilities, Sec 4.2). The multi-step row ``vtrace`` (Eq 11)
runs ``estimators.vtrace`` over the rollout, and the trainer adds one target of its own:
``gae``, the uncorrected lambda-return (V-trace with rho := 1). The field's asynchronous
critics (issue 48, ``estimators.related.field_critics``) are GAE with the values of the
actor's critic copy V_{k-L}: ``cleanba_mixed`` (V(s_t) from the copy, bootstraps from the
learner's Vbar), ``stale_gae`` (all values from the copy) and ``recompute_no_ratio`` (all
from the learner's Vbar: the trainer's ``gae`` itself, registered under both names); the
first two read ``TargetInputs.behaviour_values`` (:data:`NEEDS_ACTOR_CRITIC`). The comparator ``brace``
(issue 13) runs the registry row's ``sequence`` (``estimators.related.brace``) with
``config.brace_n``, ``brace_tail_anchor`` and V-trace's thresholds ``rho_bar`` / ``c_bar``.
``vccc_bstar`` needs the
replay's per-state b* (Eq 9) and exists only on the tabular testbed.

Every target has ONE signature, ``fn(inputs: TargetInputs, config: TrainConfig, clip) ->
TargetOutput``: ``clip`` is the weight clip c (a traced grid value of the trainer's program,
``train.programs.GridValues``, except for ``brace``: ``config.clip``); comparators register
more with :func:`register_critic_target`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax.numpy as jnp

from vccc_jax.envs.policy_heads import CategoricalHead
from vccc_jax.estimators import registry
from vccc_jax.estimators.registry import CriticTarget, TargetExtras
from vccc_jax.estimators.related.field_critics import NEEDS_ACTOR_CRITIC as _NEEDS
from vccc_jax.estimators.types import Transitions
from vccc_jax.estimators.vtrace import vtrace
from vccc_jax.train.config import TrainConfig

Array = chex.Array


class TargetInputs(NamedTuple):
    """What a critic target may use; all [T, B] unless noted (time-major).

    transitions: rewards, discounts (gamma (1 - terminated)), values / next_values
    (Vbar(s_t) / Vbar(s_{t+1}), the final observation's value at a time-limit cut) and
    log_rhos (log pi_k(a_t|s_t) - log mu(a_t|s_t); 0 when ``config.correct`` is False).
    truncated: time-limit cut after t. log_mu_all / log_pi_all: [T, B, P] the behaviour /
    target distributions as the policy head's rows (full log-probs of a categorical actor, a
    Gaussian's [mean, log_std]). baseline: b(s_t) (Vbar or 0, ``config.baseline``).
    is_action: [T, B] bool policy steps (token env tool steps are False) or None (every
    step). head: the policy head (``envs.policy_heads``; None: categorical rows), whose
    ``expected_weight`` gives Z(s). behaviour_values / behaviour_next_values: V_{k-L}(s_t) /
    V_{k-L}(s_{t+1}) from the critic copy of each step's behaviour version (the learner's
    Vbar at lag-0 steps), or None (only :data:`NEEDS_ACTOR_CRITIC` targets read them).
    """

    transitions: Transitions
    truncated: Array
    log_mu_all: Array
    log_pi_all: Array
    baseline: Array
    is_action: Optional[Array] = None
    head: Any = None
    behaviour_values: Optional[Array] = None
    behaviour_next_values: Optional[Array] = None


class TargetOutput(NamedTuple):
    targets: Array  # [T, B] regression targets (stop-gradient)
    advantages: Array  # [T, B] the target's own actor advantages


TargetFn = Callable[[TargetInputs, TrainConfig, Any], TargetOutput]
CRITIC_TARGETS: dict[str, TargetFn] = {}


def register_critic_target(name: str, fn: TargetFn, *, overwrite: bool = False) -> None:
    """Add a critic target ``fn(inputs: TargetInputs, config: TrainConfig, clip) ->
    TargetOutput``."""
    if name in CRITIC_TARGETS and not overwrite:
        raise ValueError(f"critic target {name!r} is already registered")
    CRITIC_TARGETS[name] = fn


def get_critic_target(name: str) -> TargetFn:
    if name not in CRITIC_TARGETS:
        raise ValueError(f"critic must be one of {sorted(CRITIC_TARGETS)}, got {name!r}")
    return CRITIC_TARGETS[name]


def _vtrace(x: TargetInputs, log_rhos: Array, lambda_: float, rho_bar: float, c_bar: float,
            n_steps: Optional[int]):
    t = x.transitions
    return vtrace(
        log_rhos,
        t.discounts,
        t.rewards,
        t.values,
        t.next_values[-1],
        lambda_=lambda_,
        clip_rho_threshold=rho_bar,
        clip_c_threshold=c_bar,
        clip_pg_rho_threshold=rho_bar,
        truncations=x.truncated,
        truncation_values=t.next_values,
        n_steps=n_steps,
    )


def gae_advantages(x: TargetInputs, lambda_: float) -> Array:
    """Uncorrected GAE(gamma, lambda) advantages on Vbar (V-trace with rho := 1, minus Vbar)."""
    t = x.transitions
    out = _vtrace(x, jnp.zeros_like(t.log_rhos), lambda_, 1.0, 1.0, None)
    return out.vs - t.values


def _gae_target(x: TargetInputs, cfg: TrainConfig, clip=None) -> TargetOutput:
    """Uncorrected GAE(gamma, lambda) value target: V-trace with rho := 1 (Eq 11, on-policy)."""
    t = x.transitions
    out = _vtrace(x, jnp.zeros_like(t.log_rhos), cfg.target_lambda, 1.0, 1.0, cfg.vtrace_n)
    return TargetOutput(out.vs, out.vs - t.values)


def _actor_copy_gae(x: TargetInputs, cfg: TrainConfig, copy_bootstrap: bool) -> TargetOutput:
    """GAE(gamma, lambda) on V(s_t) of the actor's critic copy; bootstraps (the rollout's end
    and time-limit cuts) from the copy (``stale_gae``) or from the learner's Vbar
    (``cleanba_mixed``). Advantages: the same GAE on the copy's values (the field's)."""
    if x.behaviour_values is None:
        raise ValueError("this critic needs the actor's critic copy V_{k-L}(s_t) "
                         "(TargetInputs.behaviour_values): the trainer logs it when the "
                         "config's critic is one of train.targets.NEEDS_ACTOR_CRITIC")
    t = x.transitions
    next_values = x.behaviour_next_values if copy_bootstrap else t.next_values
    t = t._replace(values=x.behaviour_values, next_values=next_values)
    out = _vtrace(x._replace(transitions=t), jnp.zeros_like(t.log_rhos), cfg.target_lambda,
                  1.0, 1.0, cfg.vtrace_n)
    return TargetOutput(out.vs, out.vs - t.values)


def _cleanba_mixed_target(x: TargetInputs, cfg: TrainConfig, clip=None) -> TargetOutput:
    """Cleanba's PPO (issue 48): GAE with V(s_t) from the actor's critic copy (version k - L)
    and the bootstrap from the learner's critic (k); no ratio."""
    return _actor_copy_gae(x, cfg, copy_bootstrap=False)


def _stale_gae_target(x: TargetInputs, cfg: TrainConfig, clip=None) -> TargetOutput:
    """verl / OpenRLHF's default (issue 48): GAE as the actor computed it, every value from its
    critic copy (version k - L); no ratio."""
    return _actor_copy_gae(x, cfg, copy_bootstrap=True)


def _vtrace_target(x: TargetInputs, cfg: TrainConfig, clip=None) -> TargetOutput:
    """V-trace(lambda, rhobar, cbar, n), Eq 11; advantages are V-trace's policy-gradient ones."""
    t = x.transitions
    out = _vtrace(x, t.log_rhos, cfg.target_lambda, cfg.rho_bar, cfg.c_bar, cfg.vtrace_n)
    return TargetOutput(out.vs, out.pg_advantages)


def one_step_adapter(target: CriticTarget) -> TargetFn:
    """The trainer form of a one-step registry row: targets Y and advantages Y - Vbar.

    Extras: a target that needs a general baseline gets b = ``inputs.baseline``; one with an
    optional baseline (``vccc``) gets None (b = Vbar, Eq 8) when ``config.baseline`` is
    "value", else b = 0 (Eq 4); Z(s) = E_mu[w | s] (Sec 4.2) comes from the logged full
    log-probabilities with the row's weight kind and ``clip``.
    """
    def fn(x: TargetInputs, cfg: TrainConfig, clip) -> TargetOutput:
        t = x.transitions
        if target.uses_baseline or cfg.baseline != "value":
            baseline = x.baseline
        else:
            baseline = None
        z = None
        if target.uses_z:  # the head's Z: exact sum over actions, or normal CDFs (1-d Gaussian)
            head = CategoricalHead() if x.head is None else x.head
            z = head.expected_weight(x.log_pi_all, x.log_mu_all, target.weight_kind, clip)
        y = target.one_step(t, TargetExtras(baseline=baseline, z=z), clip)
        return TargetOutput(y, y - t.values)

    fn.__doc__ = f"{target.description} (estimators.registry row {target.name!r})."
    return fn


def brace_options(cfg: TrainConfig) -> dict:
    """Options of the registry's ``brace`` row from a TrainConfig."""
    return dict(n=cfg.brace_n, tail_anchor=cfg.brace_tail_anchor, rho_bar=cfg.rho_bar,
                c_bar=cfg.c_bar)


def _brace_target(x: TargetInputs, cfg: TrainConfig, clip) -> TargetOutput:
    """BRACE (comparator, issue 13): n policy steps of Eq 11 (lambda 1, rhobar / cbar), then
    a ratio-free Monte-Carlo tail to the rollout's end (bootstrapped from Vbar there; time-
    limit cuts bootstrap from the final observation's value). Advantages: BRACE's
    policy-gradient ones (V-trace form). ``clip``: a Python number (``config.clip``)."""
    t = x.transitions
    seq = registry.SequenceInputs(
        log_rhos=t.log_rhos, discounts=t.discounts, rewards=t.rewards, values=t.values,
        bootstrap_value=t.next_values[-1], truncations=x.truncated,
        truncation_values=t.next_values, is_action=x.is_action)
    out = registry.get_critic_target("brace").sequence(seq, clip, brace_options(cfg))
    return TargetOutput(out.vs, out.pg_advantages)


# the critics that read the actor's critic copy (TargetInputs.behaviour_values)
NEEDS_ACTOR_CRITIC = _NEEDS

register_critic_target("gae", _gae_target)
register_critic_target("recompute_no_ratio", _gae_target)  # NeMo-RL: the trainer's gae
register_critic_target("cleanba_mixed", _cleanba_mixed_target)
register_critic_target("stale_gae", _stale_gae_target)
for _target in registry.CRITIC_TARGETS.values():
    if _target.name == "vtrace":
        register_critic_target("vtrace", _vtrace_target)
    elif _target.name == "brace":
        register_critic_target("brace", _brace_target)
    elif not _target.multi_step and not _target.uses_bstar:
        register_critic_target(_target.name, one_step_adapter(_target))
