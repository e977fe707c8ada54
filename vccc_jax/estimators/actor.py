"""Actor-side corrections: importance-weighted / PPO surrogates with score centering.

Notation of vccc_blog_en.txt §2 and §5: u = grad log pi_theta(a|s) (the score),
w(s, a) an action weight (ratio, truncated ratio, double-sided mask), and

    m_w(s) = E_{a~mu}[w(s, a) u(s, a) | s]                         (§5.2)

The score-centred update (Eq 2 / Eq 13) replaces w u by w u - m_w(s):

    g^SC(s) = E_mu[ A_t (w_t u(s_t, a_t) - m_w(s_t)) | s_t = s ],

which removes any dependence on a state-only baseline inside A_t (Eq 2). Everything here is
a *loss on log-probabilities*, so it composes with any network: m_w(s) enters through the
scalar "centering term"

    c(s) = sum_a sg(mu(a|s) w(s, a)) log pi_theta(a|s),   grad_theta c(s) = m_w(s),

computed by :func:`centering_term` from full log-probability vectors (or approximately from
top-k behaviour statistics by :func:`centering_term_topk`).
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import checks
from vccc_jax.estimators.importance import WeightKind, importance_weights

Array = chex.Array
sg = jax.lax.stop_gradient


def policy_loss(
    log_pi: Array,
    log_mu: Array,
    advantages: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    ppo_epsilon: Optional[float] = None,
    log_pi_old: Optional[Array] = None,
    centering: Optional[Array] = None,
) -> Array:
    """Mean policy loss (to minimise) over all tokens, with optional score centering (Eq 13).

    Per token t, with ref = ``log_pi_old`` if given else sg(``log_pi``):

        w_t = weight_kind(exp(ref_t - log_mu_t))           (stop-gradient; kind, clip)
        r_t = exp(log_pi_t - ref_t)                         (1 at the current params)
        J_t = w_t * r_t * A_t                               (ppo_epsilon None)
        J_t = w_t * min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)   (PPO clip)
        J_t -= A_t * c_t                                     (if ``centering`` is given)
        loss = -mean_t J_t

    Special cases: ``log_pi_old=log_mu``, kind="ratio" and ``ppo_epsilon`` set is standard
    PPO; no ``log_pi_old`` gives the gradient E_mu[w A u] (IS / TIS / MIS policy gradient);
    ``log_pi_old`` != ``log_mu`` is the decoupled objective (proximal policy pi_old,
    behaviour mu). With ``centering`` = :func:`centering_term` the gradient at r = 1 is
    E_mu[A (w u - m_w)], Eq 13.

    Args:
      log_pi: log pi_theta(a_t|s_t) (carries the gradient), any shape.
      log_mu: logged behaviour log-probabilities, same shape.
      advantages: A_t, same shape (treated as constants).
      kind, clip: the per-token weight (static).
      ppo_epsilon: PPO clip range (static) or None.
      log_pi_old: proximal policy log-probs (constants) or None.
      centering: c(s_t) per token (with gradient), e.g. from :func:`centering_term`.
    """
    checks.check_same_shape(
        log_pi=log_pi, log_mu=log_mu, advantages=advantages, log_pi_old=log_pi_old,
        centering=centering,
    )
    checks.check_log_probs("log_mu", log_mu)
    checks.check_log_probs("log_pi", log_pi)
    if ppo_epsilon is not None and not 0 < ppo_epsilon < 1:
        raise ValueError(f"ppo_epsilon must be in (0, 1), got {ppo_epsilon}")
    advantages = sg(advantages)
    ref = sg(log_pi) if log_pi_old is None else sg(log_pi_old)
    w = sg(importance_weights(ref - log_mu, kind, clip))
    r = jnp.exp(log_pi - ref)
    if ppo_epsilon is None:
        objective = w * r * advantages
    else:
        clipped_r = jnp.clip(r, 1.0 - ppo_epsilon, 1.0 + ppo_epsilon)
        objective = w * jnp.minimum(r * advantages, clipped_r * advantages)
    if centering is not None:
        objective = objective - advantages * centering
    return -jnp.mean(objective)


def centering_term(
    log_pi_all: Array,
    log_mu_all: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    log_pi_old_all: Optional[Array] = None,
) -> Array:
    """c(s) = sum_a sg(mu(a|s) w(s, a)) log pi_theta(a|s), whose gradient is m_w(s) (§5.2).

    Args:
      log_pi_all: [..., A] current-policy log-probabilities of every action (with gradient).
      log_mu_all: [..., A] behaviour log-probabilities of every action (as sampled:
        temperature / top-k included; -inf for actions mu cannot emit).
      log_pi_old_all: [..., A] proximal-policy log-probabilities (constants). When given, the
        weight is w(exp(log_pi_old - log_mu)), matching :func:`policy_loss` with
        ``log_pi_old`` (the decoupled / multi-epoch PPO case); else w uses sg(log_pi_all).

    Returns:
      [...] one scalar per state. For kind="ratio" with full support, mu w = pi, so
      m_w = E_pi[u] = 0 and centering is a no-op in expectation, as it should be.
    """
    checks.check_same_shape(
        log_pi_all=log_pi_all, log_mu_all=log_mu_all, log_pi_old_all=log_pi_old_all
    )
    checks.check_rank_at_least("log_pi_all", log_pi_all, 1)
    ref = sg(log_pi_all) if log_pi_old_all is None else sg(log_pi_old_all)
    w = importance_weights(ref - log_mu_all, kind, clip)
    coeff = sg(jnp.exp(log_mu_all) * w)
    return jnp.sum(coeff * log_pi_all, axis=-1)


def centering_term_topk(
    log_pi_all: Array,
    topk_log_mu: Array,
    topk_ids: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
) -> Array:
    """Approximate c(s) from a top-k summary of the behaviour distribution plus a tail term.

    For large vocabularies only the k most likely behaviour tokens are logged (as the
    write-up suggests, §5.2 and §7). Tail model: the unlogged behaviour mass
    1 - sum_topk mu is spread over the remaining actions in proportion to pi_theta, so each
    tail action has mu(a) = tail_mu * pi(a) / tail_pi and one common ratio
    rho_tail = tail_pi / tail_mu. The result is exact when k covers the support, and its
    error is otherwise the tail-model error, which callers should track separately from
    Bellman-target error.

    Args:
      log_pi_all: [..., A] current-policy log-probs (with gradient).
      topk_log_mu: [..., k] logged behaviour log-probs of the top-k tokens.
      topk_ids: [..., k] their action ids (int, distinct).
    """
    checks.check_same_shape(topk_log_mu=topk_log_mu, topk_ids=topk_ids)
    chex.assert_type(topk_ids, int)
    num_actions = log_pi_all.shape[-1]
    in_topk = jnp.sum(jax.nn.one_hot(topk_ids, num_actions, dtype=log_pi_all.dtype), axis=-2)
    pi_all = sg(jnp.exp(log_pi_all))
    topk_log_pi = jnp.take_along_axis(log_pi_all, topk_ids, axis=-1)
    tail_mu = jnp.clip(1.0 - jnp.sum(jnp.exp(topk_log_mu), axis=-1), 0.0, 1.0)
    tail_pi = jnp.clip(jnp.sum(pi_all * (1.0 - in_topk), axis=-1), 0.0, 1.0)
    # Top-k part: exact.
    w_top = importance_weights(sg(topk_log_pi) - topk_log_mu, kind, clip)
    top = jnp.sum(sg(jnp.exp(topk_log_mu) * w_top) * topk_log_pi, axis=-1)
    # Tail part: mu(a) = tail_mu * pi(a) / tail_pi, one common log-ratio for all tail actions.
    safe = (tail_mu > 0) & (tail_pi > 0)
    log_rho_tail = jnp.where(
        safe, jnp.log(jnp.where(safe, tail_pi, 1.0)) - jnp.log(jnp.where(safe, tail_mu, 1.0)), 0.0
    )
    w_tail = importance_weights(log_rho_tail, kind, clip)
    tail_mu_a = jnp.where(
        safe[..., None], tail_mu[..., None] * pi_all / jnp.where(safe, tail_pi, 1.0)[..., None], 0.0
    )
    tail = jnp.sum(sg(tail_mu_a * w_tail[..., None] * (1.0 - in_topk)) * log_pi_all, axis=-1)
    return top + tail
