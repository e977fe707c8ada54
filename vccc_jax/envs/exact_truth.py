"""Exact ground truth for neural learners on a :mod:`~vccc_jax.envs.tabular_env` (issue 11 §1).

On a tabular env the whole observation space is a table (``EnvParams.obs_table`` [N, d]),
so the actor network's logits on every state, and with them every value the write-up
talks about, are available in closed form with no Monte-Carlo noise:

* V^{pi_k} of the learner's current policy and V^{mu_i} of every behaviour version in the
  actor's version ring (``envs.lag.VersionBuffer``);
* the replay mixture (Sec 1.3, Eq 6): state weights d_mix = sum_i w_i d^{mu_i}
  (``tabular.history.replay_state_distribution``), the version posterior q_i(s)
  (``tabular.history.version_posterior``), the policy the replay acts with
  mubar = sum_i q_i mu_i (``tabular.exact.replay_policy``) and V^{mubar}, which is the fixed
  point of the *uncorrected* expected critic update under that replay (one-hot critic);
* for a linear critic on aliased features, the projected fixed points (:func:`linear_fixed_point`);
* critic errors |V - V^{pi_k}| and |V - V^{mubar}| under a stated state weighting;
* the exact expected actor update of the one-step TD actor (Sec 5.1, optionally clipped and
  score-centred as in Eq 13) and its bias against Eq 12, in the actor's parameter space.

Replay model. The behaviour data of version i is assumed to be distributed as the
normalised discounted visitation d^{mu_i} (what an env with ``reset_prob = 1 - gamma``
produces under mu_i at stationarity) and version i is replayed with probability w_i. The
trainer's envs persist across versions, so its real state distribution can differ; pass
your own state weights (e.g. :func:`empirical_state_weights` of the batch) to the error
functions to score against what was actually sampled.

How a trainer calls this (per update or per evaluation; every function is pure and
jittable, ``apply_fn`` / ``kind`` / ``clip`` / ``centred`` static)::

    mdp, obs_table = tabular_env.params_mdp(env_params), env_params.obs_table
    log_pi  = policy_log_probs(actor_apply, actor_params, obs_table)            # [N, A]
    log_mus = ring_log_probs(actor_apply, buffer, obs_table, temperature, top_k)  # [K, N, A]
    truth   = version_truth(mdp, log_pi, log_mus, lag_law.pmf(K))             # VersionTruth
    errs    = critic_errors(critic_values_on(obs_table), truth)                 # CriticErrors
    grads   = actor_update_truth(actor_apply, actor_params, obs_table, mdp, truth,
                                 critic_values, kind="ratio", clip=None, centred=False)
    report  = gradient_bias(grads.expected, grads.eq12)   # and/or (applied_update, grads.eq12)

``log_mus[l]`` is the version ``l`` updates old (lags capped by the versions pushed, as in
the rollout), so the weights are the lag law's pmf over lags 0..K-1.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs.rollout import sampling_log_probs
from vccc_jax.estimators import actor_registry
from vccc_jax.estimators.importance import WeightKind
from vccc_jax.tabular import exact, history
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array
ApplyFn = Callable[[Any, Array], Array]


# ------------------------------------------------------------------ policies on the table


def policy_log_probs(apply_fn: ApplyFn, params: Any, obs_table: Array,
                     temperature: float = 1.0, top_k: int = 0) -> Array:
    """log pi(.|s) on every effective state: ``sampling_log_probs(apply_fn(params, obs_table))``.

    temperature 1 and top_k 0 give the learner's pi_k (the rollout's ``log_pi_all``); the
    rollout's sampling settings give the behaviour distribution. [N, A]
    """
    return sampling_log_probs(apply_fn(params, obs_table), temperature, top_k)


def ring_log_probs(apply_fn: ApplyFn, buffer: lag_lib.VersionBuffer, obs_table: Array,
                   temperature: float = 1.0, top_k: int = 0) -> Array:
    """Behaviour log-probs of every lag 0..K-1 of a version ring (lag l = ``lag.get(buffer, l)``,
    capped by the versions pushed so far). [K, N, A]"""
    lags = jnp.arange(buffer.num_versions, dtype=jnp.int32)
    stacked = lag_lib.gather(buffer, lags)
    return jax.vmap(lambda p: policy_log_probs(apply_fn, p, obs_table, temperature, top_k))(stacked)


def _probs(log_p: Array) -> Array:
    return jnp.exp(log_p)


# ------------------------------------------------------------------ values and mixtures


class VersionTruth(NamedTuple):
    """Closed-form values of one update (N effective states, K versions).

    log_pi [N, A], log_mus [K, N, A], weights [K] (replay probability of each version);
    v_pi [N] = V^{pi_k}; v_mus [K, N] = V^{mu_i}; d_pi [N], d_mus [K, N]: normalised
    discounted visitations; d_mix [N] = sum_i w_i d^{mu_i}; posterior [K, N] = q_i(s);
    mix_policy [N, A] = mubar; v_mix [N] = V^{mubar}, the fixed point of the uncorrected
    expected update under the replay (one-hot critic).
    """

    log_pi: Array
    log_mus: Array
    weights: Array
    v_pi: Array
    v_mus: Array
    d_pi: Array
    d_mus: Array
    d_mix: Array
    posterior: Array
    mix_policy: Array
    v_mix: Array


def version_truth(mdp: TabularMDP, log_pi: Array, log_mus: Array, weights: Array) -> VersionTruth:
    """All exact values of one update (Sec 1.3 / Eq 6 replay model of the module docstring).

    Args:
      mdp: the env's effective MDP (``tabular_env.params_mdp``; infinite horizon).
      log_pi: [N, A] the learner's policy.
      log_mus: [K, N, A] behaviour versions (e.g. :func:`ring_log_probs`).
      weights: [K] replay probability of each version (sums to 1; zeros allowed).
    """
    N, A = mdp.num_states, mdp.num_actions
    chex.assert_shape(log_pi, (N, A))
    chex.assert_rank(log_mus, 3)
    chex.assert_shape(log_mus, (None, N, A))
    chex.assert_shape(weights, (log_mus.shape[0],))
    if mdp.horizon is not None:
        raise ValueError("version_truth works on the effective (folded) MDP; use params_mdp")
    pi, mus = _probs(log_pi), _probs(log_mus)
    weights = jnp.asarray(weights, pi.dtype)
    v_pi = exact.policy_value(mdp, pi)
    v_mus = jax.vmap(lambda m: exact.policy_value(mdp, m))(mus)
    d_pi = exact.visitation(mdp, pi)
    d_mus = jax.vmap(lambda m: exact.visitation(mdp, m))(mus)
    d_mix = history.replay_state_distribution(weights, d_mus)
    posterior = history.version_posterior(weights, d_mus)
    mix_policy = exact.replay_policy(mus, posterior)
    return VersionTruth(
        log_pi=log_pi, log_mus=log_mus, weights=weights, v_pi=v_pi, v_mus=v_mus, d_pi=d_pi,
        d_mus=d_mus, d_mix=d_mix, posterior=posterior, mix_policy=mix_policy,
        v_mix=exact.policy_value(mdp, mix_policy),
    )


def linear_fixed_point(mdp: TabularMDP, features: Array, state_weights: Array,
                       backup_policy: Array, ridge: float = 0.0) -> Array:
    """Values Phi theta* of a linear critic at the fixed point of the expected semi-gradient
    TD update Phi^T D (T_pi Phi theta - Phi theta) = 0 (a projected Bellman fixed point).

    ``backup_policy`` is the policy whose backup the target has in conditional mean:
    ``truth.mix_policy`` for the uncorrected target under the replay, pi_k for VCCC (Eq 5/6:
    E[Y - Vbar | s] = T_pi Vbar - Vbar for every version). ``state_weights`` D: e.g.
    ``truth.d_mix``. With one-hot features (and D > 0) this is V^{backup_policy}.
    ``ridge`` adds ridge * I to the normal matrix (aliased features may be rank deficient).
    features [N, d]; returns [N].
    """
    chex.assert_rank(features, 2)
    chex.assert_shape(state_weights, (features.shape[0],))
    phi = features.astype(backup_policy.dtype)
    m = exact.discounted_transition_matrix(mdp, backup_policy)
    r = exact.expected_reward(mdp, backup_policy)
    dphi = state_weights[:, None] * phi
    a = dphi.T @ (phi - m @ phi) + ridge * jnp.eye(phi.shape[1], dtype=phi.dtype)
    theta = jnp.linalg.solve(a, dphi.T @ r)
    return phi @ theta


# ------------------------------------------------------------------ critic errors


class CriticErrors(NamedTuple):
    """Errors of a critic's values V [N] (scalars). rmse_*: sqrt(sum_s D(s) (V - V*)^2) under
    the stated weighting D; max_*: max over states with D(s) > 0. ``*_pi``: against V^{pi_k};
    ``*_mix``: against V^{mubar} (the stale fixed point); gap: the same norm of V^{mubar} -
    V^{pi_k} (how far apart the two targets are)."""

    rmse_pi: Array
    max_pi: Array
    rmse_mix: Array
    max_mix: Array
    gap: Array


def _weighted(diff: Array, w: Array) -> tuple[Array, Array]:
    return (jnp.sqrt(jnp.sum(w * jnp.square(diff))),
            jnp.max(jnp.where(w > 0, jnp.abs(diff), 0.0)))


def critic_errors(values: Array, truth: VersionTruth, state_weights: Optional[Array] = None) -> CriticErrors:
    """Exact critic errors of ``values`` [N] (the critic applied to ``obs_table``).

    ``state_weights`` [N] (sums to 1) defaults to ``truth.d_mix`` (where the replayed data
    lies); ``truth.d_pi`` scores where the current policy goes, a uniform vector every state.
    """
    chex.assert_shape(values, truth.v_pi.shape)
    w = truth.d_mix if state_weights is None else state_weights
    chex.assert_shape(w, truth.v_pi.shape)
    values = values.astype(truth.v_pi.dtype)
    rp, mp = _weighted(values - truth.v_pi, w)
    rm, mm = _weighted(values - truth.v_mix, w)
    gap, _ = _weighted(truth.v_mix - truth.v_pi, w)
    return CriticErrors(rmse_pi=rp, max_pi=mp, rmse_mix=rm, max_mix=mm, gap=gap)


def empirical_state_weights(state_ids: Array, num_states: int) -> Array:
    """Histogram of sampled effective-state ids (e.g. ``traj.env_state.state`` with
    ``record_states=True``), normalised to sum to 1. [num_states]"""
    counts = jnp.bincount(state_ids.reshape(-1), length=num_states).astype(jnp.float32)
    return counts / jnp.maximum(jnp.sum(counts), 1.0)


# ------------------------------------------------------------------ actor gradient (Eq 12)


class ActorTruth(NamedTuple):
    """Exact actor updates in parameter space (pytrees shaped like the actor params).

    expected: E_replay[w A_phi u] of the one-step TD actor (Sec 5.1) with the given critic,
      weighted by d_mix (optionally score-centred, Eq 13);
    eq12: sum_s d_mix(s) E_pi[Q^pi(s, a) u(s, a) | s] — what Eq 12 says the update equals when
      the critic is V^pi and the weights are exact ratios (same state weighting);
    policy_gradient: sum_s d_pi(s) E_pi[Q^pi u | s], the on-policy gradient direction
      (normalised visitation; the policy-gradient theorem up to 1 / (1 - gamma)).
    """

    expected: Any
    eq12: Any
    policy_gradient: Any


def _surrogate_grad(apply_fn: ApplyFn, params: Any, obs_table: Array, coeff: Array) -> Any:
    """grad_theta sum_{s,a} coeff(s, a) log pi_theta(a|s) = sum coeff(s, a) u(s, a)."""
    coeff = jax.lax.stop_gradient(coeff)

    def f(p):
        logp = jax.nn.log_softmax(apply_fn(p, obs_table), axis=-1)
        return jnp.sum(coeff.astype(logp.dtype) * jnp.where(coeff != 0, logp, 0.0))

    return jax.grad(f)(params)


def td_actor_coefficients(log_pi: Array, log_mu: Array, adv: Array, *, kind: WeightKind,
                          clip: Optional[float], centred: bool, params: Optional[dict] = None,
                          next_prob: Optional[Array] = None, lags: Optional[Array] = None,
                          threshold=None) -> Array:
    """Per-action coefficients of the one-step TD actor's expected update at one state under
    a behaviour mu (Sec 5.1; Eq 13 when ``centred``): E_mu[A (w u - c m_w) | s] =
    sum_a coeff(a) u(a) with coeff = mu w A - c E_mu[A | s] mu w, w = ``importance_weights(
    log pi - log mu, kind, clip)`` (0 off mu's support). Shapes broadcast to [..., A].

    ``kind`` may be any token-level row of ``estimators.actor_registry`` (issue 21; the
    Eq 10 kinds are its first rows), with its ``params`` (``clip`` fills a row's clip), the
    per-s' advantages ``adv`` [..., A, S'] and ``next_prob`` for sign-dependent rows, the
    version ``lags`` (AReaL) and M2PO's population ``threshold``
    (``tabular.exact_actor.correction_coefficients`` does the work)."""
    row = actor_registry.get_actor_correction(kind)
    merged = {"clip": clip} if clip is not None and "clip" in row.param_names else {}
    merged.update(params or {})
    return exact.correction_coefficients(log_pi, log_mu, adv, correction=row.name, params=merged,
                                         centred=centred, next_prob=next_prob, lags=lags,
                                         threshold=threshold)


def actor_update_truth(
    apply_fn: ApplyFn,
    params: Any,
    obs_table: Array,
    mdp: TabularMDP,
    truth: VersionTruth,
    critic_values: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    centred: bool = False,
    correction_params: Optional[dict] = None,
) -> ActorTruth:
    """Exact expected actor update vs Eq 12 (Sec 5.1, 5.2) for actor ``params``.

    The one-step TD actor uses A_phi(s, a, s') = r + gamma(s') V_phi(s') - V_phi(s), weight
    w_i(s, a) = ``importance_weights(log pi - log mu_i, kind, clip)`` and score
    u = grad log pi_theta (at temperature 1). Under the replay its expected update is

        sum_s d_mix(s) sum_i q_i(s) E_{mu_i}[A_phi (w_i u - c m_{w_i}(s)) | s],

    with c = 1 when ``centred`` (Eq 13) else 0. With ``kind="ratio"`` and V_phi = V^pi it
    equals ``eq12`` exactly (the ``tabular`` identity, now in the network's parameter
    space). GAE / multi-step advantages are not covered. ``critic_values`` [N].

    ``kind`` may be any token- or batch-level row of ``estimators.actor_registry`` (with
    ``correction_params``; issue 21): sign-dependent rows use the per-transition advantages (exact),
    version i has lag i (AReaL's staleness cap), M2PO's mask is its population limit over
    atoms (s, i, a) of probability d_mix(s) q_i(s) mu_i(a|s).
    """
    chex.assert_shape(critic_values, (mdp.num_states,))
    pi = _probs(truth.log_pi)
    v = critic_values.astype(pi.dtype)
    row = actor_registry.get_actor_correction(kind)
    merged = {"clip": clip} if clip is not None and "clip" in row.param_names else {}
    merged.update(correction_params or {})
    K = truth.log_mus.shape[0]
    lags = jnp.arange(K)[:, None, None]
    probs = truth.d_mix[None, :, None] * truth.posterior[:, :, None] * _probs(truth.log_mus)
    threshold = exact.population_threshold(row.name, merged, truth.log_pi[None] - truth.log_mus,
                                           probs)
    if row.sign_dependent:  # per-transition advantages A(s, a, s') [N, A, N]
        adv = exact.bellman_targets(mdp, v) - v[:, None, None]
        extra = dict(next_prob=mdp.P[None])
    else:
        adv = exact.q_values(mdp, v=v) - v[:, None]  # E[A_phi | s, a]  [N, A]
        extra = {}
    coeff = td_actor_coefficients(truth.log_pi[None], truth.log_mus, adv[None], kind=row.name,
                                  clip=None, centred=centred, params=merged, lags=lags,
                                  threshold=threshold, **extra)  # [K, N, A]
    coeff = jnp.einsum("s,ks,ksa->sa", truth.d_mix, truth.posterior, coeff)
    q_pi = exact.q_values(mdp, pi)
    eq12_coeff = pi * (q_pi - truth.v_pi[:, None])  # = pi Q^pi u in expectation (sum pi u = 0)
    return ActorTruth(
        expected=_surrogate_grad(apply_fn, params, obs_table, coeff),
        eq12=_surrogate_grad(apply_fn, params, obs_table, truth.d_mix[:, None] * eq12_coeff),
        policy_gradient=_surrogate_grad(apply_fn, params, obs_table, truth.d_pi[:, None] * eq12_coeff),
    )


class GradientBias(NamedTuple):
    """bias_norm = |update - reference|; relative = bias_norm / |reference|; cosine of the
    angle between them (1: same direction)."""

    bias_norm: Array
    relative: Array
    cosine: Array


def gradient_bias(update: Any, reference: Any) -> GradientBias:
    """Compare an actor update (exact expected, or the one a trainer applied) with a
    reference (e.g. ``ActorTruth.eq12``); both pytrees of the same structure."""
    u = jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(update)])
    r = jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(reference)]).astype(u.dtype)
    nr, nu = jnp.linalg.norm(r), jnp.linalg.norm(u)
    b = jnp.linalg.norm(u - r)
    return GradientBias(
        bias_norm=b,
        relative=b / jnp.maximum(nr, 1e-30),
        cosine=jnp.dot(u, r) / jnp.maximum(nu * nr, 1e-30),
    )
