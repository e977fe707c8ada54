"""Random verification problems: an MDP, a target policy, stale behaviour versions, a replay
mixture and a frozen critic (the setting of Sec 1.3 / Eq 6 of the write-up), generated in
batches of one shape so that every check is one ``jax.vmap`` over the batch.

Also the two *independent* closed forms of the clipped policies of Eq 10 (written as
min(c mu, pi) and pi 1[mask], not via the library's weights), which the claims of the
sampled half and the clipped fixed points are compared against.
"""

from __future__ import annotations

import dataclasses

import chex
import flax
import jax
import jax.numpy as jnp

from vccc_jax.tabular import mdp as mdplib
from vccc_jax.tabular.mdp import TabularMDP
from vccc_jax.tabular.policies import softmax_policy

Array = chex.Array

CLIP = 2.0          # truncation threshold c of the clipped targets (Eq 10)
MASK_CLIP = 2.0     # double-sided mask [1/c, c]
TEMPERATURE = 0.8   # pi = softmax(logits / T); the score u carries the 1/T
Z_CRIT = 3.29       # two-sided 0.1% normal quantile
ALPHA = 1e-3        # level of every statistical test (99.9% confidence)
NUM_VERSIONS = 3
STALENESS = (0.25, 0.5, 1.0)  # logit-noise scale of behaviour versions mu_1..mu_3
EXACT_TOL = 1e-10   # absolute, on quantities of order the values (relative to 1 + scale)


@flax.struct.dataclass
class Problem:
    """One MDP with a target policy, K behaviour versions, a replay mixture and a critic."""

    mdp: TabularMDP
    logits: Array      # [S, A] target logits; pi = softmax(logits / TEMPERATURE)
    pi: Array          # [S, A]
    mus: Array         # [K, S, A] behaviour versions (mus[-1] is the stalest)
    mix: Array         # [K, S] replay mixture q_k(s) (columns sum to 1)
    vbar: Array        # [S] arbitrary frozen bootstrap values
    baselines: Array   # [NB, S] arbitrary state baselines
    # True: ``mus`` are the versions of a lag law's support and ``mix`` [K, S] its P(L) (the same
    # in every state); the actor and sequence contracts then check the P(L)-weighted expectation
    # (:mod:`vccc_jax.verify.lags`, ``--lag-law``) instead of each version.
    law: bool = flax.struct.field(pytree_node=False, default=False)


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    kind: str          # "dirichlet" | "episodic" | "garnet"
    num_states: int
    num_actions: int
    num_mdps: int
    branching: int = 2


def default_groups(num_mdps: int = 256, quick: bool = False) -> tuple[GroupSpec, ...]:
    """Mixed sizes. ``quick``: fewer, smaller groups (same identities)."""
    if quick:
        shapes = [("episodic", 4, 2), ("garnet", 6, 3)]
    else:
        shapes = [("dirichlet", 2, 2), ("episodic", 5, 3), ("garnet", 8, 4), ("dirichlet", 12, 5)]
    n = len(shapes)
    sizes = [num_mdps // n + (1 if i < num_mdps % n else 0) for i in range(n)]
    return tuple(GroupSpec(k, s, a, b, branching=3) for (k, s, a), b in zip(shapes, sizes))


def make_problems(key: Array, spec: GroupSpec, dtype=None) -> Problem:
    """A batch of ``spec.num_mdps`` random problems of one shape (leading batch axis)."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    B, S, A, K = spec.num_mdps, spec.num_states, spec.num_actions, NUM_VERSIONS
    k_mdp, k_gamma, k_logits, k_noise, k_mix, k_v, k_b = jax.random.split(key, 7)
    if spec.kind == "garnet":
        mdp = mdplib.garnet_mdp(k_mdp, B, S, A, spec.branching, dtype=dtype)
    else:
        mdp = mdplib.random_mdp(k_mdp, B, S, A, dtype=dtype)
    gamma = jax.random.uniform(k_gamma, (B,), dtype, 0.5, 0.97)
    if spec.kind == "episodic":
        # The last state is terminal (absorbing, zero reward); every other MDP is undiscounted.
        last = jax.nn.one_hot(S - 1, S, dtype=dtype)
        P = mdp.P.at[:, S - 1].set(jnp.broadcast_to(last, (B, A, S)))
        R = mdp.R.at[:, S - 1].set(0.0)
        gamma = jnp.where(jnp.arange(B) % 2 == 0, 1.0, gamma).astype(dtype)
        mdp = mdp.replace(P=P, R=R, terminal=jnp.broadcast_to(last, (B, S)))
    mdp = mdp.replace(gamma=gamma)
    logits = jax.random.normal(k_logits, (B, S, A), dtype)
    pi = softmax_policy(logits, TEMPERATURE)
    noise = jax.random.normal(k_noise, (B, K, S, A), dtype)
    scale = jnp.asarray(STALENESS, dtype)[None, :, None, None]
    mus = softmax_policy(logits[:, None] + scale * noise, TEMPERATURE)
    mix = jnp.moveaxis(mdplib.dirichlet(k_mix, 1.0, K, (B, S), dtype), -1, 1)
    vbar = 3.0 * jax.random.normal(k_v, (B, S), dtype)
    kb1, kb2 = jax.random.split(k_b)
    baselines = jnp.stack(
        [jnp.zeros((B, S), dtype), 5.0 * jax.random.normal(kb1, (B, S), dtype), vbar + 3.0], axis=1
    )
    return Problem(mdp=mdp, logits=logits, pi=pi, mus=mus, mix=mix, vbar=vbar, baselines=baselines)


def truncated_policy(pi: Array, mu: Array, c: float) -> tuple[Array, Array]:
    """(Z, pitilde) for w = min(rho, c), written as min(c mu, pi) (independent of the library; Eq 10)."""
    m = jnp.minimum(c * mu, pi)
    z = jnp.sum(m, axis=-1)
    return z, m / z[:, None]


def masked_policy(pi: Array, mu: Array, c: float) -> tuple[Array, Array]:
    """(Z, pitilde) for the double-sided mask: mu w = pi 1[mu / c <= pi <= c mu] (Eq 10)."""
    m = jnp.where((pi >= mu / c) & (pi <= c * mu), pi, 0.0)
    z = jnp.sum(m, axis=-1)
    return z, m / jnp.where(z > 0, z, 1.0)[:, None]


def maxabs(x) -> Array:
    """max |x| (the error of every exact check)."""
    return jnp.max(jnp.abs(x))
