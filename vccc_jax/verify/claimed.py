"""Closed forms of what an estimator claims, at any threshold c and any version law.

Written independently of the library's weights (as :func:`problems.truncated_policy`):
the clipped behaviour mass is m(s, a) = sum_k q_k(s) mu_k(a|s) w_k(s, a), i.e.
sum_k q_k min(c mu_k, pi) (truncation) or sum_k q_k pi 1[mu_k / c <= pi <= c mu_k] (mask),
and pi for the unclipped ratio; Z = sum_a m, pitilde = m / Z (Eq 10, Eq 6 for a mixture).
For one version the law q is one-hot and m is exactly the built-in claims' min(c mu, pi).

:class:`ClaimedMean` is the ``claimed`` of a :class:`~vccc_jax.verify.targets.TargetSpec`
built for a user's claim; :func:`claimed_value` the fixed point it implies; the atoms of the
diagnosis (:mod:`.user_one_step`) use the same :func:`behaviour_mass`.
"""

from __future__ import annotations

import dataclasses

import chex
import jax.numpy as jnp

from vccc_jax.tabular import exact as ex
from vccc_jax.verify.contracts import Claim
from vccc_jax.verify.problems import Problem

Array = chex.Array


def behaviour_mass(p: Problem, mix: Array, kind: str, c) -> Array:
    """m(s, a) = sum_k q_k(s) mu_k(a|s) w_k(s, a) for w of ``kind`` at threshold c. [S, A]

    ``kind``: "none" (w = 1: the replay's own policy), "ratio" (pi), "truncate", "mask".
    """
    if kind == "ratio":
        return p.pi
    if kind == "none":
        per = p.mus
    elif kind == "truncate":
        per = jnp.minimum(c * p.mus, p.pi[None])
    else:
        per = jnp.where((p.pi[None] >= p.mus / c) & (p.pi[None] <= c * p.mus), p.pi[None], 0.0)
    return jnp.einsum("ks,ksa->sa", mix, per)


def normalised(m: Array) -> tuple[Array, Array]:
    """(Z, m / Z) with Z = sum_a m (rows with Z = 0 are left at 0)."""
    z = jnp.sum(m, axis=-1)
    return z, m / jnp.where(z > 0, z, 1.0)[:, None]


def clipped_mean(p: Problem, m: Array) -> Array:
    """Vbar + Z (T_pitilde Vbar - Vbar) for the mass m (the mean of Eq 10's target). [S]"""
    z, pit = normalised(m)
    return p.vbar + z * (ex.bellman_operator(p.mdp, pit, p.vbar) - p.vbar)


@dataclasses.dataclass(frozen=True)
class ClaimedMean:
    """The claimed E[Y | s] of a one-step target (``TargetSpec.claimed``): T_pi Vbar for
    ``vpi`` / ``any`` (the reference of the bias), Vbar + Z (T_pitilde Vbar - Vbar) for a
    clipped or masked claim, under the cells' version law (``claims.mix``)."""

    claim: Claim

    def __call__(self, k) -> Array:
        if self.claim.weight_kind == "ratio":
            return k.t_pi
        return clipped_mean(k.problem, behaviour_mass(k.problem, k.mix, self.claim.weight_kind, self.claim.c))


def claimed_value(p: Problem, mix: Array, claim: Claim) -> Array:
    """The claimed fixed point: V^pi, or V^pitilde with pitilde ∝ m (Eq 10). [S]"""
    if claim.weight_kind == "ratio":
        return ex.policy_value(p.mdp, p.pi)
    _, pit = normalised(behaviour_mass(p, mix, claim.weight_kind, claim.c))
    return ex.policy_value(p.mdp, pit)
