"""Tiny gymnax-style environments with known answers, for the envs tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class ToyState(environment.EnvState):
    time: int
    position: jax.Array


@struct.dataclass
class ToyParams(environment.EnvParams):
    max_steps_in_episode: int = 4
    stop_prob: float = 0.0


class StopOrGo(environment.Environment[ToyState, ToyParams]):
    """Two actions. Reward = action (0 or 1).

    * action 1 ("stop") terminates the episode when ``deterministic_stop``; otherwise the
      episode terminates with probability ``stop_prob`` after every step, whatever the action.
    * the time limit ``max_steps_in_episode`` truncates.
    Observation: [time, position] with position = number of 1-actions so far.

    With ``deterministic_stop=False`` and a policy with P(a=1) = p, the value of any state
    with the time limit lifted is V = p / (1 - gamma (1 - q)), q = stop_prob, and with a
    horizon H it is p (1 - (gamma (1 - q))^H) / (1 - gamma (1 - q)).
    """

    def __init__(self, deterministic_stop: bool = True):
        super().__init__()
        self.deterministic_stop = deterministic_stop

    @property
    def default_params(self) -> ToyParams:
        return ToyParams()

    def step_env(self, key, state, action, params):
        action = jnp.asarray(action, jnp.int32)
        new_state = ToyState(time=state.time + 1, position=state.position + action)
        if self.deterministic_stop:
            terminated = action == 1
        else:
            terminated = jax.random.uniform(key) < params.stop_prob
        reward = action.astype(jnp.float32)
        return self.get_obs(new_state), new_state, reward, terminated, {}

    def reset_env(self, key, params):
        state = ToyState(time=0, position=jnp.zeros((), jnp.int32))
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([jnp.asarray(state.time, jnp.float32),
                          jnp.asarray(state.position, jnp.float32)])

    def is_terminated(self, state, params):
        return jnp.zeros((), bool)

    @property
    def num_actions(self) -> int:
        return 2

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 1e6, (2,), jnp.float32)


class LegacyStopOrGo(StopOrGo):
    """The same env behind the legacy gymnax API: step returns 5 values, done merged."""

    def step_env(self, key, state, action, params):
        obs, new_state, reward, terminated, info = super().step_env(key, state, action, params)
        done = terminated | (new_state.time >= params.max_steps_in_episode)
        return obs, new_state, reward, done, info

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        key_step, key_reset = jax.random.split(key)
        obs, new_state, reward, done, info = self.step_env(key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        new_state = jax.tree_util.tree_map(lambda a, b: jax.lax.select(done, a, b), state_re,
                                           new_state)
        obs = jax.lax.select(done, obs_re, obs)
        return obs, new_state, reward, done, info
