"""Exact expected actor update on the token env vs Eq 12, in the actor's parameter space
(issue 12; the token twin of :func:`vccc_jax.envs.exact_truth.actor_update_truth`).

The one-step TD actor (Sec 5.1) on a ``tabular.token.TokenTask`` uses, at a policy state
s = (t, p, q, k = 0), the advantage A_phi(s, a, s') = r + d V_phi(s') - V_phi(s), the weight
w_l(s, a) = ``importance_weights(log pi - log mu_l, kind, clip)`` (0 where mu_l = 0) and the
score u = grad_theta log pi_theta(a|s) (temperature 1). Tool-observation states (k > 0) are
not actions: no ratio, no actor gradient, so they contribute nothing here (the critic values
of tool states still enter through the backup of the policy token that triggers the tool).

With state weights D(s) at policy states and a version posterior q_l(s), its expected update
is (c = 1 when ``centred``, Eq 13; else 0)

    expected = sum_s D(s) sum_l q_l(s) E_{mu_l}[A_phi(s, a) (w_l(s, a) u(s, a) - c m_{w_l}(s))],
    eq12     = sum_s D(s) E_pi[(Q^pi(s, a) - V^pi(s)) u(s, a)]          (Eq 12, same D),

where E[A_phi | s, a] = ``class_backup(task, V_phi[t + 1], t)`` - V_phi(s) depends on the
token only through its class and m_w(s) = E_mu[w u | s]. With ``kind="ratio"`` and
V_phi = V^pi the two are equal for any D, any posterior and any behaviour versions that
cover pi's support (the Sec 5.1 identity), with or without centring (m_w = E_pi[u] = 0).

Both are written as coefficient tables coeff [H, P, Q, V] with update = sum coeff(s, a)
u(s, a) (:func:`update_coefficients`, one position at a time under ``lax.map``: O(P Q V) per
position, never V x V) and turned into parameter-space vectors by ONE surrogate gradient
``exact_truth._surrogate_grad`` on the policy-state observation grid (:func:`policy_obs_grid`).
Compare them with ``exact_truth.gradient_bias``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import token_env as token_env_lib
from vccc_jax.estimators import actor_registry
from vccc_jax.estimators.importance import WeightKind
from vccc_jax.tabular import actor_paths, exact_actor
from vccc_jax.tabular import token as token_task
from vccc_jax.tabular.token import TokenTask

Array = chex.Array
ApplyFn = Callable[[Any, Array], Array]
LogMusFn = Callable[[Array], Array]  # position t -> behaviour log-probs [L, P, Q, V]

__all__ = ["Coefficients", "TokenActorTruth", "policy_obs_grid", "update_coefficients",
           "actor_update_truth", "policy_occupancy", "token_paths", "SequenceCoefficients",
           "sequence_update_coefficients", "SequenceTruth", "sequence_update_truth"]


class Coefficients(NamedTuple):
    """Per-token coefficients [H, P, Q, V] of the two updates (update = sum coeff u)."""

    expected: Array
    eq12: Array


class TokenActorTruth(NamedTuple):
    """Exact actor updates in parameter space (pytrees shaped like the actor params):
    ``expected`` (the one-step TD actor under the stated D, posterior and versions) and
    ``eq12`` (its Eq 12 reference under the same D)."""

    expected: Any
    eq12: Any


def policy_obs_grid(env: token_env_lib.TokenEnv) -> Array:
    """Observations of every policy state (t < H, p, q, k = 0): [H, P, Q, F]
    (``token_env.policy_observations`` stacked over positions)."""
    return jax.vmap(lambda t: token_env_lib.policy_observations(env, t))(
        jnp.arange(env.task.horizon, dtype=jnp.int32))


def _critic_table(task: TokenTask, values: Array, dtype) -> Array:
    """Critic values [H, P, Q, K] or [H+1, P, Q, K] -> [H+1, P, Q, K] (V(H, .) = 0: the
    step at position H - 1 terminates, so row H only ever meets discount 0)."""
    H, P, Q, K = task.horizon, task.num_prompts, task.num_states, task.num_counters
    if values.shape == (H, P, Q, K):
        values = jnp.concatenate([values, jnp.zeros((1, P, Q, K), values.dtype)], axis=0)
    elif values.shape != (H + 1, P, Q, K):
        raise ValueError(f"critic_values must have shape [H, P, Q, K] = {(H, P, Q, K)} "
                         f"(or [H+1, P, Q, K]), got {values.shape}")
    return values.astype(dtype)


def _check_tables(task: TokenTask, posterior: Array, state_weights: Array) -> None:
    H, P, Q = task.horizon, task.num_prompts, task.num_states
    if posterior.ndim != 4 or posterior.shape[1:] != (H, P, Q):
        raise ValueError(f"posterior must have shape [L, H, P, Q] = [L, {H}, {P}, {Q}], "
                         f"got {posterior.shape}")
    if state_weights.shape != (H, P, Q):
        raise ValueError(f"state_weights must have shape [H, P, Q] = {(H, P, Q)} (policy "
                         f"states), got {state_weights.shape}")


def update_coefficients(
    task: TokenTask,
    log_pi_fn: token_task.LogProbFn,
    log_mus_fn: LogMusFn,
    posterior: Array,
    state_weights: Array,
    critic_values: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    centred: bool = False,
    pi_values: Optional[token_task.Values] = None,
    params: Optional[dict] = None,
) -> Coefficients:
    """Coefficient tables of the expected one-step TD actor update and of Eq 12 (module
    docstring), [H, P, Q, V] each.

    Args:
      task: the token task.
      log_pi_fn: t -> log pi(.|t, p, q) [P, Q, V] (the learner's softmax).
      log_mus_fn: t -> behaviour log-probs of every version [L, P, Q, V] (-inf off support).
      posterior: [L, H, P, Q] version posterior q_l(s) at the policy states.
      state_weights: [H, P, Q] D(s) at the policy states.
      critic_values: V_phi [H, P, Q, K] (or [H+1, P, Q, K]; row H is never used).
      kind / clip / centred: the actor's weight (Eq 10 kinds) and Eq 13 centring (static).
      pi_values: ``token.policy_values(task, log_pi_fn)`` if already computed.
      params: the row's parameters when ``kind`` is any token- or batch-level row of
        ``estimators.actor_registry`` (issue 21; version l has lag l for AReaL's staleness
        cap; M2PO's mask is its population limit over atoms (t, p, q, l, a) of probability
        D q_l mu_l(a), found in one first pass over the positions). Sequence-level rows
        have no per-state form: :func:`sequence_update_coefficients` (short horizons).
    """
    _check_tables(task, posterior, state_weights)
    dtype = task.gamma.dtype
    vbar = _critic_table(task, critic_values, dtype)
    vals = token_task.policy_values(task, log_pi_fn) if pi_values is None else pi_values
    posterior, state_weights = posterior.astype(dtype), state_weights.astype(dtype)
    row = actor_registry.get_actor_correction(kind)
    L = posterior.shape[0]
    lags = jnp.arange(L).reshape(L, 1, 1, 1)
    threshold = None
    if row.level == "batch":
        def atoms(t):
            lms = log_mus_fn(t)
            probs = (state_weights[t][None] * posterior[:, t])[..., None] * jnp.exp(lms)
            return log_pi_fn(t)[None] - lms, probs

        lr_all, p_all = jax.lax.map(atoms, jnp.arange(task.horizon, dtype=jnp.int32))
        threshold = exact_actor.population_threshold(row.name, _merge(row, clip, params),
                                                     lr_all, p_all)

    def one(t):
        lp = log_pi_fn(t)  # [P, Q, V]
        lms = log_mus_fn(t)  # [L, P, Q, V]
        chex.assert_rank(lms, 4)
        chex.assert_equal_shape([lp, lms[0]])
        adv = token_task.token_view(task, token_task.class_backup(task, vbar[t + 1], t)
                                    - vbar[t, :, :, 0, None])  # E[A_phi | s, a]  [P, Q, V]
        coeff = et.td_actor_coefficients(lp[None], lms, adv[None], kind=row.name, clip=clip,
                                         centred=centred, params=params, lags=lags,
                                         threshold=threshold)  # [L, P, Q, V]
        d = state_weights[t][..., None]  # [P, Q, 1]
        expected = d * jnp.sum(posterior[:, t][..., None] * coeff, axis=0)
        q_minus_v = token_task.token_view(task, vals.q_class[t] - vals.v[t, :, :, 0, None])
        return expected, d * jnp.exp(lp) * q_minus_v  # pi (Q^pi - V^pi): sum_a pi u = 0

    expected, eq12 = jax.lax.map(one, jnp.arange(task.horizon, dtype=jnp.int32))
    return Coefficients(expected=expected, eq12=eq12)


def actor_update_truth(
    apply_fn: ApplyFn,
    params: Any,
    obs_grid: Array,
    task: TokenTask,
    log_mus_fn: LogMusFn,
    posterior: Array,
    state_weights: Array,
    critic_values: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    centred: bool = False,
    pi_values: Optional[token_task.Values] = None,
    correction_params: Optional[dict] = None,
) -> TokenActorTruth:
    """Exact expected actor update vs Eq 12 (Sec 5.1, 5.2) for actor ``params`` on the token
    task (module docstring). pi = softmax(apply_fn(params, obs_grid[t])) with ``obs_grid``
    [H, P, Q, F] the policy-state observations (:func:`policy_obs_grid`); the other
    arguments as in :func:`update_coefficients`. ``apply_fn`` / ``kind`` / ``clip`` /
    ``centred`` static."""
    H, P, Q = task.horizon, task.num_prompts, task.num_states
    if obs_grid.shape[:3] != (H, P, Q):
        raise ValueError(f"obs_grid must have shape [H, P, Q, ...] = [{H}, {P}, {Q}, ...], "
                         f"got {obs_grid.shape}")

    def log_pi_fn(t):
        return jax.nn.log_softmax(apply_fn(params, obs_grid[t]), axis=-1)

    coeff = update_coefficients(task, log_pi_fn, log_mus_fn, posterior, state_weights,
                                critic_values, kind=kind, clip=clip, centred=centred,
                                pi_values=pi_values, params=correction_params)
    return TokenActorTruth(
        expected=et._surrogate_grad(apply_fn, params, obs_grid, coeff.expected),
        eq12=et._surrogate_grad(apply_fn, params, obs_grid, coeff.eq12),
    )


def _merge(row, clip, params) -> dict:
    merged = {"clip": clip} if clip is not None and "clip" in row.param_names else {}
    merged.update(params or {})
    return merged


# ------------------------------------------- every row by path enumeration (issue 21)


def token_paths(task: TokenTask, log_pi_fn: token_task.LogProbFn, log_mus_fn: LogMusFn
                ) -> actor_paths.Paths:
    """All P V^H token sequences of the task (``tabular.actor_paths.Paths``): prompt p
    uniform, then per position a policy token (pi / mu_l) at k = 0, an environment tool token
    (``tool_log_probs``) at k > 0, token 0 with probability 1 after the episode ended (so
    every ended path appears once with its probability). policy_id = (t P + p) Q + q;
    critic index ((t P + p) Q + q) K + k of a table [H + 1, P, Q, K]. One ``lax.scan`` over
    the H positions (``log_pi_fn`` / ``log_mus_fn`` see a traced t). Only for short horizons
    and small vocabularies (P V^H paths)."""
    H, P, Q, V, K = (task.horizon, task.num_prompts, task.num_states, task.num_tokens,
                     task.num_counters)
    dtype = task.gamma.dtype
    p, digits = actor_paths.path_digits(P * V ** H, V, H)
    L = log_mus_fn(jnp.zeros((), jnp.int32)).shape[0]
    tool_p = jnp.exp(task.tool_log_probs)

    def step(carry, xs):
        q, k, alive, p_pi, p_mu = carry
        t, tok = xs
        lp = log_pi_fn(t)[p, q, tok]
        lms = log_mus_fn(t)[:, p, q, tok]  # [L, N]
        act = alive & (k == 0)
        other = jnp.where(alive & (k > 0), tool_p[tok], (tok == 0).astype(dtype))
        out = token_task.step_class(task, p, t, q, k, task.token_class[tok])
        rec = dict(pid=(t * P + p) * Q + q, a=tok, alive=alive, act=act,
                   lp=jnp.where(act, lp, 0.0), lm=jnp.where(act[None], lms, 0.0),
                   r=jnp.where(alive, out.reward, 0.0), d=jnp.where(alive, out.discount, 0.0),
                   vid=((t * P + p) * Q + q) * K + k,
                   nvid=(((t + 1) * P + p) * Q + out.q) * K + out.k)
        carry = (jnp.where(alive, out.q, q), jnp.where(alive, out.k, k), alive & ~out.ended,
                 p_pi * jnp.where(act, jnp.exp(lp), other),
                 p_mu * jnp.where(act[None], jnp.exp(lms), other[None]))
        return carry, rec

    n = p.shape[0]
    init = (task.prompt_state[p], jnp.zeros((n,), jnp.int32), jnp.ones((n,), bool),
            jnp.full((n,), 1.0 / P, dtype), jnp.full((L, n), 1.0 / P, dtype))
    (_, _, _, p_pi, p_mu), o = jax.lax.scan(step, init, (jnp.arange(H, dtype=jnp.int32), digits))
    return actor_paths.Paths(
        policy_id=o["pid"].astype(jnp.int32), action=o["a"].astype(jnp.int32),
        alive=o["alive"], is_action=o["act"], log_pi=o["lp"], log_mus=jnp.moveaxis(o["lm"], 0, 1),
        reward=o["r"].astype(dtype), discount=o["d"].astype(dtype),
        value_id=o["vid"].astype(jnp.int32), next_value_id=o["nvid"].astype(jnp.int32),
        prob_pi=p_pi, prob_mus=p_mu)


def policy_occupancy(task: TokenTask, log_pi_fn: token_task.LogProbFn) -> Array:
    """D^pi(t, p, q, k): the probability that an episode of pi is running at state (t, p, q, k)
    (prompt uniform), [H, P, Q, K], by one forward pass over the positions (class-level, no
    V x V). With it, sum_s D^pi(s) E_pi[A u | s] is E_pi[sum_t A_t u_t] at any horizon: pass
    D^pi[..., 0] as ``state_weights``, pi as the only behaviour and posterior 1 to
    :func:`update_coefficients` (sequence IS with c -> inf has exactly this update)."""
    H, P, Q, K = task.horizon, task.num_prompts, task.num_states, task.num_counters
    dtype = task.gamma.dtype
    start = jnp.zeros((P, Q, K), dtype).at[jnp.arange(P), task.prompt_state, 0].add(1.0 / P)
    tool_c = token_task.tool_class_probs(task)

    def fwd(m, t):
        g = token_task._grid(task, t)  # next (q, k) and termination per [P, Q, K, C]
        pol = token_task._class_sum(jnp.exp(log_pi_fn(t)), task)  # [P, Q, C]
        probs = jnp.concatenate([pol[:, :, None], jnp.broadcast_to(tool_c, (P, Q, K - 1,
                                                                            tool_c.shape[0]))], 2)
        flow = m[..., None] * probs * (1.0 - g.ended.astype(dtype))  # [P, Q, K, C]
        idx = (jnp.arange(P)[:, None, None, None] * Q + g.q) * K + g.k
        nxt = jax.ops.segment_sum(flow.reshape(-1), idx.reshape(-1), num_segments=P * Q * K)
        return nxt.reshape(P, Q, K), m

    _, occ = jax.lax.scan(fwd, start, jnp.arange(H, dtype=jnp.int32))
    return occ


class SequenceCoefficients(NamedTuple):
    """Coefficient tables [H, P, Q, V] (update = sum coeff u) by path enumeration:
    ``expected`` the row's update under the version mixture; ``policy_gradient``
    E_pi[sum_t (Q^pi - V^pi) u] (pi's own path law); ``eq12`` sum_s D(s) E_pi[(Q^pi - V^pi)
    u | s] with D = ``occupancy`` [H, P, Q], the behaviour mixture's expected number of
    visits of each policy state (the D under which token-level rows are compared)."""

    expected: Array
    policy_gradient: Array
    eq12: Array
    occupancy: Array


def sequence_update_coefficients(
    task: TokenTask,
    log_pi_fn: token_task.LogProbFn,
    log_mus_fn: LogMusFn,
    version_weights: Array,
    critic_values: Array,
    *,
    correction: str,
    params: Optional[dict] = None,
    lam: float = 0.0,
    pi_values: Optional[token_task.Values] = None,
    paths: Optional[actor_paths.Paths] = None,
) -> SequenceCoefficients:
    """Exact expected update of ANY actor-correction row (sequence-level included) on a
    short-horizon token task by enumerating its P V^H sequences (:func:`token_paths`; each
    sequence comes from version l with probability ``version_weights`` [L]); GAE(``lam``)
    advantages of ``critic_values`` ([H(+1), P, Q, K]) along each sequence (lam = 0: the
    one-step TD actor of :func:`update_coefficients`, which it equals for token rows with
    D = ``occupancy`` and the posterior of the mixture). No exact answer at H >= 32 for
    rows that are nonlinear in the sequence ratio (seq_tis, seq_mis, gspo, topr): the law of
    R = prod_t rho_t is not finite-state."""
    H, P, Q, V = task.horizon, task.num_prompts, task.num_states, task.num_tokens
    dtype = task.gamma.dtype
    vals = token_task.policy_values(task, log_pi_fn) if pi_values is None else pi_values
    paths = token_paths(task, log_pi_fn, log_mus_fn) if paths is None else paths
    version_weights = jnp.asarray(version_weights, dtype)
    critic = _critic_table(task, critic_values, dtype).reshape(-1)
    adv = actor_paths.path_advantages(paths, critic, lam)
    ids = H * P * Q
    expected = actor_paths.expected_update(paths, adv, version_weights, correction=correction,
                                           params=params, num_ids=ids, num_actions=V)
    adv_pi = actor_paths.path_advantages(paths, vals.v.reshape(-1), 0.0)
    pg = actor_paths.pi_update(paths, adv_pi, num_ids=ids, num_actions=V)
    occ = actor_paths.occupancy(paths, version_weights, ids).reshape(H, P, Q)

    def eq12_at(t):
        q_minus_v = token_task.token_view(task, vals.q_class[t] - vals.v[t, :, :, 0, None])
        return occ[t][..., None] * jnp.exp(log_pi_fn(t)) * q_minus_v

    eq12 = jax.lax.map(eq12_at, jnp.arange(H, dtype=jnp.int32))
    shape = (H, P, Q, V)
    return SequenceCoefficients(expected=expected.reshape(shape), policy_gradient=pg.reshape(shape),
                                eq12=eq12, occupancy=occ)


class SequenceTruth(NamedTuple):
    """:class:`SequenceCoefficients` in the actor's parameter space (pytrees)."""

    expected: Any
    policy_gradient: Any
    eq12: Any


def sequence_update_truth(
    apply_fn: ApplyFn,
    params: Any,
    obs_grid: Array,
    task: TokenTask,
    log_mus_fn: LogMusFn,
    version_weights: Array,
    critic_values: Array,
    *,
    correction: str,
    correction_params: Optional[dict] = None,
    lam: float = 0.0,
) -> SequenceTruth:
    """:func:`sequence_update_coefficients` for actor ``params`` (pi = softmax(apply_fn(params,
    obs_grid[t]))), turned into parameter-space updates by one surrogate gradient each."""

    def log_pi_fn(t):
        return jax.nn.log_softmax(apply_fn(params, obs_grid[t]), axis=-1)

    c = sequence_update_coefficients(task, log_pi_fn, log_mus_fn, version_weights,
                                     critic_values, correction=correction,
                                     params=correction_params, lam=lam)
    grad = lambda x: et._surrogate_grad(apply_fn, params, obs_grid, x)  # noqa: E731
    return SequenceTruth(expected=grad(c.expected), policy_gradient=grad(c.policy_gradient),
                         eq12=grad(c.eq12))
