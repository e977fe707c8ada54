"""Policy evaluation on a single finite MDP: V^pi, Q^pi, T_pi, visitation (``tabular.exact``).

Notation of vccc_blog_en.txt (see ``tabular.exact``). Policies are [S, A] probability
tables, values [S]. Linear systems go through ``tabular.linear`` (pivot-free, dominant).
Everything here is re-exported by ``tabular.exact``; import it from there.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.tabular.linear import (
    ELIMINATION_MAX_STATES,
    _eliminate_batch_minor,
    _krylov_solve,
    solve_dominant,
)
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts
from vccc_jax.tabular.policies import log_ratio_table

Array = chex.Array


def _check_single(mdp: TabularMDP) -> None:
    if mdp.P.ndim != 3:
        raise ValueError(
            f"exact routines take a single MDP (P [S, A, S]); got P {mdp.P.shape}: "
            "use jax.vmap over the batch axis"
        )


def _check_policy(name: str, pi: Array, mdp: TabularMDP) -> None:
    if pi.shape != (mdp.num_states, mdp.num_actions):
        raise ValueError(
            f"{name} must have shape [S, A] = {(mdp.num_states, mdp.num_actions)}, got {pi.shape}"
        )


def _check_values(name: str, v: Array, mdp: TabularMDP) -> None:
    if v.shape != (mdp.num_states,):
        raise ValueError(f"{name} must have shape [S] = {(mdp.num_states,)}, got {v.shape}")


# ------------------------------------------------------------------ policy evaluation


def expected_reward(mdp: TabularMDP, pi: Array) -> Array:
    """r_pi(s) = sum_{a, s'} pi(a|s) P(s'|s, a) r(s, a, s'). [S]"""
    _check_single(mdp)
    _check_policy("pi", pi, mdp)
    return jnp.einsum("sa,sat->s", pi, mdp.P * mdp.R)


def transition_matrix(mdp: TabularMDP, pi: Array) -> Array:
    """P_pi(s, s') = sum_a pi(a|s) P(s'|s, a). [S, S]"""
    _check_single(mdp)
    _check_policy("pi", pi, mdp)
    return jnp.einsum("sa,sat->st", pi, mdp.P)


def discounted_transition_matrix(mdp: TabularMDP, pi: Array) -> Array:
    """P_pi(s, s') gamma (1 - terminal[s']): the matrix of the Bellman equation. [S, S]"""
    return transition_matrix(mdp, pi) * next_state_discounts(mdp)[None, :]


def policy_values_by_time(mdp: TabularMDP, pi: Array) -> Array:
    """Backward induction for a finite horizon H: V_t for t = 0..H, with V_H = 0. [H+1, S]

    V_t = r_pi + P_pi diag(gamma (1 - terminal)) V_{t+1}; V_t is the value with H - t steps
    to go under the stationary policy pi.
    """
    H = mdp.horizon
    if H is None:
        raise ValueError("policy_values_by_time needs mdp.horizon (got None)")
    r_pi = expected_reward(mdp, pi)
    M = discounted_transition_matrix(mdp, pi)

    def step(v_next, _):
        v = r_pi + M @ v_next
        return v, v

    _, vs = jax.lax.scan(step, jnp.zeros_like(r_pi), None, length=H)
    return jnp.concatenate([vs[::-1], jnp.zeros_like(r_pi)[None]], axis=0)


def policy_value(mdp: TabularMDP, pi: Array) -> Array:
    """V^pi [S]: the solution of V = r_pi + P_pi diag(gamma(s')) V (:func:`solve_dominant`).

    With a finite horizon, V^pi at time 0 by backward induction
    (:func:`policy_values_by_time`). This is the fixed point V^pi = T_pi V^pi of Sec 1.4.
    """
    if mdp.horizon is not None:
        return policy_values_by_time(mdp, pi)[0]
    r_pi = expected_reward(mdp, pi)
    M = discounted_transition_matrix(mdp, pi)
    eye = jnp.eye(mdp.num_states, dtype=M.dtype)
    return solve_dominant(eye - M, r_pi)



def batched_policy_value(mdps: TabularMDP, pis: Array, *, method: str = "auto") -> Array:
    """V^pi for a batch of MDPs [N, ...] and policies [N, S, A] in one fused computation. [N, S]

    The same numbers as ``jax.vmap(policy_value)`` (infinite horizon), built for speed:
    P_pi and r_pi are formed with fused contractions (r_pi = sum_a pi sum_s' P R, never
    materialising P * R) and the linear systems are solved by

      ``"lapack"``       batched LU with partial pivoting (``jnp.linalg.solve``; see
                         :func:`solve_dominant` for why not to run two of these
                         concurrently on CPU with jaxlib 0.10);
      ``"elimination"``  :func:`_eliminate_batch_minor`, unrolled pivot-free elimination
                         vectorised over the batch (fast for small S; compile time grows
                         with S);
      ``"krylov"``       :func:`_krylov_solve`: BiCGSTAB checked by its residual, LU
                         fallback (fast when the MDPs mix quickly, e.g. random MDPs);
      ``"dominant"``     ``vmap(solve_dominant)`` (XLA-native loop, any S);
      ``"auto"``         elimination when S <= ELIMINATION_MAX_STATES, else krylov.

    Accuracy: elimination / LU to round-off; krylov to a relative residual of 1e-6
    (float32) or 1e-12 (float64). ``method`` is static. A finite horizon falls back to
    ``jax.vmap(policy_value)``.
    """
    if method not in ("auto", "lapack", "elimination", "krylov", "dominant"):
        raise ValueError(
            f"method must be 'auto', 'lapack', 'elimination', 'krylov' or 'dominant', got {method!r}"
        )
    if mdps.P.ndim != 4:
        raise ValueError(f"batched_policy_value takes a batch of MDPs (P [N, S, A, S]), got {mdps.P.shape}")
    if pis.shape != mdps.P.shape[:3]:
        raise ValueError(f"pis must have shape [N, S, A] = {mdps.P.shape[:3]}, got {pis.shape}")
    if mdps.horizon is not None:
        return jax.vmap(policy_value)(mdps, pis)
    S = mdps.num_states
    if method == "auto":
        method = "elimination" if S <= ELIMINATION_MAX_STATES else "krylov"
    disc = mdps.gamma[:, None] * (1.0 - mdps.terminal)  # [N, S']
    pr = jnp.sum(mdps.P * mdps.R, axis=-1)  # [N, S, A] (fused multiply-reduce)
    eye = jnp.eye(S, dtype=mdps.P.dtype)
    if method == "elimination":
        m = jnp.einsum("nsa,nsat->stn", pis, mdps.P) * disc.T[None]  # batch-minor [S, S', N]
        r_pi = jnp.einsum("nsa,nsa->sn", pis, pr)
        return _eliminate_batch_minor(eye[:, :, None] - m, r_pi).T
    a = eye[None] - jnp.einsum("nsa,nsat->nst", pis, mdps.P) * disc[:, None, :]
    r_pi = jnp.sum(pis * pr, axis=-1)
    if method == "lapack":
        return jnp.linalg.solve(a, r_pi[..., None])[..., 0]
    if method == "krylov":
        return _krylov_solve(a, r_pi)
    return jax.vmap(solve_dominant)(a, r_pi)


def bellman_targets(mdp: TabularMDP, v: Array) -> Array:
    """H(s, a, s') = r(s, a, s') + gamma (1 - terminal[s']) v(s'). [S, A, S']"""
    _check_single(mdp)
    _check_values("v", v, mdp)
    return mdp.R + (next_state_discounts(mdp) * v)[None, None, :]


def q_values(mdp: TabularMDP, pi: Optional[Array] = None, v: Optional[Array] = None) -> Array:
    """Q(s, a) = E[r + gamma(s') v(s') | s, a]. [S, A]

    With ``v=None``, v = V^pi (Q^pi); for a finite horizon v = V_1 (so Q is Q^pi at time 0).
    """
    if v is None:
        if pi is None:
            raise ValueError("q_values needs pi when v is None")
        v = policy_values_by_time(mdp, pi)[1] if mdp.horizon is not None else policy_value(mdp, pi)
    return jnp.sum(mdp.P * bellman_targets(mdp, v), axis=-1)


def bellman_operator(mdp: TabularMDP, pi: Array, v: Array) -> Array:
    """(T_pi v)(s) = E_{a~pi, s'~P}[r + gamma(s') v(s')]. [S]"""
    _check_policy("pi", pi, mdp)
    return jnp.sum(pi * q_values(mdp, v=v), axis=-1)


def n_step_backup(mdp: TabularMDP, pi: Array, v: Array, n: int) -> Array:
    """T_pi^n v: the exact n-step pi backup (n >= 0, static). [S]"""
    r_pi = expected_reward(mdp, pi)
    M = discounted_transition_matrix(mdp, pi)
    out, _ = jax.lax.scan(lambda x, _: (r_pi + M @ x, None), v, None, length=n)
    return out


def visitation(mdp: TabularMDP, pi: Array, *, normalize: bool = True) -> Array:
    """Discounted state visitation from ``init``: d(s) ∝ sum_t E[prod gamma(s_1..s_t) 1[s_t = s]].

    Unnormalised, d = init^T (I - P_pi diag(gamma(s')))^{-1} (a sum over the horizon when
    finite); this is the weighting of the policy-gradient theorem. ``normalize`` divides by
    the total so that d sums to 1. [S]
    """
    M = discounted_transition_matrix(mdp, pi)
    if mdp.horizon is None:
        eye = jnp.eye(mdp.num_states, dtype=M.dtype)
        d = solve_dominant((eye - M).T, mdp.init)
    else:
        def step(x, _):
            return x @ M, x

        _, ds = jax.lax.scan(step, mdp.init, None, length=mdp.horizon)
        d = jnp.sum(ds, axis=0)
    return d / jnp.sum(d) if normalize else d



def _masked(prob: Array, y: Array) -> Array:
    # Cells of probability 0 never occur: drop them (they may hold inf from a support
    # violation, and 0 * inf would be NaN).
    return jnp.where(prob > 0, y, 0.0)


def ratio_table(pi: Array, mu: Array) -> Array:
    """rho(s, a) = exp(log pi - log mu) with the library's overflow guard. [S, A]"""
    return safe_ratios(log_ratio_table(pi, mu))
