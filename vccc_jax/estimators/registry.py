"""The ONE critic-target table, shared by every testbed under the same names.

Each :class:`CriticTarget` names a target of docs/method.md, the importance weight whose
diagnostics it reports (``importance.WEIGHT_KINDS``), whether it is crossed with a clip
c, and — for one-step targets — an elementwise function

    one_step(t: Transitions, extras: TargetExtras, clip) -> Y   (same shape as t.rewards)

Multi-step targets (``vtrace``, Eq 11; the comparator ``brace``) have ``one_step=None`` and
``multi_step=True``; a row may give a time-major ``sequence(seq: SequenceInputs, clip,
options) -> vs [T, ...]`` that both testbeds call (``brace`` does), else each testbed
supplies its own sequence adapter (tabular: exact moments and sampled
trajectories; trainer: ``estimators.vtrace`` on the rollout). Testbed-only targets (the
trainer's uncorrected lambda-return ``gae``) live in that testbed's adapter.

Adapters: ``vccc_jax.tabular.methods`` (exact fixed points and the sweep) and
``vccc_jax.train.targets`` (the trainer). A comparator registers here once with
:func:`register_critic_target` and both testbeds can evaluate it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import chex

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import WEIGHT_KINDS
from vccc_jax.estimators.types import Transitions

Array = chex.Array


class TargetExtras(NamedTuple):
    """Per-method extra inputs (each of the shape of the transitions, or None).

    baseline: a state-only baseline b(s) (Eq 4; the general baseline of Sec 4.2); None
      means b = Vbar (Eq 8). z: Z(s) = E_mu[w | s] for the method's weight (Sec 4.2).
    b_star: the variance-minimising state baseline of Eq 9.
    """

    baseline: Optional[Array] = None
    z: Optional[Array] = None
    b_star: Optional[Array] = None


OneStepFn = Callable[[Transitions, TargetExtras, Array], Array]


class SequenceInputs(NamedTuple):
    """Time-major inputs [T, ...] of a multi-step target (the arguments of
    ``estimators.vtrace.vtrace``); bootstrap_value [...] = Vbar(s_T). truncations /
    truncation_values: time-limit cuts (DESIGN.md Sec 3); is_action: policy steps (token
    testbed; None = every step)."""

    log_rhos: Array
    discounts: Array
    rewards: Array
    values: Array
    bootstrap_value: Array
    truncations: Optional[Array] = None
    truncation_values: Optional[Array] = None
    is_action: Optional[Array] = None


SequenceFn = Callable[[SequenceInputs, Array, dict], Array]


@dataclasses.dataclass(frozen=True)
class CriticTarget:
    """One row of the critic-target table.

    name: canonical key (``uncorrected``, ``vccc``, ``vccc_bstar``, ``truncated``,
      ``masked``, ``naive_baseline``, ``centered_baseline``, ``vtrace``).
    description: one line for tables and legends.
    weight_kind: one of ``importance.WEIGHT_KINDS``; the weight whose ESS / clip rate /
      Z(s) are reported (and the ``kind`` the target's clip uses).
    uses_clip: whether the target takes a clip c (crossed with a sweep's clip axis).
    one_step: ``f(t, extras, clip) -> Y`` (elementwise), or None when ``multi_step``.
    multi_step: the target needs a trajectory (each testbed adapts it).
    uses_baseline: needs a general baseline b(s) in ``extras.baseline`` (Sec 4.2). A target
      with an optional baseline (``vccc``: Eq 4 with b given, Eq 8 with None = Vbar) reads
      ``extras.baseline`` without requiring it.
    uses_z: reads ``extras.z``. uses_bstar: reads ``extras.b_star``.
    sequence: for a multi-step row, optionally ``f(seq: SequenceInputs, clip, options) ->
      (vs, pg_advantages)`` shared by the testbeds (``clip`` may be traced).
    option_defaults: the row's options and their defaults (``sequence``'s ``options``).
    """

    name: str
    description: str
    weight_kind: str
    uses_clip: bool
    one_step: Optional[OneStepFn] = None
    multi_step: bool = False
    uses_baseline: bool = False
    uses_z: bool = False
    uses_bstar: bool = False
    sequence: Optional[SequenceFn] = None
    option_defaults: tuple = ()

    def __post_init__(self):
        if self.weight_kind not in WEIGHT_KINDS:
            raise ValueError(
                f"critic target {self.name!r}: weight_kind must be one of {WEIGHT_KINDS}, "
                f"got {self.weight_kind!r}")
        if self.multi_step != (self.one_step is None):
            raise ValueError(
                f"critic target {self.name!r}: give one_step exactly when not multi_step")


CRITIC_TARGETS: dict[str, CriticTarget] = {}


def register_critic_target(spec: CriticTarget, *, overwrite: bool = False) -> CriticTarget:
    """Add a row to :data:`CRITIC_TARGETS` (comparators register themselves this way)."""
    if spec.name in CRITIC_TARGETS and not overwrite:
        raise ValueError(f"critic target {spec.name!r} is already registered")
    CRITIC_TARGETS[spec.name] = spec
    return spec


def get_critic_target(name: str) -> CriticTarget:
    """The registered row ``name``; ValueError listing the known names otherwise."""
    if name not in CRITIC_TARGETS:
        raise ValueError(f"critic target must be one of {sorted(CRITIC_TARGETS)}, got {name!r}")
    return CRITIC_TARGETS[name]


def _uncorrected(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.uncorrected_target(t.rewards, t.discounts, t.next_values)


def _vccc(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.vccc_target(*t, baseline=e.baseline)


def _vccc_bstar(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.vccc_target(*t, baseline=e.b_star)


def _truncated(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.clipped_target(*t, clip=clip, kind="truncate")


def _masked(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.clipped_target(*t, clip=clip, kind="mask")


def _naive_baseline(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.naive_clipped_target(*t, baseline=e.baseline, clip=clip, kind="truncate")


def _centered_baseline(t: Transitions, e: TargetExtras, clip) -> Array:
    return ct.centered_clipped_target(*t, baseline=e.baseline, z=e.z, clip=clip,
                                      kind="truncate")


for _spec in (
    CriticTarget("uncorrected", "uncorrected H = r + gamma Vbar(s')", "none", False,
                 _uncorrected),
    CriticTarget("vccc", "VCCC / IW-TD, b = Vbar (Eq 8)", "ratio", False, _vccc),
    CriticTarget("vccc_bstar", "VCCC with b* (Eq 4, Eq 9)", "ratio", False, _vccc_bstar,
                 uses_bstar=True),
    CriticTarget("truncated", "clipped, w = min(rho, c) (Eq 10)", "truncate", True,
                 _truncated),
    CriticTarget("masked", "masked, w = rho 1[1/c <= rho <= c] (Eq 10)", "mask", True,
                 _masked),
    CriticTarget("naive_baseline", "naive clipped, general b (negative control)", "truncate",
                 True, _naive_baseline, uses_baseline=True),
    CriticTarget("centered_baseline", "Z-centred clipped, general b (Sec 4.2)", "truncate",
                 True, _centered_baseline, uses_baseline=True, uses_z=True),
    CriticTarget("vtrace", "V-trace, rhobar = cbar = c (Eq 11)", "truncate", True,
                 multi_step=True),
):
    register_critic_target(_spec)


# ------------------------------------------------------------------- comparators (issue 13)

BRACE_OPTIONS = (("n", 2), ("tail_anchor", "prefix"), ("rho_bar", None), ("c_bar", None))


def brace_sequence(seq: SequenceInputs, clip, options: dict):
    """BRACE targets and advantages (``estimators.related.brace.brace``) on a sequence.

    options: ``n`` (policy steps in the importance-corrected prefix), ``tail_anchor``
    ("prefix" | "constant"), ``rho_bar`` / ``c_bar`` (static thresholds; both None: rhobar =
    cbar = ``clip``, applied by truncating the log-ratios, min(rho, c) = exp(min(log rho,
    log c)), so a traced clip shares one compiled program, as the tabular V-trace adapter
    does). Returns ``BraceOutput(vs, pg_advantages)``.
    """
    import jax.numpy as jnp

    from vccc_jax.estimators.related.brace import brace

    o = dict(BRACE_OPTIONS)
    o.update(options)
    log_rhos, rho_bar, c_bar = seq.log_rhos, o["rho_bar"], o["c_bar"]
    if rho_bar is None and c_bar is None:  # +inf / NaN kept: weight 0 (importance.safe_ratios)
        log_rhos = jnp.where(log_rhos < jnp.inf, jnp.minimum(log_rhos, jnp.log(clip)), log_rhos)
    elif rho_bar is None or c_bar is None:
        raise ValueError("brace: give both rho_bar and c_bar, or neither (then both = clip)")
    return brace(log_rhos, seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                 n=int(o["n"]), clip_rho_threshold=rho_bar, clip_c_threshold=c_bar,
                 clip_pg_rho_threshold=rho_bar, is_action=seq.is_action,
                 truncations=seq.truncations, truncation_values=seq.truncation_values,
                 tail_anchor=o["tail_anchor"])


register_critic_target(CriticTarget(
    "brace", "BRACE: n-step IS prefix + ratio-free MC tail (comparator)", "truncate", True,
    multi_step=True, sequence=brace_sequence, option_defaults=BRACE_OPTIONS))
