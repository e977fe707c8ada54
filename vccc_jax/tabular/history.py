"""Policy version histories pi_0..pi_K and replay staleness mixtures (DESIGN.md §6).

Two pieces:

1. **Staleness laws** (:func:`lag_weights`, :func:`version_weights`): the replay buffer
   holds transitions from versions pi_{K - l}, l = 0..K ("lag l"), with probabilities given
   by a law parameterised by its **mean lag** m, so that every law on a sweep's "mean lag"
   axis really has that mean:

   ============  ===================================================  ===============
   law           weights over lags l = 0..L                           mean
   ============  ===================================================  ===============
   ``fixed``     1[l = m]                       (m integer)           m
   ``uniform``   uniform on {0, ..., 2m}        (2m integer)          m
   ``geometric`` ∝ q^l, q solved so the truncated mean is m           m
   ``zipf``      ∝ (l + 1)^(-s), s solved so the truncated mean is m  m (heavy tail)
   ============  ===================================================  ===============

   (The brief's "uniform on [0, k]" is the uniform law with mean k/2: ``uniform`` at mean
   m = k/2.) Weights are float64 numpy arrays computed at configuration time (host side);
   geometric/zipf parameters are found by bisection to 1e-13 relative accuracy.

2. **Version histories** (:func:`policy_history`): pi_0..pi_K from exact softmax
   policy-gradient or natural-policy-gradient steps on an MDP, so consecutive versions drift
   the way a trained actor does, plus the replay's behaviour state distribution
   (:func:`replay_state_distribution`: the law-weighted mixture of the versions' normalised
   discounted visitations) and the posterior over versions at each state.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact
from vccc_jax.tabular.mdp import TabularMDP
from vccc_jax.tabular.policies import softmax_policy

Array = chex.Array

STALENESS_LAWS = ("fixed", "uniform", "geometric", "zipf")


# ------------------------------------------------------------------ staleness laws


def _truncated_mean(log_w: np.ndarray) -> float:
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    return float(np.dot(np.arange(len(w)), w))


def _solve_mean(log_weight_fn, mean_lag: float, max_lag: int) -> np.ndarray:
    """Find t with mean(softmax(log_weight_fn(t))) = mean_lag by bisection (mean is
    increasing in t). Returns the normalised weights."""
    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _truncated_mean(log_weight_fn(mid)) < mean_lag:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-14:
            break
    log_w = log_weight_fn(0.5 * (lo + hi))
    w = np.exp(log_w - log_w.max())
    return w / w.sum()


def lag_weights(law: str, mean_lag: float, max_lag: int) -> np.ndarray:
    """Replay probabilities of lags l = 0..max_lag under a staleness law with mean ``mean_lag``.

    Args:
      law: one of ``STALENESS_LAWS``.
      mean_lag: the mean lag m >= 0 (integer for ``fixed``, a multiple of 1/2 for
        ``uniform``); ``geometric``/``zipf`` need m < max_lag.
      max_lag: L, the oldest lag available (the history length K).

    Returns:
      float64 [max_lag + 1], non-negative, summing to 1, with mean ``mean_lag``.
    """
    if law not in STALENESS_LAWS:
        raise ValueError(f"law must be one of {STALENESS_LAWS}, got {law!r}")
    if not isinstance(max_lag, (int, np.integer)) or max_lag < 0:
        raise ValueError(f"max_lag must be a non-negative int, got {max_lag!r}")
    m = float(mean_lag)
    if not (m >= 0 and np.isfinite(m)):
        raise ValueError(f"mean_lag must be a finite number >= 0, got {mean_lag!r}")
    L = int(max_lag)
    lags = np.arange(L + 1, dtype=np.float64)
    w = np.zeros(L + 1)
    if m == 0:
        w[0] = 1.0
        return w
    if law == "fixed":
        if m != int(m) or m > L:
            raise ValueError(f"mean_lag for law 'fixed' must be an integer <= max_lag={L}, got {m}")
        w[int(m)] = 1.0
        return w
    if law == "uniform":
        top = 2 * m
        if top != int(top) or top > L:
            raise ValueError(
                f"mean_lag for law 'uniform' must be a multiple of 1/2 with 2*mean_lag <= "
                f"max_lag={L}, got {m}"
            )
        w[: int(top) + 1] = 1.0 / (int(top) + 1)
        return w
    if m >= L:
        raise ValueError(f"mean_lag for law {law!r} must be < max_lag={L}, got {m}")
    if law == "geometric":
        return _solve_mean(lambda t: t * lags, m, L)  # q = e^t
    return _solve_mean(lambda t: t * np.log1p(lags), m, L)  # (l + 1)^(-s) with s = -t


def version_weights(law: str, mean_lag: float, num_versions: int) -> np.ndarray:
    """Mixture weights over versions i = 0..K (K = num_versions - 1): weight of pi_i is the
    probability of lag K - i. float64 [num_versions]."""
    if not isinstance(num_versions, (int, np.integer)) or num_versions < 1:
        raise ValueError(f"num_versions must be a positive int, got {num_versions!r}")
    return lag_weights(law, mean_lag, num_versions - 1)[::-1].copy()


def lag_mean(weights_over_lags: np.ndarray) -> float:
    return float(np.dot(np.arange(len(weights_over_lags)), weights_over_lags))


# ------------------------------------------------------------------ version histories


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    """How pi_0..pi_K are made (saved with every result row).

    algorithm: ``"npg"`` (natural policy gradient) or ``"pg"`` (vanilla policy gradient),
      both with exact gradients, on tabular softmax logits.
    step_size: eta of each step.
    num_versions: K + 1 (versions pi_0..pi_K; the oldest lag available is K).
    init_scale: pi_0 = softmax(theta_0) with theta_0 ~ N(0, init_scale^2) per (s, a).
    """

    algorithm: str = "npg"
    step_size: float = 0.5
    num_versions: int = 17
    init_scale: float = 1.0

    def __post_init__(self):
        if self.algorithm not in ("npg", "pg"):
            raise ValueError(f"history algorithm must be 'npg' or 'pg', got {self.algorithm!r}")
        if not self.step_size > 0:
            raise ValueError(f"history step_size must be > 0, got {self.step_size}")
        if not (isinstance(self.num_versions, int) and self.num_versions >= 1):
            raise ValueError(f"history num_versions must be an int >= 1, got {self.num_versions!r}")
        if not self.init_scale >= 0:
            raise ValueError(f"history init_scale must be >= 0, got {self.init_scale}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class History(NamedTuple):
    """pi_0..pi_K of one MDP (leading axis: version; vmap adds an MDP axis in front).

    logits [V, S, A]; probs [V, S, A]; log_probs [V, S, A] (log_softmax of the logits, so
    ratios are exp of a difference of exact log-probabilities); values V^{pi_i} [V, S];
    visitation: normalised discounted visitation d^{pi_i} from the MDP's ``init`` [V, S];
    kl [V - 1]: E_{s ~ d^{pi_i}} KL(pi_i(.|s) || pi_{i-1}(.|s)) for i = 1..K (how far each
    step moves the policy, measured where the newer policy goes); kl_max [V - 1]: the
    largest per-state KL of each step.
    """

    logits: Array
    probs: Array
    log_probs: Array
    values: Array
    visitation: Array
    kl: Array
    kl_max: Array


def npg_step(mdp: TabularMDP, logits: Array, step_size) -> Array:
    """Natural policy gradient for tabular softmax: theta(s, a) += eta * A^pi(s, a).

    This is the exact NPG update of Kakade (2001) / Agarwal et al. (2021, Lemma 5.1), whose
    1 / (1 - gamma) factor is folded into ``step_size``. Every state moves by the same
    eta regardless of visitation.
    """
    pi = softmax_policy(logits)
    q = exact.q_values(mdp, pi)
    adv = q - jnp.sum(pi * q, axis=-1, keepdims=True)
    return logits + step_size * adv


def pg_step(mdp: TabularMDP, logits: Array, step_size) -> Array:
    """Vanilla policy gradient ascent on J = init . V^pi with the exact gradient
    d(s) pi(a|s) A^pi(s, a) (``exact.policy_gradient``, unnormalised visitation)."""
    pi = softmax_policy(logits)
    grad = exact.policy_gradient(mdp, pi, exact.softmax_score(pi))
    return logits + step_size * grad


def _kl_rows(log_p: Array, log_q: Array) -> Array:
    """KL(p || q) per row of [S, A] log-probability tables. [S]"""
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def policy_history(mdp: TabularMDP, initial_logits: Array, config: HistoryConfig) -> History:
    """pi_0..pi_K of one MDP from exact (N)PG steps starting at ``initial_logits`` [S, A].

    ``config`` is static (use functools.partial before jit/vmap). Single MDP; vmap for a
    batch, e.g. ``jax.vmap(lambda m, th: policy_history(m, th, cfg))(mdps, logits)``.
    """
    if initial_logits.shape != (mdp.num_states, mdp.num_actions):
        raise ValueError(
            f"initial_logits must have shape [S, A] = {(mdp.num_states, mdp.num_actions)}, "
            f"got {initial_logits.shape}"
        )
    step = npg_step if config.algorithm == "npg" else pg_step

    def body(theta, _):
        new = step(mdp, theta, config.step_size)
        return new, new

    _, later = jax.lax.scan(body, initial_logits, None, length=config.num_versions - 1)
    logits = jnp.concatenate([initial_logits[None], later], axis=0)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    probs = jnp.exp(log_probs)
    values = jax.vmap(lambda p: exact.policy_value(mdp, p))(probs)
    visit = jax.vmap(lambda p: exact.visitation(mdp, p))(probs)
    kl_states = jax.vmap(_kl_rows)(log_probs[1:], log_probs[:-1])  # [V-1, S]
    kl = jnp.sum(visit[1:] * kl_states, axis=-1)
    return History(
        logits=logits, probs=probs, log_probs=log_probs, values=values, visitation=visit,
        kl=kl, kl_max=jnp.max(kl_states, axis=-1),
    )


def initial_logits(key: Array, num_mdps: int, num_states: int, num_actions: int,
                   init_scale: float, dtype=None) -> Array:
    """theta_0 ~ N(0, init_scale^2) for a batch of MDPs. [num_mdps, S, A]"""
    dtype = jnp.result_type(float) if dtype is None else dtype
    return init_scale * jax.random.normal(key, (num_mdps, num_states, num_actions), dtype)


# ------------------------------------------------------------------ replay mixtures


def replay_state_distribution(weights: Array, visitation: Array) -> Array:
    """Behaviour state distribution of the replay: d_mix(s) = sum_i w_i d^{pi_i}(s). [S]

    ``weights`` [V] are the version weights of a staleness law (:func:`version_weights`),
    ``visitation`` [V, S] the versions' normalised discounted visitations.
    """
    return jnp.einsum("v,vs->s", weights, visitation)


def version_posterior(weights: Array, visitation: Array) -> Array:
    """P(version i | state s) in the replay: w_i d^{pi_i}(s) / d_mix(s). [V, S]

    Where d_mix(s) = 0 (a state no version visits; it is never replayed) the prior w_i is
    returned, so the column is still a distribution.
    """
    joint = weights[:, None] * visitation
    total = jnp.sum(joint, axis=0, keepdims=True)
    prior = jnp.broadcast_to(weights[:, None], joint.shape)
    return jnp.where(total > 0, joint / jnp.where(total > 0, total, 1.0), prior)
