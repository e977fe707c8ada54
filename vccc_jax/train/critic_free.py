"""A small critic-free trainer on the token env: GRPO and PS-PPO (issue 14; PureJaxRL style).

One update = one rollout of ``groups`` x ``group_size`` episodes (each group shares a prompt)
with the behaviour actor of each episode read from a version ring at a lag drawn from
``lag`` (``envs.lag``; "fixed:0" = on-policy), then ONE gradient step of the PPO clipped
surrogate (ratio pi / mu, so stale data is corrected as in PPO) with GRPO's group-normalised
return as every token's advantage (``estimators.related.ps_ppo``):

* ``law = "full"``: GRPO, every live policy token backpropagated.
* another cutoff law: PS-PPO. Per episode a cutoff T is drawn from the law at the prompt's
  length scale (an EMA of that prompt's episode lengths from EARLIER updates, so T is
  independent of the current actions), kept tokens get weight 1 / S(t). The kept tokens are
  PACKED into a static budget of ``capacity`` rows (``ps_ppo.capacity_for``): the learner's
  forward and backward pass run on those rows only, which is where the compute and memory
  saving comes from (a masked full batch would cost the same as GRPO). Tokens beyond the
  budget are dropped and counted (``overflow``; it biases the update, so the budget has slack).

Each trajectory's token sum is divided by its live policy length (GRPO's 1/|o|, a constant
per trajectory, so prefix sampling stays unbiased) and averaged over episodes.
Per update we report the return of the batch, the exact return J of the learner's policy
(``tabular.token.policy_values``), the fraction of live policy tokens backpropagated, the
packed rows and overflow; :func:`learner_cost` gives the learner's compiled peak memory
(``memory_analysis``) and wall time per update.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.token_env import exact_log_prob_fn, make_token_env
from vccc_jax.estimators.related import ps_ppo
from vccc_jax.tabular import token as tk
from vccc_jax.train.networks import Actor

Array = chex.Array


@dataclasses.dataclass(frozen=True)
class CFConfig:
    env: str = "token:V=16,H=12,Q=6,C=4,P=4,accept=0.3,seed=0"
    groups: int = 8  # prompts per update
    group_size: int = 8  # G rollouts per prompt
    law: str = "full"  # cutoff law: full (GRPO) | uniform | mixture:eps | geometric:q
    slack: float = 1.1  # token budget = slack x expected kept tokens at length scale H
    lag: str = "fixed:0"  # staleness (envs.lag.LagLaw)
    lr: float = 3e-3
    clip_eps: float = 0.2
    hidden: int = 32
    length_ema: float = 0.8
    seed: int = 0

    def replace(self, **changes) -> "CFConfig":
        return dataclasses.replace(self, **changes)

    def sampling(self) -> "CFConfig":
        """This config with the fields only the learner reads (law, slack, clip_eps,
        length_ema) and the seed at their defaults: two configs with the same ``sampling()``
        share init / rollout / evaluate (``CriticFree(cfg, like=...)``)."""
        return self.replace(**{k: getattr(CFConfig, k) for k in LEARNER_ONLY})


LEARNER_ONLY = ("law", "slack", "clip_eps", "length_ema", "seed")


class CFState(NamedTuple):
    params: Any
    opt_state: Any
    ring: lag_lib.VersionBuffer
    lengths: Array  # [P] per-prompt length scale (EMA of live lengths)
    step: Array


class Batch(NamedTuple):
    """Time-major rollout [H, B] (B = groups x group_size) plus per-episode fields [B]."""

    obs: Array
    actions: Array
    log_mu: Array
    policy_step: Array  # live policy (non-tool) step
    alive: Array
    returns: Array  # [B]
    prompts: Array  # [B]
    lags: Array  # [B]


class CriticFree:
    """init / rollout / learn / evaluate for one config (each jitted once). ``like``: a
    trainer whose config has the same :meth:`CFConfig.sampling` (another law, slack, ...):
    its env and compiled init / rollout / evaluate are reused (they read no learner field)."""

    def __init__(self, cfg: CFConfig, like: "CriticFree | None" = None):
        if like is not None and like.cfg.sampling() != cfg.sampling():
            raise ValueError(f"CriticFree(like=...): {like.cfg} and {cfg} differ beyond "
                             f"the learner fields {LEARNER_ONLY}")
        self.cfg = cfg
        self.env, self.env_params = (make_token_env(cfg.env) if like is None
                                     else (like.env, like.env_params))
        self.task = self.env.task
        self.law = ps_ppo.CutoffLaw.parse(cfg.law)
        self.lag = lag_lib.LagLaw.parse(cfg.lag)
        self.num_versions = self.lag.default_num_versions()
        self.batch = cfg.groups * cfg.group_size
        self.capacity = ps_ppo.capacity_for(self.law, self.task.horizon, self.batch, cfg.slack)
        self.actor = Actor(self.task.num_tokens, hidden=(cfg.hidden,))
        self.nf = self.env.num_exact_features
        self.opt = optax.adam(cfg.lr)
        self.learn = jax.jit(self._learn)
        if like is None:
            self.init, self.rollout = jax.jit(self._init), jax.jit(self._rollout)
            self.evaluate = jax.jit(self._evaluate)
        else:  # bound to a trainer whose fields they read are equal: the same functions
            self.init, self.rollout, self.evaluate = like.init, like.rollout, like.evaluate

    # ------------------------------------------------------------------ state
    def _init(self, key: Array) -> CFState:
        params = self.actor.init(key, jnp.zeros((self.nf,), jnp.float32))
        return CFState(params, self.opt.init(params), lag_lib.init_buffer(params, self.num_versions),
                       jnp.full((self.task.num_prompts,), float(self.task.horizon), jnp.float32),
                       jnp.zeros((), jnp.int32))

    # ---------------------------------------------------------------- rollout
    def _rollout(self, state: CFState, key: Array) -> Batch:
        cfg, task, B = self.cfg, self.task, self.batch
        k_prompt, k_lag, k_run = jax.random.split(key, 3)
        group_prompts = jax.random.randint(k_prompt, (cfg.groups,), 0, task.num_prompts)
        prompts = jnp.repeat(group_prompts, cfg.group_size)
        lags = self.lag.sample(k_lag, B, self.num_versions, available=lag_lib.available(state.ring),
                               step=state.step)
        mu_params = lag_lib.gather(state.ring, lags)
        _, s0 = jax.vmap(self.env.reset_env, (0, None))(jax.random.split(k_run, B), self.env_params)
        s0 = s0.replace(prompt=prompts, q=task.prompt_state[prompts])

        def step(carry, key):
            st, alive = carry
            obs = jax.vmap(self.env.observation, (0, None))(st, self.env_params)[:, : self.nf]
            logits = jax.vmap(self.actor.apply)(mu_params, obs)
            ka, ke = jax.random.split(key)
            a = jax.random.categorical(ka, logits).astype(jnp.int32)
            log_mu = jnp.take_along_axis(jax.nn.log_softmax(logits), a[:, None], -1)[:, 0]
            _, st2, r, done, info = jax.vmap(self.env.step_env, (0, 0, 0, None))(
                jax.random.split(ke, B), st, a, self.env_params)
            out = (obs, a, log_mu, alive & info["is_action"], alive, jnp.where(alive, r, 0.0))
            return (st2, alive & ~done), out

        keys = jax.random.split(jax.random.fold_in(k_run, 1), task.horizon)
        _, (obs, a, log_mu, pol, alive, r) = jax.lax.scan(step, (s0, jnp.ones((B,), bool)), keys)
        return Batch(obs, a, log_mu, pol, alive, jnp.sum(r, 0), prompts, lags)

    # ------------------------------------------------------------------ learn
    def _learn(self, state: CFState, batch: Batch, key: Array):
        cfg, H, B, C = self.cfg, self.task.horizon, self.batch, self.capacity
        adv = ps_ppo.group_advantages(batch.returns.reshape(cfg.groups, cfg.group_size)).reshape(B)
        surv = self.law.survival(state.lengths[batch.prompts], H).T  # [H, B]
        cutoffs = ps_ppo.sample_cutoffs(key, surv.T)
        n_live = jnp.maximum(jnp.sum(batch.policy_step, 0), 1)  # GRPO's 1/|o|
        w = ps_ppo.prefix_weights(cutoffs, surv, batch.policy_step) / n_live[None, :] / B
        flat_w = w.reshape(-1)
        count = jnp.sum(flat_w > 0)
        (idx,) = jnp.nonzero(flat_w > 0, size=C, fill_value=0)
        valid = jnp.arange(C) < count
        rows = lambda x: x.reshape((H * B,) + x.shape[2:])[idx]  # noqa: E731
        obs, a, log_mu = rows(batch.obs), rows(batch.actions), rows(batch.log_mu)
        w_rows = jnp.where(valid, flat_w[idx], 0.0)
        adv_rows = jnp.tile(adv, H)[idx]

        def loss_fn(params):
            logp = jax.nn.log_softmax(self.actor.apply(params, obs))
            log_pi = jnp.take_along_axis(logp, a[:, None], -1)[:, 0]
            return jnp.sum(ps_ppo.ppo_token_loss(log_pi[None], log_mu[None], adv_rows[None],
                                                 w_rows[None], clip_eps=cfg.clip_eps))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        upd, opt_state = self.opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, upd)
        P = self.task.num_prompts
        seen = jax.ops.segment_sum(jnp.ones((B,)), batch.prompts, P)
        mean_len = jax.ops.segment_sum(jnp.sum(batch.alive, 0).astype(jnp.float32), batch.prompts, P)
        lengths = jnp.where(seen > 0, cfg.length_ema * state.lengths
                            + (1 - cfg.length_ema) * mean_len / jnp.maximum(seen, 1), state.lengths)
        new = CFState(params, opt_state, lag_lib.push(state.ring, params), lengths, state.step + 1)
        live = jnp.sum(batch.policy_step)
        metrics = {"loss": loss, "return": jnp.mean(batch.returns),
                   "kept_fraction": jnp.minimum(count, C) / live, "packed_rows": jnp.asarray(C),
                   "overflow": jnp.maximum(count - C, 0) / live, "live_tokens": live,
                   "mean_lag": jnp.mean(batch.lags.astype(jnp.float32))}
        return new, metrics

    # --------------------------------------------------------------- evaluate
    def _evaluate(self, params) -> Array:
        """Exact J = mean_p V^pi(p) of the actor (tabular.token solver)."""
        fn = exact_log_prob_fn(self.env, self.actor.apply, params)
        return jnp.mean(tk.start_values(self.task, tk.policy_values(self.task, fn).v))


def learner_cost(trainer: CriticFree, state: CFState, batch: Batch, key: Array, repeats: int = 5) -> dict:
    """Compiled memory of the learner step (``memory_analysis``: temp, argument, output bytes)
    and its median wall time per call (s)."""
    compiled = jax.jit(trainer._learn).lower(state, batch, key).compile()
    mem = compiled.memory_analysis()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(state, batch, key))
        times.append(time.perf_counter() - t0)
    return {"temp_bytes": int(mem.temp_size_in_bytes), "argument_bytes": int(mem.argument_size_in_bytes),
            "output_bytes": int(mem.output_size_in_bytes), "learn_seconds": float(np.median(times))}


def train(cfg: CFConfig, num_updates: int, *, eval_every: int = 5, trainer: CriticFree | None = None,
          on_update: Callable[[int, int, dict], None] | None = None):
    """Run ``num_updates`` updates -> (final state, rows [dict per update]). Rows carry the
    metrics, ``exact_return`` every ``eval_every`` updates (NaN otherwise), the learner's
    wall time and the cumulative backpropagated rows (``compute_rows``).
    ``on_update(update, num_updates, row)`` is called after each update (progress)."""
    tr = CriticFree(cfg) if trainer is None else trainer
    key = jax.random.PRNGKey(cfg.seed)
    key, k0 = jax.random.split(key)
    state = tr.init(k0)
    rows, compute = [], 0
    for u in range(num_updates):
        key, kr, kl = jax.random.split(key, 3)
        batch = tr.rollout(state, kr)
        t0 = time.perf_counter()
        state, m = jax.block_until_ready(tr.learn(state, batch, kl))
        dt = time.perf_counter() - t0
        m = {k: float(v) for k, v in m.items()}
        compute += int(m["packed_rows"])
        exact = float(tr.evaluate(state.params)) if (u + 1) % eval_every == 0 else float("nan")
        rows.append(dict(m, update=u + 1, learn_seconds=dt, compute_rows=compute,
                         exact_return=exact))
        if on_update is not None:
            on_update(u + 1, num_updates, rows[-1])
    return state, rows
