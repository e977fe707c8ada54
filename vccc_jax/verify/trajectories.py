"""Enumeration of every length-T trajectory of a small MDP as estimator inputs (exact
expectations of multi-step estimators).

From each start state s_0 every sequence of (a_t, s_{t+1}) cells, t = 0..T-1, is listed:
N = S (A S)^T trajectories, start-state-major, each with its probability given s_0 under
mu(a|s) P(s'|s, a). A multi-step estimator evaluated on them (time-major [T, N]) and weighted
by that probability gives E_mu[x_t | s_0] exactly (:func:`expect`); the exact value of an
operator at time t is (P_mu^t w_{T-t})(s_0), w_h the h-step operator (:func:`at_times`).
Cheap for S = 3, A = 2, T = 3 (648 trajectories). The indices are static numpy; only the
probabilities and the estimator inputs are traced.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import chex
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts
from vccc_jax.tabular.policies import log_ratio_table

Array = chex.Array


class Segments(NamedTuple):
    """Every length-T trajectory: int indices [T, N] (time-major) and prob [N] given s_0.

    ``inputs`` holds the estimator inputs of V-trace's signature, time-major: log_rhos,
    discounts, rewards, values [T, N] and bootstrap_value [N]."""

    states: np.ndarray
    actions: np.ndarray
    next_states: np.ndarray
    prob: Array
    inputs: dict


def enumerate_segments(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, horizon: int) -> Segments:
    """All trajectories of ``horizon`` steps of a single MDP under mu, with pi's log-ratios and
    the critic ``vbar`` [S] (``bootstrap_value`` = vbar(s_T))."""
    S, A = mdp.num_states, mdp.num_actions
    seqs = np.asarray(list(itertools.product(range(A * S), repeat=horizon)), np.int32)  # [(AS)^T, T]
    cells = np.tile(seqs, (S, 1))
    actions, nxt = cells // S, cells % S
    starts = np.repeat(np.arange(S, dtype=np.int32), len(seqs))
    states = np.concatenate([starts[:, None], nxt[:, :-1]], axis=1)
    prob = jnp.prod(mu[states, actions] * mdp.P[states, actions, nxt], axis=1)
    disc = next_state_discounts(mdp)
    inputs = dict(log_rhos=log_ratio_table(pi, mu)[states, actions].T, discounts=disc[nxt].T,
                  rewards=mdp.R[states, actions, nxt].T, values=vbar[states].T,
                  bootstrap_value=vbar[nxt[:, -1]])
    return Segments(states.T, actions.T, nxt.T, prob, inputs)


def expect(seg: Segments, x: Array) -> Array:
    """E_mu[x | s_0] for x [..., N] (trajectories grouped by start state): [..., S]."""
    S = int(seg.states[0].max()) + 1
    prob = seg.prob.reshape((1,) * (x.ndim - 1) + (-1,))
    return jnp.sum((prob * x).reshape(x.shape[:-1] + (S, -1)), axis=-1)


def at_times(mdp: TabularMDP, mu: Array, by_length: Array, horizon: int) -> Array:
    """[(P_mu^t w_{T-t})(s_0)]_t for t = 0..T-1: the exact E[x_t | s_0] of an estimator whose
    expectation on an h-step segment starting at s is ``by_length[h, s]`` ([T + 1, S]). [T, S]"""
    P = ex.transition_matrix(mdp, mu)
    out, reach = [], jnp.eye(mdp.num_states, dtype=P.dtype)
    for t in range(horizon):
        out.append(reach @ by_length[horizon - t])
        reach = reach @ P
    return jnp.stack(out)
