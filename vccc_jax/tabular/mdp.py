"""Batched finite MDPs with exact answers (DESIGN.md §6, the tabular testbed).

A :class:`TabularMDP` holds arrays with any number of leading batch dimensions:

    P        [..., S, A, S']  transition probabilities P(s'|s, a)
    R        [..., S, A, S']  rewards r(s, a, s')
    gamma    [...]            discount in [0, 1]
    init     [..., S]         initial-state distribution
    terminal [..., S]         1.0 where a state is terminal (absorbing, value 0)
    horizon  static int|None  finite horizon H (episodes of H steps), or None

Termination follows the estimator convention (DESIGN.md §3): the discount of a transition
s -> s' is ``gamma * (1 - terminal[s'])``, so a terminal next state cuts the bootstrap. A
terminal state is made absorbing with zero reward by the generators; with that, episodic
MDPs with ``gamma = 1`` have a well-posed linear system as long as termination is reached.

Single-MDP routines (``tabular.exact``) take an unbatched MDP; batches are handled with
``jax.vmap(f)(mdp, ...)`` over the leading axis (``horizon`` is static metadata and is shared
by the whole batch).

Finite horizon: with ``horizon = H`` the exact routines use backward induction over H
steps with a stationary policy; :func:`fold_time` builds the equivalent infinite-horizon
MDP whose states are (t, s) pairs plus one absorbing terminal state (the write-up's "time is
included in the state"), on which the ordinary linear solve gives the same values.
"""

from __future__ import annotations

import functools
from typing import Optional

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

Array = chex.Array

PROB_ATOL = 1e-6


@flax.struct.dataclass
class TabularMDP:
    """A (batch of) finite MDP(s); see the module docstring for the field layout."""

    P: Array
    R: Array
    gamma: Array
    init: Array
    terminal: Array
    horizon: Optional[int] = flax.struct.field(pytree_node=False, default=None)

    @property
    def num_states(self) -> int:
        return self.P.shape[-3]

    @property
    def num_actions(self) -> int:
        return self.P.shape[-2]

    @property
    def batch_shape(self) -> tuple:
        return self.P.shape[:-3]

    def __getitem__(self, idx) -> "TabularMDP":
        """Index the leading batch dimension(s), e.g. ``mdps[3]`` or ``mdps[:8]``."""
        return jax.tree_util.tree_map(lambda x: x[idx], self)


def make_mdp(
    P: Array,
    R: Array,
    gamma,
    init: Optional[Array] = None,
    terminal: Optional[Array] = None,
    horizon: Optional[int] = None,
    *,
    validate: bool = True,
) -> TabularMDP:
    """Build a :class:`TabularMDP`, filling defaults and broadcasting rewards.

    Args:
      P: [..., S, A, S'] transition probabilities.
      R: [..., S, A, S'] or [..., S, A] (expected reward, independent of s') rewards.
      gamma: scalar or [...] discount.
      init: [..., S] initial distribution; uniform if None.
      terminal: [..., S] 0/1 terminal flags; none terminal if None.
      horizon: static finite horizon or None.
      validate: run :func:`validate_mdp` (needs concrete arrays).
    """
    P = jnp.asarray(P)
    dtype = P.dtype if jnp.issubdtype(P.dtype, jnp.floating) else jnp.result_type(float)
    P = P.astype(dtype)
    if P.ndim < 3:
        raise ValueError(f"P must have shape [..., S, A, S'], got {P.shape}")
    batch, S = P.shape[:-3], P.shape[-3]
    R = jnp.asarray(R, dtype)
    if R.shape == P.shape[:-1]:
        R = jnp.broadcast_to(R[..., None], P.shape)
    if R.shape != P.shape:
        raise ValueError(f"R must have shape {P.shape} or {P.shape[:-1]}, got {R.shape}")
    gamma = jnp.broadcast_to(jnp.asarray(gamma, dtype), batch)
    if init is None:
        init = jnp.full(batch + (S,), 1.0 / S, dtype)
    init = jnp.asarray(init, dtype)
    if terminal is None:
        terminal = jnp.zeros(batch + (S,), dtype)
    terminal = jnp.asarray(terminal, dtype)
    mdp = TabularMDP(P=P, R=R, gamma=gamma, init=init, terminal=terminal, horizon=horizon)
    if validate:
        validate_mdp(mdp)
    return mdp


def validate_mdp(mdp: TabularMDP, atol: float = PROB_ATOL) -> TabularMDP:
    """Raise ValueError naming the field if the MDP is malformed; returns the MDP.

    Checks shapes (always) and, on concrete arrays, that P has no negative entries and rows
    summing to 1, that ``init`` is a distribution, ``gamma`` lies in [0, 1], ``terminal`` is
    0/1, and ``horizon`` is a positive int or None.
    """
    P = mdp.P
    if np.ndim(P) < 3:
        raise ValueError(f"P must have shape [..., S, A, S'], got {np.shape(P)}")
    batch, (S, _, S2) = P.shape[:-3], P.shape[-3:]
    if S2 != S:
        raise ValueError(f"P must be [..., S, A, S] with S' == S, got {P.shape}")
    if mdp.R.shape != P.shape:
        raise ValueError(f"R must have the shape of P {P.shape}, got {mdp.R.shape}")
    if np.shape(mdp.gamma) != batch:
        raise ValueError(f"gamma must have the batch shape {batch}, got {np.shape(mdp.gamma)}")
    if np.shape(mdp.init) != batch + (S,):
        raise ValueError(f"init must have shape {batch + (S,)}, got {np.shape(mdp.init)}")
    if np.shape(mdp.terminal) != batch + (S,):
        raise ValueError(f"terminal must have shape {batch + (S,)}, got {np.shape(mdp.terminal)}")
    if mdp.horizon is not None and (not isinstance(mdp.horizon, (int, np.integer)) or mdp.horizon < 1):
        raise ValueError(f"horizon must be a positive int or None, got {mdp.horizon!r}")
    if isinstance(P, jax.core.Tracer):
        return mdp
    p = np.asarray(P)
    if np.any(~np.isfinite(p)) or np.any(p < -atol):
        raise ValueError(f"P has negative or non-finite probabilities (min {np.nanmin(p)})")
    row = p.sum(-1)
    if np.any(np.abs(row - 1.0) > atol):
        bad = np.argwhere(np.abs(row - 1.0) > atol)[0]
        raise ValueError(
            f"P rows must sum to 1: P[{', '.join(map(str, bad))}, :] sums to {row[tuple(bad)]}"
        )
    if not np.all(np.isfinite(np.asarray(mdp.R))):
        raise ValueError("R has non-finite rewards")
    g = np.asarray(mdp.gamma)
    if np.any(~(g >= 0) | ~(g <= 1)):
        raise ValueError(f"gamma must lie in [0, 1], got values in [{g.min()}, {g.max()}]")
    d = np.asarray(mdp.init)
    if np.any(d < -atol) or np.any(np.abs(d.sum(-1) - 1.0) > atol):
        raise ValueError("init must be a probability distribution over states (>= 0, sums to 1)")
    t = np.asarray(mdp.terminal)
    if np.any((t != 0) & (t != 1)):
        raise ValueError("terminal must contain only 0 and 1")
    return mdp


def next_state_discounts(mdp: TabularMDP) -> Array:
    """gamma * (1 - terminal[s']) for a single MDP: the discount of a step into s'. [S]."""
    return mdp.gamma[..., None] * (1.0 - mdp.terminal)


# ----------------------------------------------------------------------------- generators


def _dtype(dtype):
    return jnp.result_type(float) if dtype is None else dtype


def dirichlet(key: Array, concentration: float, num_categories: int, shape: tuple, dtype) -> Array:
    """Symmetric Dirichlet(concentration) vectors [*shape, num_categories].

    For concentration 1 (uniform on the simplex) this normalises i.i.d. exponentials, which
    is exact and much cheaper to compile than the general gamma sampler used otherwise.
    """
    if concentration == 1.0:
        e = jax.random.exponential(key, tuple(shape) + (num_categories,), dtype)
        return e / jnp.sum(e, axis=-1, keepdims=True)
    alpha = jnp.full((num_categories,), concentration, dtype)
    return jax.random.dirichlet(key, alpha, tuple(shape), dtype=dtype)


@functools.partial(
    jax.jit, static_argnames=("num_mdps", "num_states", "num_actions", "concentration", "horizon", "dtype")
)
def random_mdp(
    key: Array,
    num_mdps: int,
    num_states: int,
    num_actions: int,
    *,
    gamma: float = 0.9,
    concentration: float = 1.0,
    reward_scale: float = 1.0,
    horizon: Optional[int] = None,
    dtype=None,
) -> TabularMDP:
    """A batch of random MDPs: Dirichlet(concentration) transition rows, N(0, scale) rewards.

    Rewards depend on (s, a, s'); the initial distribution is Dirichlet(1).
    Shapes: P, R [num_mdps, S, A, S]; gamma [num_mdps]; init [num_mdps, S].
    """
    dtype = _dtype(dtype)
    kp, kr, ki = jax.random.split(key, 3)
    S, A = num_states, num_actions
    P = dirichlet(kp, concentration, S, (num_mdps, S, A), dtype)
    R = reward_scale * jax.random.normal(kr, (num_mdps, S, A, S), dtype)
    init = dirichlet(ki, 1.0, S, (num_mdps,), dtype)
    return make_mdp(P, R, gamma, init=init, horizon=horizon, validate=False)


@functools.partial(jax.jit, static_argnames=("num_mdps", "num_states", "num_actions", "branching", "dtype"))
def garnet_mdp(
    key: Array,
    num_mdps: int,
    num_states: int,
    num_actions: int,
    branching: int,
    *,
    gamma: float = 0.9,
    reward_scale: float = 1.0,
    dtype=None,
) -> TabularMDP:
    """Garnet MDPs: each (s, a) reaches ``branching`` distinct next states.

    The probabilities over the chosen next states are the gaps of sorted uniforms (a
    uniform point of the simplex, as in Archibald et al.'s Garnets); rewards r(s, a) are
    N(0, scale), constant over s'.
    """
    if not 1 <= branching <= num_states:
        raise ValueError(f"branching must lie in [1, num_states={num_states}], got {branching}")
    dtype = _dtype(dtype)
    S, A = num_states, num_actions
    kperm, kw, kr = jax.random.split(key, 3)
    # Distinct next states: the first `branching` entries of a random permutation.
    scores = jax.random.uniform(kperm, (num_mdps, S, A, S))
    ranks = jnp.argsort(jnp.argsort(scores, axis=-1), axis=-1)
    chosen = ranks < branching
    cuts = jnp.sort(jax.random.uniform(kw, (num_mdps, S, A, branching - 1), dtype), axis=-1)
    edges = jnp.concatenate(
        [jnp.zeros(cuts.shape[:-1] + (1,), dtype), cuts, jnp.ones(cuts.shape[:-1] + (1,), dtype)],
        axis=-1,
    )
    gaps = jnp.diff(edges, axis=-1)  # [..., branching]
    # Assign gap k to the chosen state of rank k.
    onehot = jax.nn.one_hot(ranks, S, dtype=dtype)[..., :branching]  # [N,S,A,S',branching]
    P = jnp.where(chosen, jnp.einsum("nsatk,nsak->nsat", onehot, gaps), 0.0).astype(dtype)
    R = reward_scale * jax.random.normal(kr, (num_mdps, S, A), dtype)
    return make_mdp(P, R, gamma, validate=False)


def chain_mdp(
    num_states: int,
    *,
    gamma: float = 0.99,
    slip: float = 0.1,
    reward: float = 1.0,
    num_actions: int = 2,
    dtype=None,
) -> TabularMDP:
    """A chain with a sparse terminal reward (long horizon; for multi-step credit).

    States 0..n-1 form the chain and state n is terminal (absorbing, value 0). Action 1
    ("right") moves s -> s+1 with probability 1 - slip and s -> max(s-1, 0) otherwise;
    every other action ("left") moves to max(s-1, 0) with probability 1 - slip and right
    otherwise. Reaching the end (n-1 -> n) pays ``reward``; every other reward is 0. The
    episode starts in state 0. Returns an unbatched MDP with S = n + 1 states.
    """
    if num_states < 2:
        raise ValueError(f"num_states must be >= 2, got {num_states}")
    if not 0.0 <= slip < 1.0:
        raise ValueError(f"slip must lie in [0, 1), got {slip}")
    if num_actions < 2:
        raise ValueError(f"num_actions must be >= 2, got {num_actions}")
    dtype = _dtype(dtype)
    n, S = num_states, num_states + 1
    P = np.zeros((S, num_actions, S))
    R = np.zeros((S, num_actions, S))
    for s in range(n):
        right, left = s + 1, max(s - 1, 0)
        for a in range(num_actions):
            p_right = 1.0 - slip if a == 1 else slip
            P[s, a, right] += p_right
            P[s, a, left] += 1.0 - p_right
    R[n - 1, :, n] = reward
    P[n, :, n] = 1.0
    init = np.zeros(S)
    init[0] = 1.0
    terminal = np.zeros(S)
    terminal[n] = 1.0
    return make_mdp(
        jnp.asarray(P, dtype), jnp.asarray(R, dtype), gamma, init=jnp.asarray(init, dtype),
        terminal=jnp.asarray(terminal, dtype),
    )


def bandit_mdp(
    rewards=(0.0, 1.0), *, gamma: float = 0.0, dtype=None
) -> TabularMDP:
    """The write-up's one-step bandit (Sec 4.1): one state, r(a0) = 0, r(a1) = 1.

    Modelled as state 0 (the decision) whose actions all lead to the terminal state 1, so
    the value of state 0 is the expected immediate reward for any gamma. Unbatched, S = 2.
    """
    dtype = _dtype(dtype)
    r = jnp.asarray(rewards, dtype)
    A = r.shape[0]
    P = jnp.zeros((2, A, 2), dtype).at[:, :, 1].set(1.0)
    R = jnp.zeros((2, A, 2), dtype).at[0, :, 1].set(r)
    return make_mdp(
        P, R, gamma, init=jnp.asarray([1.0, 0.0], dtype), terminal=jnp.asarray([0.0, 1.0], dtype)
    )


def with_horizon(mdp: TabularMDP, horizon: Optional[int]) -> TabularMDP:
    """The same MDP with a finite horizon (static metadata) set or removed."""
    return mdp.replace(horizon=horizon)


def fold_time(mdp: TabularMDP) -> TabularMDP:
    """Fold the finite horizon into the state: an equivalent infinite-horizon MDP.

    For a single (unbatched) MDP with ``horizon = H`` and S states, the folded MDP has
    H * S + 1 states: index t * S + s is "state s at time t" (t = 0..H-1) and the last index
    is an absorbing terminal state. Steps at t < H - 1 go to time t + 1; steps at t = H - 1
    go to the terminal state (if the original s' was terminal the episode also ends there,
    its discount is 0 either way). Rewards are copied. A stationary policy pi [S, A] becomes
    :func:`fold_policy`. V_folded[t * S + s] is the value of s with H - t steps to go.
    """
    H = mdp.horizon
    if H is None:
        raise ValueError("fold_time needs an MDP with a finite horizon (mdp.horizon is None)")
    if mdp.P.ndim != 3:
        raise ValueError(f"fold_time takes a single MDP (use jax.vmap), got P {mdp.P.shape}")
    return _fold_time(mdp)


@jax.jit
def _fold_time(mdp: TabularMDP) -> TabularMDP:
    H = mdp.horizon
    S, A = mdp.num_states, mdp.num_actions
    N = H * S + 1
    dtype = mdp.P.dtype
    P = jnp.zeros((N, A, N), dtype)
    R = jnp.zeros((N, A, N), dtype)
    for t in range(H):
        rows = slice(t * S, (t + 1) * S)
        if t < H - 1:
            P = P.at[rows, :, (t + 1) * S : (t + 2) * S].set(mdp.P)
            R = R.at[rows, :, (t + 1) * S : (t + 2) * S].set(mdp.R)
        else:
            P = P.at[rows, :, N - 1].set(1.0)
            R = R.at[rows, :, N - 1].set(jnp.sum(mdp.P * mdp.R, axis=-1))
    P = P.at[N - 1, :, N - 1].set(1.0)
    # Original terminal states stay terminal at every time slice.
    terminal = jnp.concatenate([jnp.tile(mdp.terminal, H), jnp.ones((1,), dtype)])
    init = jnp.concatenate([mdp.init, jnp.zeros(((H - 1) * S + 1,), dtype)])
    return TabularMDP(P=P, R=R, gamma=mdp.gamma, init=init, terminal=terminal, horizon=None)


def fold_policy(pi: Array, horizon: int) -> Array:
    """A stationary policy [S, A] on the time-folded MDP of :func:`fold_time`: [H*S+1, A]."""
    A = pi.shape[-1]
    return jnp.concatenate([jnp.tile(pi, (horizon, 1)), jnp.full((1, A), 1.0 / A, pi.dtype)])
