"""Exact BRACE operator, fixed point, bias and variance on tabular MDPs (issue 13).

The estimator is :func:`vccc_jax.estimators.related.brace.brace` (read its module docstring
for how we read the abstract). Every step of a tabular MDP is a policy step (no tool
states). Notation: M_c(s, s') = sum_a mu(a|s) c(s, a) P(s'|s, a) gamma(s') with
c = min(cbar, rho) (Eq 11's trace matrix, lambda = 1), P_mu Gamma the behaviour's
discounted transition matrix, and V^mu the behaviour value (the expected ratio-free
Monte-Carlo return).

Expected target (infinite-horizon or time-folded MDP), exactly:

    E_mu[v_t | s_t = s] = v(s) + X_n(s) + Z_n(s)
    X_n = (expected n-step V-trace operator)(v) - v      (exact.expected_vtrace_operator)
    Z_n = K^n (V^mu - v),  K = M_c ("prefix" anchor) or P_mu Gamma ("constant" anchor)

Closed-form bias (unclipped ratios, "prefix" anchor). Then M_c = P_pi Gamma and the
expected target does not depend on v at all: it is the value of "follow pi for n steps,
then mu", so it is also the fixed point, and its bias against V^pi is

    bias(n) = (P_pi Gamma)^n (V^mu - V^pi)                          (infinite horizon)
    bias(n) = (P_pi Gamma)^n (V^mu_n - V^pi_n),  0 for n >= H        (horizon H)

where V_n is the value at time n (H - n steps to go). The lag enters through
mu = pi_{K - l} of a policy history (:func:`bias_by_lag`); the bias decays like
gamma^n ||V^mu - V^pi|| and vanishes once the prefix covers the horizon. With clipping
the fixed point solves a linear system (:func:`brace_fixed_point`).

Variance: :func:`target_moments` computes the exact mean and variance of the sampled
target by a dynamic programme over (state, remaining budget) on the time-folded MDP
(second moments of a Markov linear recurrence), so horizons of tens of steps cost nothing;
:func:`enumerate_targets` is the brute-force check (every trajectory through the
estimator itself). :func:`variance_growth_rows` shows that BRACE's variance does not grow
exponentially with the horizon while the full importance-corrected return's does, at the
rate E_mu[rho^2] = 1 + chi^2(pi || mu) per step (Sec 4.3).
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.related.brace import TAIL_ANCHORS, brace
from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import TabularMDP, fold_policy, fold_time, next_state_discounts
from vccc_jax.tabular.policies import log_ratio_table

Array = chex.Array


class CheckRow(NamedTuple):
    """One verify row: a computed number, what it should equal, and the tolerance."""

    name: str
    computed: float
    expected: float
    atol: float


def _check_anchor(tail_anchor: str) -> None:
    if tail_anchor not in TAIL_ANCHORS:
        raise ValueError(f"tail_anchor must be one of {TAIL_ANCHORS}, got {tail_anchor!r}")


def _clip(x: Array, bar: Optional[float]) -> Array:
    return x if bar is None else jnp.minimum(x, bar)


def _infinite(mdp: TabularMDP, name: str) -> None:
    if mdp.horizon is not None:
        raise ValueError(f"{name} takes an infinite-horizon MDP; fold a finite horizon first "
                         "(tabular.brace.fold)")


def fold(mdp: TabularMDP, pi: Array, mu: Array, vbar: Optional[Array] = None):
    """Time-fold a finite-horizon MDP and its policies (and a stationary critic [S]).

    Returns (folded_mdp, pi_f, mu_f, vbar_f); vbar_f is Vbar tiled over time with 0 at the
    absorbing end state (None if ``vbar`` is None). Folded state t * S + s is s at time t.
    """
    H = mdp.horizon
    folded = fold_time(mdp)
    vf = None if vbar is None else jnp.concatenate([jnp.tile(vbar, H), jnp.zeros((1,), vbar.dtype)])
    return folded, fold_policy(pi, H), fold_policy(mu, H), vf


def trace_matrix(mdp: TabularMDP, pi: Array, mu: Array, clip_c_threshold: Optional[float]) -> Array:
    """M_c(s, s') = sum_a mu c P(s'|s, a) gamma(s'), c = min(cbar, rho) (0 where mu = 0). [S, S]"""
    c = jnp.where(mu > 0, _clip(exact.ratio_table(pi, mu), clip_c_threshold), 0.0)
    return jnp.einsum("sa,sat->st", mu * c, mdp.P) * next_state_discounts(mdp)[None, :]


@functools.partial(jax.jit, static_argnames=("n", "clip_rho_threshold", "clip_c_threshold", "tail_anchor"))
def expected_brace_operator(
    mdp: TabularMDP, pi: Array, mu: Array, v: Array, *, n: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> Array:
    """E_mu[v_t | s_t = s] of the BRACE target with critic v (module docstring). [S]

    Infinite-horizon (or folded) MDP; trajectories are long enough that the segment end
    never cuts the tail (episodes end at terminal states or the discount decays).
    """
    _infinite(mdp, "expected_brace_operator")
    _check_anchor(tail_anchor)
    prefix = exact.expected_vtrace_operator(
        mdp, pi, mu, v, n_steps=n, lambda_=1.0, clip_rho_threshold=clip_rho_threshold,
        clip_c_threshold=clip_c_threshold) - v
    K = (trace_matrix(mdp, pi, mu, clip_c_threshold) if tail_anchor == "prefix"
         else exact.discounted_transition_matrix(mdp, mu))
    tail, _ = jax.lax.scan(lambda z, _: (K @ z, None), exact.policy_value(mdp, mu) - v, None,
                           length=n)
    return v + prefix + tail


@functools.partial(jax.jit, static_argnames=("n", "clip_rho_threshold", "clip_c_threshold", "tail_anchor"))
def brace_fixed_point(
    mdp: TabularMDP, pi: Array, mu: Array, *, n: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> Array:
    """V* = B_n V*: the operator is affine, B(V) = B(0) + L V, so V* = (I - L)^{-1} B(0). [S]

    L is read off column by column (B(e_i) - B(0)); one dense solve.
    """
    op = lambda v: expected_brace_operator(  # noqa: E731
        mdp, pi, mu, v, n=n, clip_rho_threshold=clip_rho_threshold,
        clip_c_threshold=clip_c_threshold, tail_anchor=tail_anchor)
    eye = jnp.eye(mdp.num_states, dtype=mdp.P.dtype)
    b0 = op(jnp.zeros(mdp.num_states, mdp.P.dtype))
    L = (jax.vmap(op)(eye) - b0[None, :]).T
    return jnp.linalg.solve(eye - L, b0)


@functools.partial(jax.jit, static_argnames=("n",))
def bias_closed_form(mdp: TabularMDP, pi: Array, mu: Array, n: int) -> Array:
    """(P_pi Gamma)^n (V^mu - V^pi) (unclipped, "prefix" anchor); finite horizon: values at
    time n, and 0 for n >= H. Bias of the fixed point (= expected target) vs V^pi. [S]"""
    M = exact.discounted_transition_matrix(mdp, pi)
    if mdp.horizon is None:
        gap = exact.policy_value(mdp, mu) - exact.policy_value(mdp, pi)
    else:
        if n >= mdp.horizon:
            return jnp.zeros(mdp.num_states, mdp.P.dtype)
        gap = (exact.policy_values_by_time(mdp, mu)[n] - exact.policy_values_by_time(mdp, pi)[n])
    out, _ = jax.lax.scan(lambda z, _: (M @ z, None), gap, None, length=n)
    return out


def bias_by_lag(mdp: TabularMDP, probs: Array, ns: Sequence[int], lags: Sequence[int]) -> np.ndarray:
    """init . bias(n) for mu = pi_{K - l}, pi = pi_K of a history ``probs`` [K + 1, S, A]
    (``tabular.history.policy_history(...).probs``). float64-able array [len(ns), len(lags)]."""
    K = probs.shape[0] - 1
    pi = probs[K]
    rows = [[float(mdp.init @ bias_closed_form(mdp, pi, probs[K - lag], n)) for lag in lags]
            for n in ns]
    return np.asarray(rows)


# --------------------------------------------------------------------------- moments


@functools.partial(jax.jit, static_argnames=("n", "clip_rho_threshold", "clip_c_threshold", "tail_anchor"))
def target_moments(
    mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, *, n: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> tuple[Array, Array]:
    """Exact (mean, variance) of the BRACE target at every state of a finite-horizon MDP.

    ``mdp.horizon = H``; pi, mu [S, A]; vbar [S] (stationary critic, tiled over time).
    Returns ([H, S], [H, S]): row t is the target at time t (H - t steps to go), computed by
    the second-moment recursion of the level recurrence (estimator docstring) on the
    time-folded MDP: for Y = x + a Y' with (x, a) a function of the transition,
    E[Y^2 | s] = E[x^2 + 2 x a m(s') + a^2 q(s')]; X and Z (prefix and tail parts) also
    need their cross moment. Exact after H + 1 sweeps (the folded MDP is a DAG).
    """
    _check_anchor(tail_anchor)
    H, S = mdp.horizon, mdp.num_states
    if H is None:
        raise ValueError("target_moments needs a finite-horizon MDP (mdp.horizon)")
    fm, pf, mf, vf = fold(mdp, pi, mu, vbar)
    prob = mf[:, :, None] * fm.P                       # [N, A, N]
    gam = jnp.broadcast_to(next_state_discounts(fm)[None, None, :], fm.P.shape)
    delta = fm.R + gam * vf[None, None, :] - vf[:, None, None]
    rho = jnp.where(mf > 0, exact.ratio_table(pf, mf), 0.0)[:, :, None]
    x = _clip(rho, clip_rho_threshold) * delta
    a = gam * _clip(rho, clip_c_threshold)
    w = a if tail_anchor == "prefix" else gam
    mean, var = _prefix_tail_moments(prob, delta, gam, x, a, w, tail_len=H + 1,
                                     prefix_len=min(int(n), H))
    return (vf + mean)[:-1].reshape(H, S), var[:-1].reshape(H, S)


def enumerate_targets(
    mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, *, n: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: (mean, variance) [S] of the time-0 target, over every H-step trajectory
    of the time-folded MDP, each run through :func:`~vccc_jax.estimators.related.brace.brace`.

    (A_S)^H trajectories per start state (A^H S^(H-1)): tiny MDPs only. The last step's
    reward is its expectation over s' (as :func:`~vccc_jax.tabular.mdp.fold_time` does).
    """
    H, S, A = mdp.horizon, mdp.num_states, mdp.num_actions
    fm, pf, mf, vf = fold(mdp, pi, mu, vbar)
    P, R = np.asarray(fm.P), np.asarray(fm.R)
    gam, v = np.asarray(next_state_discounts(fm)), np.asarray(vf)
    lrt, muf = np.asarray(log_ratio_table(pf, mf)), np.asarray(mf)
    N = fm.num_states
    cols = {k: [] for k in ("lr", "d", "r", "v", "p", "s0")}
    for s0 in range(S):
        for actions in itertools.product(range(A), repeat=H):
            for nexts in itertools.product(range(S), repeat=H - 1):
                states = [s0] + [(k + 1) * S + s for k, s in enumerate(nexts)] + [N - 1]
                p, row = 1.0, {k: [] for k in ("lr", "d", "r", "v")}
                for k in range(H):
                    s, a, s2 = states[k], actions[k], states[k + 1]
                    p *= muf[s, a] * P[s, a, s2]
                    row["lr"].append(lrt[s, a])
                    row["d"].append(gam[s2])
                    row["r"].append(R[s, a, s2])
                    row["v"].append(v[s])
                for k in row:
                    cols[k].append(row[k])
                cols["p"].append(p)
                cols["s0"].append(s0)
    arr = {k: np.asarray(cols[k], np.float64).T for k in ("lr", "d", "r", "v")}  # [H, M]
    arr = {k: np.where(np.isfinite(x), x, 0.0) if k == "lr" else x for k, x in arr.items()}
    out = brace(jnp.asarray(arr["lr"]), jnp.asarray(arr["d"]), jnp.asarray(arr["r"]),
                jnp.asarray(arr["v"]), jnp.zeros(arr["v"].shape[1], jnp.float64), n=n,
                clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_c_threshold,
                clip_pg_rho_threshold=None, tail_anchor=tail_anchor)
    y, p, s0 = np.asarray(out.vs[0]), np.asarray(cols["p"]), np.asarray(cols["s0"])
    p = p / np.array([np.sum(p[s0 == s]) for s in range(S)])[s0]  # rows of mu, P sum to 1 +- eps
    mean = np.array([np.sum(p[s0 == s] * y[s0 == s]) for s in range(S)])
    var = np.array([np.sum(p[s0 == s] * (y[s0 == s] - mean[s]) ** 2) for s in range(S)])
    return mean, var


# ------------------------------------------------------ segments (with environment steps)


@functools.partial(jax.jit, static_argnames=("n", "n_steps", "clip_rho_threshold", "clip_c_threshold",
                                             "clip_pg_rho_threshold", "tail_anchor"))
def expected_segment_targets(
    mdp: TabularMDP, pi: Array, mu: Array, v: Array, *, n: int, n_steps: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0, tail_anchor: str = "prefix",
    is_action: Optional[Array] = None,
) -> tuple[Array, Array]:
    """Exact E_mu[vs_0 | s_0 = s] and E_mu[pg_advantages_0 | s_0 = s] of the BRACE estimator on a
    segment of h steps bootstrapped from ``v`` at its end, for every h = 0..n_steps.

    Returns (vs [n_steps + 1, S], pg [n_steps + 1, S]); row h is a segment of h steps (row 0:
    vs = v, the bootstrap, and pg = 0). Infinite-horizon (or folded) MDP; episode ends are
    the zero discounts gamma(s') of terminal next states. ``is_action`` (optional bool [S])
    marks the states where the policy acts; at the others (tool / environment steps) the
    transition law is mu's row, the ratio is 1 and the step does not count toward n.

    By a recursion over (h steps to go, m prefix actions left) of the expected prefix part X
    and tail part Z (the estimator docstring's two parts), E over a ~ mu, s' ~ P, with
    gamma' = gamma(s'), delta = r + gamma' v(s') - v(s), w = c ("prefix") or 1 ("constant"):

        X^m_0 = Z^m_0 = 0,   X^0_h = 0,   Z^0_h = E[delta + gamma' Z^0_{h-1}(s')]
        m >= 1, policy state:  X^m_h = E[rho^c delta + gamma' c X^{m-1}_{h-1}(s')],
                               Z^m_h = E[gamma' w Z^{m-1}_{h-1}(s')]
        m >= 1, env state:     X^m_h = E[delta + gamma' X^m_{h-1}(s')],  Z^m_h = E[gamma' Z^m_{h-1}(s')]
        vs_h = v + X^n_h + Z^n_h,
        pg_h = E[min(rhobar_pg, rho) (r + gamma' vs_{h-1}(s') - v(s))]   (ratio 1 at env states)

    Without environment states, vs_h = (n-step V-trace operator, lambda = 1)(v) + K^n
    (T_mu^{h-n} v - v) for n <= h (``tests/tabular/test_brace_exact.py``), K as in
    :func:`expected_brace_operator`.
    """
    _check_anchor(tail_anchor)
    _infinite(mdp, "expected_segment_targets")
    S = mdp.num_states
    act = jnp.ones((S,), bool) if is_action is None else jnp.asarray(is_action, bool)
    rho = jnp.where(act[:, None], jnp.where(mu > 0, exact.ratio_table(pi, mu), 0.0), 1.0)
    prob = mu[:, :, None] * mdp.P                                      # [S, A, S']
    gam = next_state_discounts(mdp)[None, None, :]
    delta = mdp.R + gam * v[None, None, :] - v[:, None, None]
    rho_c, c, rho_pg = (_clip(rho, bar)[:, :, None] for bar in (clip_rho_threshold, clip_c_threshold,
                                                                 clip_pg_rho_threshold))
    w = c if tail_anchor == "prefix" else jnp.ones_like(c)
    E = lambda y: jnp.sum(jnp.where(prob > 0, prob * y, 0.0), axis=(1, 2))  # noqa: E731
    levels = jax.vmap(E)  # over a leading axis of prefix budgets
    nxt = lambda t: t[..., None, None, :]  # noqa: E731  (a table over s' -> [..., 1, 1, S'])
    on = act[None, :]

    def step(carry, _):  # one more step to go
        x, z, vs_prev = carry
        z0 = E(delta + gam * nxt(z[0]))[None]
        x_act = levels((rho_c * delta)[None] + (gam * c)[None] * nxt(x[:-1]))
        z_act = levels((gam * w)[None] * nxt(z[:-1]))
        x_env = levels(delta[None] + gam[None] * nxt(x[1:]))
        z_env = levels(gam[None] * nxt(z[1:]))
        x = jnp.concatenate([jnp.zeros_like(z0), jnp.where(on, x_act, x_env)])
        z = jnp.concatenate([z0, jnp.where(on, z_act, z_env)])
        pg = E(rho_pg * (mdp.R + gam * nxt(vs_prev) - v[:, None, None]))
        vs = v + x[-1] + z[-1]
        return (x, z, vs), (vs, pg)

    zeros = jnp.zeros((n + 1, S), v.dtype)
    _, (vs, pg) = jax.lax.scan(step, (zeros, zeros, v), None, length=n_steps)
    return jnp.concatenate([v[None], vs]), jnp.concatenate([jnp.zeros_like(v)[None], pg])


# ------------------------------------------------------- sweep adapter (infinite horizon)


def segment_moments(
    mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, *, n: int, n_steps: int, clip,
    tail_anchor: str = "prefix",
) -> tuple[Array, Array]:
    """Exact (mean [S], var [S]) of the BRACE target v_0 on a segment of ``n_steps`` steps
    of an infinite-horizon (or folded) MDP, bootstrapped from ``vbar`` at the segment end.

    The tabular sweep's multi-step adapter (``tabular.methods``; the sampled counterpart is
    :func:`brace_trajectory_target`). rhobar = cbar = ``clip`` (may be traced; inf = no
    clipping). The same second-moment recursion as :func:`target_moments`, indexed by steps
    to go instead of folded time: first the ratio-free tail over the last
    ``n_steps - n`` steps (Z_m = delta + gamma' Z_{m-1}(s'), Z_0 = 0: the bootstrap), then
    n prefix levels X_j = x + a X_{j-1}(s'), Z-weight w = a ("prefix") or gamma'
    ("constant"), with the X-Z cross moment. n >= n_steps is the n_steps-step V-trace
    target with lambda = 1 (``tabular.vtrace_moments``).
    """
    _check_anchor(tail_anchor)
    _infinite(mdp, "segment_moments")
    n_eff, T = min(int(n), int(n_steps)), int(n_steps)
    prob = mu[:, :, None] * mdp.P
    gam = jnp.broadcast_to(next_state_discounts(mdp)[None, None, :], mdp.P.shape)
    delta = mdp.R + gam * vbar[None, None, :] - vbar[:, None, None]
    rho = jnp.where(mu > 0, exact.ratio_table(pi, mu), 0.0)[:, :, None]
    x = jnp.minimum(rho, clip) * delta
    a = gam * jnp.minimum(rho, clip)
    w = a if tail_anchor == "prefix" else gam
    mean, var = _prefix_tail_moments(prob, delta, gam, x, a, w, tail_len=T - n_eff,
                                     prefix_len=n_eff)
    return vbar + mean, var


def brace_moments_with_options(mdp, pi, mu, vbar, clip, o) -> tuple[Array, Array]:
    """``MethodSpec.moments`` of the sweep's ``brace`` method (options n, n_steps, tail_anchor)."""
    return segment_moments(mdp, pi, mu, vbar, n=int(o["n"]), n_steps=int(o["n_steps"]),
                           clip=clip, tail_anchor=o["tail_anchor"])


def brace_trajectory_target(traj, clip, o) -> Array:
    """vs[0] of the registry's ``brace`` row on a sampled n_steps-step replay trajectory
    (``tabular.vtrace_moments.Trajectory``, [n_steps, B]); rhobar = cbar = ``clip``."""
    from vccc_jax.estimators.registry import SequenceInputs, get_critic_target

    seq = SequenceInputs(traj.log_rhos, traj.discounts, traj.rewards, traj.values,
                         traj.bootstrap_value)
    opts = dict(n=int(o["n"]), tail_anchor=o["tail_anchor"])
    return get_critic_target("brace").sequence(seq, clip, opts).vs[0]


# ------------------------------------------------------------------------ verify rows


def bias_rows(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, ns: Sequence[int]) -> list[CheckRow]:
    """(a) The closed-form bias equals the brute force, for each n (finite-horizon MDP).

    Per n, at every start state s: closed form vs (i) the enumerated mean target minus
    V^pi (unclipped; any vbar), (ii) the fixed point of the exact operator on the folded MDP
    minus V^pi, (iii) the DP mean of :func:`target_moments` minus V^pi. Run in float64.
    """
    fm, pf, mf, _ = fold(mdp, pi, mu)
    v_pi = exact.policy_value(mdp, pi)
    S, rows = mdp.num_states, []
    for n in ns:
        closed = np.asarray(bias_closed_form(mdp, pi, mu, n))
        kw = dict(n=n, clip_rho_threshold=None, clip_c_threshold=None)
        enum_mean, _ = enumerate_targets(mdp, pi, mu, vbar, **kw)
        fixed = np.asarray(brace_fixed_point(fm, pf, mf, **kw)[:S])
        dp_mean = np.asarray(target_moments(mdp, pi, mu, vbar, **kw)[0][0])
        for s in range(S):
            vp = float(v_pi[s])
            rows += [CheckRow(f"brace bias n={n} s={s}: enumeration", enum_mean[s] - vp, closed[s], 1e-10),
                     CheckRow(f"brace bias n={n} s={s}: fixed point", fixed[s] - vp, closed[s], 1e-10),
                     CheckRow(f"brace bias n={n} s={s}: moment DP", dp_mean[s] - vp, closed[s], 1e-10)]
    return rows


def variance_by_horizon(
    mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, *, n: int,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> tuple[np.ndarray, np.ndarray]:
    """Var of the time-0 target with h = 1..H steps to go, for BRACE(n, clips) and for the
    full importance-corrected return (the same estimator with n >= H and no clipping:
    untruncated V-trace = per-decision IS with control variate vbar; vbar = 0 gives the
    plain per-decision IS Monte-Carlo return of Sec 4.3). Returns (brace [H, S], full [H, S]),
    row h - 1 = horizon h (one DP on the H-folded MDP: time slice H - h has h steps to go).
    """
    _, var_b = target_moments(mdp, pi, mu, vbar, n=n, clip_rho_threshold=clip_rho_threshold,
                              clip_c_threshold=clip_c_threshold, tail_anchor=tail_anchor)
    _, var_f = target_moments(mdp, pi, mu, vbar, n=mdp.horizon, clip_rho_threshold=None,
                              clip_c_threshold=None)
    return np.asarray(var_b)[::-1], np.asarray(var_f)[::-1]


def variance_growth_rows(
    mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, *, n: int, state: int = 0,
    clip_rho_threshold: Optional[float] = 1.0, clip_c_threshold: Optional[float] = 1.0,
    tail_anchor: str = "prefix",
) -> list[CheckRow]:
    """(b) Per-step growth of the target variance at the longest horizon H (Sec 4.3).

    Rows: log(Var_H / Var_{H-1}) of the full importance-corrected return vs
    log max_s E_mu[rho^2 | s] (its exponential rate, exact in the limit for a single-state
    MDP with gamma = 1; tolerance 0.05), and the same log-ratio for BRACE vs 0 (no
    exponential growth: clipped prefix weights <= 1 and a ratio-free tail give variance
    polynomial in H; tolerance 3 / H, which covers up to cubic growth).
    """
    var_b, var_f = variance_by_horizon(
        mdp, pi, mu, vbar, n=n, clip_rho_threshold=clip_rho_threshold,
        clip_c_threshold=clip_c_threshold, tail_anchor=tail_anchor)
    H = mdp.horizon
    rho = jnp.where(mu > 0, exact.ratio_table(pi, mu), 0.0)
    second = float(jnp.max(jnp.sum(mu * rho**2, axis=-1)))
    return [
        CheckRow(f"full IS return: log variance growth per step at H={H}",
                 float(np.log(var_f[-1, state] / var_f[-2, state])), float(np.log(second)), 0.05),
        CheckRow(f"BRACE n={n}: log variance growth per step at H={H}",
                 float(np.log(var_b[-1, state] / var_b[-2, state])), 0.0, 3.0 / H),
    ]


__all__ = [
    "CheckRow", "fold", "trace_matrix", "expected_brace_operator", "brace_fixed_point",
    "bias_closed_form", "bias_by_lag", "target_moments", "enumerate_targets", "bias_rows",
    "expected_segment_targets",
    "variance_by_horizon", "variance_growth_rows", "segment_moments",
    "brace_moments_with_options", "brace_trajectory_target",
]


def _prefix_tail_moments(prob, delta, gam, x, a, w, *, tail_len: int, prefix_len: int):
    """(mean, var) per state of Y = X + Z by the second-moment recursion shared by
    :func:`target_moments` and :func:`segment_moments`: ``tail_len`` sweeps of the ratio-free
    tail Z = delta + gamma' Z(s'), then ``prefix_len`` levels X = x + a X(s'), Z <- w Z(s'),
    with the X-Z cross moment. ``prob`` [S, A, S'] is mu(a|s) P(s'|s, a); the others are
    per-transition tables of the same shape."""
    E = lambda y: jnp.sum(jnp.where(prob > 0, prob * y, 0.0), axis=(1, 2))  # noqa: E731
    nxt = lambda t: t[None, None, :]  # noqa: E731

    def tail_sweep(carry, _):
        m, q = carry
        return (E(delta + gam * nxt(m)),
                E(delta**2 + 2 * delta * gam * nxt(m) + gam**2 * nxt(q))), None

    zeros = jnp.zeros(prob.shape[0], prob.dtype)
    (mz, qz), _ = jax.lax.scan(tail_sweep, (zeros, zeros), None, length=tail_len)

    def level(carry, _):
        mx, qx, mz, qz, cxz = carry
        return (E(x + a * nxt(mx)),
                E(x**2 + 2 * x * a * nxt(mx) + a**2 * nxt(qx)),
                E(w * nxt(mz)),
                E(w**2 * nxt(qz)),
                E(x * w * nxt(mz) + a * w * nxt(cxz))), None

    (mx, qx, mz, qz, cxz), _ = jax.lax.scan(level, (zeros, zeros, mz, qz, zeros), None,
                                            length=prefix_len)
    mean = mx + mz
    return mean, jnp.maximum(qx + 2 * cxz + qz - mean**2, 0.0)
