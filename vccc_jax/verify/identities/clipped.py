"""Exact identity sections for the clipped targets: fixed points of Eq 10 (truncate, mask,
replay mixture) and the naive / Z-centred general-baseline variants of Sec 4.2."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import exact as ex
from vccc_jax.verify.identities.shared import Prelude, affine_fixed_point, grid_mean
from vccc_jax.verify.problems import (
    CLIP,
    MASK_CLIP,
    Problem,
    masked_policy,
    maxabs,
    truncated_policy,
)


def clipped_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi, mus, vbar = p.mdp, p.pi, p.mus, p.vbar
    S = mdp.num_states
    dtype = vbar.dtype
    mu = mus[-1]
    errs = {}

    # Clipped fixed points (Eq 10): solve the fixed point of the library target's expected
    # update exactly and compare with V^{pitilde} (pitilde ∝ min(c mu, pi), or the mask's).
    def clipped_fp(m, kind, c, fn_policy):
        z, pit = fn_policy(pi, m, c)
        expected = lambda v: grid_mean(mdp, pi, m, v, lambda gg: ct.clipped_target(
            gg.rewards, gg.discounts, gg.values, gg.next_values, gg.log_rhos, clip=c, kind=kind))
        fp = affine_fixed_point(expected, S, dtype)
        err = jnp.maximum(maxabs(fp - ex.policy_value(mdp, pit)),
                          maxabs(fp - ex.clipped_fixed_point(mdp, pi, m, c, kind)))
        return jnp.where(jnp.min(z) > 1e-3, err, -jnp.inf)

    # A version whose mask rejects every action of some state has no unique fixed point; it is
    # skipped (-inf, so that a NaN error still propagates and fails), and the MDP counts as not
    # applicable only if every version is skipped.
    errs["clipped_fp_truncate"] = jnp.max(jax.vmap(lambda m: clipped_fp(m, "truncate", CLIP, truncated_policy))(mus))
    errs["clipped_fp_mask"] = jnp.max(jax.vmap(lambda m: clipped_fp(m, "mask", MASK_CLIP, masked_policy))(mus))

    # ... under a replay mixture: fixed point V^{pibar}, pibar ∝ sum_k q_k min(c mu_k, pi).
    def replay_expected(v):
        means = jax.vmap(lambda m: grid_mean(mdp, pi, m, v, lambda gg: ct.clipped_target(
            gg.rewards, gg.discounts, gg.values, gg.next_values, gg.log_rhos, clip=CLIP)))(mus)
        return jnp.sum(p.mix * means, axis=0)

    fp_replay = affine_fixed_point(replay_expected, S, dtype)
    m_replay = jnp.einsum("ks,ksa->sa", p.mix, jnp.minimum(CLIP * mus, pi[None]))
    pibar = m_replay / jnp.sum(m_replay, axis=-1, keepdims=True)
    errs["clipped_fp_replay"] = jnp.maximum(
        maxabs(fp_replay - ex.policy_value(mdp, pibar)),
        maxabs(fp_replay - ex.clipped_fixed_point(mdp, pi, mus, CLIP, "truncate", mix=p.mix)),
    )

    # Naive clipped general baseline: its fixed point leaks (1 - Z) b; the Z-centred one does
    # not (fixed point V^{pitilde} for every baseline).
    z_t, pit_t = truncated_policy(pi, mu, CLIP)
    v_pit = ex.policy_value(mdp, pit_t)

    def naive_fp(b):
        expected = lambda v: grid_mean(mdp, pi, mu, v, lambda gg: ct.naive_clipped_target(
            gg.rewards, gg.discounts, gg.values, gg.next_values, gg.log_rhos, gg.state(b), clip=CLIP))
        fp = affine_fixed_point(expected, S, dtype)
        return maxabs(fp - ex.naive_clipped_fixed_point(mdp, pi, mu, b, CLIP)), maxabs(fp - v_pit)

    def centred_fp(b):
        expected = lambda v: grid_mean(mdp, pi, mu, v, lambda gg: ct.centered_clipped_target(
            gg.rewards, gg.discounts, gg.values, gg.next_values, gg.log_rhos, gg.state(b), gg.state(z_t),
            clip=CLIP))
        return maxabs(affine_fixed_point(expected, S, dtype) - v_pit)

    naive_err, leak = jax.vmap(naive_fp)(p.baselines[1:])
    errs["naive_fp_leaks"] = jnp.max(naive_err)
    errs["naive_leak_size"] = jnp.min(leak)  # must be > 0 wherever clipping is active
    errs["naive_clipping_active"] = jnp.max(1.0 - z_t)
    errs["centred_fp"] = jnp.max(jax.vmap(centred_fp)(p.baselines))

    return errs

