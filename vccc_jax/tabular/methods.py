"""The tabular sweep's methods: adapters of ``estimators.registry`` keyed by the same names.

Every one-step row of the critic-target table (``estimators.registry.CRITIC_TARGETS``) is
a tabular method as is: its elementwise function is evaluated on the enumerated
[S, A, S'] grid of every behaviour version for exact moments and on sampled replay
batches [B] for the trained critic, so the exact and stochastic paths can never disagree
about what the target is. The tabular testbed adds only

* options: the general baseline b(s) of the Sec 4.2 targets (``oldest_value`` = V^{pi_0}
  or ``zero``), and V-trace's ``lambda_`` and ``n_steps``;
* the multi-step adapter of ``vtrace`` (exact moments and sampled trajectories,
  ``tabular.vtrace_moments``);
* the multi-step adapter of the comparator ``brace`` (issue 13; exact moments
  ``tabular.brace.segment_moments``, sampled targets through the registry row's
  ``sequence``), options ``n`` (prefix policy steps), ``n_steps`` (segment length),
  ``tail_anchor``; rhobar = cbar = the sweep's clip. A sweep config holds one options
  table per method name, so the prefix lengths of an n-grid are registered as named
  variants ``brace_n1``, ``brace_n2``, ``brace_n4``, ``brace_n8`` (``brace`` with that
  default ``n``; every option still overridable).

A comparator registers its target once in ``estimators.registry`` and, if it needs
testbed-specific parts, its :class:`MethodSpec` here with :func:`register_method`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import chex
import jax.numpy as jnp

from vccc_jax.estimators.importance import WEIGHT_KINDS
from vccc_jax.estimators.registry import CRITIC_TARGETS, CriticTarget, TargetExtras
from vccc_jax.estimators.types import Transitions
from vccc_jax.tabular.brace import brace_moments_with_options, brace_trajectory_target
from vccc_jax.tabular.vtrace_moments import vtrace_moments_with_options, vtrace_trajectory_target

Array = chex.Array

BASELINES = ("oldest_value", "zero")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A critic target the sweep can evaluate.

    name: registry key. description: one line for tables and legends.
    weight_kind: the importance weight whose ESS / clip rate / Z(s) are reported
      (one of ``estimators.importance.WEIGHT_KINDS``).
    uses_clip: whether the method is crossed with the sweep's clip axis.
    one_step: ``f(t: Transitions, extras: TargetExtras, clip, options) -> Y``
      (elementwise), or None for a multi-step method, which must give
      ``n_steps(options)``, ``moments(mdp, pi, mu, vbar, clip, options) -> (mean [S],
      var [S])`` (exact, single version) and ``trajectory_target(traj: Trajectory, clip,
      options) -> Y [B]``.
    defaults: the method's options and their default values (a config may override them).
    needs_bstar: whether targets read ``TargetExtras.b_star`` (costs S + 1 extra exact
      evaluations per update of the trained critic).
    """

    name: str
    description: str
    weight_kind: str
    uses_clip: bool
    one_step: Optional[Callable] = None
    n_steps: Optional[Callable] = None
    moments: Optional[Callable] = None
    trajectory_target: Optional[Callable] = None
    defaults: tuple = ()
    needs_bstar: bool = False

    @property
    def multi_step(self) -> bool:
        return self.one_step is None

    def options(self, given: Optional[dict] = None) -> dict:
        """Defaults overridden by ``given``; unknown keys raise ValueError naming them."""
        opts = dict(self.defaults)
        for k, v in (given or {}).items():
            if k not in opts:
                raise ValueError(
                    f"method {self.name!r} has no option {k!r}; options: {sorted(opts)}"
                )
            opts[k] = v
        return opts


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method to :data:`METHODS` (comparators register themselves this way)."""
    if spec.one_step is None and None in (spec.n_steps, spec.moments, spec.trajectory_target):
        raise ValueError(
            f"method {spec.name!r}: a multi-step method needs n_steps, moments and trajectory_target"
        )
    if spec.weight_kind not in WEIGHT_KINDS:
        raise ValueError(f"method {spec.name!r}: weight_kind must be one of {WEIGHT_KINDS}")
    METHODS[spec.name] = spec
    return spec


def general_baseline(kind: str, values_by_version: Array) -> Array:
    """The fixed general baseline b(s) of the Sec 4.2 targets: ``oldest_value`` = V^{pi_0}
    (a stale value head, the natural 'wrong' baseline in async RL) or ``zero``. [S]"""
    if kind == "oldest_value":
        return values_by_version[0]
    if kind == "zero":
        return jnp.zeros_like(values_by_version[0])
    raise ValueError(f"baseline must be one of {BASELINES}, got {kind!r}")


def _adapt_one_step(target: CriticTarget, takes_baseline: bool) -> Callable:
    """f(t, extras, clip, options) of a registry row. Without a ``baseline`` option the
    tabular method uses b = Vbar (``extras.baseline`` is dropped: Eq 8)."""
    def one_step(t: Transitions, extras: TargetExtras, clip, options):
        if not takes_baseline:
            extras = extras._replace(baseline=None)
        return target.one_step(t, extras, clip)

    return one_step


def method_from_registry(target: CriticTarget, **multi_step) -> MethodSpec:
    """The tabular :class:`MethodSpec` of a registry row. One-step rows that need a general
    baseline (``uses_baseline``) get a ``baseline`` option (the others use b = Vbar); multi-step rows need ``n_steps``, ``moments``,
    ``trajectory_target`` and ``defaults`` in ``multi_step``."""
    if target.multi_step:
        return MethodSpec(target.name, target.description, target.weight_kind,
                          target.uses_clip, **multi_step)
    takes_baseline = target.uses_baseline
    return MethodSpec(
        target.name, target.description, target.weight_kind, target.uses_clip,
        one_step=_adapt_one_step(target, takes_baseline),
        defaults=(("baseline", "oldest_value"),) if takes_baseline else (),
        needs_bstar=target.uses_bstar,
    )


for _target in list(CRITIC_TARGETS.values()):
    if _target.name == "vtrace":
        register_method(method_from_registry(
            _target,
            n_steps=lambda o: int(o["n_steps"]),
            moments=vtrace_moments_with_options,
            trajectory_target=vtrace_trajectory_target,
            defaults=(("lambda_", 1.0), ("n_steps", 3)),
        ))
    elif _target.name == "brace":
        for _name, _n in (("brace", 2), ("brace_n1", 1), ("brace_n2", 2), ("brace_n4", 4),
                          ("brace_n8", 8)):
            _spec = method_from_registry(
                _target,
                n_steps=lambda o: int(o["n_steps"]),
                moments=brace_moments_with_options,
                trajectory_target=brace_trajectory_target,
                defaults=(("n", _n), ("n_steps", 8), ("tail_anchor", "prefix")),
            )
            register_method(dataclasses.replace(
                _spec, name=_name,
                description=_target.description if _name == "brace" else f"BRACE n={_n}"))
    elif not _target.multi_step:
        register_method(method_from_registry(_target))
