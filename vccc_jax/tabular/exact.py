"""Exact, closed-form quantities on a single finite MDP (vmap over a batch of MDPs).

Notation of vccc_blog_en.txt: pi is the target policy, mu a behaviour policy, Vbar a frozen
value table, H(s, a, s') = r(s, a, s') + gamma(s') Vbar(s') the one-step Bellman sample
(``gamma(s') = gamma * (1 - terminal[s'])``), rho = pi / mu.

Policies are [S, A] probability tables; values are [S]; everything that depends on a
transition is an [S, A, S'] grid. Every one-step target of ``estimators.critic_targets`` is
elementwise, so :func:`transition_grid` broadcasts its inputs to [S, A, S'] and the
library function itself is evaluated on every (s, a, s'); :func:`target_moments` then takes
the exact conditional mean and variance under mu(a|s) P(s'|s, a). Nothing here samples.

All routines work in the dtype of their inputs: float64 inside ``jax.enable_x64(True)``
for exact checks (~1e-10), float32 otherwise.

Contents (policy evaluation lives in ``tabular.evaluation``, the linear solvers in
``tabular.linear``, the actor side in ``tabular.exact_actor``; all re-exported here)
  linear solves                     solve_dominant, ELIMINATION_MAX_STATES
  V^pi, Q^pi, T_pi, visitation      policy_value, policy_values_by_time, q_values,
                                    bellman_operator, n_step_backup, visitation, ...
  one-step target moments           transition_grid, target_moments, target_covariance
  clipping (Eq 10, Sec 4.2)          clip_weights, z_and_clipped_policy, clipped_fixed_point,
                                    naive_clipped_fixed_point, replay_policy
  Eq 9                              optimal_baseline, baseline_variance
  Eq 11                             expected_vtrace_operator, lambda_return_operator
  actor (Eq 1, 2/13, 12)            softmax_score, mean_score, actor_drift_decomposition,
                                    centred_actor_update, score_covariance,
                                    importance_weighted_actor_update, exact_actor_update,
                                    policy_gradient
  actor-correction rows (issue 21)  correction_coefficients, correction_update,
                                    population_threshold (sequence rows: tabular.actor_paths)
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import WeightKind, importance_weights, safe_ratios
from vccc_jax.tabular.evaluation import (  # noqa: F401  (re-exports)
    _check_policy,
    _check_single,
    _check_values,
    _masked,
    batched_policy_value,
    bellman_operator,
    bellman_targets,
    discounted_transition_matrix,
    expected_reward,
    n_step_backup,
    policy_value,
    policy_values_by_time,
    q_values,
    ratio_table,
    transition_matrix,
    visitation,
)
from vccc_jax.tabular.exact_actor import (  # noqa: F401  (re-exports)
    CorrectionUpdate,
    actor_drift_decomposition,
    centred_actor_update,
    correction_coefficients,
    correction_update,
    exact_actor_update,
    importance_weighted_actor_update,
    mean_score,
    policy_gradient,
    population_threshold,
    score_covariance,
    softmax_score,
)
from vccc_jax.tabular.linear import (  # noqa: F401  (re-exports)
    ELIMINATION_MAX_STATES,
    _eliminate,
    _eliminate_batch_minor,
    _krylov_solve,
    solve_dominant,
)
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts  # noqa: F401
from vccc_jax.tabular.policies import log_ratio_table  # noqa: F401

Array = chex.Array


# ------------------------------------------------------------- one-step target moments


class TransitionGrid(NamedTuple):
    """Estimator inputs broadcast to the enumerated [S, A, S'] grid of one MDP.

    ``rewards[s, a, s']`` = r(s, a, s'), ``discounts`` = gamma(s'), ``values`` = Vbar(s),
    ``next_values`` = Vbar(s'), ``log_rhos`` = log pi(a|s) - log mu(a|s); ``prob`` =
    mu(a|s) P(s'|s, a), the probability of the cell given s.
    """

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    log_rhos: Array
    prob: Array

    def state(self, x: Array) -> Array:
        """Broadcast a per-state table x [S] to the grid (e.g. a baseline b(s) or Z(s))."""
        return jnp.broadcast_to(x[:, None, None], self.rewards.shape)


def transition_grid(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array) -> TransitionGrid:
    """All per-transition inputs of the estimator core, enumerated over (s, a, s')."""
    _check_single(mdp)
    _check_policy("pi", pi, mdp)
    _check_policy("mu", mu, mdp)
    _check_values("vbar", vbar, mdp)
    shape = mdp.P.shape
    return TransitionGrid(
        rewards=mdp.R,
        discounts=jnp.broadcast_to(next_state_discounts(mdp)[None, None, :], shape),
        values=jnp.broadcast_to(vbar[:, None, None], shape),
        next_values=jnp.broadcast_to(vbar[None, None, :], shape),
        log_rhos=jnp.broadcast_to(log_ratio_table(pi, mu)[:, :, None], shape),
        prob=mu[:, :, None] * mdp.P,
    )



def target_moments(mdp: TabularMDP, mu: Array, y: Array) -> tuple[Array, Array]:
    """Exact E_mu[Y | s] and Var_mu[Y | s] of a per-transition quantity y [S, A, S'].

    Expectation over a ~ mu(.|s), s' ~ P(.|s, a) by enumeration (two-pass variance).
    Returns (mean [S], var [S]).
    """
    _check_single(mdp)
    _check_policy("mu", mu, mdp)
    if y.shape != mdp.P.shape:
        raise ValueError(f"y must have shape [S, A, S'] = {mdp.P.shape}, got {y.shape}")
    prob = mu[:, :, None] * mdp.P
    y = _masked(prob, y)
    mean = jnp.sum(prob * y, axis=(1, 2))
    var = jnp.sum(prob * jnp.square(y - mean[:, None, None]), axis=(1, 2))
    return mean, var


def target_covariance(mdp: TabularMDP, mu: Array, x: Array, y: Array) -> Array:
    """Exact Cov_mu(X, Y | s) of two per-transition quantities [S, A, S'] (or [S, A]). [S]"""
    x = jnp.broadcast_to(x[..., None], mdp.P.shape) if x.ndim == 2 else x
    y = jnp.broadcast_to(y[..., None], mdp.P.shape) if y.ndim == 2 else y
    prob = mu[:, :, None] * mdp.P
    x, y = _masked(prob, x), _masked(prob, y)
    mx = jnp.sum(prob * x, axis=(1, 2))
    my = jnp.sum(prob * y, axis=(1, 2))
    return jnp.sum(prob * (x - mx[:, None, None]) * (y - my[:, None, None]), axis=(1, 2))


# ------------------------------------------------------------------------- clipping


def clip_weights(pi: Array, mu: Array, clip: Optional[float], kind: WeightKind = "truncate") -> Array:
    """w(s, a) of Eq 10: ``importance_weights(log pi - log mu, kind, clip)``. [S, A]"""
    return importance_weights(log_ratio_table(pi, mu), kind, clip)


def z_and_clipped_policy(
    pi: Array, mu: Array, clip: Optional[float], kind: WeightKind = "truncate"
) -> tuple[Array, Array]:
    """Z(s) = E_mu[w | s] and the induced policy pitilde(a|s) = mu(a|s) w(s, a) / Z(s) (Sec 4.2).

    For ``kind="truncate"``, pitilde ∝ min(c mu, pi) (V-trace's policy). Where Z(s) = 0
    (every action masked) pitilde is undefined; mu is returned for that row.
    Returns (Z [S], pitilde [S, A]).
    """
    w = jnp.where(mu > 0, clip_weights(pi, mu, clip, kind), 0.0)
    m = mu * w
    z = jnp.sum(m, axis=-1)
    pitilde = jnp.where(z[:, None] > 0, m / jnp.where(z > 0, z, 1.0)[:, None], mu)
    return z, pitilde


def _as_versions(mus: Array, mix: Optional[Array]) -> tuple[Array, Array]:
    """mus [S, A] or [K, S, A]; mix None (uniform) / [K] / [K, S] -> (mus [K,S,A], q [K,S])."""
    if mus.ndim == 2:
        mus = mus[None]
    K, S = mus.shape[0], mus.shape[1]
    if mix is None:
        q = jnp.full((K, S), 1.0 / K, mus.dtype)
    else:
        mix = jnp.asarray(mix, mus.dtype)
        if mix.shape == (K,):
            q = jnp.broadcast_to(mix[:, None], (K, S))
        elif mix.shape == (K, S):
            q = mix
        else:
            raise ValueError(f"mix must have shape [K] = ({K},) or [K, S] = ({K}, {S}), got {mix.shape}")
    return mus, q


def replay_policy(mus: Array, mix: Optional[Array] = None) -> Array:
    """The policy that a replay mixture of versions acts with: sum_k q_k(s) mu_k(a|s). [S, A]

    ``mix`` [K] or [K, S] is the conditional probability of version k at state s (each
    column sums to 1). An uncorrected critic converges to V of this policy (Sec 1.3).
    """
    mus, q = _as_versions(mus, mix)
    return jnp.einsum("ks,ksa->sa", q, mus)


def mixture_clipped_policy(
    pi: Array, mus: Array, mix: Optional[Array], clip: Optional[float], kind: WeightKind = "truncate"
) -> tuple[Array, Array]:
    """Z(s) and pitilde for a replay mixture of versions, each with its own clipped weight.

    E_replay[w delta | s] = sum_k q_k(s) sum_a mu_k w_k (Q(s, a) - Vbar(s))
                          = Zbar(s) (T_pibar Vbar(s) - Vbar(s)),
    with Zbar = sum_k q_k Z_k and pibar ∝ sum_k q_k mu_k w_k. Returns (Zbar [S], pibar [S, A]).
    """
    mus, q = _as_versions(mus, mix)
    w = jax.vmap(lambda mu: jnp.where(mu > 0, clip_weights(pi, mu, clip, kind), 0.0))(mus)
    m = jnp.einsum("ks,ksa->sa", q, mus * w)
    z = jnp.sum(m, axis=-1)
    pibar = jnp.where(z[:, None] > 0, m / jnp.where(z > 0, z, 1.0)[:, None], replay_policy(mus, q))
    return z, pibar


def clipped_fixed_point(
    mdp: TabularMDP,
    pi: Array,
    mus: Array,
    clip: Optional[float],
    kind: WeightKind = "truncate",
    mix: Optional[Array] = None,
) -> Array:
    """Fixed point of the expected clipped update Vbar <- Vbar + alpha E[w delta] (Eq 10). [S]

    The expected update is Zbar (T_pibar V - V) (see :func:`mixture_clipped_policy`), so
    where Zbar > 0 the fixed point is V^{pibar}; for one version and truncation,
    pibar ∝ min(c mu, pi). ``kind="ratio"`` gives V^pi for any mixture (Eq 6).
    """
    _, pibar = mixture_clipped_policy(pi, mus, mix, clip, kind)
    return policy_value(mdp, pibar)


def naive_clipped_fixed_point(
    mdp: TabularMDP,
    pi: Array,
    mu: Array,
    baseline: Array,
    clip: Optional[float],
    kind: WeightKind = "truncate",
) -> Array:
    """Fixed point of the expected *naive* clipped update with a fixed baseline b (Sec 4.2). [S]

    E_mu[H + (w - 1)(H - b) | s] = Z T_pitilde V + (1 - Z) b, so the fixed point solves
    (I - diag(Z) P_pitilde diag(gamma(s'))) V = Z r_pitilde + (1 - Z) b: the baseline leaks.
    """
    if mdp.horizon is not None:
        raise ValueError("naive_clipped_fixed_point is defined for infinite-horizon MDPs")
    _check_values("baseline", baseline, mdp)
    z, pit = z_and_clipped_policy(pi, mu, clip, kind)
    M = z[:, None] * discounted_transition_matrix(mdp, pit)
    rhs = z * expected_reward(mdp, pit) + (1.0 - z) * baseline
    return solve_dominant(jnp.eye(mdp.num_states, dtype=M.dtype) - M, rhs)


# ---------------------------------------------------------------------------- Eq 9


def optimal_baseline(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array) -> Array:
    """b*(s) = E_mu[(rho - 1) rho H | s] / E_mu[(rho - 1)^2 | s]  (Eq 9), exactly. [S]

    The variance-minimising state baseline of the VCCC target (Eq 4). Where the
    denominator Var_mu(rho | s) is 0 (rho = 1 a.s.) the baseline has no effect; Vbar(s) is
    returned there.
    """
    grid = transition_grid(mdp, pi, mu, vbar)
    rho = safe_ratios(grid.log_rhos)
    h = grid.rewards + grid.discounts * grid.next_values
    num = jnp.sum(grid.prob * _masked(grid.prob, (rho - 1.0) * rho * h), axis=(1, 2))
    den = jnp.sum(grid.prob * _masked(grid.prob, jnp.square(rho - 1.0)), axis=(1, 2))
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), vbar)


def baseline_variance(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, baselines: Array) -> Array:
    """Var_mu(Y_b | s) of the Eq 4 target for a batch of baselines b [..., S], in closed form.

    Y_b = rho H - (rho - 1) b is affine in b, so Var(Y_b) = Var(rho H) - 2 b Cov(rho H, rho)
    + b^2 Var(rho). [..., S]
    """
    grid = transition_grid(mdp, pi, mu, vbar)
    rho = safe_ratios(grid.log_rhos)
    rh = rho * (grid.rewards + grid.discounts * grid.next_values)
    v_rh = target_covariance(mdp, mu, rh, rh)
    c = target_covariance(mdp, mu, rh, rho)
    v_rho = target_covariance(mdp, mu, rho, rho)
    lead = (1,) * (baselines.ndim - 1)
    v_rh, c, v_rho = (x.reshape(lead + x.shape) for x in (v_rh, c, v_rho))
    return v_rh - 2.0 * baselines * c + jnp.square(baselines) * v_rho


# --------------------------------------------------------------------------- Eq 11


def expected_vtrace_operator(
    mdp: TabularMDP,
    pi: Array,
    mu: Array,
    v: Array,
    *,
    n_steps: Optional[int] = None,
    lambda_: float = 1.0,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
) -> Array:
    """E_mu[v_t | s_t = s] of the V-trace(lambda) target (Eq 11), by its linear recursion. [S]

    With rho^c = min(rhobar, rho), c = lambda min(cbar, rho) (None = no truncation),
    delta = r + gamma(s') v(s') - v(s), the expected correction A_n = E[v_t - v(s_t)]
    over n steps satisfies

        A_n = g + M A_{n-1},  A_0 = 0,
        g(s)     = sum_a mu(a|s) rho^c(s, a) E[delta | s, a],
        M(s, s') = sum_a mu(a|s) c(s, a) P(s'|s, a) gamma(s').

    ``n_steps=None`` is the untruncated trace (n -> infinity): A = (I - M)^{-1} g. For a
    trajectory of length T starting at s, E[vs[0]] of ``estimators.vtrace`` with
    ``n_steps=None`` is this operator with n_steps = T.
    """
    rho = ratio_table(pi, mu)
    rho_c = rho if clip_rho_threshold is None else jnp.minimum(clip_rho_threshold, rho)
    c = rho if clip_c_threshold is None else jnp.minimum(clip_c_threshold, rho)
    c = lambda_ * c
    # Unsampled actions (mu = 0) contribute nothing.
    rho_c = jnp.where(mu > 0, rho_c, 0.0)
    c = jnp.where(mu > 0, c, 0.0)
    q = q_values(mdp, v=v)
    g = jnp.sum(mu * rho_c * (q - v[:, None]), axis=-1)
    M = jnp.einsum("sa,sat->st", mu * c, mdp.P) * next_state_discounts(mdp)[None, :]
    if n_steps is None:
        A = solve_dominant(jnp.eye(mdp.num_states, dtype=M.dtype) - M, g)
    else:
        A, _ = jax.lax.scan(lambda x, _: (g + M @ x, None), jnp.zeros_like(g), None, length=n_steps)
    return v + A


def lambda_return_operator(mdp: TabularMDP, pi: Array, v: Array, lambda_: float, n_steps: int) -> Array:
    """Expected truncated lambda-return under pi over n steps: the GAE(gamma, lambda) value target.

    G^lambda = (1 - lambda) sum_{k=1}^{n-1} lambda^{k-1} T_pi^k v + lambda^{n-1} T_pi^n v,
    computed from the n-step backups (a route independent of the V-trace recursion). [S]
    """
    r_pi = expected_reward(mdp, pi)
    M = discounted_transition_matrix(mdp, pi)

    def step(carry, k):
        x, acc = carry
        x = r_pi + M @ x
        weight = jnp.where(k < n_steps, (1.0 - lambda_) * lambda_ ** (k - 1), lambda_ ** (n_steps - 1))
        return (x, acc + weight * x), None

    (_, acc), _ = jax.lax.scan(step, (v, jnp.zeros_like(v)), jnp.arange(1, n_steps + 1))
    return acc
