"""V-trace on the tabular testbed: exact conditional moments and sampled trajectories.

The multi-step adapter of the ``vtrace`` row of ``estimators.registry`` (Eq 11, with
rhobar = cbar = c on a sweep's clip axis): the exact mean and variance of the n-step
target per behaviour version (:func:`vtrace_moments`) and the target on sampled n-step
replay trajectories (:func:`vtrace_trajectory_target`).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.vtrace import vtrace
from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts

Array = chex.Array


class Trajectory(NamedTuple):
    """Time-major sampled n-step replay trajectories [n, B] (+ bootstrap [B])."""

    log_rhos: Array
    discounts: Array
    rewards: Array
    values: Array
    bootstrap_value: Array


def vtrace_moments(
    mdp: TabularMDP,
    pi: Array,
    mu: Array,
    v: Array,
    *,
    n_steps: int,
    lambda_: float,
    clip_rho_threshold,
    clip_c_threshold,
) -> tuple[Array, Array]:
    """Exact E_mu[v_s | s] and Var_mu[v_s | s] of the n-step V-trace target (Eq 11). [S], [S]

    With X_m(s) = v_s - v(s) for m steps to go, rho^c = min(rhobar, rho),
    c = lambda min(cbar, rho), delta = r + gamma(s') v(s') - v(s):

        X_m = rho^c delta + gamma(s') c X'_{m-1}(s'),   X_0 = 0,

    where X'_{m-1}(s') depends on the past only through s' (Markov). Hence
    A_m = E[X_m | s] and B_m = E[X_m^2 | s] follow the recursion

        A_m(s) = E[rho^c delta + gamma' c A_{m-1}(s')]
        B_m(s) = E[(rho^c delta)^2 + 2 rho^c delta gamma' c A_{m-1}(s')
                   + (gamma' c)^2 B_{m-1}(s')],

    the expectation over a ~ mu(.|s), s' ~ P(.|s, a). A_n is the quantity of
    ``exact.expected_vtrace_operator`` (the tests check they agree); Var = B_n - A_n^2.
    """
    rho = exact.ratio_table(pi, mu)
    rho_c = jnp.where(mu > 0, jnp.minimum(clip_rho_threshold, rho), 0.0)
    c = jnp.where(mu > 0, lambda_ * jnp.minimum(clip_c_threshold, rho), 0.0)
    delta = exact.bellman_targets(mdp, v) - v[:, None, None]  # [S, A, S']
    gam = next_state_discounts(mdp)[None, None, :]
    prob = mu[:, :, None] * mdp.P
    rd = rho_c[:, :, None] * delta
    gc = gam * c[:, :, None]

    def step(carry, _):
        a_prev, b_prev = carry
        a = jnp.sum(prob * (rd + gc * a_prev[None, None, :]), axis=(1, 2))
        b = jnp.sum(
            prob * (rd**2 + 2.0 * rd * gc * a_prev[None, None, :] + gc**2 * b_prev[None, None, :]),
            axis=(1, 2),
        )
        return (a, b), None

    zeros = jnp.zeros_like(v)
    (a, b), _ = jax.lax.scan(step, (zeros, zeros), None, length=n_steps)
    return v + a, jnp.maximum(b - a**2, 0.0)


def vtrace_moments_with_options(mdp, pi, mu, vbar, clip, o):
    return vtrace_moments(mdp, pi, mu, vbar, n_steps=o["n_steps"], lambda_=o["lambda_"],
                          clip_rho_threshold=clip, clip_c_threshold=clip)


def vtrace_trajectory_target(traj: Trajectory, clip, o) -> Array:
    """vs[0] of ``estimators.vtrace.vtrace`` on an n-step trajectory, rhobar = cbar = c.

    With rhobar = cbar the two truncations are one: min(rho, c) = exp(min(log rho, log c)).
    So the log-ratios are truncated first and passed with thresholds None, which is Eq 11
    with rhobar = cbar = c exactly and keeps c a traced value (``vtrace`` wants static
    thresholds), so every c of a sweep shares one compiled program.
    """
    log_rhos = jnp.minimum(traj.log_rhos, jnp.log(clip))
    out = vtrace(
        log_rhos, traj.discounts, traj.rewards, traj.values, traj.bootstrap_value,
        lambda_=o["lambda_"], clip_rho_threshold=None, clip_c_threshold=None,
        clip_pg_rho_threshold=None,
    )
    return out.vs[0]


