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
* ``"interpolated"`` -- AReaL's approximated proximal policy (A-3PO, ``prox_logp_method=
  loglinear``; AReaL ``areal/trainer/ppo/actor.py::compute_prox_logp_approximations``, docs
  ``docs/en/algorithms/prox_approx.md``): no forward pass for pi_old; per token, log pi_prox
  = log mu + alpha (log pi_theta - log mu), alpha = (v_prox - v_behave) / (v_theta -
  v_behave) clipped to [0, 1], with AReaL's v_prox = v_theta - 1. With the token's lag l =
  v_theta - v_behave: alpha = (l - 1) / l for l >= 1, 0 at l = 0 (alpha = 0 at l = 1 too:
  pi_prox = mu). pi_theta is the learner at the update's start (pi_k: what AReaL's first
  minibatch reads; later minibatches read the drifting learner). Not a normalised
  distribution (sum_a mu^(1 - alpha) pi^alpha <= 1, Hoelder): AReaL only ever reads the
  taken token's value; the trainer's full-row uses (score centring, KL diagnostics) read it
  as is. :func:`interpolated_log_prox`.
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

ROUTES = ("exact", "ewma", "behaviour", "interpolated")
DISCREPANCY_KINDS = ("ratio", "truncate", "mask")


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")


def interpolation_alpha(lags: Array) -> Array:
    """A-3PO's alpha = (v_prox - v_behave) / (v_theta - v_behave) with v_prox = v_theta - 1
    and lag l = v_theta - v_behave: (l - 1) / l for l >= 1, 0 for l <= 0 (AReaL clips to
    [0, 1] and sets 0 where v_theta = v_behave)."""
    lags = jnp.asarray(lags)
    l = lags.astype(jnp.result_type(float))
    return jnp.where(lags > 0, jnp.maximum(l - 1.0, 0.0) / jnp.maximum(l, 1.0), 0.0)


def interpolated_log_prox(log_mu: Array, log_pi: Array, lags: Array, mix_fn=None) -> Array:
    """A-3PO's log pi_prox = log mu + alpha (log pi - log mu) (:func:`interpolation_alpha`;
    ``lags`` broadcast against the log-probs), written (1 - alpha) log mu + alpha log pi so a
    -inf log mu (off a top-k sampler's support) stays -inf instead of -inf + inf; alpha = 0
    returns log mu exactly. ``mix_fn(log_mu, log_pi, alpha)``: another head's interpolation
    of its rows (a Gaussian's geometric mixture, ``envs.policy_heads``). A constant
    (stop_gradient)."""
    alpha = interpolation_alpha(lags).astype(log_mu.dtype)
    mix = (1.0 - alpha) * log_mu + alpha * log_pi if mix_fn is None else mix_fn(log_mu, log_pi, alpha)
    return jax.lax.stop_gradient(jnp.where(alpha > 0, mix, log_mu))


def old_log_probs(route: str, log_mu: Array, *, exact_log_pi_old: Optional[Array] = None,
                  ewma_log_pi: Optional[Array] = None, log_pi: Optional[Array] = None,
                  lags: Optional[Array] = None) -> Array:
    """log pi_old for a route: the exact training-side log-probs, the EWMA policy's, A-3PO's
    interpolation, or mu's.

    ``exact_log_pi_old`` (from a version snapshot or a dedicated old-logit model) is
    required for ``"exact"``, ``ewma_log_pi`` (the network at :func:`ewma_params`) for
    ``"ewma"``, ``log_pi`` (the learner's, no gradient needed) and the per-token ``lags`` for
    ``"interpolated"``; ``"behaviour"`` returns ``log_mu``. Always a constant (stop_gradient).
    """
    _check_route(route)
    if route == "interpolated":
        if log_pi is None or lags is None:
            raise ValueError("route 'interpolated' needs log_pi (the learner's log-probs) and the "
                             "per-token lags")
        chex.assert_equal_shape([log_pi, log_mu])
        return interpolated_log_prox(log_mu, log_pi, lags)
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
                     ewma_logits: Optional[Array] = None,
                     lags: Optional[Array] = None, head=None) -> tuple[Array, Array]:
    """The trainer's pi_old for ``TrainConfig.pi_old_route`` -> (log pi_old(a_t|s_t) [T, B],
    log pi_old(.|s_t) [T, B, A]), constants.

    route ``""`` (off): pi_k, the learner at the start of the update (``log_pi_all``; the
    trainer's proximal policy before this option existed, same numbers). ``"exact"``:
    the training-side log-probs of each token's behaviour version
    (``behaviour_log_pi_all`` = log_softmax of that version's logits, before the sampler's
    temperature / top-k / mismatch; from a version snapshot). ``"ewma"``: log_softmax of
    ``ewma_logits`` (the actor at :func:`ewma_params`). ``"behaviour"``: the sampler's
    ``log_mu_all``. ``"interpolated"``: A-3PO's (1 - alpha) log mu + alpha log pi_k per action
    (:func:`interpolated_log_prox`, ``lags`` [T, B] the tokens' version lags). The actor then uses ``actor.policy_loss(log_pi, log_mu, A,
    log_pi_old=...)``: w(pi_old / mu) x PPO-clip(pi_theta / pi_old) (module docstring).

    ``head``: the policy head whose rows the ``*_all`` arrays are (``envs.policy_heads``:
    ``normalize``, ``log_prob``, ``interpolate``), or None: categorical log-prob rows.
    """
    chex.assert_equal_shape([log_pi_all, log_mu_all])
    if head is None:
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
            full = (jax.nn.log_softmax(ewma_logits, axis=-1) if head is None
                    else head.normalize(ewma_logits))
        elif route == "interpolated":
            if lags is None:
                raise ValueError("pi_old_route 'interpolated' needs the per-token lags")
            chex.assert_shape(lags, log_pi_all.shape[:-1])
            full = interpolated_log_prox(log_mu_all, log_pi_all, lags[..., None],
                                         None if head is None else head.interpolate)
        else:
            full = log_mu_all
    chex.assert_equal_shape([full, log_pi_all])
    full = jax.lax.stop_gradient(full)
    if head is None:
        return jnp.take_along_axis(full, action[..., None], -1)[..., 0], full
    return head.log_prob(full, action), full


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
    "ROUTES", "DISCREPANCY_KINDS", "interpolated_log_prox", "interpolation_alpha",
    "old_log_probs", "DecoupledRatios", "decoupled_ratios",
    "decoupled_weights", "decoupled_policy_loss", "EwmaState", "ewma_decay_for_lag",
    "ewma_init", "ewma_update", "ewma_params", "route_cost", "route_log_pi_old",
    "trainer_ewma_decay",
]
