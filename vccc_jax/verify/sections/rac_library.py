"""The library's RAC estimator (``estimators.related.rac``) checked exactly, on the RAC rows'
problem (S = 4, A = 3, three reward channels, a history of nine NPG versions;
:func:`~vccc_jax.verify.sections.comparators.rac_problem`).

- Expected update (every (s, a, s') cell of every version enumerated): at the newest
  version K, with behaviour lag 1, a fast channel (delay 0, through ``rac_advantages``) and
  slow channels with delays 1 and 3 whose residuals (``channel_residuals``, exact channel
  critics V_c^pi) were pushed into ``RACQueue``\\ s one optimiser step apart
  (``queue_push``) and are reinjected by ``queue_advantages`` with their kernels and the
  clipped ratio min(cbar, pi_K / mu) (cbar = 1, active), while ``rac_advantages`` adds
  nothing for them at the consuming step. Sum over cells of prob x advantage x score,
  weighted by d^pi(s) = ``tabular.rac.expected_update(..., "rac")`` (computed, with the
  channel values and d^pi, in the RAC rows' compiled graph: ``comparators.rac_numbers``): pins the kernel by age,
  the queue order, the clipped reinjection ratio and the delay rule.
- Pathwise, on random trajectories with episode ends and rho-bar != c-bar: delay 0 with the
  identity kernel (through ``rac_advantages`` and through the queue at age 0) equals the
  library V-trace's pg advantage on the summed channels (the abstract's reduction; V-trace is
  linear in rewards and values): pins the residual's V-trace targets and bootstrap.

The library functions are looked up when the section runs (static arguments of the graph).
"""

from __future__ import annotations

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.policies import log_ratio_table
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL, maxabs
from vccc_jax.verify.report import Row, exact_row, pair_row
from vccc_jax.verify.sections.comparators import (
    RAC_LIB_CLIP,
    RAC_LIB_DELAYS,
    RAC_LIB_KERNELS,
    RAC_LIB_LAG,
    rac_numbers,
)

rl = importlib.import_module("vccc_jax.estimators.related.rac")
vt = importlib.import_module("vccc_jax.estimators.vtrace")

Array = chex.Array

DELAYS, KERNELS, CLIP, LAG = RAC_LIB_DELAYS, RAC_LIB_KERNELS, RAC_LIB_CLIP, RAC_LIB_LAG  # delay 1, clip active
# pathwise reduction: (rho_bar, c_bar, pg_rho_bar = the reinjection clip)
PATH_CLIPS = (1.3, 0.8, 1.1)


def library_fns() -> tuple:
    """The library functions checked here, looked up now (so a patch is seen)."""
    return (rl.channel_residuals, rl.rac_advantages, rl.init_queue, rl.queue_push, rl.queue_advantages,
            vt.vtrace)


def library_update(problem, truth: dict, fns: tuple) -> Array:
    """The library's expected update at version K, [S, A] (``truth``: channel values and d^pi
    from ``comparators.rac_numbers``)."""
    residuals_fn, rac_advantages, init_queue, queue_push, queue_advantages, _ = fns
    mdp, probs, ch = problem
    K = probs.shape[0] - 1
    pi = probs[K]
    S, A = mdp.num_states, mdp.num_actions
    grid = jnp.broadcast_to  # (s, a, s') cells, flattened to one axis N = S A S'
    disc = grid(ex.next_state_discounts(mdp)[None, None, :], mdp.P.shape).reshape(1, -1)
    u = ex.softmax_score(pi)  # [S, A, A]

    def cells(version, c):
        """(residuals [N], log mu [N], log rho [N], prob [N]) of version's batch, channel c."""
        mu = probs[version]
        v_c = truth["channel_values"][c]  # exact channel critic V_c^pi
        lr = grid(log_ratio_table(pi, mu)[:, :, None], mdp.P.shape).reshape(1, -1)
        res = residuals_fn(lr, disc, ch[c].reshape(1, -1), grid(v_c[:, None, None], mdp.P.shape).reshape(1, -1),
                           grid(v_c[None, None, :], mdp.P.shape).reshape(-1), clip_rho_threshold=None)[0]
        log_mu = grid(jnp.log(mu)[:, :, None], mdp.P.shape).reshape(-1)
        return res, log_mu, lr[0], (mu[:, :, None] * mdp.P).reshape(-1)

    def update(adv, prob):  # sum over cells of prob x advantage x score, per state: [S, A]
        return jnp.einsum("sa,sab->sb", jnp.sum((prob * adv).reshape(mdp.P.shape), axis=-1), u)

    log_pi_now = grid(jnp.log(pi)[:, :, None], mdp.P.shape).reshape(-1)
    total = jnp.zeros((S, A), pi.dtype)
    for c, (delay, kernel) in enumerate(zip(DELAYS, KERNELS)):
        res, _, lr, prob = cells(K - LAG, c)  # the batch consumed now
        now = rac_advantages(jnp.zeros_like(res), res, lr, kernel=kernel, delay=delay, clip_pg_rho_threshold=CLIP)
        total = total + update(now, prob)
        if delay:
            q = init_queue(len(kernel), res.shape[0], res.dtype)
            ages = range(len(kernel) - 1, -1, -1)  # oldest arrival first; age j came from K - LAG - delay - j
            batches = [cells(K - LAG - delay - j, c) for j in ages]
            for r_j, lm_j, _, _ in batches:
                q = queue_push(q, r_j, lm_j)
            adv = queue_advantages(q, jnp.broadcast_to(log_pi_now, q.log_mu.shape), kernel,
                                   clip_pg_rho_threshold=CLIP)  # [L, N], row = age
            for j, (_, _, _, prob_j) in zip(ages, batches):
                total = total + update(adv[j], prob_j)
    return truth["visitation"][:, None] * total


def path_data(key: Array, length: int = 7, width: int = 8) -> dict:
    """Random fast and slow channels on trajectories with episode ends (numpy, seeded by key)."""
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)))
    shape = (length, width)
    return dict(log_rhos=0.7 * rng.normal(size=shape), discounts=0.9 * (rng.random(shape) > 0.2),
                rewards=rng.normal(size=(2,) + shape), values=rng.normal(size=(2,) + shape),
                bootstrap_value=rng.normal(size=(2, width)))


def identity_error(data: dict, fns: tuple) -> Array:
    """max |RAC at delay 0 with the identity kernel (rac_advantages, and the queue at age 0) -
    V-trace pg advantage on the summed channels| (module docstring)."""
    residuals_fn, rac_advantages, init_queue, queue_push, queue_advantages, vtrace = fns
    rbar, cbar, pgbar = PATH_CLIPS
    lr, disc = data["log_rhos"], data["discounts"]
    r, v, bv = data["rewards"], data["values"], data["bootstrap_value"]
    clips = dict(clip_rho_threshold=rbar, clip_c_threshold=cbar)
    want = vtrace(lr, disc, r[0] + r[1], v[0] + v[1], bv[0] + bv[1], clip_pg_rho_threshold=pgbar,
                  **clips).pg_advantages
    fast = vtrace(lr, disc, r[0], v[0], bv[0], clip_pg_rho_threshold=pgbar, **clips).pg_advantages
    slow = residuals_fn(lr, disc, r[1], v[1], bv[1], **clips)
    direct = rac_advantages(fast, slow, lr, kernel=(1.0,), delay=0, clip_pg_rho_threshold=pgbar)
    q = queue_push(init_queue(1, lr.size, lr.dtype), slow.reshape(-1), -lr.reshape(-1))  # log mu = -log rho
    queued = fast + queue_advantages(q, jnp.zeros_like(q.log_mu), (1.0,),
                                     clip_pg_rho_threshold=pgbar).reshape(lr.shape)  # log pi_now = 0
    return jnp.maximum(maxabs(direct - want), maxabs(queued - want))


_UPDATE = fast_jit(library_update, static_argnums=(2,))
_IDENTITY = fast_jit(identity_error, static_argnums=(1,))


def update_row(ctx) -> Row:
    """The expected-update row (problem: ``rac_numbers(ctx)``, i.e. fold_in(ctx.key, 15))."""
    problem, (_, truth) = rac_numbers(ctx)
    with jax.enable_x64(True):
        got = np.asarray(_UPDATE(problem, truth, library_fns()))
    return pair_row("library RAC: queued clipped reinjection = exact expected update", "RAC", 1, got,
                    truth["update"], EXACT_TOL,
                    f"delays {DELAYS}, kernels {KERNELS}, cbar={CLIP:g}, behaviour lag {LAG}", min_size=1e-3)


def identity_row(ctx) -> Row:
    """The pathwise reduction row (data: fold_in(ctx.key, 19))."""
    with jax.enable_x64(True):
        err = float(_IDENTITY(path_data(jax.random.fold_in(ctx.key, 19)), library_fns()))
    rbar, cbar, pgbar = PATH_CLIPS
    return exact_row("library RAC: delay 0, identity kernel = library V-trace pg (pathwise)", "RAC", 0, err,
                     EXACT_TOL, f"direct and queued; rho_bar={rbar:g} c_bar={cbar:g} pg_rho_bar={pgbar:g}, "
                     "8 trajectories of 7 steps with episode ends")


def rac_library_rows(ctx) -> list[Row]:
    """Rows checking the library RAC estimator."""
    return [update_row(ctx), identity_row(ctx)]
