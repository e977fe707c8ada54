"""Pivot-free linear solvers for the exact oracles of ``tabular.exact`` (re-exported there).

Every linear system of the exact oracles is I - M with M >= 0 and row sums <= 1 (M = P_pi
diag(gamma(s')), the discounted transition matrix of a policy), or its transpose: weakly
diagonally dominant, so Gaussian elimination without pivoting is backward stable (growth
factor <= 2) and XLA-native.

  solve_dominant            one system, ``lax.custom_linear_solve`` (implicit gradients); jitted
  _eliminate_batch_minor    a batch stored batch-minor [S, S, N], unrolled over S
  _krylov_solve             batched BiCGSTAB checked by its residual, LU fallback
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

Array = chex.Array

__all__ = ["solve_dominant", "ELIMINATION_MAX_STATES"]


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


def _solve_dominant(a: Array, b: Array) -> Array:
    """Solve a x = b for a (weakly) diagonally dominant a, by elimination without pivoting.

    Every system in this module has this form: I - M with M >= 0 and row sums <= 1
    (e.g. M = P_pi diag(gamma(s'))), or its transpose. Elimination without pivoting is then
    backward stable (growth factor <= 2), and it is XLA-native: no LAPACK custom call.
    That matters on CPU with jaxlib 0.10, whose batched LU runs ``ParallelBatchMap`` on
    the intra-op thread pool and can deadlock when two LU calls run concurrently (two
    independent solves in one jitted graph, or two threads). Gradients use implicit
    differentiation (``lax.custom_linear_solve``; the transpose is also dominant).

    Jitted (``solve_dominant = jax.jit(_solve_dominant)``): each un-jitted call traced a
    ``custom_linear_solve`` whose vmap rule re-traces 3 jaxprs; inside an outer jit XLA
    inlines the call, so the numbers are those of the plain body.
    """
    if a.ndim != 2 or b.ndim != 1 or a.shape != (b.shape[0], b.shape[0]):
        raise ValueError(f"solve_dominant takes a [n, n] and b [n], got {a.shape} and {b.shape}")
    return jax.lax.custom_linear_solve(
        lambda x: a @ x, b,
        solve=lambda _, r: _eliminate(a, r),
        transpose_solve=lambda _, r: _eliminate(a.T, r),
    )


solve_dominant = jax.jit(_solve_dominant)
solve_dominant.__doc__ = _solve_dominant.__doc__


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

