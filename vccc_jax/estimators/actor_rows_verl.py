"""Weights of the actor rows from verl's policy-loss registry (issue 29; registered in
``estimators.actor_registry``; docs/method.md A10-A12).

Source: verl ``verl/trainer/ppo/core_algos.py`` (``@register_policy_loss``: ``geo_mean``,
``sapo``, ``dppo_tv``, ``dppo_kl``; the mirrored snapshot b178a3c of 2026-01-29 has the first
two, DPPO is in later verl main). Each row is the coefficient w_t on A_t grad log pi_theta(a_t)
of the loss's gradient, -d loss / d log pi_theta(a_t) = w_t A_t, at theta = the evaluation
policy, with verl's ``old_log_prob`` = the behaviour (log_rhos = log pi - log mu; pi_old = mu,
as the ``ppo`` row). The other entries of verl's registry are not per-token weights, or are
rows we have (docs/method.md "verl's registry, row by row"):

* ``gpg``: loss -A log pi, w = 1: the ``none`` row (alias ``gpg``); GPG differs in its
  advantage estimator, not its weight.
* ``bypass_mode``: a dispatcher with old_log_prob = rollout_log_prob: ``ppo_clip`` is the
  ``ppo`` row, ``reinforce`` with ``rollout_is`` token / sequence is ``truncate`` / ``seq_tis``
  (with rejection: ``mask`` / ``seq_mis``), without IS ``none``.
* ``clip_cov`` / ``kl_cov`` (audit only): the clipped / penalised tokens are the top
  fraction of the batch by the centred covariance (A - mean A)(log pi - mean log pi), and
  clip_cov draws them at random (``torch.randperm``); kl_cov adds ppo_kl_coef |log r| to the
  loss (an additive, not multiplicative, term). Neither is a weight on A_t u_t.
* ``dro`` (audit only): loss -(A log pi - beta/2 (log pi - log pi_old)^2): the coefficient on
  u_t is A_t - beta log rho_t, an additive shift (nonzero where A_t = 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vccc_jax.estimators.actor_stats import sequence_mean
from vccc_jax.estimators.importance import safe_ratios


def gmpo_log_terms(log_rhos, advantages, eps_low, eps_high):
    """GMPO's per-token clipped log-ratio m_t = sgn(A) min(sgn(A) l, sgn(A) clip(l, -eps_low,
    eps_high)) (verl ``geo_mean``): min(l, clip) for A > 0, max(l, clip) for A < 0, 0 for
    A = 0. NaN / +inf (invalid data) count as l = -inf, the table's convention (weight 0:
    m = -inf zeroes the sequence for A > 0; for A < 0 the token is clipped, m = -eps_low)."""
    l = jnp.where(jnp.isnan(log_rhos) | (log_rhos == jnp.inf), -jnp.inf, log_rhos)
    clamped = jnp.clip(l, -eps_low, eps_high)
    return jnp.where(advantages > 0, jnp.minimum(l, clamped),
                     jnp.where(advantages < 0, jnp.maximum(l, clamped), 0.0))


def geo_mean_weight(log_rhos, advantages, *, mask=None, eps_low, eps_high, starts=None):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673; verl ``compute_policy_loss_geo_mean``): the
    loss -Abar exp((1/|y|) sum_t m_t) per sequence (:func:`gmpo_log_terms`), whose gradient
    is Abar S (1/|y|) sum_t 1[m_t unclipped] u_t. w_t = S 1[not clipped(l_t, A_t)] with S =
    exp(mean_t m_t) (raw, then the aggregate guard) and clipped = (A > 0 and l > eps_high)
    or (A < 0 and l < -eps_low): under GRPO's aggregation (a row never divides by |y|) with a
    sequence-level advantage (verl averages A over the sequence: "we only support sequence
    level advantage")."""
    m = gmpo_log_terms(log_rhos, advantages, eps_low, eps_high)
    s = safe_ratios(sequence_mean(m, mask, starts))
    l = jnp.where(jnp.isnan(log_rhos) | (log_rhos == jnp.inf), -jnp.inf, log_rhos)
    clipped = ((advantages > 0) & (l > eps_high)) | ((advantages < 0) & (l < -eps_low))
    return s * (~clipped).astype(s.dtype)


def sapo_weight(log_rhos, advantages, *, mask=None, tau_pos, tau_neg):
    """SAPO (Gao et al. 2025, arXiv 2511.20347; verl ``compute_policy_loss_sapo``): loss
    -f(r) A with the soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)), tau = tau_pos if A > 0
    else tau_neg. -d loss / d log pi = A r f'(r) = A 4 r sigmoid(x) sigmoid(-x), x = tau (r -
    1): w = 1 at r = 1, decaying smoothly on both sides (no hard clip). verl also zeroes the
    gradient where |log r| > 20 (its clamp); we keep the gate's value there (< 1e-8 A)."""
    r = safe_ratios(log_rhos)
    tau = jnp.where(advantages > 0, tau_pos, tau_neg)
    x = tau * (r - 1.0)
    return 4.0 * r * jax.nn.sigmoid(x) * jax.nn.sigmoid(-x)


def _need_log_mu(name, log_mu, log_rhos):
    if log_mu is None:
        raise ValueError(f"{name}: the divergence mask reads probabilities: pass the behaviour "
                         "log-probabilities (data input 'log_mu')")
    if log_mu.shape != log_rhos.shape:
        raise ValueError(f"{name}: log_mu must have the shape of log_rhos {log_rhos.shape}, "
                         f"got {log_mu.shape}")


def dppo_tv_weight(log_rhos, advantages, *, mask=None, eps_low, eps_high, clip, log_mu=None):
    """DPPO-Binary-TV (arXiv 2602.04879; verl ``compute_policy_loss_dppo_tv``): loss -A
    sg(min(r, c)) log pi 1[valid], valid = (p - p_old <= eps_high) if A > 0 else (p - p_old
    >= -eps_low) with p = pi(a_t), p_old = mu(a_t) the PROBABILITIES (a total-variation
    trust region on the sampled token, not a ratio clip). w = min(rho, c) 1[valid]."""
    _need_log_mu("dppo_tv", log_mu, log_rhos)
    rho = safe_ratios(log_rhos)
    p_old = jnp.exp(log_mu)
    diff = jnp.exp(log_mu + log_rhos) - p_old
    valid = jnp.where(advantages > 0, diff <= eps_high, diff >= -eps_low)
    return jnp.minimum(rho, clip) * valid.astype(rho.dtype)


def dppo_kl_weight(log_rhos, advantages, *, mask=None, eps_low, eps_high, clip, log_mu=None):
    """DPPO-Binary-KL (arXiv 2602.04879; verl ``compute_policy_loss_dppo_kl``): as DPPO-TV
    with the binary KL of the sampled token's Bernoulli, KL = p_old log(p_old / p) + (1 -
    p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)) (verl's 1e-8 kept): valid = (KL <=
    eps_high or p <= p_old) if A > 0 else (KL <= eps_low or p >= p_old). w = min(rho, c)
    1[valid]."""
    _need_log_mu("dppo_kl", log_mu, log_rhos)
    rho = safe_ratios(log_rhos)
    p_old = jnp.exp(log_mu)
    log_p = log_mu + log_rhos
    p = jnp.exp(log_p)
    kl = p_old * (log_mu - log_p) + (1.0 - p_old) * jnp.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = jnp.where(advantages > 0, (kl <= eps_high) | (p <= p_old),
                      (kl <= eps_low) | (p >= p_old))
    return jnp.minimum(rho, clip) * valid.astype(rho.dtype)


__all__ = ["dppo_kl_weight", "dppo_tv_weight", "geo_mean_weight", "gmpo_log_terms", "sapo_weight"]
