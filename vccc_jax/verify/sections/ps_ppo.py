"""PS-PPO rows (issue 14; ``tabular.ps_ppo``: every sequence of a tiny token task with a tool
call and every cutoff enumerated, float64):

- the enumerated full-trajectory estimator E_tau[sum_t grad log pi A] equals grad J from the
  token solver (checks the enumeration);
- the prefix estimator with importance weights 1 / S(t) is unbiased: E_tau E_T[g_T] =
  E_tau[g] for a cutoff law that truncates (the abstract's claim);
- its variance equals the closed form Var(g) + E[sum <x_t, x_t'> (1/S(min(t,t')) - 1)].
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from vccc_jax.tabular import ps_ppo
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.report import Row, pair_row

LAW = "mixture:0.2"


@functools.partial(fast_jit, static_argnums=(1,))
def _ps_ppo_numbers(key, fns):
    full, cutoff, variance = fns
    task = ps_ppo.tiny_task(tools=True)
    logits = 0.7 * jax.random.normal(key, (task.num_prompts, task.horizon, task.num_states, task.num_tokens))
    return full(task, logits), cutoff(task, logits, LAW), variance(task, logits, LAW)


def ps_ppo_rows(ctx) -> list[Row]:
    """The three PS-PPO claims (keys: ``fold_in(ctx.key, 16)``)."""
    with jax.enable_x64(True):
        full, cut, var = jax.tree_util.tree_map(np.asarray, _ps_ppo_numbers(
            jax.random.fold_in(ctx.key, 16),
            (ps_ppo.claim_full_is_policy_gradient, ps_ppo.claim_cutoff_unbiased, ps_ppo.claim_variance_closed_form)))
    task = "tiny token task V=3 H=4 with a tool call, all sequences"
    return [
        pair_row("PS-PPO: E[full-trajectory estimator] = grad J (solver)", "PS-PPO", 1, *full, 1e-10, task,
                 min_size=1e-2),
        pair_row(f"PS-PPO: prefix estimator unbiased, cutoff law {LAW}", "PS-PPO", 1, *cut, 1e-10,
                 "E_tau E_T[g_T] (T enumerated) = E_tau[g]"),
        pair_row("PS-PPO: prefix variance = closed form", "PS-PPO", 1, *var, 1e-10,
                 "enumerating (tau, T) vs Var(g) + E[sum <x_t,x_t'>(1/S_min - 1)]"),
    ]
