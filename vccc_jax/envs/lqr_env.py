"""The LQR testbed (``tabular.lqr``) behind the gymnax API (issue 31): ``lqr:dim=2,act=1,...``.

Observation = the state s [n] (float32); action a [m] (unbounded Box); reward
-(s'Qs + a'Ra); s' = A s + B a + w. Episodes never terminate; a time limit
(``max_steps``, default 200) truncates (the trainer bootstraps from the final observation),
and the reset draws s_0 ~ N(m0, S0). The problem is ``tabular.lqr.random_lqr`` of the spec's
seed, so :func:`env_lqr` gives the exact oracles the same arrays in float64: a linear
Gaussian actor (``train.networks.GaussianActor`` with ``hidden=()``) has V^pi in closed form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from vccc_jax.envs.spec import parse_lqr_spec
from vccc_jax.tabular import lqr as lq


@struct.dataclass
class EnvState(environment.EnvState):
    s: jax.Array
    time: jax.Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    a: jax.Array = None
    b: jax.Array = None
    w_chol: jax.Array = None
    q: jax.Array = None
    r: jax.Array = None
    s0_mean: jax.Array = None
    s0_chol: jax.Array = None
    max_steps_in_episode: int = 200


class LQREnv(environment.Environment[EnvState, EnvParams]):
    """gymnax environment over one LQR problem (the arrays live in :class:`EnvParams`)."""

    def __init__(self, n: int, m: int, default_params: EnvParams):
        super().__init__()
        self.n, self.m = n, m
        self._default_params = default_params

    @property
    def default_params(self) -> EnvParams:
        return self._default_params

    def step_env(self, key, state: EnvState, action, params: EnvParams):
        a = jnp.asarray(action, jnp.float32).reshape(self.m)
        s = state.s
        reward = -(s @ params.q @ s + a @ params.r @ a)
        s_next = params.a @ s + params.b @ a + params.w_chol @ jax.random.normal(key, (self.n,))
        new = EnvState(s=s_next, time=state.time + 1)
        return self.get_obs(new, params), new, reward, jnp.asarray(False), {}

    def reset_env(self, key, params: EnvParams):
        s0 = params.s0_mean + params.s0_chol @ jax.random.normal(key, (self.n,))
        st = EnvState(s=s0, time=jnp.asarray(0, jnp.int32))
        return self.get_obs(st, params), st

    def get_obs(self, state: EnvState, params=None, key=None):
        return state.s.astype(jnp.float32)

    def is_terminal(self, state: EnvState, params: EnvParams):
        return jnp.asarray(False)   # no terminal states; the time limit truncates

    @property
    def name(self) -> str:
        return "LQR"

    @property
    def num_actions(self) -> int:
        return self.m

    def action_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (self.m,), jnp.float32)

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (self.n,), jnp.float32)


def env_lqr(name: str) -> lq.LQR:
    """The exact problem of an ``lqr:`` spec (float64 when x64 is on). Always drawn in float32
    and then cast: a draw under x64 is a *different* problem from the one the env (float32)
    simulates."""
    c = parse_lqr_spec(name)
    with jax.enable_x64(False):
        p = lq.random_lqr(jax.random.PRNGKey(c["seed"]), c["dim"], c["act"], gamma=c["gamma"],
                          radius=c["radius"])
        p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), p)
    return jax.tree_util.tree_map(jnp.asarray, p._replace(gamma=np.float64(c["gamma"])))


def make_lqr_env(name: str) -> tuple[LQREnv, EnvParams]:
    """(LQREnv, EnvParams) for an ``lqr:dim=...,act=...,gamma=...,seed=...,radius=...,
    max_steps=...`` spec."""
    c = parse_lqr_spec(name)
    p = env_lqr(name)
    f32 = lambda x: jnp.asarray(np.asarray(x), jnp.float32)  # noqa: E731
    params = EnvParams(a=f32(p.a), b=f32(p.b), w_chol=f32(np.linalg.cholesky(np.asarray(p.w))),
                       q=f32(p.q), r=f32(p.r), s0_mean=f32(p.s0_mean),
                       s0_chol=f32(np.linalg.cholesky(np.asarray(p.s0_cov))),
                       max_steps_in_episode=c["max_steps"])
    return LQREnv(c["dim"], c["act"], params), params
