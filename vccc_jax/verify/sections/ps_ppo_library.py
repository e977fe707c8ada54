"""The library's PS-PPO estimator (``estimators.related.ps_ppo``) checked on the PS-PPO rows'
tiny token task with a tool call (every sequence enumerated, float64;
:func:`~vccc_jax.verify.sections.ps_ppo.ps_ppo_numbers`: the same compiled enumeration).

- Exact, per cutoff law of ``LAWS`` (prompt-conditioned length scales): every sequence tau
  and every cutoff T (probabilities from the law's ``pmf``) run through the trainer's path,
  ``prefix_weights(T, survival, policy_step)`` -> ``ppo_token_loss`` (on-policy: ratio 1,
  the PPO clip inactive); the expected gradient E_tau E_T[-d loss] equals grad J from the
  token solver. Each step's gradient is d loss / d log pi_t times grad log pi_t; on steps
  that are not live policy steps (tool tokens, padding after the end) grad log pi_t is
  replaced by random vectors, so a weight that leaks onto them shows. This pins the
  1 / P(T > t) weighting, the keep rule t < T with t the position (tool steps included),
  the policy-step mask, the sum over time and the survival / pmf of each law.
- Sampled: ``sample_cutoffs`` draws T with P(T = k) = the law's pmf (chi-square test at
  0.1%, fixed key, 4096 draws per length scale).

The library functions are looked up when the section runs (static arguments of the graph).
"""

from __future__ import annotations

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import ps_ppo as tps
from vccc_jax.verify import stats
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import ALPHA, EXACT_TOL
from vccc_jax.verify.report import Row, exact_row
from vccc_jax.verify.sections.ps_ppo import ps_ppo_numbers

lib = importlib.import_module("vccc_jax.estimators.related.ps_ppo")

Array = chex.Array

# (law, per-prompt length scales): S > 0 wherever a sequence lives, so each is unbiased
LAWS = (("mixture:0.2", (2.5, 4.0)), ("geometric:0.6", (2.5, 4.0)), ("uniform", (4.0, 4.0)))
CLIP_EPS = 0.2
NUM_DRAWS = 4096


def library_fns() -> tuple:
    """The library functions checked here, looked up now (so a patch is seen)."""
    return (lib.CutoffLaw.survival, lib.CutoffLaw.pmf, lib.prefix_weights, lib.ppo_token_loss)


def gradient_errors(e: tps.Enumeration, grad_j: Array, fake: Array, fns: tuple, laws=LAWS) -> Array:
    """[len(laws)]: max |E_tau E_T[-grad of the library's prefix loss] - grad J| (docstring);
    ``e`` the exact enumeration of the task, ``fake`` [N, H, D] the scores of non-policy steps."""
    survival_fn, pmf_fn, prefix_weights, token_loss = fns
    N, H = e.policy.shape
    scores = jnp.where(e.policy[..., None], e.scores, fake)  # [N, H, D]
    cut = jnp.repeat(jnp.arange(1, H + 1, dtype=jnp.int32)[None], N, 0).reshape(-1)  # every (tau, T): B = N H
    errs = []
    for name, lengths in laws:
        law = lib.CutoffLaw.parse(name)
        scale = jnp.asarray(lengths, grad_j.dtype)[e.prompt]
        surv, pmf = survival_fn(law, scale, H), pmf_fn(law, scale, H)  # [N, H]
        weights = prefix_weights(cut, jnp.repeat(surv, H, 0).T, jnp.repeat(e.policy, H, 0).T)  # [H, B]
        mass = (e.prob[:, None] * pmf).reshape(-1)  # P(tau) P(T = k | prompt)

        def expected_loss(log_pi):  # on-policy: log_mu = log_pi, ratio 1 (the value of log_pi is irrelevant)
            adv = jnp.repeat(e.advantages, H)[None]
            return jnp.sum(mass * token_loss(log_pi, jax.lax.stop_gradient(log_pi), adv, weights, clip_eps=CLIP_EPS))

        d_log_pi = jax.grad(expected_loss)(jnp.zeros((H, N * H), grad_j.dtype))  # [H, B]
        g = -jnp.einsum("tnk,ntd->d", d_log_pi.reshape(H, N, H), scores)
        errs.append(jnp.max(jnp.abs(g - grad_j)))
    return jnp.stack(errs)


_GRADIENTS = fast_jit(gradient_errors, static_argnums=(3, 4))


def cutoff_chi2(key: Array, sample_cutoffs, survival: np.ndarray) -> tuple[float, float, int]:
    """(chi-square statistic of NUM_DRAWS cutoffs per survival row vs the rows' pmf, its
    critical value at ALPHA, degrees of freedom); survival [R, H] (numpy)."""
    R, H = survival.shape
    draws = np.asarray(sample_cutoffs(key, jnp.asarray(np.repeat(survival, NUM_DRAWS, 0)))).reshape(R, NUM_DRAWS)
    pmf = survival - np.concatenate([survival[:, 1:], np.zeros((R, 1))], axis=1)
    counts = np.stack([(draws == k).sum(1) for k in range(1, H + 1)], 1)
    expected = NUM_DRAWS * pmf
    ok = expected > 0
    outside = int(np.sum((draws < 1) | (draws > H))) + int(np.sum(counts[~ok]))  # impossible cutoffs
    chi2 = float(np.sum((counts - expected)[ok] ** 2 / expected[ok])) + (np.inf if outside else 0.0)
    dof = int(np.sum(ok) - R)
    return chi2, float(stats.chi2_isf(ALPHA, dof)), dof


def ps_ppo_library_rows(ctx, laws=LAWS) -> list[Row]:
    """Rows checking the library PS-PPO estimator (problem: fold_in(ctx.key, 16); draws: 20)."""
    rng = np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(ctx.key, 16))))
    with jax.enable_x64(True):
        _, e, grad_j = ps_ppo_numbers(ctx)  # the PS-PPO rows' enumeration (compiled once)
        fake = rng.normal(size=e.scores.shape)
        errs = np.asarray(_GRADIENTS(e, grad_j, fake, library_fns(), tuple(laws)))
        H = e.policy.shape[1]
        surv = np.concatenate([np.asarray(lib.CutoffLaw.parse(n).survival(jnp.asarray(ls), H)) for n, ls in laws])
        chi2, crit, dof = cutoff_chi2(jax.random.fold_in(ctx.key, 20), lib.sample_cutoffs, surv)
    # Every position must carry signal, or a bias confined to one position would be invisible.
    grad_j = np.asarray(grad_j).reshape(int(np.max(e.prompt)) + 1, H, -1)
    signal = float(np.min(np.sum(np.abs(grad_j), axis=(0, 2))))
    rows = [exact_row(f"library PS-PPO: E_tau E_T[grad prefix loss] = grad J, law {name}", "PS-PPO", 1, float(err),
                      EXACT_TOL, f"length scales {lengths}; prefix_weights + ppo_token_loss, policy steps only "
                      f"(tool and padding steps carry random scores); min over positions of |grad J| = {signal:.3g}")
            for (name, lengths), err in zip(laws, errs)]
    for row in rows:
        row.passed = row.passed and signal >= 1e-3
    rows.append(Row("library PS-PPO: sample_cutoffs draws T ~ the law's pmf", "PS-PPO", "sampled", 1, chi2, crit,
                    chi2 <= crit, f"chi-square {chi2:.1f} vs {crit:.1f} (df {dof}, level {ALPHA:g}); "
                                  f"{NUM_DRAWS} draws per length scale, {len(surv)} scales"))
    return rows
