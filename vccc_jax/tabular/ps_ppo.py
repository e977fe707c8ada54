"""Exact PS-PPO on small token tasks: unbiasedness over the cutoff law and its variance cost
(issue 14; the estimator and how we read the abstract: vccc_jax/estimators/related/ps_ppo.py).

Every (prompt, token sequence) of a tiny ``tabular.token.TokenTask`` is enumerated: P * V^H
padded sequences. A step after termination is padding: it gets the uniform probability 1/V,
no reward and no gradient, so sums over padded sequences are exact expectations over real
episodes (the padding factors sum to one). Tool steps get the tool distribution's probability
and no gradient. The policy is a logits table [P, H, Q, V] (``token.table_policy``); theta is
that table, flattened to D = P H Q V.

Per trajectory tau with per-step contributions x_t = grad log pi(a_t | s_t) A(tau):

    full (GRPO-style) estimator   g(tau)      = sum_t x_t
    prefix estimator (cutoff T)   g_T(tau)    = sum_{t < T} x_t / S_p(t),   S_p(t) = P(T > t)

with A(tau) = G(tau) - b_p, b_p = E[G | p] (the population limit of the group mean; the
group-normalised baseline of finite G is a per-trajectory constant too but depends on the
other rollouts, which the claims below do not need). Claims (each -> (computed, expected)):

* ``claim_full_is_policy_gradient``: E_tau[g] = grad_theta (1/P) sum_p V^pi(p) (the solver's
  values, differentiated) — checks the enumeration.
* ``claim_cutoff_unbiased``: E_tau E_T[g_T] by enumerating T (pmf of the law) = E_tau[g]
  (laws with S(t) > 0 wherever trajectories live).
* ``claim_variance_closed_form``: total variance of g_T by enumerating (tau, T) = closed form
  Var_tau(g) + E_tau[sum_{t,t'} <x_t, x_t'> (1 / S(min(t, t')) - 1)]  (since
  E_T[1[T > t] 1[T > t'] / (S_t S_t')] = S_max / (S_t S_t') = 1 / S_min).

``variance_cost`` tabulates kept fraction, variance and bias per cutoff law.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.related.ps_ppo import CutoffLaw
from vccc_jax.tabular import token as tk

Array = chex.Array


class Enumeration(NamedTuple):
    """All padded sequences: prob [N], prompt [N], alive [N, H] (live policy-or-tool step),
    returns [N] (discounted), scores [N, H, D] per-step grad log pi (policy steps only; A not
    yet applied), advantages [N] (G - E[G | p]), policy [N, H] (live policy steps: the
    trainer's ``policy_step`` mask)."""

    prob: Array
    prompt: Array
    alive: Array
    returns: Array
    scores: Array
    advantages: Array
    policy: Array


def _sequences(task: tk.TokenTask) -> tuple[Array, Array]:
    V, H, P = task.num_tokens, task.horizon, task.num_prompts
    seqs = np.array(list(itertools.product(range(V), repeat=H)), np.int32).reshape(-1, H)
    prompts = np.repeat(np.arange(P, dtype=np.int32), len(seqs))
    return jnp.asarray(np.tile(seqs, (P, 1))), jnp.asarray(prompts)


def _walk(task: tk.TokenTask, logits: Array, prompt: Array, seq: Array):
    """One padded sequence: (log-prob of each step [H] with gradient only on policy steps,
    constant log-prob of the rest [H], alive [H], discounted return [], policy step [H])."""
    log_pi_fn = tk.table_policy(logits)
    V = task.num_tokens

    def step(carry, t):
        q, k, alive, disc, ret = carry
        a = seq[t]
        out = tk.step_class(task, prompt, t, q, k, task.token_class[a])
        lp = log_pi_fn(t)[prompt, q, a]
        is_act = alive & (k == 0)
        policy_lp = jnp.where(is_act, lp, 0.0)
        other_lp = jnp.where(alive, jnp.where(k == 0, 0.0, task.tool_log_probs[a]), -jnp.log(V))
        ret = ret + jnp.where(alive, disc * out.reward, 0.0)
        new = (jnp.where(alive, out.q, q), jnp.where(alive, out.k, k), alive & ~out.ended,
               disc * out.discount, ret)
        return new, (policy_lp, other_lp.astype(lp.dtype), alive, is_act)

    dt = task.gamma.dtype
    init = (task.prompt_state[prompt], jnp.zeros((), jnp.int32), jnp.ones((), bool),
            jnp.ones((), dt), jnp.zeros((), dt))
    (_, _, _, _, ret), (plp, olp, alive, policy) = jax.lax.scan(step, init, jnp.arange(task.horizon))
    return plp, olp, alive, ret, policy


@jax.jit
def enumerate_task(task: tk.TokenTask, logits: Array) -> Enumeration:
    """All P * V^H padded sequences of ``task`` under the logits table [P, H, Q, V]."""
    chex.assert_rank(logits, 4)
    seqs, prompts = _sequences(task)

    def one(p, s):
        plp, olp, alive, ret, policy = _walk(task, logits, p, s)
        jac = jax.jacrev(lambda th: _walk(task, th, p, s)[0])(logits)  # [H, P, H, Q, V]
        return jnp.sum(plp + olp) - jnp.log(task.num_prompts), alive, ret, jac.reshape(task.horizon, -1), policy

    logp, alive, ret, scores, policy = jax.vmap(one)(prompts, seqs)
    prob = jnp.exp(logp)
    P = task.num_prompts
    mean_ret = jax.ops.segment_sum(prob * ret, prompts, P) / jax.ops.segment_sum(prob, prompts, P)
    return Enumeration(prob, prompts, alive, ret, scores, ret - mean_ret[prompts], policy)


def objective(task: tk.TokenTask, logits: Array) -> Array:
    """J = (1/P) sum_p V^pi(p) from the exact solver (prompts are uniform in the env)."""
    return jnp.mean(tk.start_values(task, tk.policy_values(task, tk.table_policy(logits)).v))


class Analysis(NamedTuple):
    """Exact moments of the full and prefix estimators for one survival table [P, H]."""

    grad_j: Array  # [D] solver gradient
    mean_full: Array  # [D] E[g]
    mean_prefix_enum: Array  # [D] E_tau E_T[g_T] by enumerating T
    var_full: Array  # E||g - E g||^2
    var_prefix_enum: Array  # E||g_T - E g_T||^2 by enumerating (tau, T)
    var_prefix_closed: Array  # the closed form of the module docstring
    kept_fraction: Array  # E[sum_t S(t) alive_t] / E[sum_t alive_t]


@jax.jit
def analyze(task: tk.TokenTask, logits: Array, survival: Array) -> Analysis:
    """All claims' quantities at once (one compilation per task shape). survival [P, H]."""
    H = task.horizon
    chex.assert_shape(survival, (task.num_prompts, H))
    e = enumerate_task(task, logits)
    x = e.scores * e.advantages[:, None, None]  # [N, H, D]
    s = survival[e.prompt]  # [N, H]
    pos = s > 0
    inv = jnp.where(pos, 1.0 / jnp.where(pos, s, 1.0), 0.0)
    g = jnp.sum(x, axis=1)
    mean_full = e.prob @ g
    var_full = e.prob @ jnp.sum(g ** 2, -1) - jnp.sum(mean_full ** 2)
    # enumerate T = 1..H: g_T = sum_{t<T} x_t / S(t)
    pmf = s - jnp.concatenate([s[:, 1:], jnp.zeros_like(s[:, :1])], axis=1)  # [N, H] (T = k+1)
    partial = jnp.cumsum(x * inv[..., None], axis=1)  # [N, H(k), D]: g_{T=k+1}
    mean_prefix = jnp.einsum("n,nk,nkd->d", e.prob, pmf, partial)
    second = jnp.einsum("n,nk,nk->", e.prob, pmf, jnp.sum(partial ** 2, -1))
    gram = jnp.einsum("ntd,nud->ntu", x, x)
    s_min = jnp.minimum(s[:, :, None], s[:, None, :])
    ok = pos[:, :, None] & pos[:, None, :]
    extra = jnp.where(ok, gram / jnp.where(ok, s_min, 1.0), 0.0)
    second_closed = e.prob @ jnp.sum(extra, axis=(1, 2))
    mean_closed = e.prob @ jnp.sum(x * pos[..., None], axis=1)
    live = e.prob @ jnp.sum(e.alive, 1)
    return Analysis(
        grad_j=jax.grad(objective, argnums=1)(task, logits).reshape(-1),
        mean_full=mean_full,
        mean_prefix_enum=mean_prefix,
        var_full=var_full,
        var_prefix_enum=second - jnp.sum(mean_prefix ** 2),
        var_prefix_closed=second_closed - jnp.sum(mean_closed ** 2),
        kept_fraction=(e.prob @ jnp.sum(s * e.alive, 1)) / live,
    )


def survival_table(task: tk.TokenTask, law, lengths=None) -> Array:
    """S_p(t) [P, H] of a law (str or CutoffLaw) at per-prompt length scales (default H)."""
    law = CutoffLaw.parse(law)
    lengths = jnp.full((task.num_prompts,), float(task.horizon)) if lengths is None else lengths
    return law.survival(jnp.asarray(lengths, task.gamma.dtype), task.horizon).astype(task.gamma.dtype)


# ------------------------------------------------------------------ claims (verify rows)


def claim_full_is_policy_gradient(task, logits) -> tuple[Array, Array]:
    """(E_tau[sum_t grad log pi A], grad J from the solver), [D] each."""
    a = analyze(task, logits, survival_table(task, "full"))
    return a.mean_full, a.grad_j


def claim_cutoff_unbiased(task, logits, law, lengths=None) -> tuple[Array, Array]:
    """(E_tau E_T[prefix estimator] enumerating T, E_tau[full estimator]), [D] each."""
    a = analyze(task, logits, survival_table(task, law, lengths))
    return a.mean_prefix_enum, a.mean_full


def claim_variance_closed_form(task, logits, law, lengths=None) -> tuple[Array, Array]:
    """(Var of the prefix estimator enumerating (tau, T), closed form), scalars."""
    a = analyze(task, logits, survival_table(task, law, lengths))
    return a.var_prefix_enum, a.var_prefix_closed


def variance_cost(task, logits, laws, lengths=None) -> list[dict]:
    """One row per law: kept fraction, Var(prefix) / Var(full), ||bias|| / ||grad J||."""
    rows = []
    for law in laws:
        a = analyze(task, logits, survival_table(task, law, lengths))
        norm = float(jnp.linalg.norm(a.grad_j))
        rows.append({
            "law": str(CutoffLaw.parse(law)),
            "kept_fraction": float(a.kept_fraction),
            "var_full": float(a.var_full),
            "var_prefix": float(a.var_prefix_closed),
            "var_ratio": float(a.var_prefix_closed / a.var_full),
            "relative_bias": float(jnp.linalg.norm(a.mean_prefix_enum - a.mean_full)) / norm,
        })
    return rows


def tiny_task(key=None, *, tools: bool = False, dtype=jnp.float64) -> tk.TokenTask:
    """A task small enough to enumerate (V=3, H=4, Q=3, C=3, P=2: 162 sequences; with a
    one-token tool call if ``tools``), EOS on class 0, a format reward and length penalty.
    The default key gives a policy gradient that is nonzero at every position (key 3, the
    earlier default, has none at the last one, so no check could see a bias there)."""
    key = jax.random.PRNGKey(0) if key is None else key
    return tk.make_task(key, num_tokens=3, horizon=4, num_states=3, num_classes=3, num_prompts=2,
                        tool_length=1 if tools else 0, num_tool_states=1 if tools else 0,
                        accept_density=0.5, format_reward=0.1, length_penalty=0.05, gamma=1.0,
                        dtype=dtype)
