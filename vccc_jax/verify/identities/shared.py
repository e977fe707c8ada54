"""Shared pieces of the exact identity sections: the prelude (T_pi Vbar, V^pi, V^{mu_k}),
exact expectations over the (s, a, s') grid, and the exact fixed point of an affine update."""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.tabular import exact as ex
from vccc_jax.verify.problems import Problem

Array = chex.Array


def affine_fixed_point(expected_target: Callable[[Array], Array], num_states: int, dtype) -> Array:
    """Fixed point of V -> F(V) for an affine F (an expected one-step update), solved exactly.

    F(V) = J V + F(0) with J[:, j] = F(e_j) - F(0); the fixed point solves (I - J) V = F(0).
    """
    eye = jnp.eye(num_states, dtype=dtype)
    f0 = expected_target(jnp.zeros((num_states,), dtype))
    J = (jax.vmap(expected_target)(eye) - f0[None, :]).T
    return ex.solve_dominant(eye - J, f0)


def grid_mean(mdp, pi, mu, vbar, fn) -> Array:
    g = ex.transition_grid(mdp, pi, mu, vbar)
    return ex.target_moments(mdp, mu, fn(g))[0]


class Prelude(NamedTuple):
    """Quantities shared by the sections: T_pi Vbar, V^pi, V^{mu_k}."""

    t_pi: Array
    v_pi: Array
    v_mus: Array


def prelude(p: Problem) -> Prelude:
    return Prelude(
        t_pi=ex.bellman_operator(p.mdp, p.pi, p.vbar),
        v_pi=ex.policy_value(p.mdp, p.pi),
        v_mus=jax.vmap(lambda m: ex.policy_value(p.mdp, m))(p.mus),
    )

