"""A tabular critic trained by stochastic semi-gradient TD on sampled replay.

In one jitted ``lax.scan``: each update draws a batch of B transitions (or n-step
trajectories for a multi-step method), forms targets with the bootstrap Vbar (= V, or a
Polyak average), and moves each visited state towards the mean of its targets in the batch
with step size lr_t = lr * t0 / (t0 + t) (Eq 7, the semi-gradient TD update). It records
the d^{pi_K}-weighted RMS error to V^{pi_K} and the per-update target variance
mean_b (Y_b - E[Y | s_b; Vbar_t])^2 (the conditional mean is exact, from the affine map).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.registry import TargetExtras
from vccc_jax.estimators.types import Transitions
from vccc_jax.tabular.fixed_point import affine_map
from vccc_jax.tabular.mdp import next_state_discounts
from vccc_jax.tabular.replay import Replay, mixture_optimal_baseline
from vccc_jax.tabular.resolve import _as_resolved, _clip_or_inf
from vccc_jax.tabular.vtrace_moments import Trajectory

Array = chex.Array


@dataclasses.dataclass(frozen=True)
class CriticSGDConfig:
    """Stochastic semi-gradient TD on sampled replay (saved with every result row).

    enabled: train a critic at all (the fixed point is always computed).
    num_updates, batch_size: updates, and transitions (or trajectories) per update.
    learning_rate, lr_decay: lr_t = learning_rate * lr_decay / (lr_decay + t)
      (``lr_decay = 0`` means constant); each visited state moves by lr_t towards the mean
      of its targets in the batch.
    polyak: tau of the bootstrap Vbar <- (1 - tau) Vbar + tau V after each update
      (1.0: Vbar = V, no target network).
    num_checkpoints: points of the recorded error / variance curves (geometric in t).
    """

    enabled: bool = True
    num_updates: int = 1000
    batch_size: int = 32
    learning_rate: float = 0.5
    lr_decay: float = 100.0
    polyak: float = 1.0
    num_checkpoints: int = 24

    def __post_init__(self):
        for name in ("num_updates", "batch_size", "num_checkpoints"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"train {name} must be an int >= 1, got {v!r}")
        if not 0 < self.learning_rate <= 1:
            raise ValueError(f"train learning_rate must lie in (0, 1], got {self.learning_rate}")
        if not self.lr_decay >= 0:
            raise ValueError(f"train lr_decay must be >= 0, got {self.lr_decay}")
        if not 0 < self.polyak <= 1:
            raise ValueError(f"train polyak must lie in (0, 1], got {self.polyak}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def checkpoints(self) -> np.ndarray:
        """Update counts (1..num_updates) at which the curves are recorded."""
        pts = np.unique(np.round(np.geomspace(1, self.num_updates, self.num_checkpoints)))
        return pts.astype(np.int64)


def _categorical(u: Array, cdf: Array) -> Array:
    """Inverse-CDF sampling: index of the first cdf entry above u (cheap for small supports).

    u [...]; cdf [..., K] (rows of a CDF, batch dims matching u's) -> int [...].
    """
    return jnp.minimum(jnp.sum(u[..., None] >= cdf, axis=-1), cdf.shape[-1] - 1)


class TrainResult(NamedTuple):
    """values [S] at the end; err_rms [T], err_max [T]: error to V^{pi_K} after each update;
    target_var [T]: mean_b (Y_b - E[Y | s_b; Vbar_t])^2 of each update's batch."""

    values: Array
    err_rms: Array
    err_max: Array
    target_var: Array


def train_critic(
    method,
    replay: Replay,
    clip,
    options: Optional[dict],
    baseline: Array,
    key: Array,
    config: CriticSGDConfig,
    *,
    v_true: Array,
    eval_dist: Array,
    cond_mean: tuple[Array, Array],
) -> TrainResult:
    """Tabular critic trained by semi-gradient TD on the replay (one jitted lax.scan).

    ``cond_mean = (c, M)``: E_replay[Y | s; Vbar] = c + M Vbar (from :func:`fixed_point`),
    used only to measure each batch's target variance. ``v_true``/``eval_dist``: V^{pi_K} and
    the state weighting of the RMS error.
    """
    r = _as_resolved(method, options)
    mdp = replay.mdp
    S = replay.pi.shape[0]
    B = config.batch_size
    dtype = replay.pi.dtype
    clip = _clip_or_inf(r, clip)
    c_mean, M_mean = cond_mean
    version_cdf = jnp.cumsum(replay.weights)
    state_cdf = jnp.cumsum(replay.visitation, axis=-1)  # [V, S]
    mu_cdf = jnp.cumsum(replay.mus, axis=-1)  # [V, S, A]
    p_cdf = jnp.cumsum(mdp.P, axis=-1)  # [S, A, S']
    gam = next_state_discounts(mdp)
    if r.multi_step:
        n = r.n_steps
        bstar_map = None
        z_table = None
    else:
        z_table = r.z(replay, clip)
        bstar_map = (
            affine_map(lambda v: mixture_optimal_baseline(replay, v), S, dtype)
            if r.needs_bstar else None
        )

    # One uniform draw per sampled quantity, taken in a single jax.random call per update
    # (each random call site costs compile time on CPU).
    def sample_start(u_v, u_s):
        ver = _categorical(u_v, jnp.broadcast_to(version_cdf, u_v.shape + version_cdf.shape))
        s = _categorical(u_s, state_cdf[ver])
        return ver, s

    def step_env(u_a, u_p, ver, s):
        a = _categorical(u_a, mu_cdf[ver, s])
        s2 = _categorical(u_p, p_cdf[s, a])
        return a, s2

    def one_step_targets(key, vbar):
        u = jax.random.uniform(key, (4, B), dtype)
        ver, s = sample_start(u[0], u[1])
        a, s2 = step_env(u[2], u[3], ver, s)
        b_star = vbar if bstar_map is None else bstar_map[0] + bstar_map[1] @ vbar
        t = Transitions(rewards=mdp.R[s, a, s2], discounts=gam[s2], values=vbar[s],
                        next_values=vbar[s2],
                        log_rhos=replay.log_pi[s, a] - replay.log_mus[ver, s, a])
        e = TargetExtras(baseline=baseline[s], z=z_table[ver, s], b_star=b_star[s])
        return s, r.one_step(t, e, clip)

    def trajectory_targets(key, vbar):
        u = jax.random.uniform(key, (2 * n + 2, B), dtype)
        ver, s0 = sample_start(u[0], u[1])

        def walk(s, u_t):
            a, s2 = step_env(u_t[0], u_t[1], ver, s)
            out = (s, replay.log_pi[s, a] - replay.log_mus[ver, s, a], gam[s2], mdp.R[s, a, s2])
            return s2, out

        s_n, (ss, log_rhos, discounts, rewards) = jax.lax.scan(
            walk, s0, u[2:].reshape(n, 2, B)
        )
        traj = Trajectory(log_rhos=log_rhos, discounts=discounts, rewards=rewards,
                          values=vbar[ss], bootstrap_value=vbar[s_n])
        return s0, r.trajectory_target(traj, clip)

    targets = trajectory_targets if r.multi_step else one_step_targets

    def update(carry, xs):
        v, vbar = carry
        t, k = xs
        s, y = targets(k, vbar)
        y = jax.lax.stop_gradient(y)
        onehot = jax.nn.one_hot(s, S, dtype=dtype)  # [B, S]
        counts = jnp.sum(onehot, axis=0)
        sums = y @ onehot
        lr = config.learning_rate * (
            config.lr_decay / (config.lr_decay + t) if config.lr_decay > 0 else 1.0
        )
        mean_y = sums / jnp.maximum(counts, 1.0)
        v_new = jnp.where(counts > 0, v + lr * (mean_y - v), v)
        var = jnp.mean(jnp.square(y - (c_mean + M_mean @ vbar)[s]))
        vbar_new = v_new if config.polyak >= 1.0 else (1 - config.polyak) * vbar + config.polyak * v_new
        err = v_new - v_true
        out = (jnp.sqrt(jnp.sum(eval_dist * err**2)), jnp.max(jnp.abs(err)), var)
        return (v_new, vbar_new), out

    v0 = jnp.zeros((S,), dtype)
    ts = jnp.arange(config.num_updates, dtype=dtype)
    keys = jax.random.split(key, config.num_updates)
    (v, _), (err_rms, err_max, var) = jax.lax.scan(update, (v0, v0), (ts, keys))
    return TrainResult(values=v, err_rms=err_rms, err_max=err_max, target_var=var)
