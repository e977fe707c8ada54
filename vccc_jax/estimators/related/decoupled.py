"""Decoupled correction with missing old logits: exact routes, PPO-EWMA, naive (issue 13).

Source: the decoupled-correction abstract in ``shared/seeds/related_abstracts.txt``; our
reading in DESIGN.md Sec 5. The actor's total ratio splits into

    pi_theta / mu  =  (pi_old^train / mu^inference)  x  (pi_theta / pi_old)
                      discrepancy factor d              staleness factor r

d aligns the inference-side sampler mu (perturbed / quantised / tempered logits of the
*same* version) with the training-side log-probabilities of that version; it is truncated
(min(d, c)) or double-sided masked (d 1[1/c <= d <= c]) and carries no gradient. r is the
PPO ratio, clipped to [1 - eps, 1 + eps]. Per token (Eq 13 notation of the write-up):

    J_t = w(d_t) * min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)

which is exactly :func:`vccc_jax.estimators.actor.policy_loss` with ``log_pi_old`` (this
module reuses it). Everything hinges on where log pi_old comes from (``ROUTES``):

* ``"exact"`` -- the training-side log-probabilities of the behaviour version. Both exact
  acquisition strategies of the abstract give the same numbers and differ only in cost:
  *version snapshots* keep the parameters of every version still in flight (memory
  ``(max_lag + 1) x |theta|``, one forward pass per token with the snapshot of its
  version); a *dedicated old-logit model* recomputes them with a separate model replica
  that trails the learner (memory ``2 x |theta|``, one extra forward pass per token).
  :func:`route_cost` states both.
* ``"ewma"`` -- PPO-EWMA (Hilton, Cobbe & Schulman 2021, "Batch size-invariance for policy
  optimization"): the proximal policy is the network evaluated at an exponential moving
  average of past actor parameters. Which EWMA: the bias-corrected (Adam-style) EMA of the
  parameters, m_k = beta m_{k-1} + (1 - beta) theta_k, m_0 = 0, pi_old = pi(. ; m_k /
  (1 - beta^k)), updated once per optimiser step (:func:`ewma_init`, :func:`ewma_update`,
  :func:`ewma_params`; one extra parameter copy, one extra forward pass). Which rate: the
  EMA's weights on theta_{k - j} have mean age beta / (1 - beta), so we match it to the
  pipeline's mean lag L: beta = L / (1 + L) (:func:`ewma_decay_for_lag`; L = 0 gives the
  current parameters). The "revised" PPO-EWMA of the abstract is not specified further; we
  keep the original (EMA of parameters, debiased).
* ``"behaviour"`` -- the naive fallback pi_old := mu. Then d == 1 (the discrepancy mask or
  truncation never fires) and the whole mismatch pi_theta / mu sits inside the PPO clip:
  the two thresholds become entangled (the clip now fires on inference noise even at lag
  0, and the discrepancy threshold has no effect), the failure the abstract describes.

Critic side: :func:`decoupled_weights` returns the per-token weight w(d) * r_clip that a
one-step importance-weighted critic target (Eq 8 / Eq 10) uses for each route.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from vccc_jax.estimators.actor import policy_loss
from vccc_jax.estimators.importance import importance_weights, safe_ratios

Array = chex.Array

ROUTES = ("exact", "ewma", "behaviour")
DISCREPANCY_KINDS = ("ratio", "truncate", "mask")


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")


def old_log_probs(route: str, log_mu: Array, *, exact_log_pi_old: Optional[Array] = None,
                  ewma_log_pi: Optional[Array] = None) -> Array:
    """log pi_old for a route: the exact training-side log-probs, the EWMA policy's, or mu's.

    ``exact_log_pi_old`` (from a version snapshot or a dedicated old-logit model) is
    required for ``"exact"``, ``ewma_log_pi`` (the network at :func:`ewma_params`) for
    ``"ewma"``; ``"behaviour"`` returns ``log_mu``. Always a constant (stop_gradient).
    """
    _check_route(route)
    if route == "exact":
        if exact_log_pi_old is None:
            raise ValueError("route 'exact' needs exact_log_pi_old (snapshot / old-logit model)")
        chex.assert_equal_shape([exact_log_pi_old, log_mu])
        return jax.lax.stop_gradient(exact_log_pi_old)
    if route == "ewma":
        if ewma_log_pi is None:
            raise ValueError("route 'ewma' needs ewma_log_pi (the policy at the EWMA parameters)")
        chex.assert_equal_shape([ewma_log_pi, log_mu])
        return jax.lax.stop_gradient(ewma_log_pi)
    return jax.lax.stop_gradient(log_mu)


class DecoupledRatios(NamedTuple):
    """discrepancy: w(pi_old / mu) after truncation / masking; staleness: pi_theta / pi_old
    (unclipped); staleness_clipped: clip(staleness, 1 - eps, 1 + eps) (or unclipped);
    discrepancy_fired / staleness_fired: where the truncation/mask or the PPO clip acted."""

    discrepancy: Array
    staleness: Array
    staleness_clipped: Array
    discrepancy_fired: Array
    staleness_fired: Array


def decoupled_ratios(log_pi: Array, log_pi_old: Array, log_mu: Array, *,
                     kind: str = "truncate", clip: Optional[float] = 2.0,
                     ppo_epsilon: Optional[float] = 0.2) -> DecoupledRatios:
    """The two factors of the split ratio and where each threshold fires (any shape)."""
    chex.assert_equal_shape([log_pi, log_pi_old, log_mu])
    if kind not in DISCREPANCY_KINDS:
        raise ValueError(f"kind must be one of {DISCREPANCY_KINDS}, got {kind!r}")
    raw_d = safe_ratios(log_pi_old - log_mu)
    d = importance_weights(log_pi_old - log_mu, kind, clip)
    r = safe_ratios(log_pi - log_pi_old)
    if ppo_epsilon is None:
        r_c = r
    else:
        if not 0 < ppo_epsilon < 1:
            raise ValueError(f"ppo_epsilon must be in (0, 1), got {ppo_epsilon}")
        r_c = jnp.clip(r, 1.0 - ppo_epsilon, 1.0 + ppo_epsilon)
    return DecoupledRatios(discrepancy=d, staleness=r, staleness_clipped=r_c,
                           discrepancy_fired=d != raw_d, staleness_fired=r_c != r)


def decoupled_weights(log_pi: Array, log_pi_old: Array, log_mu: Array, *,
                      kind: str = "truncate", clip: Optional[float] = 2.0,
                      ppo_epsilon: Optional[float] = 0.2) -> Array:
    """Critic-side weight w(pi_old / mu) * clip(pi / pi_old, 1 - eps, 1 + eps), a constant;
    plug into a one-step target Vbar + w delta (Eq 8 / 10)."""
    out = decoupled_ratios(log_pi, log_pi_old, log_mu, kind=kind, clip=clip,
                           ppo_epsilon=ppo_epsilon)
    return jax.lax.stop_gradient(out.discrepancy * out.staleness_clipped)


def decoupled_policy_loss(log_pi: Array, log_mu: Array, advantages: Array, *, route: str,
                          exact_log_pi_old: Optional[Array] = None,
                          ewma_log_pi: Optional[Array] = None, kind: str = "truncate",
                          clip: Optional[float] = 2.0, ppo_epsilon: Optional[float] = 0.2,
                          centering: Optional[Array] = None) -> Array:
    """Mean decoupled PPO loss (to minimise) for a route: ``actor.policy_loss`` with
    ``log_pi_old`` from :func:`old_log_probs` (w(pi_old/mu) * PPO-clipped pi_theta/pi_old)."""
    ref = old_log_probs(route, log_mu, exact_log_pi_old=exact_log_pi_old,
                        ewma_log_pi=ewma_log_pi)
    return policy_loss(log_pi, log_mu, advantages, kind=kind, clip=clip if kind != "ratio" else None,
                       ppo_epsilon=ppo_epsilon, log_pi_old=ref, centering=centering)


def route_log_pi_old(route: str, action: Array, *, log_pi_all: Array, log_mu_all: Array,
                     behaviour_log_pi_all: Optional[Array] = None,
                     ewma_logits: Optional[Array] = None) -> tuple[Array, Array]:
    """The trainer's pi_old for ``TrainConfig.pi_old_route`` -> (log pi_old(a_t|s_t) [T, B],
    log pi_old(.|s_t) [T, B, A]), constants.

    route ``""`` (off): pi_k, the learner at the start of the update (``log_pi_all``; the
    trainer's proximal policy before this option existed, same numbers). ``"exact"``:
    the training-side log-probs of each token's behaviour version
    (``behaviour_log_pi_all`` = log_softmax of that version's logits, before the sampler's
    temperature / top-k / mismatch; from a version snapshot). ``"ewma"``: log_softmax of
    ``ewma_logits`` (the actor at :func:`ewma_params`). ``"behaviour"``: the sampler's
    ``log_mu_all``. The actor then uses ``actor.policy_loss(log_pi, log_mu, A,
    log_pi_old=...)``: w(pi_old / mu) x PPO-clip(pi_theta / pi_old) (module docstring).
    """
    chex.assert_equal_shape([log_pi_all, log_mu_all])
    chex.assert_shape(action, log_pi_all.shape[:-1])
    if route == "":
        full = log_pi_all
    else:
        _check_route(route)
        if route == "exact":
            if behaviour_log_pi_all is None:
                raise ValueError("pi_old_route 'exact' needs behaviour_log_pi_all")
            full = behaviour_log_pi_all
        elif route == "ewma":
            if ewma_logits is None:
                raise ValueError("pi_old_route 'ewma' needs ewma_logits")
            full = jax.nn.log_softmax(ewma_logits, axis=-1)
        else:
            full = log_mu_all
    chex.assert_equal_shape([full, log_pi_all])
    full = jax.lax.stop_gradient(full)
    return jnp.take_along_axis(full, action[..., None], -1)[..., 0], full


def trainer_ewma_decay(ewma_decay: Optional[float], mean_lag: float) -> float:
    """``TrainConfig.ewma_decay`` or, if None, :func:`ewma_decay_for_lag` of the lag law's mean."""
    return float(ewma_decay) if ewma_decay is not None else ewma_decay_for_lag(mean_lag)


# ----------------------------------------------------------------------------- PPO-EWMA


class EwmaState(NamedTuple):
    """mean: the (biased) EMA m_k of the parameters; count: k, the number of updates."""

    mean: Any
    count: Array


def ewma_decay_for_lag(mean_lag: float) -> float:
    """beta with mean EMA age beta / (1 - beta) = mean_lag, i.e. beta = L / (1 + L)."""
    if not mean_lag >= 0:
        raise ValueError(f"mean_lag must be >= 0, got {mean_lag}")
    return float(mean_lag) / (1.0 + float(mean_lag))


def ewma_init(params: Any) -> EwmaState:
    """m_0 = 0 (debiased by :func:`ewma_params`), k = 0."""
    return EwmaState(mean=jax.tree_util.tree_map(jnp.zeros_like, params),
                     count=jnp.zeros((), jnp.int32))


def ewma_update(state: EwmaState, params: Any, decay) -> EwmaState:
    """m_k = decay m_{k-1} + (1 - decay) theta_k (``optax.incremental_update``), k += 1. Pure."""
    mean = optax.incremental_update(params, state.mean, 1.0 - jnp.asarray(decay))
    return EwmaState(mean=mean, count=state.count + 1)


def ewma_params(state: EwmaState, decay) -> Any:
    """Debiased EMA m_k / (1 - decay^k): a convex combination of theta_1..theta_k (k >= 1)."""
    corr = 1.0 - jnp.asarray(decay) ** state.count
    corr = jnp.where(corr > 0, corr, 1.0)
    return jax.tree_util.tree_map(lambda m: m / corr.astype(m.dtype), state.mean)


def route_cost(route: str, *, num_params: int, max_lag: int, exact_strategy: str = "snapshot") -> dict:
    """Memory (parameter copies beyond the learner's) and extra forward passes per token.

    exact/snapshot: max_lag + 1 copies (every version in flight), 1 forward pass (the
    snapshot of each token's version); exact/old_logit_model: 1 copy, 1 pass; ewma: 1 copy
    (the EMA), 1 pass; behaviour: 0, 0.
    """
    _check_route(route)
    if route == "exact":
        if exact_strategy not in ("snapshot", "old_logit_model"):
            raise ValueError(f"exact_strategy must be 'snapshot' or 'old_logit_model', got {exact_strategy!r}")
        copies = max_lag + 1 if exact_strategy == "snapshot" else 1
        return dict(param_copies=copies, extra_params=copies * num_params, extra_forward_passes=1)
    if route == "ewma":
        return dict(param_copies=1, extra_params=num_params, extra_forward_passes=1)
    return dict(param_copies=0, extra_params=0, extra_forward_passes=0)


__all__ = [
    "ROUTES", "DISCREPANCY_KINDS", "old_log_probs", "DecoupledRatios", "decoupled_ratios",
    "decoupled_weights", "decoupled_policy_loss", "EwmaState", "ewma_decay_for_lag",
    "ewma_init", "ewma_update", "ewma_params", "route_cost", "route_log_pi_old",
    "trainer_ewma_decay",
]
