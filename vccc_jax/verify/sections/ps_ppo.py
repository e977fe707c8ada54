"""PS-PPO rows (issue 14; ``tabular.ps_ppo``: every sequence of a tiny token task with a tool
call and every cutoff enumerated, float64):

- the enumerated full-trajectory estimator E_tau[sum_t grad log pi A] equals grad J from the
  token solver (checks the enumeration);
- the prefix estimator with importance weights 1 / S(t) is unbiased: E_tau E_T[g_T] =
  E_tau[g] for a cutoff law that truncates (the abstract's claim);
- its variance equals the closed form Var(g) + E[sum <x_t, x_t'> (1/S(min(t,t')) - 1)].

All three come from one ``tabular.ps_ppo.analyze`` of the cutoff law (its full-trajectory
moments do not depend on the law). The problem (:func:`ps_ppo_problem`) and the exact
enumeration with grad J (:func:`ps_ppo_numbers`) are shared with the library rows
(``ps_ppo_library``), so the library's graph compiles only the estimator.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from vccc_jax.tabular import ps_ppo
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.report import Row, pair_row

LAW = "mixture:0.2"


@fast_jit
def ps_ppo_problem(key):
    """(the tiny token task with a tool call, a logits table [P, H, Q, V] drawn from key)."""
    task = ps_ppo.tiny_task(tools=True)
    return task, 0.7 * jax.random.normal(key, (task.num_prompts, task.horizon, task.num_states, task.num_tokens))


@functools.partial(fast_jit, static_argnums=(2,))
def _ps_ppo_numbers(task, logits, fns):
    analyze, enumerate_task = fns
    a = analyze(task, logits, ps_ppo.survival_table(task, LAW))
    claims = (a.mean_full, a.grad_j), (a.mean_prefix_enum, a.mean_full), (a.var_prefix_enum, a.var_prefix_closed)
    return claims, enumerate_task(task, logits), a.grad_j


def ps_ppo_numbers(ctx):
    """(the three claims' (value, closed form) pairs, the enumeration ``tabular.ps_ppo.
    Enumeration``, grad J [D]) of the problem ``ps_ppo_problem(fold_in(ctx.key, 16))``."""
    with jax.enable_x64(True):
        return _ps_ppo_numbers(*ps_ppo_problem(jax.random.fold_in(ctx.key, 16)),
                               (ps_ppo.analyze, ps_ppo.enumerate_task))


def ps_ppo_rows(ctx) -> list[Row]:
    """The three PS-PPO claims (keys: ``fold_in(ctx.key, 16)``)."""
    with jax.enable_x64(True):
        full, cut, var = jax.tree_util.tree_map(np.asarray, ps_ppo_numbers(ctx)[0])
    task = "tiny token task V=3 H=4 with a tool call, all sequences"
    return [
        pair_row("PS-PPO: E[full-trajectory estimator] = grad J (solver)", "PS-PPO", 1, *full, 1e-10, task,
                 min_size=1e-2),
        pair_row(f"PS-PPO: prefix estimator unbiased, cutoff law {LAW}", "PS-PPO", 1, *cut, 1e-10,
                 "E_tau E_T[g_T] (T enumerated) = E_tau[g]"),
        pair_row("PS-PPO: prefix variance = closed form", "PS-PPO", 1, *var, 1e-10,
                 "enumerating (tau, T) vs Var(g) + E[sum <x_t,x_t'>(1/S_min - 1)]"),
    ]
