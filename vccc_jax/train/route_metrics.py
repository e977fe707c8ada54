"""Sampled diagnostics of the decoupled pi_old routes in the neural trainer (issue 13).

The exact tabular study (``runs.decoupled``, ``vccc sweep --config
experiments/decoupled_routes.toml``) measures the routes in closed form; this module measures
them SAMPLED, on the trainer's own batches (gymnax envs with an inference-mismatch sampler,
``envs.samplers``), against the exact route as the reference.

Per update (every ``gt_every`` updates, :func:`route_diagnostics`), at the
start-of-update actor params theta_k and on the update's batch with its advantages:

* the batch is split into ``num_minibatches`` FIXED contiguous minibatches (rows in the
  learner's flattened [T * B] order, no shuffling) and the actor-loss gradient g_m is taken
  per minibatch (``losses.actor_loss``: w(pi_old / mu) x PPO-clip(pi_theta / pi_old), the
  decoupled objective of the related-work abstract; write-up Eq 13 notation), once with
  pi_old from the configured route and once with the exact route's pi_old (the
  training-side log-probs of each token's behaviour version);
* :func:`grad_stats`: ``route_grad_rel_bias`` = |gbar_route - gbar_exact| / |gbar_exact|,
  ``route_grad_cos`` = cos(gbar_route, gbar_exact), ``route_grad_rel_var`` =
  mean_m |g_route,m - gbar_route|^2 / |gbar_exact|^2 and ``exact_grad_rel_var`` (the same
  for the exact route), gbar = mean over minibatches. The variance is the between-minibatch
  spread of one update's gradient estimates: the sampling noise of an actor step of that
  minibatch size, in units of the exact mean gradient's squared norm;
* :func:`fire_rates`: where the PPO clip of the staleness factor pi_theta / pi_old acts
  (|r - 1| > eps at theta_k) and where the truncation / mask of the discrepancy factor
  w(pi_old / mu) acts (``estimators.related.decoupled.decoupled_ratios``), under the route
  (``route_*``) and under the exact route (``exact_*``): the clip/mask interaction.

Only the actor side: the trainer's critic target uses pi_k / mu and does not depend on the
route (the exact tabular study covers the critic side).
"""

from __future__ import annotations

from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.train.learner import effective_advantages, flat_rows
from vccc_jax.train.losses import Batch, actor_loss
from vccc_jax.train.programs import GridValues
from vccc_jax.train.setup import Setup

Array = chex.Array

__all__ = ["ROUTE_METRICS", "fire_rates", "fixed_minibatches", "fixed_rows", "grad_stats",
           "minibatch_grads", "nan_metrics", "route_diagnostics", "route_vs_exact"]

ROUTE_METRICS = ("route_grad_rel_bias", "route_grad_cos", "route_grad_rel_var",
                 "exact_grad_rel_var", "route_ppo_clip_frac", "route_w_clip_frac",
                 "exact_ppo_clip_frac", "exact_w_clip_frac")
_TINY = 1e-30


def nan_metrics() -> dict:
    """Every route metric as a float32 NaN (route off or off-cycle)."""
    return {k: jnp.full((), jnp.nan, jnp.float32) for k in ROUTE_METRICS}


def fixed_minibatches(batch, num_minibatches: int):
    """Rows [n, ...] -> [num_minibatches, n / num_minibatches, ...] in order (no shuffle)."""
    def split(x):
        n = x.shape[0]
        if n % num_minibatches:
            raise ValueError(f"num_minibatches={num_minibatches} must divide the batch size {n}")
        return x.reshape((num_minibatches, n // num_minibatches) + x.shape[1:])

    return jax.tree_util.tree_map(split, batch)


def minibatch_grads(loss_fn: Callable, params, batches) -> Array:
    """Flat gradients [M, P] of ``loss_fn(params, minibatch)`` for each of M minibatches."""
    def one(mb):
        return ravel_pytree(jax.grad(loss_fn)(params, mb))[0]

    return jax.vmap(one)(batches)


def grad_stats(g_route: Array, g_exact: Array) -> dict:
    """Bias, cosine and between-minibatch variance of [M, P] route gradients vs the exact
    route's (module docstring). Identical inputs give bias exactly 0 and equal variances."""
    chex.assert_rank(g_route, 2)
    chex.assert_equal_shape([g_route, g_exact])
    mean_r, mean_e = jnp.mean(g_route, 0), jnp.mean(g_exact, 0)
    sq_e = jnp.sum(jnp.square(mean_e))
    norm_e = jnp.sqrt(sq_e)
    norm_r = jnp.sqrt(jnp.sum(jnp.square(mean_r)))
    spread = lambda g, m: jnp.mean(jnp.sum(jnp.square(g - m[None]), -1))  # noqa: E731
    return {
        "route_grad_rel_bias": jnp.sqrt(jnp.sum(jnp.square(mean_r - mean_e))) / jnp.maximum(norm_e, _TINY),
        "route_grad_cos": jnp.sum(mean_r * mean_e) / jnp.maximum(norm_r * norm_e, _TINY),
        "route_grad_rel_var": spread(g_route, mean_r) / jnp.maximum(sq_e, _TINY),
        "exact_grad_rel_var": spread(g_exact, mean_e) / jnp.maximum(sq_e, _TINY),
    }


def fire_rates(log_pi: Array, log_pi_old: Array, log_mu: Array, w: Optional[Array], *,
               kind: str, clip: Optional[float], ppo_epsilon: Optional[float]) -> tuple[Array, Array]:
    """(PPO-clip fire rate of pi_theta / pi_old, truncation / mask fire rate of w(pi_old /
    mu)), weighted means over tokens (``w``: sample weights or None). ``kind`` "ratio" (no
    truncation) counts only the non-finite guard of ``safe_ratios``."""
    out = dec.decoupled_ratios(log_pi, log_pi_old, log_mu, kind=kind,
                               clip=None if kind == "ratio" else clip, ppo_epsilon=ppo_epsilon)
    weights = jnp.ones(log_pi.shape, jnp.float32) if w is None else w
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    rate = lambda fired: jnp.sum(weights * fired.astype(jnp.float32)) / denom  # noqa: E731
    return rate(out.staleness_fired), rate(out.discrepancy_fired)


def route_vs_exact(loss_fn: Callable, params, batch, exact_batch, log_pi: Array,
                   num_minibatches: int, *, same: bool, kind: str, clip: Optional[float],
                   ppo_epsilon: Optional[float]) -> dict:
    """Every metric of ``ROUTE_METRICS`` (float32) for one update.

    ``loss_fn(params, minibatch)``: the actor loss (``losses.actor_loss``'s first output);
    ``batch`` / ``exact_batch``: the learner's rows ([n, ...], fields ``log_pi_old``,
    ``log_mu``, ``actor_w``) with pi_old from the route / from the exact route; ``log_pi``:
    log pi_theta(a_t|s_t) at ``params`` [n] (the PPO ratio's numerator at the start of the
    update); ``same``: the route IS the exact route (its gradients are reused: bias 0)."""
    def grads(b):
        return minibatch_grads(loss_fn, params, fixed_minibatches(b, num_minibatches))

    g_exact = grads(exact_batch)
    out = grad_stats(g_exact if same else grads(batch), g_exact)
    for name, b in (("route", batch), ("exact", exact_batch)):
        ppo, w = fire_rates(log_pi, b.log_pi_old, b.log_mu, batch.actor_w, kind=kind,
                            clip=clip, ppo_epsilon=ppo_epsilon)
        out[f"{name}_ppo_clip_frac"], out[f"{name}_w_clip_frac"] = ppo, w
    return {k: out[k].astype(jnp.float32) for k in ROUTE_METRICS}


def fixed_rows(setup: Setup, batch: Batch) -> Batch:
    """The [T B] time-major rows the route diagnostics split into ``num_minibatches``
    fixed contiguous minibatches, advantages as the actor loss takes them on each
    (``losses.effective_advantages``)."""
    rows = flat_rows(batch)
    m = setup.cfg.num_minibatches
    per_mb = lambda x: None if x is None else x.reshape((m, -1))  # noqa: E731
    adv = effective_advantages(per_mb(rows.advantages), per_mb(rows.actor_w),
                               setup.cfg.normalize_advantages)
    return rows._replace(advantages=adv.reshape(-1))


def route_diagnostics(setup: Setup, values: GridValues, actor_params, ltraj, prep,
                      batch: Batch, idx: Array) -> dict:
    """Sampled bias / variance of the actor update under the configured pi_old route vs
    the exact route, and the PPO-clip / discrepancy-threshold fire rates of both
    (names ``ROUTE_METRICS``), every ``gt_every`` updates inside a real ``lax.cond`` (NaN
    off-cycle and with ``gt_every=0``, so speed runs pay nothing), at the start-of-update
    ``actor_params`` on the update's learner ``batch`` [T, B] with its (start-of-update)
    advantages, over ``num_minibatches`` fixed minibatches (:func:`fixed_rows`).

    Actor side only: the critic target uses pi_k / mu whatever the route (the exact
    tabular study, ``experiments/decoupled_routes.toml``, covers the critic side)."""
    cfg = setup.cfg
    if not setup.route_diag:
        return nan_metrics()
    batch = fixed_rows(setup, batch)
    n = batch.obs.shape[0]
    exact, exact_all = dec.route_log_pi_old(
        "exact", ltraj.action, log_pi_all=ltraj.log_pi_all,
        log_mu_all=prep.inputs.log_mu_all, behaviour_log_pi_all=ltraj.log_b_all,
        head=setup.head)
    exact_batch = batch._replace(log_pi_old=exact.reshape(n),
                                 log_pi_old_all=exact_all.reshape((n, -1)))

    def compute(_):
        return route_vs_exact(
            lambda p, mb: actor_loss(setup, values, p, mb)[0], actor_params, batch,
            exact_batch, prep.log_pi_old.reshape(n), cfg.num_minibatches,
            same=cfg.pi_old_route == "exact", kind=setup.actor_kind, clip=values.actor_clip,
            ppo_epsilon=cfg.ppo_epsilon)

    return jax.lax.cond((idx + 1) % cfg.gt_every == 0, compute,
                        lambda _: nan_metrics(), None)
