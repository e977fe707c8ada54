"""Brax environments behind the gymnax API the trainers use (issue 31; optional extra
``pip install -e '.[brax]'``).

``brax:NAME[,backend=...,max_steps=...]`` (``envs.spec.parse_brax_spec``): the Brax env
``brax.envs.get_environment(NAME, backend=...)`` (``backend`` omitted: Brax's default) wrapped as
a gymnax ``Environment``: the env state carries the Brax ``State`` and a step counter, so
gymnax's ``step`` adds the time limit (``max_steps``; a truncation, not a termination) and the
auto-reset with ``final_observation``, as for every other env here. Brax's ``done`` is the
termination (e.g. ant falling over). Actions are the Brax box [-1, 1]^m.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from vccc_jax.envs.spec import parse_brax_spec


@struct.dataclass
class EnvState(environment.EnvState):
    brax_state: Any
    time: int


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = 1000


class BraxEnv(environment.Environment[EnvState, EnvParams]):
    """A Brax env (``brax.envs.Env``) as a gymnax environment."""

    def __init__(self, brax_env, max_steps: int):
        super().__init__()
        self.brax_env = brax_env
        self._default_params = EnvParams(max_steps_in_episode=max_steps)

    @property
    def default_params(self) -> EnvParams:
        return self._default_params

    def step_env(self, key, state: EnvState, action, params: EnvParams):
        new = self.brax_env.step(state.brax_state, jnp.asarray(action, jnp.float32))
        st = EnvState(brax_state=new, time=state.time + 1)
        return new.obs, st, new.reward.astype(jnp.float32), new.done > 0.5, {}

    def reset_env(self, key, params: EnvParams):
        new = self.brax_env.reset(key)
        return new.obs, EnvState(brax_state=new, time=jnp.asarray(0, jnp.int32))

    def get_obs(self, state: EnvState, params=None, key=None):
        return state.brax_state.obs

    def is_terminal(self, state: EnvState, params: EnvParams):
        return state.brax_state.done > 0.5

    @property
    def name(self) -> str:
        return f"brax:{type(self.brax_env).__name__}"

    @property
    def num_actions(self) -> int:
        return self.brax_env.action_size

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (self.brax_env.action_size,), jnp.float32)

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (self.brax_env.observation_size,), jnp.float32)


def brax_env_names() -> tuple[str, ...] | None:
    """The env names ``brax.envs.get_environment`` knows, sorted; None when Brax is not
    installed."""
    try:
        from brax import envs as brax_envs
    except ImportError:
        return None
    return tuple(sorted(brax_envs._envs))


def make_brax_env(name: str) -> tuple[BraxEnv, EnvParams]:
    """(BraxEnv, EnvParams) for a ``brax:NAME,...`` spec; ValueError (one line) when Brax is
    not installed or does not know NAME."""
    c = parse_brax_spec(name)
    try:
        from brax import envs as brax_envs
    except ImportError:
        raise ValueError(f"env {name!r} needs Brax: pip install -e '.[brax]'") from None
    kwargs = {} if c["backend"] is None else {"backend": c["backend"]}
    try:
        env = brax_envs.get_environment(c["name"], **kwargs)
    except KeyError:
        raise ValueError(f"env {name!r}: Brax has no env {c['name']!r} (known: "
                         f"{', '.join(brax_env_names())})") from None
    out = BraxEnv(env, c["max_steps"])
    return out, out.default_params
