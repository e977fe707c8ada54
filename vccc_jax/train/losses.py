"""The learner's batch and its two losses.

:class:`Batch` is one update's learner batch ([T, B, ...], the rollout's layout: observations,
actions, behaviour / proximal log-probs, advantages, critic targets, sample weights);
``train.learner`` splits it into minibatches and calls, per minibatch:

* :func:`actor_loss`: ``estimators.actor.policy_loss`` (weight kind ratio / truncate / mask or
  a row of the actor table, PPO clip against pi_old, Eq 13 centring) on one minibatch;
* :func:`critic_loss`: 0.5 (V(s) - sg[y])^2 (Eq 7).

Top-k centring (``centering_topk = k > 0``, issue 12; §5.2, §7): the centred actor's
c(s) (hence Z(s) and m_w(s)) comes from the top-k summary of the logged behaviour row
(``lax.top_k(log_mu_all, k)``: what a real pipeline logs per token, k log-probs and ids)
plus the tail model of ``estimators.actor.centering_term_topk``, support-aware: the engine
also logs its sampler's support size n_s (one integer per token, known after its top-k / top-p
filter; here the count of finite entries of the logged row, ``actor.behaviour_support_size``),
and the unlogged mass lives on the n_s - k tokens pi_old ranks highest after the top-k
(:func:`support_model`; a non-truncating sampler has n_s = V, where this is the
tail over all other tokens, unchanged). The batch still holds the full behaviour rows, but
otherwise only for the diagnostics :func:`topk_centering_errors` (``mw_topk_rel_err``,
``z_topk_abs_err``: the tail-model error against the exact values; ``mw_norm``: the size of
the exact m_w).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import importance
from vccc_jax.train import actor_weights
from vccc_jax.train.programs import GridValues
from vccc_jax.train.setup import Setup, actor_row_params

Array = chex.Array

__all__ = ["Batch", "actor_loss", "critic_loss", "finish_topk_errors",
           "topk_centering_error_sums", "topk_centering_errors", "wmean"]


class Batch(NamedTuple):
    """One update's learner batch: time-major fields [T, B, ...] (the rollout's layout, env
    axis 1); minibatches (:func:`env_minibatches`) are rows [mb, ...]."""

    obs: Array
    action: Array
    log_mu: Array
    log_pi_old: Array
    log_mu_all: Array
    log_pi_old_all: Array
    advantages: Array
    targets: Array
    critic_w: Optional[Array] = None  # sample weights (replay validity); None: all 1
    actor_w: Optional[Array] = None  # critic_w x is_action (tool steps: no actor gradient)
    log_rho: Optional[Array] = None  # b_psi head (Eq 9): log rho and H per sample
    bstar_h: Optional[Array] = None
    actor_weight: Optional[Array] = None  # w of a per-update actor row (train.actor_weights)


def wmean(x: Array, w: Optional[Array]) -> Array:
    """mean(x), or the w-weighted mean when sample weights are given."""
    if w is None:
        return jnp.mean(x)
    return jnp.sum(w * x) / jnp.maximum(jnp.sum(w), 1.0)


def topk_centering_error_sums(
    log_pi_all: Array,
    log_mu_all: Array,
    k: int,
    *,
    kind: str,
    clip: Optional[float],
    weights: Optional[Array] = None,
    log_pi_old_all: Optional[Array] = None,
    support_size: Optional[Array] = None,
    max_support: Optional[int] = None,
) -> dict:
    """Sums over rows of the top-k centring error (pair with :func:`finish_topk_errors`).

    For a softmax policy c(s) = sum_a C(a) log pi_theta(a|s) has gradient wrt the logits
    m_w = C - (sum_a C(a)) pi_theta (§5.2, Eq 13; ``envs.samplers.m_w_topk``). Exact row:
    C = mu w (w from ``log_pi_old_all`` if given, else pi_theta; as ``actor.centering_term``),
    Z = sum_a C(a). Top-k + tail model: C_k from ``actor.centering_coefficients_topk`` of
    ``lax.top_k(log_mu_all, k)``, Z_k = sum_a C_k(a). Closed forms, O(V + k) per row.

    Args:
      log_pi_all, log_mu_all: [n, A] current-policy / behaviour log-probs (constants).
      k: the summary size (static, 1 <= k <= A).
      weights: [n] row weights (0: excluded, e.g. tool steps) or None (all 1).
      support_size, max_support: the support-aware tail (``actor.centering_coefficients_topk``):
        n_s [n] int (the sampler's support size) and a static bound on it, or None.

    Returns:
      {"mw_err_sq": sum_n w ||m_k - m||^2, "mw_sq": sum_n w ||m||^2,
       "z_abs_err": sum_n w |Z_k - Z|, "count": sum_n w}, scalars.
    """
    chex.assert_rank([log_pi_all, log_mu_all], 2)
    chex.assert_equal_shape([log_pi_all, log_mu_all])
    if not 1 <= k <= log_pi_all.shape[-1]:
        raise ValueError(f"k must be in [1, {log_pi_all.shape[-1]}], got {k}")
    sg = jax.lax.stop_gradient
    log_pi_all, log_mu_all = sg(log_pi_all), sg(log_mu_all)
    ref = log_pi_all if log_pi_old_all is None else sg(log_pi_old_all)
    chex.assert_equal_shape([ref, log_pi_all])
    c_exact = jnp.exp(log_mu_all) * importance.importance_weights(ref - log_mu_all, kind, clip)
    topk_log_mu, topk_ids = jax.lax.top_k(log_mu_all, k)
    top, tail = actor_lib.centering_coefficients_topk(
        ref, topk_log_mu, topk_ids, kind=kind, clip=clip, support_size=support_size,
        max_support=max_support)
    c_topk = jnp.put_along_axis(tail, topk_ids, top, axis=-1, inplace=False)  # tail is 0 there
    z, z_k = jnp.sum(c_exact, -1), jnp.sum(c_topk, -1)
    pi = jnp.exp(log_pi_all)
    m = c_exact - z[:, None] * pi
    m_k = c_topk - z_k[:, None] * pi
    w = jnp.ones(z.shape, z.dtype) if weights is None else weights.astype(z.dtype)
    chex.assert_equal_shape([w, z])
    return {"mw_err_sq": jnp.sum(w * jnp.sum(jnp.square(m_k - m), -1)),
            "mw_sq": jnp.sum(w * jnp.sum(jnp.square(m), -1)),
            "z_abs_err": jnp.sum(w * jnp.abs(z_k - z)),
            "count": jnp.sum(w)}


def finish_topk_errors(sums: dict) -> dict:
    """Sums of :func:`topk_centering_error_sums` (any leading axes: minibatches, epochs,
    summed over) -> {"mw_topk_rel_err": ||m_k - m||_2 / ||m||_2 over all rows (0 when both
    vanish, inf when only m does), "z_topk_abs_err": mean |Z_k - Z|, "mw_norm": the RMS
    ||m||_2 of the exact rows (read the relative error against it: when no weight is clipped
    m_w is 0 up to rounding, e.g. truncation at c >= max pi / mu, and so is its error)}."""
    err, sq = jnp.sum(sums["mw_err_sq"]), jnp.sum(sums["mw_sq"])
    count = jnp.maximum(jnp.sum(sums["count"]), 1e-30)
    rel = jnp.where(sq > 0, jnp.sqrt(err / jnp.where(sq > 0, sq, 1.0)),
                    jnp.where(err > 0, jnp.inf, 0.0))
    return {"mw_topk_rel_err": rel,
            "z_topk_abs_err": jnp.sum(sums["z_abs_err"]) / count,
            "mw_norm": jnp.sqrt(sq / count)}


def topk_centering_errors(log_pi_all, log_mu_all, k, kind, clip, weights=None,
                          log_pi_old_all=None, support_size=None, max_support=None) -> dict:
    """{"mw_topk_rel_err", "z_topk_abs_err", "mw_norm"} of the top-k + tail-model centring
    against the exact values over the rows of one batch (:func:`topk_centering_error_sums`)."""
    return finish_topk_errors(topk_centering_error_sums(
        log_pi_all, log_mu_all, k, kind=kind, clip=clip, weights=weights,
        log_pi_old_all=log_pi_old_all, support_size=support_size, max_support=max_support))


# -- the two losses ------------------------------------------------------------------------


def centering_k(setup: Setup) -> int:
    """``centering_topk`` checked against the action count (0: full rows)."""
    k = setup.cfg.centering_topk
    if k and k >= setup.num_actions:
        raise ValueError(f"centering_topk={k} must be < the number of actions "
                         f"{setup.num_actions} (0 uses the full behaviour rows)")
    return k


def support_model(setup: Setup) -> tuple[bool, Optional[int]]:
    """(support-aware?, max_support) of the top-k tail model, static, from the sampler.

    A sampler that cannot truncate (temperature / mismatch only, or the uncorrected
    learner, whose "behaviour" rows are pi_old) has n_s = V on every row, where the
    support-aware tail is every non-top-k token: (False, None), the first tail model,
    no ranking. Greedy: n_s = 1 (True, 1). Top-K (``top_k`` or the sampler's k): n_s <= K
    up to ties at the K-th logit, (True, K): one ``lax.top_k`` of size K - k; with an
    inference mismatch (bf16 / int8 rounding makes such ties likely) or top-p only,
    (True, None): the exact radix select of ``actor.tail_support_mask``."""
    cfg = setup.cfg
    if not cfg.correct:
        return False, None
    spec = cfg.sampler_spec
    top_k, top_p, greedy, mismatch = ((cfg.top_k, 1.0, False, "none") if spec is None else
                                      (spec.top_k, spec.top_p, spec.greedy, spec.mismatch))
    if greedy:
        return True, 1
    top_k = top_k if 0 < top_k < setup.num_actions else 0
    if top_k == 0 and top_p >= 1.0:
        return False, None
    return True, (top_k if top_k and mismatch == "none" else None)


def actor_loss(setup: Setup, values: GridValues, actor_params, mb_: Batch):
    """PPO-style actor loss (weights / clip / Eq 13 centring) on one minibatch whose
    advantages are already those of :func:`effective_advantages` (normalised over the
    minibatch; samples with ``actor_w`` = 0 (tool steps, empty replay slots) zeroed, so
    they carry no gradient, and the rest rescaled by mb / sum(w)).

    Returns (pg_loss, entropy, approx_kl, ppo_clip, topk_sums): ``topk_sums`` is {} unless
    ``centering_topk`` > 0, then :func:`topk_centering_error_sums` of this minibatch at the
    current parameters (the error of the centring this very step used)."""
    cfg, kind_ = setup.cfg, setup.actor_kind
    w = mb_.actor_w
    head = setup.head
    log_pi_all = head.normalize(setup.actor_logits(actor_params, mb_.obs))
    log_pi = head.log_prob(log_pi_all, mb_.action)
    adv = mb_.advantages  # normalised and weighted already (effective_advantages)
    centering, topk_sums = None, {}
    c_clip = None if kind_ == "ratio" else values.actor_clip
    k = centering_k(setup) if setup.centered else 0
    if setup.centered and k == 0:
        centering = actor_lib.centering_term(
            log_pi_all, mb_.log_mu_all, kind=kind_,
            clip=c_clip, log_pi_old_all=mb_.log_pi_old_all)
    elif setup.centered:  # what a real pipeline logs: k log-probs + ids, and n_s
        topk_log_mu, topk_ids = jax.lax.top_k(mb_.log_mu_all, k)
        aware, max_support = support_model(setup)
        n_s = actor_lib.behaviour_support_size(mb_.log_mu_all) if aware else None
        centering = actor_lib.centering_term_topk(
            log_pi_all, topk_log_mu, topk_ids, kind=kind_, clip=c_clip,
            log_pi_old_all=mb_.log_pi_old_all, support_size=n_s, max_support=max_support)
        topk_sums = topk_centering_error_sums(  # diagnostics only: full rows
            log_pi_all, mb_.log_mu_all, k, kind=kind_, clip=c_clip,
            weights=w, log_pi_old_all=mb_.log_pi_old_all, support_size=n_s,
            max_support=max_support)
    # the actor-correction row (issue 21): Eq 10 kinds by kind / clip, others by weights
    weights, ref, eps = None, mb_.log_pi_old, cfg.ppo_epsilon
    if mb_.actor_weight is not None:  # sequence / batch rows: w of the whole update
        weights = mb_.actor_weight
        if not setup.actor_row.trust_region:
            ref, eps = None, None
    elif not actor_weights.legacy(setup.actor_row):
        weights, ref, trust = actor_weights.minibatch_weights(
            setup.actor_row, actor_row_params(setup, values), log_pi, mb_.log_pi_old,
            mb_.log_mu, adv, w)
        eps = cfg.ppo_epsilon if trust else None
    kind = kind_ if weights is None else "ratio"
    pg_loss = actor_lib.policy_loss(
        log_pi, mb_.log_mu, adv, kind=kind,
        clip=None if kind == "ratio" else values.actor_clip,
        ppo_epsilon=eps, log_pi_old=ref, centering=centering, weights=weights)
    entropy = wmean(head.entropy(log_pi_all), w)
    log_r = log_pi - mb_.log_pi_old
    approx_kl = wmean(jnp.exp(log_r) - 1.0 - log_r, w)
    ppo_clip = (wmean((jnp.abs(jnp.exp(log_r) - 1.0) > cfg.ppo_epsilon)
                      .astype(jnp.float32), w) if cfg.ppo_epsilon is not None
                else jnp.zeros((), jnp.float32))
    return pg_loss, entropy, approx_kl, ppo_clip, topk_sums


def critic_loss(setup: Setup, critic_params, mb_: Batch):
    """0.5 (V(s) - sg[y])^2, Eq 7 (weighted by ``critic_w``)."""
    v = setup.critic_values(critic_params, mb_.obs)
    return 0.5 * wmean(jnp.square(v - mb_.targets), mb_.critic_w)
