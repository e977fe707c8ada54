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

Updates run as ONE jitted ``lax.scan``, like the main trainer (:func:`train` calls it in
chunks of ``eval_every`` updates, one host transfer per chunk), and the exact return J of
the learner's policy (``tabular.token.policy_values``, compiled once for every law) is
evaluated on device after each chunk. On a mesh (``train.sharding``: ``mesh=``) the episodes go over
"data" in whole groups (``groups`` a multiple of its size); the rollout runs the actor once
per version (``envs.acting.versioned_logits``) and each device packs its own kept tokens
into its share of the budget (``capacity`` / data rows: the same packed set as one device
unless a share overflows), so the only collective per update is the gradient all-reduce
(plus the per-prompt length statistics). Per update we report the return of the batch, the
fraction of live policy tokens backpropagated, the packed rows and overflow;
:func:`learner_cost` gives the learner's compiled peak memory (``memory_analysis``) and wall
time per update.
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
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vccc_jax.envs import acting
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.token_env import exact_log_prob_fn, make_token_env
from vccc_jax.estimators.related import ps_ppo
from vccc_jax.tabular import token as tk
from vccc_jax.train.networks import Actor
from vccc_jax.train.sharding import DATA

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
    """init / rollout / learn / evaluate for one config (each jitted once) and the whole-run
    scan ``run``. ``like``: a trainer whose config has the same :meth:`CFConfig.sampling`
    (another law, slack, ...): its env and compiled init / rollout / evaluate are reused
    (they read no learner field). ``mesh``: a ``train.sharding`` mesh; episodes go over
    its "data" axis."""

    def __init__(self, cfg: CFConfig, like: "CriticFree | None" = None, mesh=None):
        if like is not None and like.cfg.sampling() != cfg.sampling():
            raise ValueError(f"CriticFree(like=...): {like.cfg} and {cfg} differ beyond "
                             f"the learner fields {LEARNER_ONLY}")
        if like is not None and like.mesh != mesh:
            raise ValueError("CriticFree(like=...): both trainers need the same mesh")
        self.cfg = cfg
        self.mesh = mesh
        self.blocks = 1 if mesh is None else int(mesh.shape[DATA])
        if cfg.groups % self.blocks:
            raise ValueError(f"groups={cfg.groups} must be a multiple of the mesh's data axis "
                             f"({self.blocks}): every device takes whole groups")
        self.env, self.env_params = (make_token_env(cfg.env) if like is None
                                     else (like.env, like.env_params))
        self.task = self.env.task
        self.law = ps_ppo.CutoffLaw.parse(cfg.law)
        self.lag = lag_lib.LagLaw.parse(cfg.lag)
        self.num_versions = self.lag.default_num_versions()
        self.batch = cfg.groups * cfg.group_size
        # each of the `blocks` devices packs its own episodes into an equal share
        self.capacity = self.blocks * ps_ppo.capacity_for(
            self.law, self.task.horizon, self.batch // self.blocks, cfg.slack)
        self.actor = Actor(self.task.num_tokens, hidden=(cfg.hidden,))
        self.nf = self.env.num_exact_features
        self.opt = optax.adam(cfg.lr)
        self.learn = jax.jit(self._learn)
        self.run = jax.jit(self._run, static_argnums=(2,))
        if like is None:
            self.init, self.rollout = jax.jit(self._init), jax.jit(self._rollout)
            self.evaluate = jax.jit(self._evaluate)
        else:  # bound to a trainer whose fields they read are equal: the same functions
            self.init, self.rollout, self.evaluate = like.init, like.rollout, like.evaluate

    def _on(self, x, spec: P):
        """``x`` pinned to ``spec`` on the mesh (identity without one)."""
        if self.mesh is None:
            return x
        return jax.tree_util.tree_map(
            lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, spec)), x)

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
        # the actor once per version on all episodes ([K, B] rows), not once per episode
        table = self._on(acting.lag_table(state.ring), P())
        rows = table.rows(lags)
        _, s0 = jax.vmap(self.env.reset_env, (0, None))(jax.random.split(k_run, B), self.env_params)
        s0 = s0.replace(prompt=prompts, q=task.prompt_state[prompts])
        s0 = self._on(s0, P(DATA))

        def step(carry, key):
            st, alive = carry
            obs = jax.vmap(self.env.observation, (0, None))(st, self.env_params)[:, : self.nf]
            logits, _ = acting.versioned_logits(self.actor.apply, table, rows, obs)
            ka, ke = jax.random.split(key)
            a = jax.random.categorical(ka, logits).astype(jnp.int32)
            log_mu = jnp.take_along_axis(jax.nn.log_softmax(logits), a[:, None], -1)[:, 0]
            _, st2, r, done, info = jax.vmap(self.env.step_env, (0, 0, 0, None))(
                jax.random.split(ke, B), st, a, self.env_params)
            out = (obs, a, log_mu, alive & info["is_action"], alive, jnp.where(alive, r, 0.0))
            return (st2, alive & ~done), out

        keys = jax.random.split(jax.random.fold_in(k_run, 1), task.horizon)
        _, (obs, a, log_mu, pol, alive, r) = jax.lax.scan(step, (s0, jnp.ones((B,), bool)), keys)
        batch = Batch(obs, a, log_mu, pol, alive, jnp.sum(r, 0), prompts, lags)
        return batch._replace(**{f: self._on(getattr(batch, f), P(None, DATA))
                                 for f in ("obs", "actions", "log_mu", "policy_step", "alive")})

    # ------------------------------------------------------------------ learn
    def _learn(self, state: CFState, batch: Batch, key: Array):
        cfg, H, B, nb = self.cfg, self.task.horizon, self.batch, self.blocks
        C = self.capacity // nb  # rows per block (per device on a mesh)
        adv = ps_ppo.group_advantages(batch.returns.reshape(cfg.groups, cfg.group_size)).reshape(B)
        surv = self.law.survival(state.lengths[batch.prompts], H).T  # [H, B]
        cutoffs = ps_ppo.sample_cutoffs(key, surv.T)
        n_live = jnp.maximum(jnp.sum(batch.policy_step, 0), 1)  # GRPO's 1/|o|
        w = ps_ppo.prefix_weights(cutoffs, surv, batch.policy_step) / n_live[None, :] / B

        def blocks(x):  # [H, B, ...] -> [nb, H * B / nb, ...]: each block its own episodes
            x = x.reshape((H, nb, B // nb) + x.shape[2:])
            return self._on(jnp.moveaxis(x, 1, 0).reshape((nb, -1) + x.shape[3:]), P(DATA))

        def pack(w_b, obs_b, a_b, log_mu_b, adv_b):
            count = jnp.sum(w_b > 0)
            (idx,) = jnp.nonzero(w_b > 0, size=C, fill_value=0)
            valid = jnp.arange(C) < count
            return (obs_b[idx], a_b[idx], log_mu_b[idx], jnp.where(valid, w_b[idx], 0.0),
                    adv_b[idx], count)

        adv_hb = jnp.broadcast_to(adv[None, :], (H, B))
        obs, a, log_mu, w_rows, adv_rows, counts = jax.vmap(pack)(
            blocks(w), blocks(batch.obs), blocks(batch.actions), blocks(batch.log_mu),
            blocks(adv_hb))
        count = jnp.sum(counts)
        overflow = jnp.sum(jnp.maximum(counts - C, 0))

        def loss_fn(params):
            logp = jax.nn.log_softmax(self.actor.apply(params, obs))
            log_pi = jnp.take_along_axis(logp, a[..., None], -1)[..., 0]
            return jnp.sum(ps_ppo.ppo_token_loss(log_pi, log_mu, adv_rows, w_rows,
                                                 clip_eps=cfg.clip_eps))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        upd, opt_state = self.opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, upd)
        P_ = self.task.num_prompts
        seen = jax.ops.segment_sum(jnp.ones((B,)), batch.prompts, P_)
        mean_len = jax.ops.segment_sum(jnp.sum(batch.alive, 0).astype(jnp.float32), batch.prompts, P_)
        lengths = jnp.where(seen > 0, cfg.length_ema * state.lengths
                            + (1 - cfg.length_ema) * mean_len / jnp.maximum(seen, 1), state.lengths)
        new = CFState(params, opt_state, lag_lib.push(state.ring, params), lengths, state.step + 1)
        live = jnp.sum(batch.policy_step)
        metrics = {"loss": loss, "return": jnp.mean(batch.returns),
                   "kept_fraction": (count - overflow) / live,
                   "packed_rows": jnp.asarray(self.capacity),
                   "overflow": overflow / live, "live_tokens": live,
                   "mean_lag": jnp.mean(batch.lags.astype(jnp.float32))}
        return new, metrics

    # --------------------------------------------------------------- evaluate
    def _evaluate(self, params) -> Array:
        """Exact J = mean_p V^pi(p) of the actor (tabular.token solver)."""
        fn = exact_log_prob_fn(self.env, self.actor.apply, params)
        return jnp.mean(tk.start_values(self.task, tk.policy_values(self.task, fn).v))

    # -------------------------------------------------------------- whole run
    def _run(self, state: CFState, key: Array, num_updates: int):
        """``num_updates`` updates in one scan -> (state, key, metrics [num_updates])."""
        def body(carry, _):
            state, key = carry
            key, k_roll, k_learn = jax.random.split(key, 3)
            state, m = self._learn(state, self._rollout(state, k_roll), k_learn)
            return (state, key), m

        (state, key), metrics = jax.lax.scan(body, (state, key), None, length=num_updates)
        return state, key, metrics

    def place(self, tree):
        """``tree`` replicated over the mesh (as is without one)."""
        if self.mesh is None:
            return tree
        return jax.device_put(tree, NamedSharding(self.mesh, P()))


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
          on_update: Callable[[int, int, dict], None] | None = None, mesh=None):
    """Run ``num_updates`` updates -> (final state, rows [dict per update]). Rows carry the
    metrics, ``exact_return`` every ``eval_every`` updates (NaN otherwise) and the cumulative
    backpropagated rows (``compute_rows``). The updates run as :meth:`CriticFree.run` (one
    jitted scan) in chunks of ``eval_every``, J evaluated on device between chunks;
    ``on_update(update, num_updates, row)`` is called for each update after its chunk
    (progress). ``mesh``: run over a ``train.sharding`` mesh (ignored with ``trainer``)."""
    tr = CriticFree(cfg, mesh=mesh) if trainer is None else trainer
    key = jax.random.PRNGKey(cfg.seed)
    key, k0 = jax.random.split(key)
    state, key = tr.place((tr.init(k0), key))
    rows, compute, done = [], 0, 0
    while done < num_updates:
        n = min(eval_every, num_updates - done)
        state, key, m = tr.run(state, key, n)
        exact = tr.evaluate(state.params) if (done + n) % eval_every == 0 else None
        m, exact = jax.device_get((m, exact))
        for i in range(n):
            row = {k: float(v[i]) for k, v in m.items()}
            compute += int(row["packed_rows"])
            last = i == n - 1 and exact is not None
            rows.append(dict(row, update=done + i + 1, compute_rows=compute,
                             exact_return=float(exact) if last else float("nan")))
            if on_update is not None:
                on_update(done + i + 1, num_updates, rows[-1])
        done += n
    return state, rows
