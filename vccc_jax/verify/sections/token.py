"""The token testbed (issue 12; ``tabular.token``): the identities of the write-up on an
LLM-shaped task with tool steps, computed exactly by the token solver with the *library's*
critic targets and the library's sampler (``envs.samplers``).

Rows (each a (value, closed form) pair of ``tabular.token``, max abs over every
(position, prompt, automaton state, tool countdown), float64):

- Eq 5 with tool steps: E_mu[Y_VCCC | s] = T_pi Vbar(s) for an arbitrary baseline, tool
  observation states included (``vccc_identity``);
- Sec 7, support violation: under a top-k sampler the Eq 10 target (truncation c = 1.5) is
  biased by exactly - sum_{mu(v)=0} pi(v) delta(s, v) - sum_{mu(v)>0} (pi - mu w) delta, and
  the bias is nonzero (``support_violation_bias``; tests/tabular/test_token.py also checks Eq 8);
- Sec 7, raw-logits control: sampling from temperature 0.5 but logging
  raw-logit log-probs biases the Eq 8 target by exactly its closed form, nonzero
  (``raw_logits_bias``).

The library functions (critic targets, sampler) are a static argument of the compiled
graph, looked up when the section runs, so a patched library recompiles and is checked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import samplers
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import token as tk
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, pair_row

TOP_K = 4          # of V = 12 tokens
HOT = 0.5          # sampler temperature of the raw-logits control
TRUNC_CLIP = 1.5   # Eq 10 truncation under top-k
TASK = dict(num_tokens=12, horizon=5, num_states=4, num_classes=3, num_prompts=2, tool_length=2,
            num_tool_states=2, gamma=0.9, format_reward=0.1, length_penalty=0.05)


def library_fns() -> tuple:
    """What the token solver calls from the library, looked up now (the graph's cache key:
    ``tabular.token`` reads ``critic_targets.*`` at trace time, so a patch is traced in)."""
    return (ct.vccc_target, ct.clipped_target, ct.uncorrected_target, samplers.sampler_log_probs)


@functools.partial(fast_jit, static_argnums=(1,))
def _token_numbers(key, fns) -> dict:
    sampler = fns[3]
    k_task, k_pi, k_mu, k_v, k_b = jax.random.split(key, 5)
    task = tk.make_task(k_task, **TASK)
    H, P, Q, V, K = task.horizon, task.num_prompts, task.num_states, task.num_tokens, task.num_counters
    logits = 2.0 * jax.random.normal(k_pi, (P, H, Q, V))
    stale = logits + 1.5 * jax.random.normal(k_mu, logits.shape)
    vbar = jax.random.normal(k_v, (H + 1, P, Q, K))
    baseline = jax.random.normal(k_b, (H + 1, P, Q, K))
    pi, mu = tk.table_policy(logits), tk.table_policy(stale)

    def spec_fn(spec):
        return lambda t: sampler(logits[:, t], spec)

    topk, hot = spec_fn(samplers.SamplerSpec(top_k=TOP_K)), spec_fn(samplers.SamplerSpec(temperature=HOT))
    raw = lambda t: samplers.raw_log_probs(logits[:, t])  # noqa: E731
    return dict(
        identity=jnp.stack(tk.vccc_identity(task, pi, mu, vbar, baseline=baseline)),
        tools=jnp.sum(task.tool_state),
        support=jnp.stack(tk.support_violation_bias(task, pi, topk, vbar, kind="truncate", clip=TRUNC_CLIP)),
        raw=jnp.stack(tk.raw_logits_bias(task, pi, hot, raw, vbar)),
    )


def token_rows(ctx) -> list[Row]:
    """Rows of the token testbed (keys: ``fold_in(ctx.key, 12)``)."""
    with jax.enable_x64(True):
        n = jax.tree_util.tree_map(np.asarray, _token_numbers(jax.random.fold_in(ctx.key, 12), library_fns()))
    shape = (f"V={TASK['num_tokens']} H={TASK['horizon']} Q={TASK['num_states']} P={TASK['num_prompts']}, "
             f"{int(n['tools'])} tool states x m={TASK['tool_length']} tool tokens")
    return [
        pair_row("token task: E_mu[Y_VCCC] = T_pi Vbar incl. tool steps, any b", "Eq 5", 1,
                 *n["identity"], EXACT_TOL, f"{shape}; stale mu, random baseline"),
        pair_row(f"token top-k={TOP_K}: Eq 10 bias = support-violation closed form", "Sec 7", 1,
                 *n["support"], EXACT_TOL, f"Eq 10 truncate c={TRUNC_CLIP:g} (support + clipping terms)", min_size=1e-2),
        pair_row("token raw-logits control: Eq 8 bias = closed form, nonzero", "Sec 7", 1,
                 *n["raw"], EXACT_TOL, f"sampler temperature {HOT:g}; raw-logit log-probs logged",
                 min_size=1e-2),
    ]
