"""A multi-version replay buffer for the trainer (issue 11 §2; the replay case of Eq 6, Sec 1.3).

Each rollout is kept for ``R`` more updates. A stored transition keeps what its behaviour
logged when it was collected — the action, reward, termination / truncation, the final
observation, log mu(a|s) and the whole sampling distribution log mu(.|s) — and the id of
the actor version that acted. When it is replayed at update k, the learner recomputes only
log pi_k(.|s) and the lag k - version, so every correction sees "its own logged importance
ratio rho_i = pi_k / mu_i" (write-up Sec 2.3: a replay of several behaviour policies).

The buffer is a ring of R slots, each holding one rollout [T, B, ...]; ``valid[r]`` is False
until slot r is first written (the learner masks those columns out of every loss).
:func:`combine` lays the fresh rollout and the R stored ones side by side on the env axis,
[T, B (1 + R)], so multi-step targets (GAE, V-trace) run along each stored column's own time
order unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
from flax import struct

from vccc_jax.envs.rollout import Trajectory

Array = chex.Array

# Trajectory fields a replayed transition keeps (the rest is recomputed or per-rollout).
STORED = ("obs", "action", "reward", "terminated", "truncated", "final_obs", "log_mu",
          "log_mu_all", "version", "discount", "is_action", "log_b_all")


@struct.dataclass
class ReplayBuffer:
    """data: dict of the ``STORED`` fields, leaves [R, T, B, ...] (None fields stay None);
    valid: bool [R]; head: int32 [] slot written last (-1 before the first push)."""

    data: Any
    valid: Array
    head: Array

    @property
    def size(self) -> int:
        return self.valid.shape[0]


def _stored(traj: Trajectory) -> dict:
    return {name: getattr(traj, name) for name in STORED}


def init_replay(traj_like: Trajectory, size: int) -> ReplayBuffer:
    """An empty buffer of ``size`` rollouts shaped like ``traj_like`` (arrays or
    ShapeDtypeStructs, e.g. from ``jax.eval_shape`` of a rollout)."""
    if size < 1:
        raise ValueError(f"replay size must be >= 1, got {size}")
    data = jax.tree_util.tree_map(lambda x: jnp.zeros((size,) + tuple(x.shape), x.dtype),
                                  _stored(traj_like))
    return ReplayBuffer(data=data, valid=jnp.zeros((size,), bool),
                        head=jnp.full((), -1, jnp.int32))


def push(buffer: ReplayBuffer, traj: Trajectory, version: Array) -> ReplayBuffer:
    """Store ``traj`` (overwriting the oldest slot) with absolute behaviour version ids
    ``version`` [T, B] (the trainer passes update - lag)."""
    chex.assert_equal_shape([traj.reward, version])
    head = (buffer.head + 1) % buffer.size
    new = dict(_stored(traj), version=jnp.asarray(version, jnp.int32))
    data = jax.tree_util.tree_map(
        lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), head, 0),
        buffer.data, new)
    return ReplayBuffer(data=data, valid=buffer.valid.at[head].set(True), head=head)


def _side_by_side(fresh: Array, stored: Array) -> Array:
    """fresh [T, B, ...] and stored [R, T, B, ...] -> [T, B (1 + R), ...] (fresh first)."""
    r, t, b = stored.shape[:3]
    moved = jnp.moveaxis(stored, 0, 1).reshape((t, r * b) + stored.shape[3:])
    return jnp.concatenate([fresh, moved.astype(fresh.dtype)], axis=1)


def combine(
    buffer: ReplayBuffer,
    traj: Trajectory,
    fresh_version: Array,
    current_version: Array,
    log_pi_fn: Callable[[Array], Array],
) -> tuple[Trajectory, Array]:
    """The learner's batch: the fresh rollout and every stored one, [T, B (1 + R), ...].

    Stored columns get log pi_k(.|s) = ``log_pi_fn(obs)`` [T, n, A] from the current actor and
    lag = ``current_version`` - version; their logged log mu / log mu(.|s) are kept as stored.
    Episode statistics are zero there (returns are reported from the fresh rollout only).
    Returns (trajectory, valid [T, B (1 + R)] float32 sample weights).
    """
    d = buffer.data
    t, b = traj.reward.shape
    stored_log_pi = log_pi_fn(jnp.moveaxis(d["obs"], 0, 1).reshape((t, -1) + d["obs"].shape[3:]))
    stored_log_pi = jnp.moveaxis(stored_log_pi.reshape((t, buffer.size, b) + stored_log_pi.shape[2:]), 1, 0)
    stored_lag = current_version - d["version"]

    def both(name, stored):
        return _side_by_side(getattr(traj, name), stored)

    zeros = lambda x: jnp.zeros((buffer.size,) + x.shape, x.dtype)  # noqa: E731
    out = Trajectory(
        obs=both("obs", d["obs"]),
        action=both("action", d["action"]),
        reward=both("reward", d["reward"]),
        terminated=both("terminated", d["terminated"]),
        truncated=both("truncated", d["truncated"]),
        final_obs=both("final_obs", d["final_obs"]),
        log_mu=both("log_mu", d["log_mu"]),
        log_mu_all=both("log_mu_all", d["log_mu_all"]),
        log_pi_all=both("log_pi_all", stored_log_pi),
        lag=both("lag", stored_lag),
        version=_side_by_side(jnp.asarray(fresh_version, jnp.int32), d["version"]),
        episode_return=both("episode_return", zeros(traj.episode_return)),
        episode_length=both("episode_length", zeros(traj.episode_length)),
        episode_done=both("episode_done", zeros(traj.episode_done)),
        env_state=None,
        discount=None if traj.discount is None else both("discount", d["discount"]),
        is_action=None if traj.is_action is None else both("is_action", d["is_action"]),
        log_b_all=None if traj.log_b_all is None else both("log_b_all", d["log_b_all"]),
    )
    valid = jnp.concatenate(
        [jnp.ones((t, b), jnp.float32),
         jnp.repeat(buffer.valid.astype(jnp.float32), b)[None].repeat(t, 0)], axis=1)
    return out, valid
