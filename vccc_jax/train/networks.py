"""Separate actor and critic MLPs (flax linen): a categorical actor (logits), a Gaussian actor
([mean, log_std]) and a critic.

PureJaxRL-style initialisation: orthogonal(sqrt 2) hidden layers, orthogonal(0.01) policy
head, orthogonal(1) value head, zero biases; tanh activations, 64 units by default.
Observations with several trailing dims (MinAtar's 10x10xC grids) are flattened; boolean
observations are cast to float32.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax.linen.initializers import constant, orthogonal

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


def _torso(x, obs_ndim: int, hidden: Sequence[int], activation: str):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    x = jnp.asarray(x, jnp.float32)
    if obs_ndim != 1:
        x = x.reshape(x.shape[: x.ndim - obs_ndim] + (-1,))
    act = ACTIVATIONS[activation]
    for width in hidden:
        x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
    return x


class Actor(nn.Module):
    """Policy network: obs [..., *obs_shape] -> logits [..., num_actions]."""

    num_actions: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs):
        x = _torso(obs, self.obs_ndim, self.hidden, self.activation)
        return nn.Dense(self.num_actions, kernel_init=orthogonal(0.01),
                        bias_init=constant(0.0))(x)


class Critic(nn.Module):
    """Value network: obs [..., *obs_shape] -> V(s) [...]."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs):
        x = _torso(obs, self.obs_ndim, self.hidden, self.activation)
        return nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(x)[..., 0]


class GaussianActor(nn.Module):
    """Continuous policy network: obs [..., *obs_shape] -> [mean, log_std] [..., 2m] (the rows
    of ``envs.policy_heads.GaussianHead``).

    State-dependent mean (orthogonal(0.01) head, as the categorical actor's), state-independent
    learned log-std initialised at ``log_std_init`` (PureJaxRL's continuous PPO shape). With
    ``hidden=()`` the mean is linear in the observation, so on the LQR testbed the policy is
    exactly the linear-Gaussian family whose V^pi ``tabular.lqr`` knows in closed form.
    """

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_ndim: int = 1
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, obs):
        x = _torso(obs, self.obs_ndim, self.hidden, self.activation)
        mean = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(x)
        log_std = self.param("log_std", constant(self.log_std_init), (self.action_dim,))
        return jnp.concatenate([mean, jnp.broadcast_to(log_std, mean.shape)], axis=-1)
