"""Enumeration of (s, a, s') transition grids as estimator inputs (exact expectations).

The library's one-step estimators are elementwise, so evaluating them on every cell of the
enumerated grid and weighting by the cell probability mu(a|s) P(s'|s, a) (or
q_k(s) mu_k(a|s) P(s'|s, a) over a replay mixture, Eq 6) gives their exact conditional
moments. A sample from the same distribution is the same structure with the cell axis
replaced by N draws (:func:`draw`).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.mdp import TabularMDP
from vccc_jax.verify.problems import CLIP, MASK_CLIP, Problem

Array = chex.Array


class Cells(NamedTuple):
    """Per-transition estimator inputs, enumerated: every field [S, C] (C cells per state).

    For one behaviour version the cells are (a, s') with ``prob`` = mu(a|s) P(s'|s, a); for a
    replay mixture they are (k, a, s') with prob = q_k(s) mu_k(a|s) P(s'|s, a). The
    per-state fields (``values``, baselines, ``z_*``) are broadcast to the cells.
    """

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    log_rhos: Array
    baseline: Array       # an arbitrary state baseline b(s)
    baseline_vmu: Array   # b(s) = V^{mu_k}(s): a stale critic as the baseline
    baseline_star: Array  # b*(s) of Eq 9 for the cell's version
    z_truncate: Array     # Z_k(s) = E_{mu_k}[min(rho, c) | s] (c = CLIP unless a claim says)
    z_mask: Array         # Z_k(s) for the double-sided mask [1/c, c] (c = MASK_CLIP unless ...)
    prob: Array


def version_cells(mdp: TabularMDP, pi: Array, mu: Array, vbar: Array, baseline: Array,
                  clip: float = CLIP, mask_clip: float = MASK_CLIP) -> Cells:
    """Cells of one behaviour version mu: (a, s') flattened, [S, A * S']. ``clip`` /
    ``mask_clip``: the thresholds of the Z(s) fields (a checked estimator's claim)."""
    g = ex.transition_grid(mdp, pi, mu, vbar)
    S = mdp.num_states
    z_t, _ = ex.z_and_clipped_policy(pi, mu, clip, "truncate")
    z_m, _ = ex.z_and_clipped_policy(pi, mu, mask_clip, "mask")
    v_mu = ex.policy_value(mdp, mu)
    b_star = ex.optimal_baseline(mdp, pi, mu, vbar)

    def flat(x):
        return x.reshape(S, -1)

    return Cells(
        rewards=flat(g.rewards), discounts=flat(g.discounts), values=flat(g.values),
        next_values=flat(g.next_values), log_rhos=flat(g.log_rhos),
        baseline=flat(g.state(baseline)), baseline_vmu=flat(g.state(v_mu)),
        baseline_star=flat(g.state(b_star)), z_truncate=flat(g.state(z_t)),
        z_mask=flat(g.state(z_m)), prob=flat(g.prob),
    )


def mix_cells(per_version: Cells, mix: Array) -> Cells:
    """Replay cells from per-version cells [K, S, C] and version probabilities q_k(s) [K, S]."""
    per_version = per_version._replace(prob=per_version.prob * mix[:, :, None])
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1), per_version)


def replay_cells(mdp: TabularMDP, pi: Array, mus: Array, mix: Array, vbar: Array, baseline: Array) -> Cells:
    """Cells of a replay mixture of versions (Eq 6): (k, a, s') flattened, [S, K * A * S']."""
    per_version = jax.vmap(lambda mu: version_cells(mdp, pi, mu, vbar, baseline))(mus)  # [K, S, C]
    return mix_cells(per_version, mix)


def all_cells(p: Problem, clip: float = CLIP, mask_clip: float = MASK_CLIP) -> tuple[Cells, Cells]:
    """(cells of every version [K, S, A*S'], replay-mixture cells [S, K*A*S'])."""
    per_version = jax.vmap(lambda mu: version_cells(p.mdp, p.pi, mu, p.vbar, p.baselines[1], clip, mask_clip))(p.mus)
    return per_version, mix_cells(per_version, p.mix)


def evaluate_joined(fn, *cell_sets: Cells) -> list[Array]:
    """``fn`` (elementwise) on several cell sets of any shapes with ONE call, on their fields
    flattened and joined: one traced evaluation instead of one per set. Returns one output
    per set, of that set's shape."""
    flat = jax.tree_util.tree_map(lambda *xs: jnp.concatenate([x.ravel() for x in xs]), *cell_sets)
    y = fn(flat)
    out, start = [], 0
    for c in cell_sets:
        out.append(y[start:start + c.rewards.size].reshape(c.rewards.shape))
        start += c.rewards.size
    return out


def cell_moments(cells: Cells, y: Array) -> tuple[Array, Array]:
    """Exact (mean, var) [S] of y [S, C] under the cell distribution (zero-probability cells dropped)."""
    y = jnp.where(cells.prob > 0, y, 0.0)
    mean = jnp.sum(cells.prob * y, axis=-1)
    var = jnp.sum(cells.prob * jnp.square(y - mean[:, None]), axis=-1)
    return mean, var


def draw(key: Array, prob: Array, n: int) -> Array:
    """n i.i.d. cell indices from each row of prob [S, C] by inverse CDF. [S, n]"""
    cdf = jnp.cumsum(prob, axis=-1)
    cdf = cdf / cdf[:, -1:]
    u = jax.random.uniform(key, (prob.shape[0], n), prob.dtype)
    idx = jax.vmap(lambda c, x: jnp.searchsorted(c, x, side="right"))(cdf, u)
    return jnp.minimum(idx, prob.shape[1] - 1)
