"""A token-level (LLM-shaped) task with exact values, and its exact solver (issue 12).

The task (:class:`TokenTask`) is a finite-horizon MDP whose actions are tokens of a
vocabulary of size V, whose reward is a verifier on the finished sequence, and whose
exact values are cheap because the *value-relevant* state is small:

* tokens map to C token classes (``token_class`` [V]); a deterministic automaton reads
  classes: ``transition`` [Q, C] -> Q. Nothing is ever V x V or Q x V x V: per position the
  solver touches [P, Q, V] log-probabilities once (a segment sum over classes) and
  [P, Q, K, C] class tables otherwise.
* prompts p (P of them) fix the initial automaton state ``prompt_state[p]`` and the
  prompt-dependent verifier ``accept_reward[p, q]`` paid when the episode ends in state q.
* optional per-step format reward ``step_reward[q']`` (on entering q'), a per-policy-token
  ``length_penalty`` and an end-of-sequence structure ``ends[q, c]`` (class c read in state q
  ends the episode, e.g. an EOS class).
* tool calls: when a *policy* token moves the automaton into a state with
  ``tool_state[q']``, the ENVIRONMENT appends ``tool_length`` = m observation tokens drawn
  from its own distribution ``tool_log_probs`` [V]; they move the automaton like any token
  but are not actions. The state therefore carries a countdown k in {0..m} of tool tokens
  still to come (k = 0: the policy acts). Tool tokens never re-trigger a tool call.

State at position t: (p, t, q, k); every table below is [H(+1), P, Q, K] with K = m + 1.
A policy is a function of (prompt, position, automaton state) only: ``log_pi_fn(t)`` returns
normalised log-probabilities [P, Q, V] at position t (``-inf`` off the support), so V^pi,
Q^pi (per class: Q depends on the token only through its class), V^mu of any behaviour
sampler and the exact conditional mean of every one-step critic target are computed by
backward induction over (t, q, k).

Time, termination and the tool-step convention (documented once, used by the env):
* the episode terminates when ``ends[q, c]`` fires or after the step at position H - 1
  (the horizon is part of the task: position is in the state, V(H, .) = 0, no bootstrap).
  Reward on termination includes ``accept_reward[p, q_final]``.
* discount of a policy step: ``gamma``; of a tool step: ``tool_discount`` (default 1), both
  0 on termination. Tool steps get NO importance ratio (log rho = 0, weight 1, no actor
  gradient): their one-step target is the plain environment backup r + d Vbar(s'), whose
  conditional mean is the exact backup of the tool state whatever the policy; the critic is
  trained on tool states too, and a multi-step (V-trace) trace passes across them with c = 1
  ("the critic bootstraps across tool steps"). With tool_discount = 1 tool tokens do not
  count as time for discounting (the usual LLM convention).

Every target expectation takes the library estimator itself (``estimators.critic_targets``)
evaluated on every (state, token) of a position and weighted by mu — the "value" — and the
closed forms of the write-up are computed separately from class aggregates, so the verify
package can report (value, closed form) pairs: :func:`vccc_identity` (Eq 5 with tool steps),
:func:`support_violation_bias` (Eq 8 / Eq 10 under top-k / top-p, Sec 7) and
:func:`raw_logits_bias` (the raw-logits negative control, Sec 7).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from vccc_jax.estimators import critic_targets
from vccc_jax.estimators.importance import importance_weights

Array = chex.Array
LogProbFn = Callable[[Array], Array]  # position t (int scalar) -> log-probs [P, Q, V]


@struct.dataclass
class TokenTask:
    """The token task (see module docstring). Float leaves share one dtype."""

    token_class: Array  # int32 [V] -> [0, C)
    transition: Array  # int32 [Q, C] -> [0, Q)
    ends: Array  # bool [Q, C]: reading class c in state q terminates
    accept_reward: Array  # float [P, Q]: verifier reward at the final automaton state
    step_reward: Array  # float [Q]: format reward for entering q'
    length_penalty: Array  # float []: subtracted on every policy token
    tool_state: Array  # bool [Q]: entering q' by a policy token triggers m tool tokens
    tool_log_probs: Array  # float [V]: the environment's observation-token distribution
    prompt_state: Array  # int32 [P]: initial automaton state of each prompt
    gamma: Array  # float []: discount of a policy step
    tool_discount: Array  # float []: discount of a tool step
    horizon: int = struct.field(pytree_node=False, default=128)
    tool_length: int = struct.field(pytree_node=False, default=0)

    @property
    def num_tokens(self) -> int:
        return self.token_class.shape[-1]

    @property
    def num_classes(self) -> int:
        return self.transition.shape[-1]

    @property
    def num_states(self) -> int:
        return self.transition.shape[-2]

    @property
    def num_prompts(self) -> int:
        return self.prompt_state.shape[-1]

    @property
    def num_counters(self) -> int:
        """K = m + 1 values of the tool countdown."""
        return self.tool_length + 1


def make_task(
    key: Array,
    *,
    num_tokens: int = 1024,
    horizon: int = 128,
    num_states: int = 8,
    num_classes: int = 8,
    num_prompts: int = 4,
    tool_length: int = 0,
    num_tool_states: int = 0,
    eos: bool = True,
    accept_density: float = 0.3,
    format_reward: float = 0.0,
    length_penalty: float = 0.0,
    gamma: float = 1.0,
    tool_discount: float = 1.0,
    dtype=None,
) -> TokenTask:
    """A random task: random class map (every class non-empty), random automaton, random
    accepting sets per prompt (density ``accept_density``; at least one accepting state),
    class 0 as EOS (stays in q and ends) if ``eos``, ``num_tool_states`` random tool states
    and a Dirichlet(1) tool-token distribution over the non-EOS tokens.
    ``format_reward`` > 0 rewards entering states 0..Q/2-1 on every step."""
    if num_classes > num_tokens:
        raise ValueError(f"num_classes={num_classes} must be <= num_tokens={num_tokens}")
    if num_tool_states > num_states:
        raise ValueError(f"num_tool_states={num_tool_states} must be <= num_states={num_states}")
    if tool_length < 0 or horizon < 1:
        raise ValueError(f"need tool_length >= 0 and horizon >= 1, got {tool_length}, {horizon}")
    dtype = jnp.result_type(float) if dtype is None else dtype
    k = jax.random.split(key, 7)
    token_class = (jax.random.permutation(k[0], num_tokens) % num_classes).astype(jnp.int32)
    transition = jax.random.randint(k[1], (num_states, num_classes), 0, num_states, jnp.int32)
    ends = jnp.zeros((num_states, num_classes), bool)
    if eos:
        transition = transition.at[:, 0].set(jnp.arange(num_states, dtype=jnp.int32))
        ends = ends.at[:, 0].set(True)
    accept = jax.random.bernoulli(k[2], accept_density, (num_prompts, num_states))
    accept = accept.at[jnp.arange(num_prompts), jax.random.randint(
        k[3], (num_prompts,), 0, num_states)].set(True)
    tool_state = jnp.zeros((num_states,), bool)
    if num_tool_states and tool_length:
        tool_state = tool_state.at[jax.random.permutation(k[4], num_states)[:num_tool_states]].set(True)
    tool_logits = jnp.log(jax.random.dirichlet(k[5], jnp.ones((num_tokens,), dtype)))
    if eos:
        tool_logits = jnp.where(token_class == 0, -jnp.inf, tool_logits)
    step_reward = jnp.where(jnp.arange(num_states) < num_states // 2, format_reward, 0.0)
    return TokenTask(
        token_class=token_class,
        transition=transition,
        ends=ends,
        accept_reward=accept.astype(dtype),
        step_reward=step_reward.astype(dtype),
        length_penalty=jnp.asarray(length_penalty, dtype),
        tool_state=tool_state,
        tool_log_probs=jax.nn.log_softmax(tool_logits.astype(dtype)),
        prompt_state=jax.random.randint(k[6], (num_prompts,), 0, num_states, jnp.int32),
        gamma=jnp.asarray(gamma, dtype),
        tool_discount=jnp.asarray(tool_discount, dtype),
        horizon=horizon,
        tool_length=tool_length,
    )


class Step(NamedTuple):
    """Outcome of reading one token class: next automaton state, next countdown, reward,
    termination and the discount d (gamma / tool_discount, 0 on termination)."""

    q: Array
    k: Array
    reward: Array
    ended: Array
    discount: Array


def step_class(task: TokenTask, prompt, time, q, k, c) -> Step:
    """Elementwise transition of state (prompt, time, q, k) on token class c (broadcasts).

    k == 0: a policy token (length penalty, may trigger a tool call); k > 0: a tool token
    (countdown k - 1). The env (envs/token_env.py) and the solver both use this function.
    """
    q2 = task.transition[q, c]
    is_action = k == 0
    ended = task.ends[q, c] | (time + 1 >= task.horizon)
    reward = (
        task.step_reward[q2]
        - jnp.where(is_action, task.length_penalty, 0.0)
        + jnp.where(ended, task.accept_reward[prompt, q2], 0.0)
    )
    k2 = jnp.where(is_action, jnp.where(task.tool_state[q2], task.tool_length, 0), k - 1)
    k2 = jnp.where(ended, 0, k2).astype(jnp.int32)
    discount = jnp.where(ended, 0.0, jnp.where(is_action, task.gamma, task.tool_discount))
    return Step(q2, k2, reward.astype(task.gamma.dtype), ended, discount.astype(task.gamma.dtype))


def _grid(task: TokenTask, time) -> Step:
    """step_class on the whole [P, Q, K, C] grid at position ``time``."""
    P, Q, K, C = task.num_prompts, task.num_states, task.num_counters, task.num_classes
    p = jnp.arange(P).reshape(P, 1, 1, 1)
    q = jnp.arange(Q).reshape(1, Q, 1, 1)
    k = jnp.arange(K).reshape(1, 1, K, 1)
    c = jnp.arange(C).reshape(1, 1, 1, C)
    out = step_class(task, p, time, q, k, c)
    shape = (P, Q, K, C)
    return Step(*(jnp.broadcast_to(x, shape) for x in out))


def _class_sum(x: Array, task: TokenTask) -> Array:
    """Sum a [..., V] array over tokens of each class -> [..., C] (a segment sum, O(V))."""
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1]).T  # [V, N]
    out = jax.ops.segment_sum(flat, task.token_class, num_segments=task.num_classes)
    return out.T.reshape(lead + (task.num_classes,))


def tool_class_probs(task: TokenTask) -> Array:
    """The tool-token distribution aggregated over classes [C]."""
    return _class_sum(jnp.exp(task.tool_log_probs), task)



class Backup(NamedTuple):
    """One position's class-level Bellman samples, each [P, Q, K, C]."""

    step: Step
    next_values: Array  # Vbar(t+1, p, q', k')
    h: Array  # r + d * next_values


def _backup_grid(task: TokenTask, v_next: Array, time) -> Backup:
    """H[p, q, k, c] = r + d Vbar(t + 1, p, q', k') at position ``time`` (v_next [P, Q, K])."""
    g = _grid(task, time)
    p = jnp.broadcast_to(jnp.arange(task.num_prompts).reshape(-1, 1, 1, 1), g.q.shape)
    nv = v_next[p, g.q, g.k]
    return Backup(g, nv, g.reward + g.discount * nv)


def class_backup(task: TokenTask, v_next: Array, time) -> Array:
    """r + d Vbar(t + 1, s') per token class at the policy states (k = 0) of position
    ``time``: [P, Q, C] (v_next = Vbar[t + 1], [P, Q, K]); Q^pi when Vbar = V^pi."""
    return _backup_grid(task, v_next, time).h[:, :, 0, :]


def _check_values(name: str, v: Array, task: TokenTask) -> None:
    shape = (task.horizon + 1, task.num_prompts, task.num_states, task.num_counters)
    if v.shape != shape:
        raise ValueError(f"{name} must have shape [H+1, P, Q, K] = {shape}, got {v.shape}")


def _log_probs(fn: LogProbFn, task: TokenTask, time, name: str) -> Array:
    out = fn(time)
    shape = (task.num_prompts, task.num_states, task.num_tokens)
    if out.shape != shape:
        raise ValueError(f"{name}(t) must return log-probs [P, Q, V] = {shape}, got {out.shape}")
    return out


def _backup_at(task: TokenTask, class_probs: Array, h: Array) -> Array:
    """[P, Q, K] expectation of h: policy class probs on k = 0, tool class probs on k > 0."""
    act = jnp.sum(class_probs * h[:, :, 0, :], axis=-1)  # [P, Q]
    tool = jnp.sum(tool_class_probs(task)[None, None, None] * h[:, :, 1:, :], axis=-1)  # [P, Q, K-1]
    return jnp.concatenate([act[..., None], tool], axis=-1)


def _with_tool(x0: Array, tool: Array) -> Array:
    """Policy-state values x0 [P, Q] with tool-state values tool[..., 1:] -> [P, Q, K]."""
    return jnp.concatenate([x0[..., None], tool[..., 1:]], axis=-1)


def bellman_backup(task: TokenTask, log_pi_fn: LogProbFn, vbar: Array) -> Array:
    """(T_pi Vbar)(t, p, q, k), [H, P, Q, K]; on tool states (k > 0) the environment's
    backup, which no policy affects."""
    _check_values("vbar", vbar, task)

    def one(t):
        b = _backup_grid(task, vbar[t + 1], t)
        pi_c = _class_sum(jnp.exp(_log_probs(log_pi_fn, task, t, "log_pi_fn")), task)
        return _backup_at(task, pi_c, b.h)

    return jax.lax.map(one, jnp.arange(task.horizon))


class Values(NamedTuple):
    """v: V^pi [H+1, P, Q, K] (v[H] = 0); q_class: Q^pi per token class [H, P, Q, C] at policy
    states (Q^pi(s, token) = q_class[..., token_class[token]])."""

    v: Array
    q_class: Array


def policy_values(task: TokenTask, log_pi_fn: LogProbFn) -> Values:
    """V^pi and Q^pi by backward induction over (t, q, k) (pass a behaviour sampler's
    log-probs to get V^mu). Cost per position: one [P, Q, V] segment sum."""
    zero = jnp.zeros((task.num_prompts, task.num_states, task.num_counters), task.gamma.dtype)

    def back(v_next, t):
        b = _backup_grid(task, v_next, t)
        pi_c = _class_sum(jnp.exp(_log_probs(log_pi_fn, task, t, "log_pi_fn")), task)
        v = _backup_at(task, pi_c, b.h)
        return v, (v, b.h[:, :, 0, :])

    _, (vs, qs) = jax.lax.scan(back, zero, jnp.arange(task.horizon), reverse=True)
    return Values(v=jnp.concatenate([vs, zero[None]], 0), q_class=qs)


def start_values(task: TokenTask, v: Array) -> Array:
    """V at the start of each prompt, v[0, p, prompt_state[p], 0] -> [P]."""
    return v[0, jnp.arange(task.num_prompts), task.prompt_state, 0]


def table_policy(logits: Array, temperature: float = 1.0) -> LogProbFn:
    """log_pi_fn from a logits table [P, H, Q, V] (tests, tabular experiments)."""
    chex.assert_rank(logits, 4)
    return lambda t: jax.nn.log_softmax(logits[:, t] / temperature, axis=-1)


# ------------------------------------------------------------------- target expectations


class TargetExpectations(NamedTuple):
    """Exact conditional means under mu of the one-step critic targets, each [H, P, Q, K].

    t_pi: T_pi Vbar. uncorrected: E_mu[H] = T_mu Vbar. vccc: E_mu[Eq 4] (Eq 8 when no
    baseline). truncated: E_mu[Eq 10] with (kind, clip) (Eq 8 for kind="ratio").
    clipped_closed: the closed form Vbar + Z (T_pitilde Vbar - Vbar) with mu w summed over
    mu's support (Sec 4.2). z: Z(s) = E_mu[w|s]. support_violation: pi mass on tokens with
    mu = 0. Tool states: every target is the environment backup (no ratio), z = 1 and
    support_violation = 0. Ratios use the ``logged`` log-probs (default: mu's own).
    """

    t_pi: Array
    uncorrected: Array
    vccc: Array
    truncated: Array
    clipped_closed: Array
    z: Array
    support_violation: Array


def token_view(task: TokenTask, x: Array) -> Array:
    """[P, Q, C] class table -> [P, Q, V] token table (a gather, O(V))."""
    return jnp.take(x, task.token_class, axis=-1)


def expected_targets(
    task: TokenTask,
    log_pi_fn: LogProbFn,
    log_mu_fn: LogProbFn,
    vbar: Array,
    *,
    kind: str = "truncate",
    clip: Optional[float] = 1.0,
    baseline: Optional[Array] = None,
    log_logged_fn: Optional[LogProbFn] = None,
) -> TargetExpectations:
    """Exact E_mu[Y | s] of the library's targets: the estimator functions of
    ``estimators.critic_targets`` are evaluated on every token of every policy state
    ([P, Q, V] per position) and averaged under mu (tokens are sampled from mu).

    ``log_logged_fn``: the log-probs the pipeline LOGGED as behaviour (default: mu's). A
    raw-logits pipeline logs log_softmax(raw logits) while sampling from mu (Sec 7).
    """
    _check_values("vbar", vbar, task)
    if baseline is not None:
        _check_values("baseline", baseline, task)
    logged_fn = log_mu_fn if log_logged_fn is None else log_logged_fn

    def one(t):
        b = _backup_grid(task, vbar[t + 1], t)
        lp = _log_probs(log_pi_fn, task, t, "log_pi_fn")
        lm = _log_probs(log_mu_fn, task, t, "log_mu_fn")
        ll = _log_probs(logged_fn, task, t, "log_logged_fn")
        pi, mu = jnp.exp(lp), jnp.exp(lm)
        tool = _backup_at(task, _class_sum(mu, task), b.h)  # k > 0 part is policy-free
        rew, disc, nxt = (token_view(task, x[:, :, 0, :]) for x in (b.step.reward, b.step.discount, b.next_values))
        v0 = vbar[t][:, :, 0]
        vals = jnp.broadcast_to(v0[..., None], lp.shape)
        log_rhos = lp - ll
        base = None if baseline is None else jnp.broadcast_to(baseline[t][:, :, 0, None], lp.shape)
        y_vccc = critic_targets.vccc_target(rew, disc, vals, nxt, log_rhos, base)
        if kind == "ratio":
            y_trunc = critic_targets.vccc_target(rew, disc, vals, nxt, log_rhos)
        else:
            y_trunc = critic_targets.clipped_target(rew, disc, vals, nxt, log_rhos, clip=clip, kind=kind)
        y_h = critic_targets.uncorrected_target(rew, disc, nxt)

        def mean(y):
            return jnp.sum(jnp.where(mu > 0, mu * y, 0.0), axis=-1)

        mw = jnp.where(mu > 0, mu * importance_weights(log_rhos, kind, clip), 0.0)
        closed = v0 + jnp.sum(_class_sum(mw, task) * (b.h[:, :, 0, :] - v0[..., None]), axis=-1)
        ones = jnp.ones_like(tool)
        return TargetExpectations(
            t_pi=_backup_at(task, _class_sum(pi, task), b.h),
            uncorrected=_with_tool(mean(y_h), tool),
            vccc=_with_tool(mean(y_vccc), tool),
            truncated=_with_tool(mean(y_trunc), tool),
            clipped_closed=_with_tool(closed, tool),
            z=_with_tool(jnp.sum(mw, axis=-1), ones),
            support_violation=_with_tool(jnp.sum(jnp.where(mu > 0, 0.0, pi), axis=-1), 0 * ones),
        )

    return jax.lax.map(one, jnp.arange(task.horizon))


# ------------------------------------------------------------ (value, closed form) pairs


def vccc_identity(
    task: TokenTask, log_pi_fn: LogProbFn, log_mu_fn: LogProbFn, vbar: Array,
    baseline: Optional[Array] = None,
) -> tuple[Array, Array]:
    """(E_mu[Y_VCCC | s], T_pi Vbar(s)), [H, P, Q, K] each, tool states included (Eq 5):
    equal whenever mu covers pi's support, for any baseline."""
    e = expected_targets(task, log_pi_fn, log_mu_fn, vbar, kind="ratio", clip=None, baseline=baseline)
    return e.vccc, e.t_pi


def _excess(pi: Array, mu: Array, kind: str, clip: Optional[float]) -> Array:
    """pi - mu w on mu's support, from probabilities directly (not from log-ratios):
    ratio: 0; truncate: (pi - c mu)^+; mask: pi 1[pi/mu outside [1/c, c]]."""
    if kind == "ratio":
        return jnp.zeros_like(pi)
    if kind == "truncate":
        return jnp.maximum(pi - clip * mu, 0.0)
    if kind == "mask":
        return jnp.where((pi * clip >= mu) & (pi <= clip * mu), 0.0, pi)
    raise ValueError(f"kind must be 'ratio', 'truncate' or 'mask', got {kind!r}")


def _bias_closed(task, log_pi_fn, vbar, per_token) -> Array:
    """sum_c delta_c sum_{v in c} per_token(t, pi, v) at policy states, 0 on tool states."""

    def one(t):
        b = _backup_grid(task, vbar[t + 1], t)
        delta = b.h[:, :, 0, :] - vbar[t][:, :, 0, None]  # [P, Q, C]
        x0 = jnp.sum(delta * _class_sum(per_token(t), task), axis=-1)
        return jnp.concatenate([x0[..., None], jnp.zeros(x0.shape + (task.tool_length,), x0.dtype)], -1)

    return jax.lax.map(one, jnp.arange(task.horizon))


def support_violation_bias(
    task: TokenTask, log_pi_fn: LogProbFn, log_mu_fn: LogProbFn, vbar: Array,
    *, kind: str = "ratio", clip: Optional[float] = None,
) -> tuple[Array, Array]:
    """(E_mu[Y] - T_pi Vbar by enumeration, closed form), [H, P, Q, K], for the Eq 8
    (kind="ratio") / Eq 10 target under a truncated sampler mu (top-k, top-p, mask; Sec 7):

        bias(s) = - sum_{v: mu(v|s) = 0} pi(v|s) delta(s, v)           (support violation)
                  - sum_{v: mu(v|s) > 0} (pi - mu w)(v|s) delta(s, v)   (clipping; 0 for ratio)

    with delta(s, v) = r + d Vbar(s') - Vbar(s); (pi - mu w) from probabilities (see _excess).
    """
    e = expected_targets(task, log_pi_fn, log_mu_fn, vbar, kind=kind, clip=clip)

    def per_token(t):
        pi = jnp.exp(log_pi_fn(t))
        mu = jnp.exp(log_mu_fn(t))
        return -jnp.where(mu > 0, _excess(pi, mu, kind, clip), pi)

    return e.truncated - e.t_pi, _bias_closed(task, log_pi_fn, vbar, per_token)


def raw_logits_bias(
    task: TokenTask, log_pi_fn: LogProbFn, log_mu_fn: LogProbFn, log_raw_fn: LogProbFn,
    vbar: Array,
) -> tuple[Array, Array]:
    """(E_mu[Y_Eq8] - T_pi Vbar by enumeration, closed form) when tokens come from the
    sampler mu but the pipeline logs the raw-logits log-probs log_raw (negative control,
    Sec 7):  bias(s) = sum_v delta(s, v) [mu(v) pi(v) / raw(v) 1[mu(v) > 0] - pi(v)].
    Nonzero under temperature != 1, top-k, top-p whenever delta varies with v."""
    e = expected_targets(task, log_pi_fn, log_mu_fn, vbar, kind="ratio", clip=None,
                         log_logged_fn=log_raw_fn)

    def per_token(t):
        lp, lm, lr = log_pi_fn(t), log_mu_fn(t), log_raw_fn(t)
        return jnp.where(jnp.isfinite(lm), jnp.exp(lp + lm - lr), 0.0) - jnp.exp(lp)

    return e.vccc - e.t_pi, _bias_closed(task, log_pi_fn, vbar, per_token)
