"""Linear-quadratic testbed with exact truth for continuous actions (issue 31).

Dynamics ``s' = A s + B a + w``, ``w ~ N(0, W)``; reward ``r(s, a) = -(s'Qs + a'Ra)``;
discount gamma; start state ``s_0 ~ N(m0, S0)``. Linear-Gaussian policies
``a ~ N(K s + k0, diag(exp(2 log_std)))`` (:class:`GaussianPolicy`; the trainer's Gaussian
actor has the same distrax ``MultivariateNormalDiag`` law).

Everything quadratic stays quadratic, so the oracles are closed forms on coefficients
(:class:`Quadratic`, ``f(x) = x'Mx + v'x + c``):

* :func:`action_value`: Qbar(s, a) = r(s, a) + gamma E[Vbar(s') | s, a] over z = (s, a);
* :func:`policy_expect`: E_{a ~ pi(.|s)}[f(s, a)] of a quadratic f over z (a quadratic in s);
* :func:`bellman`: T_pi Vbar = policy_expect(action_value(Vbar)) (exact);
* :func:`value`: V^pi; its quadratic part P solves the discrete Lyapunov equation
  ``P = -(Q + K'RK) + gamma F'PF`` (F = A + BK), solved as one Kronecker linear system
  (jit- and grad-safe; tests compare it with scipy.linalg.solve_discrete_lyapunov), then the
  linear and constant parts by two small linear solves;
* :func:`objective`: J(pi) = E_{s0}[V^pi(s0)], differentiable in the policy parameters, so
  ``jax.grad(objective)`` is the true policy gradient (a test checks it against the classic
  closed form of Fazel et al. 2018 for the gain).

Because these are quadratic in the action, their expectations over a Gaussian depend only on
its first two moments: any action law with the same mean and covariance given s has the same
T_pi Vbar and V^pi (:func:`lqr_offpolicy.clipped_fixed_point` uses this).

Conventions: float64 for exact checks (callers run under ``jax.enable_x64(True)``); states
``[..., n]``, actions ``[..., m]``.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import distrax
import jax
import jax.numpy as jnp

Array = chex.Array


class LQR(NamedTuple):
    """One linear-quadratic problem (a pytree; every field a float array).

    a [n, n], b [n, m]: dynamics. w [n, n]: dynamics noise covariance (PSD).
    q [n, n] (PSD), r [m, m] (PD): reward -(s'qs + a'ra). gamma: discount in [0, 1).
    s0_mean [n], s0_cov [n, n]: start-state law.
    """

    a: Array
    b: Array
    w: Array
    q: Array
    r: Array
    gamma: Array
    s0_mean: Array
    s0_cov: Array

    @property
    def n(self) -> int:
        return self.a.shape[-1]

    @property
    def m(self) -> int:
        return self.b.shape[-1]


class GaussianPolicy(NamedTuple):
    """a ~ N(gain s + offset, diag(exp(2 log_std))): gain [m, n], offset [m], log_std [m]."""

    gain: Array
    offset: Array
    log_std: Array

    @property
    def cov(self) -> Array:
        return jnp.diag(jnp.exp(2.0 * self.log_std))


class Quadratic(NamedTuple):
    """f(x) = x' mat x + vec' x + const (mat symmetric [d, d], vec [d], const [])."""

    mat: Array
    vec: Array
    const: Array

    def __call__(self, x: Array) -> Array:
        """f at x [..., d] -> [...]."""
        return _quad_eval(self, x)


@jax.jit
def _quad_eval(f: Quadratic, x: Array) -> Array:
    return jnp.einsum("...i,ij,...j->...", x, f.mat, x) + x @ f.vec + f.const


def check(lqr: LQR, *pols: GaussianPolicy) -> None:
    """Shape contract of a problem and its policies (ValueError naming the field)."""
    n, m = lqr.n, lqr.m
    want = dict(a=(n, n), b=(n, m), w=(n, n), q=(n, n), r=(m, m), gamma=(), s0_mean=(n,),
                s0_cov=(n, n))
    for name, shape in want.items():
        if jnp.shape(getattr(lqr, name)) != shape:
            raise ValueError(f"lqr.{name} must have shape {shape}, got {jnp.shape(getattr(lqr, name))}")
    for pol in pols:
        for name, shape in dict(gain=(m, n), offset=(m,), log_std=(m,)).items():
            if jnp.shape(getattr(pol, name)) != shape:
                raise ValueError(f"policy.{name} must have shape {shape}, "
                                 f"got {jnp.shape(getattr(pol, name))}")


def random_lqr(key: chex.PRNGKey, n: int = 2, m: int = 1, gamma: float = 0.9,
               radius: float = 0.8) -> LQR:
    """A random stable-ish problem: A scaled to spectral radius ``radius``, B, W, Q, R random
    (W, Q PSD; R PD), start N(0, I). Dtype follows the x64 setting."""
    ka, kb, kw, kq, kr, km = jax.random.split(key, 6)
    a = jax.random.normal(ka, (n, n))
    a = a * radius / jnp.max(jnp.abs(jnp.linalg.eigvals(a)))
    b = 0.5 * jax.random.normal(kb, (n, m)) / jnp.sqrt(n)
    lw = 0.3 * jax.random.normal(kw, (n, n))
    lq = jax.random.normal(kq, (n, n)) / jnp.sqrt(n)
    lr = jax.random.normal(kr, (m, m)) / jnp.sqrt(m)
    return LQR(a=a, b=b, w=lw @ lw.T + 0.05 * jnp.eye(n), q=lq @ lq.T + 0.1 * jnp.eye(n),
               r=lr @ lr.T + 0.5 * jnp.eye(m), gamma=jnp.asarray(gamma, a.dtype),
               s0_mean=0.3 * jax.random.normal(km, (n,)), s0_cov=jnp.eye(n))


def lead(v: Array, x: Array) -> Array:
    """A vector v [d] shaped to broadcast against x [..., d] (explicit ranks: the project runs
    with rank promotion raising)."""
    return jnp.reshape(v, (1,) * (jnp.ndim(x) - 1) + jnp.shape(v))


def mean_action(pol: GaussianPolicy, s: Array) -> Array:
    """K s + k0, [..., m] for s [..., n]."""
    m = s @ pol.gain.T
    return m + lead(pol.offset, m)


def distribution(pol: GaussianPolicy, s: Array) -> distrax.MultivariateNormalDiag:
    """pi(. | s) for states s [..., n] as a distrax distribution (batch shape [...])."""
    loc = mean_action(pol, s)
    return distrax.MultivariateNormalDiag(
        loc=loc, scale_diag=jnp.broadcast_to(lead(jnp.exp(pol.log_std), loc), loc.shape))


@jax.jit
def reward(lqr: LQR, s: Array, a: Array) -> Array:
    """r(s, a) = -(s'Qs + a'Ra), [...]."""
    return -(jnp.einsum("...i,ij,...j->...", s, lqr.q, s) + jnp.einsum("...i,ij,...j->...", a, lqr.r, a))


def step(lqr: LQR, s: Array, a: Array, key: chex.PRNGKey) -> Array:
    """s' = A s + B a + w, w ~ N(0, W) (Cholesky of W + 1e-12 I), [..., n]."""
    noise = jax.random.normal(key, s.shape, s.dtype) @ jnp.linalg.cholesky(
        lqr.w + 1e-12 * jnp.eye(lqr.n, dtype=s.dtype)).T
    return s @ lqr.a.T + a @ lqr.b.T + noise


@jax.jit
def closed_loop_radius(lqr: LQR, pol: GaussianPolicy) -> Array:
    """sqrt(gamma) * spectral radius of A + BK: V^pi and d_pi are finite iff it is < 1."""
    return jnp.sqrt(lqr.gamma) * jnp.max(jnp.abs(jnp.linalg.eigvals(lqr.a + lqr.b @ pol.gain)))


def _sym(x: Array) -> Array:
    return 0.5 * (x + x.T)


@jax.jit
def action_value(lqr: LQR, vbar: Quadratic) -> Quadratic:
    """Qbar(s, a) = r(s, a) + gamma E[Vbar(s') | s, a], a quadratic over z = (s, a) [n + m]."""
    n, m = lqr.n, lqr.m
    g = jnp.concatenate([lqr.a, lqr.b], axis=1)                       # s'_mean = g z
    cost = jnp.block([[lqr.q, jnp.zeros((n, m), lqr.q.dtype)], [jnp.zeros((m, n), lqr.q.dtype), lqr.r]])
    return Quadratic(mat=_sym(-cost + lqr.gamma * g.T @ vbar.mat @ g),
                     vec=lqr.gamma * g.T @ vbar.vec,
                     const=lqr.gamma * (vbar.const + jnp.trace(vbar.mat @ lqr.w)))


@jax.jit
def policy_expect(fz: Quadratic, pol: GaussianPolicy, mean_shift: Array = None,
                  cov: Array = None) -> Quadratic:
    """E_{a ~ pi(.|s)}[f(s, a)] for a quadratic f over z = (s, a): a quadratic in s.

    Only the first two moments of the action law enter: ``mean_shift`` (default the policy's
    offset) and ``cov`` (default diag(exp(2 log_std))) override them, so a non-Gaussian
    law a = K s + e with E e = mean_shift, Cov e = cov gives the same result.
    """
    m, n = pol.gain.shape
    k0 = pol.offset if mean_shift is None else mean_shift
    cov = pol.cov if cov is None else cov
    h = jnp.concatenate([jnp.eye(n, dtype=fz.mat.dtype), pol.gain], axis=0)   # z = h s + h0 + (0, e)
    h0 = jnp.concatenate([jnp.zeros(n, fz.mat.dtype), k0])
    return Quadratic(mat=_sym(h.T @ fz.mat @ h),
                     vec=2.0 * h.T @ fz.mat @ h0 + h.T @ fz.vec,
                     const=h0 @ fz.mat @ h0 + fz.vec @ h0 + fz.const
                     + jnp.trace(fz.mat[n:, n:] @ cov))


@jax.jit
def bellman(lqr: LQR, pol: GaussianPolicy, vbar: Quadratic) -> Quadratic:
    """T_pi Vbar(s) = E_{a ~ pi}[r + gamma Vbar(s')], exact (a quadratic in s)."""
    return policy_expect(action_value(lqr, vbar), pol)


def lyapunov(f: Array, rhs: Array, gamma: Array) -> Array:
    """The P with P = gamma F'PF + rhs (discrete Lyapunov), one Kronecker solve (n^2 unknowns).

    Row-major vec: vec(F'PF) = (F' kron F') vec(P). Requires sqrt(gamma) * spectral radius(F)
    < 1 (:func:`closed_loop_radius`; else V^pi is infinite and the solve is meaningless).
    """
    n = f.shape[0]
    lhs = jnp.eye(n * n, dtype=f.dtype) - gamma * jnp.kron(f.T, f.T)
    return _sym(jnp.linalg.solve(lhs, rhs.reshape(-1)).reshape(n, n))


@jax.jit
def value(lqr: LQR, pol: GaussianPolicy, mean_shift: Array = None, cov: Array = None) -> Quadratic:
    """V^pi as a quadratic: P by :func:`lyapunov`, then the linear part p and constant c.

    With F = A + BK, f0 = B k0, W_pi = B Sigma B' + W:
      P = -(Q + K'RK) + gamma F'PF,
      (I - gamma F') p = -2 K'R k0 + 2 gamma F'P f0,
      (1 - gamma) c = -(k0'R k0 + tr(R Sigma)) + gamma (f0'P f0 + p'f0 + tr(P W_pi)).
    ``mean_shift`` / ``cov`` override k0 / Sigma as in :func:`policy_expect`.
    """
    k, k0 = pol.gain, (pol.offset if mean_shift is None else mean_shift)
    sig = pol.cov if cov is None else cov
    g = lqr.gamma
    f, f0 = lqr.a + lqr.b @ k, lqr.b @ k0
    p_mat = lyapunov(f, -(lqr.q + k.T @ lqr.r @ k), g)
    n = lqr.n
    p_vec = jnp.linalg.solve(jnp.eye(n, dtype=f.dtype) - g * f.T,
                             -2.0 * k.T @ lqr.r @ k0 + 2.0 * g * f.T @ p_mat @ f0)
    w_pi = lqr.b @ sig @ lqr.b.T + lqr.w
    const = (-(k0 @ lqr.r @ k0 + jnp.trace(lqr.r @ sig))
             + g * (f0 @ p_mat @ f0 + p_vec @ f0 + jnp.trace(p_mat @ w_pi))) / (1.0 - g)
    return Quadratic(p_mat, p_vec, const)


@jax.jit
def q_value(lqr: LQR, pol: GaussianPolicy) -> Quadratic:
    """Q^pi(s, a) over z = (s, a)."""
    return action_value(lqr, value(lqr, pol))


def gaussian_mean(f: Quadratic, mean: Array, cov: Array) -> Array:
    """E[f(x)] for x ~ N(mean, cov): mean'M mean + v'mean + c + tr(M cov)."""
    return f(mean) + jnp.trace(f.mat @ cov)


@jax.jit
def objective(lqr: LQR, pol: GaussianPolicy) -> Array:
    """J(pi) = E_{s0 ~ N(m0, S0)}[V^pi(s0)] (differentiable in pol)."""
    return gaussian_mean(value(lqr, pol), lqr.s0_mean, lqr.s0_cov)


@jax.jit
def discounted_state_moments(lqr: LQR, pol: GaussianPolicy) -> tuple[Array, Array]:
    """Mean and second moment E[s], E[ss'] of the normalised discounted state law
    d_pi = (1 - gamma) sum_t gamma^t P(s_t), from the start law (closed form).

    With S = sum_t gamma^t E s_t and X = sum_t gamma^t E s_t s_t':
      S = (I - gamma F)^-1 (m0 + gamma f0 / (1 - gamma)),
      X = X0 + gamma (F X F' + F S f0' + f0 S'F' + (f0 f0' + W_pi) / (1 - gamma)).
    """
    g = lqr.gamma
    f, f0 = lqr.a + lqr.b @ pol.gain, lqr.b @ pol.offset
    w_pi = lqr.b @ pol.cov @ lqr.b.T + lqr.w
    n = lqr.n
    s_sum = jnp.linalg.solve(jnp.eye(n, dtype=f.dtype) - g * f, lqr.s0_mean + g * f0 / (1.0 - g))
    x0 = lqr.s0_cov + jnp.outer(lqr.s0_mean, lqr.s0_mean)
    rhs = x0 + g * (jnp.outer(f @ s_sum, f0) + jnp.outer(f0, f @ s_sum)
                    + (jnp.outer(f0, f0) + w_pi) / (1.0 - g))
    x_sum = lyapunov(f.T, rhs, g)                                    # X = gamma F X F' + rhs
    return (1.0 - g) * s_sum, (1.0 - g) * x_sum


@jax.jit
def mixture_value(lqr: LQR, pols: GaussianPolicy, weights: Array) -> Quadratic:
    """V of the mixture policy that acts with ``pols[l]`` (leaves with a leading axis L) with
    probability ``weights[l]`` at every step: the fixed point of V = sum_l w_l T_{pi_l} V.

    That map is affine in the coefficients (mat, vec, const) of a quadratic V, so its fixed
    point is one linear solve in the n^2 + n + 1 coefficients (the map's matrix by
    ``jax.jacfwd``); finite iff the mixture's closed loop is stable in mean square (then
    the solve's matrix is invertible). ``weights`` = one-hot gives :func:`value`.
    """
    n = lqr.n
    zero = Quadratic(jnp.zeros((n, n), lqr.a.dtype), jnp.zeros(n, lqr.a.dtype),
                     jnp.zeros((), lqr.a.dtype))

    def flat(v: Quadratic) -> Array:
        return jnp.concatenate([v.mat.reshape(-1), v.vec, v.const[None]])

    def unflat(x: Array) -> Quadratic:
        return Quadratic(x[:n * n].reshape(n, n), x[n * n:n * n + n], x[-1])

    def t_mix(x: Array) -> Array:
        outs = jax.vmap(lambda p: flat(bellman(lqr, p, unflat(x))))(pols)
        return weights @ outs

    x0 = flat(zero)
    jac, b = jax.jacfwd(t_mix)(x0), t_mix(x0)
    x = jnp.linalg.solve(jnp.eye(x0.shape[0], dtype=x0.dtype) - jac, b)
    v = unflat(x)
    return Quadratic(_sym(v.mat), v.vec, v.const)
