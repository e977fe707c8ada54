"""Binding a tabular method's options: what the exact and training code call.

:func:`resolve` binds one :class:`~vccc_jax.tabular.methods.MethodSpec`;
:func:`resolve_bank` puts several one-step methods behind a traced index so they share
one compiled program.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import WEIGHT_KINDS, importance_weights, safe_ratios
from vccc_jax.tabular import exact
from vccc_jax.tabular.methods import MethodSpec, general_baseline
from vccc_jax.tabular.replay import Replay

Array = chex.Array


def _weights_of_kind(kind: str, log_rhos: Array, clip) -> tuple[Array, Array]:
    """(w, clipped) of a weight kind on log-ratios: w = 1 (none), rho, min(rho, c) or the
    mask; ``clipped`` marks where w != rho because of the clip."""
    rho = safe_ratios(log_rhos)
    if kind in ("truncate", "mask"):
        w = importance_weights(log_rhos, kind, clip)
        return w, w != rho
    w = rho if kind == "ratio" else jnp.ones_like(rho)
    return w, jnp.zeros(rho.shape, bool)


def _z_of_kind(kind: str, replay: "Replay", clip) -> Array:
    """Z_i(s) = E_{mu_i}[w | s] of a weight kind (``exact.z_and_clipped_policy``). [V, S]"""
    if kind in ("truncate", "mask"):
        return jax.vmap(lambda mu: exact.z_and_clipped_policy(replay.pi, mu, clip, kind)[0])(
            replay.mus
        )
    return jnp.ones(replay.visitation.shape, replay.pi.dtype)


class Resolved(NamedTuple):
    """A method with its options bound: what the exact and training code call.

    Built by :func:`resolve` (one method) or :func:`resolve_bank` (several one-step methods
    behind a traced index, so they share one compiled program). ``multi_step``,
    ``uses_clip``, ``needs_bstar`` and ``n_steps`` are static; the callables take traced
    arrays: one_step(transitions, extras, clip), moments(mdp, pi, mu, vbar, clip),
    trajectory_target(traj, clip), weights(log_rhos, clip) -> (w, clipped),
    z(replay, clip) -> [V, S], baseline(values_by_version) -> [S].
    """

    multi_step: bool
    uses_clip: bool
    needs_bstar: bool
    n_steps: int
    one_step: Optional[Callable]
    moments: Optional[Callable]
    trajectory_target: Optional[Callable]
    weights: Callable
    z: Callable
    baseline: Callable


def resolve(spec: MethodSpec, options: Optional[dict] = None) -> Resolved:
    """Bind a method's options (validated against its defaults)."""
    o = spec.options(options)
    kind = spec.weight_kind
    return Resolved(
        multi_step=spec.multi_step,
        uses_clip=spec.uses_clip,
        needs_bstar=spec.needs_bstar,
        n_steps=int(spec.n_steps(o)) if spec.multi_step else 1,
        one_step=None if spec.multi_step else (lambda t, e, clip: spec.one_step(t, e, clip, o)),
        moments=(lambda m, pi, mu, v, clip: spec.moments(m, pi, mu, v, clip, o))
        if spec.multi_step else None,
        trajectory_target=(lambda traj, clip: spec.trajectory_target(traj, clip, o))
        if spec.multi_step else None,
        weights=lambda log_rhos, clip: _weights_of_kind(kind, log_rhos, clip),
        z=lambda replay, clip: _z_of_kind(kind, replay, clip),
        baseline=lambda values: general_baseline(o.get("baseline", "zero"), values),
    )


def resolve_bank(specs: tuple, options: tuple, index) -> Resolved:
    """Several one-step methods selected by a traced ``index`` (``lax.switch``).

    Everything method-specific (target, weight kind, baseline) switches on the index, so
    one compiled program evaluates every method of the bank. All must be one-step and
    agree on ``uses_clip``. ``index`` must not be batched (a vmapped index would make the
    switch evaluate every branch).
    """
    if len(specs) != len(options) or not specs:
        raise ValueError("resolve_bank needs one options dict per method")
    if len(specs) == 1:
        return resolve(specs[0], options[0])
    if any(s.multi_step for s in specs):
        raise ValueError("resolve_bank takes one-step methods only")
    if len({s.uses_clip for s in specs}) != 1:
        raise ValueError("a bank's methods must agree on uses_clip")
    rs = [resolve(s, o) for s, o in zip(specs, options)]
    kinds = sorted({s.weight_kind for s in specs}, key=WEIGHT_KINDS.index)
    kind_index = jnp.asarray([kinds.index(s.weight_kind) for s in specs])[index]

    def switch_kind(fn):
        return lambda *args: jax.lax.switch(
            kind_index, [functools.partial(fn, k) for k in kinds], *args
        )

    return Resolved(
        multi_step=False,
        uses_clip=specs[0].uses_clip,
        needs_bstar=any(s.needs_bstar for s in specs),
        n_steps=1,
        one_step=lambda t, e, clip: jax.lax.switch(index, [r.one_step for r in rs], t, e, clip),
        moments=None,
        trajectory_target=None,
        weights=switch_kind(_weights_of_kind),
        z=switch_kind(_z_of_kind),
        baseline=lambda values: jnp.stack([r.baseline(values) for r in rs])[index],
    )


def _as_resolved(method, options) -> Resolved:
    return method if isinstance(method, Resolved) else resolve(method, options)


def _clip_or_inf(r: Resolved, clip):
    return clip if r.uses_clip else jnp.inf


def version_z(method, replay: Replay, clip, options: Optional[dict] = None) -> Array:
    """Z_i(s) = E_{mu_i}[w | s] for the method's weight (1 for unclipped). [V, S]"""
    r = _as_resolved(method, options)
    return r.z(replay, _clip_or_inf(r, clip))

