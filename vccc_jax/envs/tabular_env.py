"""Any :class:`~vccc_jax.tabular.mdp.TabularMDP` behind the gymnax API (DESIGN.md §6, issue 11).

The environment exists so that a *neural* critic trained under policy lag can be scored
against exact values: every quantity of ``tabular.exact`` (V^{pi_k}, V^{mu_i}, visitations,
replay mixtures) is available in closed form on the very MDP the env samples from
(see :mod:`vccc_jax.envs.exact_truth`).

State space. The env runs on the *effective* MDP :func:`effective_mdp`: the MDP itself
when it has no horizon, else its time-folded twin ``tabular.mdp.fold_time`` (N = H * S + 1
states: index t * S + s is "state s at time t", the last index an absorbing terminal state).
``EnvState.state`` is an index into the effective MDP; the exact oracles work on the same
indices.

Observation maps (``obs``, static), one row per effective state (``EnvParams.obs_table``
[N, d]):

``"onehot"``       one-hot of the *underlying* state s (d = S). On a finite-horizon MDP this
                   aliases time: the critic cannot see how many steps are left.
``"features"``     fixed random features of s, phi(s) ~ N(0, I_d / d), d = ``feature_dim``
                   (aliasing whenever d < S: a linear critic cannot represent every V).
``"onehot_time"``  one-hot of the effective index, i.e. of (state, time) (d = H * S + 1).
                   Finite horizons only.

The folded terminal state (index N - 1) observes as the zero vector; it is only ever seen
as a ``final_observation`` behind a discount of 0.

Termination vs truncation (DESIGN.md §3, and how ``envs.rollout.env_step`` reads them):

* ``terminated``: s' is terminal (``terminal[s'] = 1``: an absorbing state of an episodic
  MDP, or the end of a finite horizon, which ``fold_time`` makes a terminal state, since
  the exact values there are V_H = 0). The learner uses discount 0.
* ``truncated``: a cut that is not part of the MDP: the time limit
  ``max_steps_in_episode``, or a random cut with probability ``reset_prob`` after every
  step. The learner bootstraps from V(final_observation) with the discount kept.
  ``reset_prob = 1 - gamma`` makes the long-run state distribution of the env under a fixed
  policy pi equal to the normalised discounted visitation ``tabular.exact.visitation`` (the
  weighting used by ``tabular.history.replay_state_distribution``): the stationary law of
  "continue with probability gamma (1 - terminal[s']), else restart from init" solves
  d = c init + d P_pi diag(gamma (1 - terminal)).

Rewards r(s, a, s') are deterministic given the transition (``R[s, a, s']``), cast to
float32 like every gymnax reward. The env has no discount of its own: a learner must use
``gamma = EnvParams.gamma`` for the exact values to apply.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from vccc_jax.tabular.mdp import TabularMDP, fold_time

Array = chex.Array

OBS_MAPS = ("onehot", "features", "onehot_time")
# Time limit used when none is given and episodes end by random cuts / terminal states only.
NO_TIME_LIMIT = 2**30


@struct.dataclass
class EnvState(environment.EnvState):
    """time: steps since the episode began; state: int32 index into the effective MDP;
    cut: the random truncation drawn on the step that produced this state."""

    time: Array
    state: Array
    cut: Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    """The effective MDP's arrays (N effective states) plus the observation table.

    P, R [N, A, N]; init, terminal [N]; gamma []; obs_table [N, d] float32;
    max_steps_in_episode: time limit (a truncation); reset_prob: per-step random cut
    probability (a truncation).
    """

    P: Array = None
    R: Array = None
    gamma: Array = None
    init: Array = None
    terminal: Array = None
    obs_table: Array = None
    max_steps_in_episode: int = NO_TIME_LIMIT
    reset_prob: float = 0.0


def effective_mdp(mdp: TabularMDP) -> TabularMDP:
    """The infinite-horizon MDP the env samples from: ``fold_time(mdp)`` when a horizon is
    set, else ``mdp``. Single (unbatched) MDPs only."""
    if mdp.P.ndim != 3:
        raise ValueError(f"TabularEnv takes a single MDP (P [S, A, S]), got P {mdp.P.shape}")
    return fold_time(mdp) if mdp.horizon is not None else mdp


def observation_table(
    mdp: TabularMDP, obs: str = "onehot", *, feature_dim: Optional[int] = None,
    key: Optional[Array] = None,
) -> Array:
    """Observation of every effective state (module docstring): float32 [N, d].

    ``feature_dim`` and ``key`` are required for ``obs="features"``.
    """
    if obs not in OBS_MAPS:
        raise ValueError(f"obs must be one of {OBS_MAPS}, got {obs!r}")
    S, H = mdp.num_states, mdp.horizon
    n_eff = S if H is None else H * S + 1
    if obs == "onehot_time":
        if H is None:
            raise ValueError("obs='onehot_time' needs a finite-horizon MDP (mdp.horizon is None)")
        return jnp.eye(n_eff, dtype=jnp.float32)
    if obs == "onehot":
        base = jnp.eye(S, dtype=jnp.float32)
    else:
        if feature_dim is None or feature_dim < 1:
            raise ValueError(f"obs='features' needs feature_dim >= 1, got {feature_dim!r}")
        if key is None:
            raise ValueError("obs='features' needs a key for the random features")
        base = jax.random.normal(key, (S, feature_dim), jnp.float32) / jnp.sqrt(feature_dim)
    if H is None:
        return base
    return jnp.concatenate([jnp.tile(base, (H, 1)), jnp.zeros((1, base.shape[1]), jnp.float32)])


def make_params(
    mdp: TabularMDP,
    obs: str = "onehot",
    *,
    feature_dim: Optional[int] = None,
    key: Optional[Array] = None,
    max_steps_in_episode: Optional[int] = None,
    reset_prob: float = 0.0,
) -> EnvParams:
    """EnvParams of a :class:`TabularEnv` for ``mdp`` (see the module docstring).

    ``max_steps_in_episode=None``: no time limit (``NO_TIME_LIMIT``); a finite horizon
    ends episodes by termination anyway.
    """
    if not 0.0 <= reset_prob < 1.0:
        raise ValueError(f"reset_prob must lie in [0, 1), got {reset_prob}")
    if max_steps_in_episode is not None and max_steps_in_episode < 1:
        raise ValueError(f"max_steps_in_episode must be >= 1, got {max_steps_in_episode}")
    eff = effective_mdp(mdp)
    return EnvParams(
        P=eff.P, R=eff.R, gamma=jnp.asarray(eff.gamma), init=eff.init, terminal=eff.terminal,
        obs_table=observation_table(mdp, obs, feature_dim=feature_dim, key=key),
        max_steps_in_episode=NO_TIME_LIMIT if max_steps_in_episode is None else max_steps_in_episode,
        reset_prob=reset_prob,
    )


def params_mdp(params: EnvParams) -> TabularMDP:
    """The effective MDP stored in ``params`` (infinite horizon), for the exact oracles."""
    return TabularMDP(P=params.P, R=params.R, gamma=params.gamma, init=params.init,
                      terminal=params.terminal, horizon=None)


class TabularEnv(environment.Environment[EnvState, EnvParams]):
    """gymnax environment over a finite MDP; build with :func:`make_tabular_env`.

    The env object holds only static sizes (states N, actions A, observation dim d); the
    MDP lives in :class:`EnvParams`, so one env can be vmapped over a batch of params of
    the same shapes.
    """

    def __init__(self, num_states: int, num_actions: int, obs_dim: int,
                 default_params: Optional[EnvParams] = None):
        super().__init__()
        self.num_states = num_states
        self._num_actions = num_actions
        self.obs_dim = obs_dim
        self._default_params = default_params

    @property
    def default_params(self) -> EnvParams:
        if self._default_params is None:
            raise ValueError("this TabularEnv has no default params; pass params explicitly")
        return self._default_params

    def step_env(self, key, state: EnvState, action, params: EnvParams):
        k_next, k_cut = jax.random.split(key)
        action = jnp.asarray(action, jnp.int32)
        probs = params.P[state.state, action]
        next_state = jax.random.categorical(
            k_next, jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
        ).astype(jnp.int32)
        reward = params.R[state.state, action, next_state].astype(jnp.float32)
        terminated = params.terminal[next_state] > 0
        cut = jax.random.uniform(k_cut) < params.reset_prob
        new = EnvState(time=state.time + 1, state=next_state, cut=cut)
        return self.get_obs(new, params), new, reward, terminated, {}

    def reset_env(self, key, params: EnvParams):
        s0 = jax.random.categorical(
            key, jnp.where(params.init > 0, jnp.log(jnp.where(params.init > 0, params.init, 1.0)),
                           -jnp.inf)
        ).astype(jnp.int32)
        state = EnvState(time=jnp.zeros((), jnp.int32), state=s0, cut=jnp.zeros((), bool))
        return self.get_obs(state, params), state

    def get_obs(self, state: EnvState, params=None, key=None) -> Array:
        params = self.default_params if params is None else params
        return params.obs_table[state.state]

    def is_terminated(self, state: EnvState, params: EnvParams) -> Array:
        return params.terminal[state.state] > 0

    def is_truncated(self, state: EnvState, params: EnvParams) -> Array:
        """Time limit or random cut, and never on a terminal step (that is termination)."""
        cut = jnp.logical_or(state.time >= params.max_steps_in_episode, state.cut)
        return jnp.logical_and(cut, ~self.is_terminated(state, params))

    @property
    def name(self) -> str:
        return "TabularEnv"

    @property
    def num_actions(self) -> int:
        return self._num_actions

    def action_space(self, params=None) -> spaces.Discrete:
        return spaces.Discrete(self._num_actions)

    def observation_space(self, params=None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, (self.obs_dim,), jnp.float32)

    def state_space(self, params=None) -> spaces.Dict:
        return spaces.Dict({
            "time": spaces.Discrete(NO_TIME_LIMIT),
            "state": spaces.Discrete(self.num_states),
            "cut": spaces.Discrete(2),
        })


def make_tabular_env(
    mdp: TabularMDP,
    obs: str = "onehot",
    *,
    feature_dim: Optional[int] = None,
    key: Optional[Array] = None,
    max_steps_in_episode: Optional[int] = None,
    reset_prob: float = 0.0,
) -> tuple[TabularEnv, EnvParams]:
    """(env, params) for a single MDP: random / Garnet (index a batch first), chain, episodic
    with terminal states, or finite-horizon (folded). Arguments as in :func:`make_params`.

    Example::

        mdp = random_mdp(key, 1, 6, 3)[0]
        env, params = make_tabular_env(mdp, "onehot", reset_prob=1 - 0.9)
        obs, state = env.reset(key, params)
    """
    params = make_params(mdp, obs, feature_dim=feature_dim, key=key,
                         max_steps_in_episode=max_steps_in_episode, reset_prob=reset_prob)
    n, a = params.P.shape[0], params.P.shape[1]
    return TabularEnv(n, a, params.obs_table.shape[1], params), params
