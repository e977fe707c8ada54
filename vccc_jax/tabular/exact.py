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

Contents
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
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import WeightKind, importance_weights, safe_ratios
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


# ------------------------------------------------------------------------ linear solves


def _eliminate(a: Array, b: Array) -> Array:
    """Gaussian elimination without pivoting for one system a x = b (a [n, n], b [n])."""
    n = a.shape[-1]
    aug = jnp.concatenate([a, b[:, None]], axis=1)
    idx = jnp.arange(n)

    def forward(k, m):
        row = m[k]
        f = jnp.where(idx > k, m[:, k] / row[k], 0.0)
        return m - f[:, None] * row[None, :]

    m = jax.lax.fori_loop(0, n, forward, aug)

    def backward(i, x):
        k = n - 1 - i
        return x.at[k].set((m[k, n] - jnp.dot(m[k, :n], x)) / m[k, k])

    return jax.lax.fori_loop(0, n, backward, jnp.zeros_like(b))


def solve_dominant(a: Array, b: Array) -> Array:
    """Solve a x = b for a (weakly) diagonally dominant a, by elimination without pivoting.

    Every system in this module has this form: I - M with M >= 0 and row sums <= 1
    (e.g. M = P_pi diag(gamma(s'))), or its transpose. Elimination without pivoting is then
    backward stable (growth factor <= 2), and it is XLA-native: no LAPACK custom call.
    That matters on CPU with jaxlib 0.10, whose batched LU runs ``ParallelBatchMap`` on
    the intra-op thread pool and can deadlock when two LU calls run concurrently (two
    independent solves in one jitted graph, or two threads). Gradients use implicit
    differentiation (``lax.custom_linear_solve``; the transpose is also dominant).
    """
    if a.ndim != 2 or b.ndim != 1 or a.shape != (b.shape[0], b.shape[0]):
        raise ValueError(f"solve_dominant takes a [n, n] and b [n], got {a.shape} and {b.shape}")
    return jax.lax.custom_linear_solve(
        lambda x: a @ x, b,
        solve=lambda _, r: _eliminate(a, r),
        transpose_solve=lambda _, r: _eliminate(a.T, r),
    )


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


# Largest S for which batched_policy_value(method="auto") uses the unrolled elimination.
ELIMINATION_MAX_STATES = 48


def _eliminate_batch_minor(a: Array, b: Array) -> Array:
    """Solve a x = b for a batch stored *batch-minor*: a [S, S, N], b [S, N] -> x [S, N].

    Gaussian elimination without pivoting, unrolled over the (static) S with shrinking
    static slices, so every step is one vectorised update over the contiguous batch axis.
    No pivoting is needed (and the elimination is backward stable, growth factor <= 2)
    because I - P_pi diag(gamma(s')) is diagonally dominant by rows: P_pi >= 0 and its
    discounted row sums are <= 1.
    """
    S = a.shape[0]
    aug = jnp.concatenate([a, b[:, None, :]], axis=1)  # [S, S+1, N]
    for k in range(S - 1):
        f = aug[k + 1 :, k] / aug[k, k][None]
        aug = aug.at[k + 1 :, k + 1 :].add(-f[:, None, :] * aug[k, k + 1 :][None])
    rhs = aug[:, S]
    x = jnp.zeros_like(rhs)
    for k in reversed(range(S)):
        xk = rhs[k] / aug[k, k]
        x = x.at[k].set(xk)
        if k:
            rhs = rhs.at[:k].add(-aug[:k, k] * xk[None])
    return x


def _krylov_solve(a: Array, b: Array) -> Array:
    """Batched a x = b (a [N, S, S], b [N, S]) by BiCGSTAB, with an LU fallback.

    I - P_pi diag(gamma(s')) of a fast-mixing MDP has a tightly clustered spectrum (one
    eigenvalue near 1 - gamma, the rest near 1), so a Krylov method needs a handful of
    O(S^2) mat-vecs instead of an O(S^3) factorisation. Every solution is checked by its
    residual; if any system of the batch did not converge (slow mixing, e.g. a long
    chain), the whole batch is solved by LU instead, so the result never depends on
    convergence luck.
    """
    from jax.scipy.sparse.linalg import bicgstab

    S = a.shape[-1]
    tol = 1e-6 if a.dtype == jnp.float32 else 1e-12
    x = jax.vmap(lambda aa, bb: bicgstab(lambda v: aa @ v, bb, tol=tol, atol=0.0, maxiter=min(S, 256))[0])(a, b)
    res = jnp.max(jnp.abs(jnp.einsum("nij,nj->ni", a, x) - b), axis=-1)
    scale = jnp.max(jnp.abs(b), axis=-1) + jnp.max(jnp.abs(x), axis=-1)
    ok = jnp.all(res <= 10.0 * tol * scale)
    return jax.lax.cond(ok, lambda: x, lambda: jnp.linalg.solve(a, b[..., None])[..., 0])


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


def _masked(prob: Array, y: Array) -> Array:
    # Cells of probability 0 never occur: drop them (they may hold inf from a support
    # violation, and 0 * inf would be NaN).
    return jnp.where(prob > 0, y, 0.0)


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


def ratio_table(pi: Array, mu: Array) -> Array:
    """rho(s, a) = exp(log pi - log mu) with the library's overflow guard. [S, A]"""
    return safe_ratios(log_ratio_table(pi, mu))


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


# ---------------------------------------------------------------------- actor side


def softmax_score(pi: Array, temperature: float = 1.0) -> Array:
    """u(s, a) = grad_theta log pi(a|s) for pi = softmax(theta / temperature) with tabular theta.

    Only the row theta[s, :] matters for state s, so u is stored as [S, A, A]:
    u[s, a, a'] = (1[a = a'] - pi(a'|s)) / temperature.
    """
    A = pi.shape[-1]
    return (jnp.eye(A, dtype=pi.dtype)[None, :, :] - pi[:, None, :]) / temperature


def mean_score(mu: Array, u: Array, w: Optional[Array] = None) -> Array:
    """m_w(s) = E_mu[w(s, a) u(s, a) | s] (Sec 2.2 / 5.2); w = None gives m_mu(s). [S, A]"""
    weight = mu if w is None else mu * jnp.where(mu > 0, w, 0.0)
    return jnp.einsum("sa,sab->sb", weight, u)


def actor_drift_decomposition(
    mdp: TabularMDP, pi: Array, mu: Array, baseline: Array, temperature: float = 1.0
) -> tuple[Array, Array, Array]:
    """Eq 1 for a softmax pi, with G the behaviour Monte-Carlo return (E[G | s, a] = Q^mu):

        g_b(s) = E_mu[(G - b(s)) u | s] = Cov_mu(G, u | s) + (V^mu(s) - b(s)) m_mu(s).

    Returns (g_b, cov, drift), each [S, A] (the gradient wrt theta[s, :]).
    """
    u = softmax_score(pi, temperature)
    q_mu = q_values(mdp, mu)
    v_mu = jnp.sum(mu * q_mu, axis=-1)
    g_b = jnp.einsum("sa,sab->sb", mu * (q_mu - baseline[:, None]), u)
    cov = jnp.einsum("sa,sab->sb", mu * (q_mu - v_mu[:, None]), u)
    drift = (v_mu - baseline)[:, None] * mean_score(mu, u)
    return g_b, cov, drift


def centred_actor_update(mdp: TabularMDP, mu: Array, u: Array, w: Array, advantages: Array) -> Array:
    """Eq 13: g^SC(s) = E_mu[A (w u - m_w(s)) | s] for per-transition advantages A [S, A, S']
    (or [S, A]). [S, A]"""
    if advantages.ndim == 3:
        advantages = jnp.sum(mdp.P * _masked(mu[:, :, None] * mdp.P, advantages), axis=-1)
    m_w = mean_score(mu, u, w)
    centred = jnp.where(mu > 0, w, 0.0)[:, :, None] * u - m_w[:, None, :]
    return jnp.einsum("sa,sab->sb", mu * advantages, centred)


def score_covariance(mdp: TabularMDP, mu: Array, u: Array, w: Array, returns_q: Array) -> Array:
    """Cov_mu(G, Z_w | s) with Z_w = w u and E[G | s, a] = returns_q(s, a) (Eq 2 RHS). [S, A]"""
    mean_g = jnp.sum(mu * returns_q, axis=-1)
    zw = jnp.where(mu > 0, w, 0.0)[:, :, None] * u
    return jnp.einsum("sa,sab->sb", mu * (returns_q - mean_g[:, None]), zw)


def importance_weighted_actor_update(mdp: TabularMDP, pi: Array, mu: Array, v: Array, u: Array) -> Array:
    """E_mu[rho (r + gamma(s') v(s') - v(s)) u | s] (Sec 5.1, the LHS of Eq 12). [S, A]"""
    rho = jnp.where(mu > 0, ratio_table(pi, mu), 0.0)
    adv = q_values(mdp, v=v) - v[:, None]
    return jnp.einsum("sa,sab->sb", mu * rho * adv, u)


def exact_actor_update(mdp: TabularMDP, pi: Array, u: Array) -> Array:
    """E_pi[Q^pi(s, a) u(s, a) | s] (the RHS of Eq 12). [S, A]"""
    return jnp.einsum("sa,sab->sb", pi * q_values(mdp, pi), u)


def policy_gradient(mdp: TabularMDP, pi: Array, u: Array) -> Array:
    """grad_theta of init . V^pi for tabular logits: d(s) E_pi[Q^pi u | s] with the
    unnormalised discounted visitation d (the policy-gradient theorem). [S, A]

    Infinite-horizon MDPs only (a finite horizon makes Q time-dependent).
    """
    if mdp.horizon is not None:
        raise ValueError("policy_gradient is defined for infinite-horizon MDPs (horizon=None)")
    d = visitation(mdp, pi, normalize=False)
    return d[:, None] * exact_actor_update(mdp, pi, u)
