"""The exact replay mixture of behaviour versions (DESIGN.md Sec 6; write-up Sec 1.3, 4.4).

A replayed transition is drawn as i ~ w, s ~ d^{mu_i}, a ~ mu_i(.|s), s' ~ P(.|s, a), so
the replay's state distribution is d_mix = sum_i w_i d^{mu_i} and the version seen at s
has posterior q_i(s) = w_i d^{mu_i}(s) / d_mix(s).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.tabular import exact
from vccc_jax.tabular.history import replay_state_distribution, version_posterior
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array


class Replay(NamedTuple):
    """Everything exact about one MDP's replay mixture (single MDP; vmap for batches).

    pi [S, A], log_pi [S, A]: the target pi_K. mus, log_mus [V, S, A]: versions pi_0..pi_K.
    weights [V]: the staleness law's version weights. visitation [V, S]: d^{mu_i}.
    state_dist [S]: d_mix. posterior [V, S]: q_i(s).
    """

    mdp: TabularMDP
    pi: Array
    log_pi: Array
    mus: Array
    log_mus: Array
    weights: Array
    visitation: Array
    state_dist: Array
    posterior: Array


def make_replay(mdp: TabularMDP, log_probs: Array, visitation: Array, weights: Array) -> Replay:
    """Replay of versions ``log_probs`` [V, S, A] (the last is the target pi_K) mixed with
    ``weights`` [V]; ``visitation`` [V, S] are the versions' normalised visitations."""
    chex.assert_rank(log_probs, 3)
    chex.assert_rank(weights, 1)
    if weights.shape[0] != log_probs.shape[0] or visitation.shape != log_probs.shape[:2]:
        raise ValueError(
            f"weights {weights.shape} / visitation {visitation.shape} do not match "
            f"log_probs {log_probs.shape} (need [V] and [V, S])"
        )
    mus = jnp.exp(log_probs)
    return Replay(
        mdp=mdp, pi=mus[-1], log_pi=log_probs[-1], mus=mus, log_mus=log_probs,
        weights=weights, visitation=visitation,
        state_dist=replay_state_distribution(weights, visitation),
        posterior=version_posterior(weights, visitation),
    )



def mixture_optimal_baseline(replay: Replay, vbar: Array) -> Array:
    """State-only variance-minimising baseline of Eq 9 for the replay mixture. [S]

        b*(s) = E_replay[(rho - 1) rho H | s] / E_replay[(rho - 1)^2 | s],

    both expectations over i ~ q(.|s), a ~ mu_i, s' ~ P. For a single version this is
    ``exact.optimal_baseline`` (tested); where the denominator is 0, Vbar(s).
    """
    def per_version(mu):
        grid = exact.transition_grid(replay.mdp, replay.pi, mu, vbar)
        rho = safe_ratios(grid.log_rhos)
        h = grid.rewards + grid.discounts * grid.next_values
        num, _ = exact.target_moments(replay.mdp, mu, (rho - 1.0) * rho * h)
        den, _ = exact.target_moments(replay.mdp, mu, jnp.square(rho - 1.0))
        return num, den

    num, den = jax.vmap(per_version)(replay.mus)
    num = jnp.sum(replay.posterior * num, axis=0)
    den = jnp.sum(replay.posterior * den, axis=0)
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), vbar)

