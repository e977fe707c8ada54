"""A token-level (LLM-shaped) gymnax environment over a ``tabular.token.TokenTask`` (issue 12).

Each step appends one token to the sequence. On a policy step (tool countdown k = 0) the
token is the agent's action; on a tool-observation step (k > 0) the ENVIRONMENT draws the
token from the task's tool distribution and ignores the agent's action; ``info["is_action"]``
says which (the trainer must give such steps log rho = 0, no actor gradient, and may drop
them from the actor loss; the critic trains on them with the plain backup). The transition
itself is ``tabular.token.step_class``, so the env and the exact solver cannot disagree.

Termination vs truncation (DESIGN.md §3): the horizon H is part of the task (position is in
the state, V(H, .) = 0), so the step at position H - 1 and any EOS-type end
(``task.ends``) TERMINATE: discount 0, no bootstrap. ``params.max_steps_in_episode`` < H
produces a genuine time-limit TRUNCATION (``truncated`` True, ``terminated`` False): the
learner must bootstrap from the value of ``info["final_observation"]``, whose exact value
the solver knows. ``info["discount"]`` is the step's discount under the task's convention:
``gamma`` after a policy step, ``tool_discount`` (default 1) after a tool step, 0 on
termination (``rollout.Trajectory.discounts(gamma)`` agrees when tool_discount == gamma).

Observation (float32 [F]): one-hot prompt [P], one-hot automaton state [Q], one-hot tool
countdown [m + 1], position (one-hot [H + 1] if ``onehot_time``, and t / H), then
optionally ``last_token_features`` pairs of (cos, sin) of the last token — features the
value does NOT depend on. ``num_exact_features`` counts the features before them: an actor
that reads only ``obs[..., :num_exact_features]`` is a function of (prompt, position,
automaton state) on policy steps, so :func:`exact_log_prob_fn` gives its exact V^pi via
``tabular.token.policy_values``. Nothing in a step is V x V: the tool draw is one
``categorical`` over [V].
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from vccc_jax.envs import samplers
from vccc_jax.envs.spec import TOKEN_GAMMA, parse_token_spec
from vccc_jax.tabular import token as token_task
from vccc_jax.tabular.token import TokenTask

Array = chex.Array


@struct.dataclass
class TokenEnvState:
    prompt: Array  # int32
    q: Array  # int32 automaton state
    k: Array  # int32 tool tokens still to come (0: the policy acts)
    last_token: Array  # int32 (-1 at the start)
    ended: Array  # bool: the last step terminated
    time: Array  # int32 position t


@struct.dataclass
class TokenEnvParams:
    task: TokenTask
    max_steps_in_episode: int = 128


class TokenEnv(environment.Environment):
    """gymnax env over a TokenTask (see module docstring). Jittable and vmappable; several
    tasks of equal shapes can be vmapped through ``params``."""

    def __init__(self, task: TokenTask, *, onehot_time: bool = True, last_token_features: int = 0):
        super().__init__()
        self.task = task
        self.onehot_time = onehot_time
        self.last_token_features = last_token_features

    # ----------------------------------------------------------------- gymnax surface
    @property
    def default_params(self) -> TokenEnvParams:
        return TokenEnvParams(task=self.task, max_steps_in_episode=self.task.horizon)

    @property
    def name(self) -> str:
        return "TokenEnv"

    @property
    def num_actions(self) -> int:
        return self.task.num_tokens

    @property
    def num_exact_features(self) -> int:
        t = self.task
        return t.num_prompts + t.num_states + t.num_counters + (t.horizon + 1) * self.onehot_time + 1

    @property
    def num_features(self) -> int:
        return self.num_exact_features + 2 * self.last_token_features

    def action_space(self, params: Optional[TokenEnvParams] = None) -> spaces.Discrete:
        return spaces.Discrete(self.task.num_tokens)

    def observation_space(self, params: Optional[TokenEnvParams] = None) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (self.num_features,), jnp.float32)

    def state_space(self, params: Optional[TokenEnvParams] = None) -> spaces.Dict:
        t = self.task
        return spaces.Dict({
            "prompt": spaces.Discrete(t.num_prompts),
            "q": spaces.Discrete(t.num_states),
            "k": spaces.Discrete(t.num_counters),
            "last_token": spaces.Discrete(t.num_tokens),
            "ended": spaces.Discrete(2),
            "time": spaces.Discrete(t.horizon + 1),
        })

    def is_truncated(self, state: TokenEnvState, params: TokenEnvParams) -> Array:
        """A time-limit cut (max_steps_in_episode < H) that did not terminate."""
        return (state.time >= params.max_steps_in_episode) & ~state.ended

    def is_terminated(self, state: TokenEnvState, params: TokenEnvParams) -> Array:
        return state.ended

    # ----------------------------------------------------------------- dynamics
    def reset_env(self, key: Array, params: TokenEnvParams) -> tuple[Array, TokenEnvState]:
        task = params.task
        prompt = jax.random.randint(key, (), 0, task.num_prompts, jnp.int32)
        state = TokenEnvState(
            prompt=prompt,
            q=task.prompt_state[prompt],
            k=jnp.zeros((), jnp.int32),
            last_token=jnp.full((), -1, jnp.int32),
            ended=jnp.zeros((), bool),
            time=jnp.zeros((), jnp.int32),
        )
        return self.observation(state, params), state

    def step_env(self, key: Array, state: TokenEnvState, action: Array, params: TokenEnvParams):
        task = params.task
        is_action = state.k == 0
        tool_token = jax.random.categorical(key, task.tool_log_probs).astype(jnp.int32)
        tok = jnp.where(is_action, jnp.asarray(action, jnp.int32), tool_token)
        out = token_task.step_class(task, state.prompt, state.time, state.q, state.k, task.token_class[tok])
        new = TokenEnvState(
            prompt=state.prompt, q=out.q, k=out.k, last_token=tok, ended=out.ended,
            time=state.time + 1,
        )
        info = {
            "is_action": is_action,
            "token": tok,
            "discount": out.discount,
            "automaton_state": state.q,
            "tool_remaining": state.k,
        }
        return self.observation(new, params), new, out.reward, out.ended, info

    # ----------------------------------------------------------------- observations
    def observation(self, state: TokenEnvState, params: TokenEnvParams) -> Array:
        """Features of one state (see module docstring), float32 [F]."""
        return observation_features(
            params.task, state.prompt, state.time, state.q, state.k, state.last_token,
            onehot_time=self.onehot_time, last_token_features=self.last_token_features,
        )

    def observe(self, key, state, action, params):  # gymnax >= 1.0 hook
        del key, action
        return self.observation(state, params)


def observation_features(
    task: TokenTask, prompt, time, q, k, last_token, *, onehot_time: bool = True,
    last_token_features: int = 0,
) -> Array:
    """Observation vector(s) for (prompt, time, q, k, last_token) (broadcasting ints)."""
    f32 = jnp.float32
    parts = [
        jax.nn.one_hot(prompt, task.num_prompts, dtype=f32),
        jax.nn.one_hot(q, task.num_states, dtype=f32),
        jax.nn.one_hot(k, task.num_counters, dtype=f32),
    ]
    if onehot_time:
        parts.append(jax.nn.one_hot(time, task.horizon + 1, dtype=f32))
    parts.append((jnp.asarray(time, f32) / task.horizon)[..., None])
    if last_token_features:
        freqs = jnp.pi * (1.0 + jnp.arange(last_token_features, dtype=f32)) / 7.0
        tok = jnp.asarray(last_token, f32)[..., None]
        angle = tok * freqs.reshape((1,) * (tok.ndim - 1) + (-1,))
        parts += [jnp.cos(angle), jnp.sin(angle)]
    lead = jnp.broadcast_shapes(*(p.shape[:-1] for p in parts))
    return jnp.concatenate([jnp.broadcast_to(p, lead + p.shape[-1:]) for p in parts], axis=-1)


def policy_observations(env: TokenEnv, time) -> Array:
    """Observations of every policy state (p, q, k = 0) at position ``time``: [P, Q, F]
    (last-token features at a fixed value: an exact actor must not read them)."""
    t = env.task
    p = jnp.arange(t.num_prompts)[:, None]
    q = jnp.arange(t.num_states)[None, :]
    zeros = jnp.zeros((t.num_prompts, t.num_states), jnp.int32)
    return observation_features(
        t, p + 0 * q, zeros + time, q + 0 * p, zeros, zeros - 1,
        onehot_time=env.onehot_time, last_token_features=env.last_token_features,
    )


def exact_log_prob_fn(
    env: TokenEnv,
    apply_fn: Callable[[Any, Array], Array],
    params: Any,
    spec: Optional[samplers.SamplerSpec] = None,
) -> token_task.LogProbFn:
    """t -> log-probs [P, Q, V] of an actor network on every policy state, for the exact
    solver (``tabular.token.policy_values`` / ``expected_targets``). ``spec=None``: the
    training-side softmax (pi); a spec: that sampler's distribution (mu, deterministic
    mismatches only — "noise" has no fixed distribution). The actor sees
    ``obs[..., :env.num_exact_features]``."""
    if spec is not None and spec.needs_key:
        raise ValueError("exact log-probs need a deterministic sampler (no mismatch='noise')")
    n = env.num_exact_features

    def fn(t):
        logits = apply_fn(params, policy_observations(env, t)[..., :n])
        if spec is None:
            return jax.nn.log_softmax(logits, axis=-1)
        return samplers.sampler_log_probs(logits, spec)

    return fn


def make_token_env(spec: str = "", key: Optional[Array] = None, **overrides) -> tuple[TokenEnv, TokenEnvParams]:
    """Build (env, params) from ``"V=1024,H=128,Q=8,C=8,P=4,m=0,tools=0,gamma=1,seed=0"``
    (any subset; the ``token:`` prefix of ``--env token:...`` is stripped). Extra keys:
    tool_discount, length_penalty, format_reward, accept, eos (0/1), onehot_time (0/1),
    last_token_features, max_steps."""
    kw = {"gamma": TOKEN_GAMMA, **parse_token_spec(spec)}  # ValueError: bad key or value
    kw.update(overrides)
    seed = kw.pop("seed", 0)
    onehot_time = kw.pop("onehot_time", True)
    ltf = kw.pop("last_token_features", 0)
    max_steps = kw.pop("max_steps", None)
    task = token_task.make_task(jax.random.PRNGKey(seed) if key is None else key, **kw)
    env = TokenEnv(task, onehot_time=onehot_time, last_token_features=ltf)
    params = env.default_params
    if max_steps is not None:
        params = params.replace(max_steps_in_episode=int(max_steps))
    return env, params
