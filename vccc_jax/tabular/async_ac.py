"""Asynchronous tabular actor-critic: score-centred actor + version-corrected critic.

Both halves of vccc_blog_en.txt together (Sec 2, 5, 9): a softmax actor with tabular logits
theta [S, A] and a tabular critic V [S], trained from transitions that lagged actor versions
generated. Everything is one jitted ``lax.scan`` over updates; MDPs, seeds and *variants*
(actor weight, centering, critic target, staleness) are data, so a whole grid is one
vmapped program.

**Versions.** A ring buffer holds the last L + 1 actor versions (log-probabilities and their
normalised discounted visitations), oldest first; its newest entry is the current policy
pi_k (lag 0). Early on (k < L) the buffer is padded with pi_0. Two samplers feed a batch
of B transitions to every update:

* ``"replay"``: the staleness laws of ``tabular.history``. A transition is drawn as lag
  l ~ law (mean lag m), s ~ d^{pi_{k-l}}, a ~ pi_{k-l}(.|s), s' ~ P(.|s, a) -- the replay
  model of ``tabular.critic``; the state distribution is d_mix = sum_l w_l d^{pi_{k-l}} and
  the version seen at s has posterior q_l(s) (``history.version_posterior``).
* ``"rollout"``: B persistent workers with **mid-trajectory version switches**. A worker
  keeps acting with the weights it holds; after each step it continues its trajectory with
  probability gamma (else it resets to s ~ init and fetches the newest weights), and before
  the next step it fetches the newest weights with probability ``refresh_prob`` (forced
  when its version leaves the buffer). A trajectory can thus start under mu_3 and continue
  under mu_5 and mu_8 (Sec 3.4). The exact joint law of (state, lag) of a worker given the
  version history is propagated alongside (``propagate_workers``) and is the sampling
  distribution the diagnostics use (with sampled updates: the law of a fresh worker
  population given the realised versions, not the realised worker states).

**One update k** (Sec 6: critic first, then the actor with the updated critic):

1. Critic: any one-step target of ``tabular.critic.METHODS`` (uncorrected, VCCC / IW-TD,
   VCCC with b*, truncated, masked, naive / Z-centred general baseline -- built on the
   estimator core) with bootstrap Vbar = V_k; each visited state moves ``critic_lr``
   towards the mean of its targets in the batch.
2. Actor: TD advantage A = r + gamma(s') V_{k+1}(s') - V_{k+1}(s) (Sec 5.1) and the library
   loss ``estimators.actor.policy_loss`` with weight w in {1 (``none``: the uncorrected
   update of Eq 1), rho (``ratio``: PPO's ratio at r = 1), min(rho, c) (``truncate``),
   rho 1[1/c <= rho <= c] (``mask``)}, optionally score-centred (Eq 13) with m_w from the
   full behaviour row (``centering_term``) or from its top-k summary plus a tail model
   (``centering_term_topk``). One gradient-ascent step of size ``actor_lr``.

``expected=True`` replaces both sampled steps by their exact expectations (the critic moves
every replayed state towards E_replay[Y | s]; the actor takes the library loss over the
enumerated (version, s, a) cells weighted by their probabilities), so training is
deterministic.

**Exact diagnostics per update** (:func:`actor_diagnostics`), with d the sampling state
distribution (the write-up's Sec 7: state-distribution shift aside, the reference
gradient is weighted by the behaviour visitation):

    g_app(s)  = d(s) sum_l q_l(s) E_{mu_l}[A (w u - m_c) | s]        expected applied update
    g_ref(s)  = d(s) E_pi[Q^pi u | s]                                 Eq 12 target
    g_true    = grad_theta init.V^pi (= d^pi_unnorm(s) E_pi[Q^pi u | s])  true policy gradient
    g_app - g_ref = drift + critic + weight, with, per version l,
      drift_l  = (T_{mu_l} V - V)(s) (m_w - m_c)(s)     Eq 1's baseline-drift term, where
                                                         m_c in {0, m_w, m_hat} is the centering
                                                         applied (none / exact / top-k)
      critic_l = Cov_{mu_l}(Q_V - Q^pi, w u | s)        future-policy mismatch through the
                                                         bootstrap (Sec 2.3)
      weight_l = Cov_{mu_l}(Q^pi, w u | s) - E_pi[Q^pi u | s]   clipping / masking bias

(Q_V = E[r + gamma V(s') | s, a].) Cosines of g_app with g_true and g_ref, the norms, the
critic's distance to V^{pi_k} and J(pi_k) = init . V^{pi_k} are recorded; the top-k
centering's approximation error ||m_hat - m_w|| is reported separately (Sec 7).

**Grid** (:func:`run_grid`, config ``experiments/async_ac.json``): {stale critic, VCCC
critic} x {no centering, score centering} x actor weights x mean lag, on >= 64 random MDPs,
returns tidy rows; :func:`fig_async_ac` draws them; :func:`main` is the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from typing import NamedTuple, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import actor as actor_est
from vccc_jax.estimators.importance import importance_weights
from vccc_jax.tabular import critic, exact, history
from vccc_jax.tabular import mdp as mdp_mod
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts

Array = chex.Array
sg = jax.lax.stop_gradient

ACTOR_KINDS = ("none", "ratio", "truncate", "mask")
CENTERINGS = ("none", "exact", "topk")
SAMPLINGS = ("replay", "rollout")
ONE_STEP_CRITICS = tuple(name for name, spec in critic.METHODS.items() if not spec.multi_step)


# ============================================================================ config


@dataclasses.dataclass(frozen=True)
class ACConfig:
    """Static settings of the asynchronous actor-critic (one compiled program per config).

    num_updates = num_chunks * chunk_len: the scan runs ``num_chunks`` chunks of
      ``chunk_len`` updates; diagnostics are averaged within a chunk (curves have
      ``num_chunks`` points; ``chunk_len=1`` gives per-update curves).
    batch_size: transitions per update (sampled mode; also the number of rollout workers).
    actor_lr, critic_lr: step sizes (the critic's is the per-state move towards the targets).
    critic_methods: the one-step critic targets a variant may select (``Variant.critic`` is
      an index into this tuple); all of them are compiled in.
    critic_options: ((method, ((option, value), ...)), ...) overrides of method options.
    max_lag: L, the oldest version kept (buffer of L + 1 versions).
    sampling: ``"replay"`` (staleness law) or ``"rollout"`` (workers with mid-trajectory
      version switches); see the module docstring.
    expected: exact expected updates instead of sampled ones (deterministic).
    topk: k of the top-k behaviour summary used by ``centering="topk"``; 0 compiles the
      top-k path out (``centering="topk"`` is then rejected; cheaper grids).
    critic_init: ``"initial_value"`` starts the critic at V^{pi_0} (a critic warmed up on the
      initial policy, so the critic error measures tracking, not warm-up); ``"zero"``.
    """

    num_chunks: int = 30
    chunk_len: int = 10
    batch_size: int = 32
    actor_lr: float = 2.0
    critic_lr: float = 0.5
    critic_methods: tuple = ("uncorrected", "vccc")
    critic_options: tuple = ()
    max_lag: int = 16
    sampling: str = "replay"
    expected: bool = False
    topk: int = 2
    critic_init: str = "initial_value"

    def __post_init__(self):
        for name in ("num_chunks", "chunk_len", "batch_size"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"ACConfig.{name} must be an int >= 1, got {v!r}")
        if not (isinstance(self.topk, int) and self.topk >= 0):
            raise ValueError(f"ACConfig.topk must be an int >= 0, got {self.topk!r}")
        if not (isinstance(self.max_lag, int) and self.max_lag >= 0):
            raise ValueError(f"ACConfig.max_lag must be an int >= 0, got {self.max_lag!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"ACConfig.sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.critic_init not in ("initial_value", "zero"):
            raise ValueError(f"ACConfig.critic_init must be 'initial_value' or 'zero', got {self.critic_init!r}")
        if not self.actor_lr > 0:
            raise ValueError(f"ACConfig.actor_lr must be > 0, got {self.actor_lr}")
        if not 0 < self.critic_lr <= 1:
            raise ValueError(f"ACConfig.critic_lr must lie in (0, 1], got {self.critic_lr}")
        if not isinstance(self.critic_methods, tuple) or not self.critic_methods:
            raise ValueError("ACConfig.critic_methods must be a non-empty tuple of method names")
        for m in self.critic_methods:
            if m not in critic.METHODS:
                raise ValueError(f"ACConfig.critic_methods has unknown method {m!r}; known: {sorted(critic.METHODS)}")
            if critic.METHODS[m].multi_step:
                raise ValueError(
                    f"ACConfig.critic_methods: {m!r} is multi-step; the actor-critic takes one-step "
                    f"targets: {ONE_STEP_CRITICS}"
                )
        for m, opts in self.critic_options:
            if m not in self.critic_methods:
                raise ValueError(f"ACConfig.critic_options names {m!r}, which is not in critic_methods")
            critic.METHODS[m].options(dict(opts))

    @property
    def num_updates(self) -> int:
        return self.num_chunks * self.chunk_len

    @property
    def num_versions(self) -> int:
        return self.max_lag + 1

    def method_options(self, method: str) -> dict:
        return critic.METHODS[method].options(dict(dict(self.critic_options).get(method, ())))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["critic_methods"] = list(self.critic_methods)
        d["critic_options"] = {m: dict(o) for m, o in self.critic_options}
        return d


class Variant(NamedTuple):
    """One actor-critic variant as *data* (vmap a batch of them).

    actor_kind: int index into ``ACTOR_KINDS``; actor_clip: c of truncate / mask.
    centering: int index into ``CENTERINGS`` (none, exact m_w, top-k estimate).
    critic: int index into ``ACConfig.critic_methods``; critic_clip: c of clipped targets.
    lag_weights: [L + 1] replay probabilities of lags 0..L (``"replay"`` sampling).
    refresh_prob: [] probability a rollout worker fetches the newest weights before a step.
    """

    actor_kind: Array
    actor_clip: Array
    centering: Array
    critic: Array
    critic_clip: Array
    lag_weights: Array
    refresh_prob: Array


def make_variant(
    config: ACConfig,
    *,
    actor_kind: str = "truncate",
    actor_clip: float = 1.0,
    centering: str = "none",
    critic: str = "vccc",
    critic_clip: float = 1.0,
    law: str = "geometric",
    mean_lag: float = 0.0,
    refresh_prob: float = 1.0,
    dtype=None,
) -> Variant:
    """A :class:`Variant` from names (host side; errors name the argument)."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    if actor_kind not in ACTOR_KINDS:
        raise ValueError(f"actor_kind must be one of {ACTOR_KINDS}, got {actor_kind!r}")
    if centering not in CENTERINGS:
        raise ValueError(f"centering must be one of {CENTERINGS}, got {centering!r}")
    if centering == "topk" and config.topk == 0:
        raise ValueError("centering='topk' needs ACConfig.topk >= 1 (got topk=0)")
    if critic not in config.critic_methods:
        raise ValueError(f"critic must be one of config.critic_methods {config.critic_methods}, got {critic!r}")
    if actor_kind in ("truncate", "mask") and not actor_clip > 0:
        raise ValueError(f"actor_clip must be > 0, got {actor_clip}")
    if actor_kind == "mask" and not actor_clip >= 1:
        raise ValueError(f"actor_clip must be >= 1 for a double-sided mask, got {actor_clip}")
    if not critic_clip >= 1:
        raise ValueError(f"critic_clip must be >= 1, got {critic_clip}")
    if not 0 < refresh_prob <= 1:
        raise ValueError(f"refresh_prob must lie in (0, 1], got {refresh_prob}")
    weights = history.lag_weights(law, mean_lag, config.max_lag)
    return Variant(
        actor_kind=jnp.asarray(ACTOR_KINDS.index(actor_kind), jnp.int32),
        actor_clip=jnp.asarray(actor_clip, dtype),
        centering=jnp.asarray(CENTERINGS.index(centering), jnp.int32),
        critic=jnp.asarray(config.critic_methods.index(critic), jnp.int32),
        critic_clip=jnp.asarray(critic_clip, dtype),
        lag_weights=jnp.asarray(weights, dtype),
        refresh_prob=jnp.asarray(refresh_prob, dtype),
    )


def stack_variants(variants: Sequence[Variant]) -> Variant:
    """Stack variants along a new leading axis (for vmap)."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *variants)


# ============================================================================ actor side


def weight_table(log_pi: Array, log_mus: Array, kind: Array, clip: Array) -> Array:
    """w(s, a) for every version: 1 / rho / min(rho, c) / masked rho, by ``kind`` index. [..., S, A]"""
    log_rhos = log_pi - log_mus
    ws = jnp.stack([  # every kind is evaluated; the mask's clip is kept valid for unused rows
        jnp.ones_like(log_rhos),
        importance_weights(log_rhos, "ratio"),
        importance_weights(log_rhos, "truncate", clip),
        importance_weights(log_rhos, "mask", jnp.maximum(clip, 1.0)),
    ])
    return ws[kind]


def _unit_centering(log_pi_all: Array, log_mu_all: Array) -> Array:
    """c(s) = sum_a sg(mu(a|s)) log pi(a|s): the w = 1 case of ``actor.centering_term``
    (gradient m_mu(s) of Eq 1)."""
    return jnp.sum(sg(jnp.exp(log_mu_all)) * log_pi_all, axis=-1)


def _unit_centering_topk(log_pi_all: Array, topk_log_mu: Array, topk_ids: Array) -> Array:
    """The w = 1 case of ``actor.centering_term_topk``, with its tail model (the unlogged
    behaviour mass spread over the remaining actions in proportion to pi)."""
    A = log_pi_all.shape[-1]
    in_topk = jnp.sum(jax.nn.one_hot(topk_ids, A, dtype=log_pi_all.dtype), axis=-2)
    pi_all = sg(jnp.exp(log_pi_all))
    top = jnp.sum(sg(jnp.exp(topk_log_mu)) * jnp.take_along_axis(log_pi_all, topk_ids, axis=-1), axis=-1)
    tail_mu = jnp.clip(1.0 - jnp.sum(jnp.exp(topk_log_mu), axis=-1), 0.0, 1.0)
    tail_pi = jnp.sum(pi_all * (1.0 - in_topk), axis=-1)
    safe = tail_pi > 0
    scale = jnp.where(safe, tail_mu / jnp.where(safe, tail_pi, 1.0), 0.0)
    tail = jnp.sum(sg(scale[..., None] * pi_all * (1.0 - in_topk)) * log_pi_all, axis=-1)
    return top + tail


def centering_value(
    log_pi_all: Array, log_mu_all: Array, topk_log_mu: Array, topk_ids: Array,
    kind: Array, clip: Array, centering: Array,
) -> Array:
    """Per-state centering term c(s) whose gradient is the m_w(s) subtracted in Eq 13.

    ``centering`` 0: none (0); 1: exact from the full behaviour row
    (``actor.centering_term``); 2: top-k summary + tail (``actor.centering_term_topk``).
    Shapes: log_pi_all, log_mu_all [..., A]; topk_* [..., k] (``None``: no top-k path,
    index 2 then falls back to the exact term). Returns [...].
    """

    def exact_c(k):
        if k == 0:
            return _unit_centering(log_pi_all, log_mu_all)
        return actor_est.centering_term(log_pi_all, log_mu_all, kind=ACTOR_KINDS[k], clip=clip)

    def topk_c(k):
        if k == 0:
            return _unit_centering_topk(log_pi_all, topk_log_mu, topk_ids)
        return actor_est.centering_term_topk(
            log_pi_all, topk_log_mu, topk_ids, kind=ACTOR_KINDS[k], clip=clip)

    c_exact = jax.lax.switch(kind, [functools.partial(exact_c, k) for k in range(4)])
    if topk_log_mu is None:
        c_topk = c_exact
    else:
        c_topk = jax.lax.switch(kind, [functools.partial(topk_c, k) for k in range(4)])
    zero = jnp.zeros_like(c_exact)
    return jnp.stack([zero, c_exact, c_topk])[centering]


def _top_k(log_mus: Array, topk: int):
    """(top-k log-probs, ids) of behaviour rows, or (None, None) when topk == 0."""
    if topk == 0:
        return None, None
    return jax.lax.top_k(log_mus, topk)


def actor_loss(
    log_pi_tok: Array, log_mu_tok: Array, advantages: Array, centering_tok: Array,
    kind: Array, clip: Array,
) -> Array:
    """``actor.policy_loss`` for a traced weight kind; ``none`` (w = 1) passes the target's
    own log-probability as the behaviour of the weight, so that w = exp(0) = 1."""

    def branch(k):
        if k == 0:
            return actor_est.policy_loss(log_pi_tok, sg(log_pi_tok), advantages, kind="ratio",
                                         centering=centering_tok)
        return actor_est.policy_loss(log_pi_tok, log_mu_tok, advantages, kind=ACTOR_KINDS[k],
                                     clip=clip, centering=centering_tok)

    return jax.lax.switch(kind, [functools.partial(branch, k) for k in range(4)])


class ActorDiagnostics(NamedTuple):
    """Closed-form actor quantities at one update (all gradients are [S, A] in logit space).

    g_app: expected applied update; g_ref: d(s) E_pi[Q^pi u | s] (Eq 12, behaviour state
    weighting); g_true: the true policy gradient; drift, critic, weight: the split of
    g_app - g_ref (module docstring); m_w [V, S, A]: exact mean weighted scores;
    m_hat [V, S, A]: the top-k estimates of m_w.
    """

    g_app: Array
    g_ref: Array
    g_true: Array
    drift: Array
    critic: Array
    weight: Array
    m_w: Array
    m_hat: Array


def actor_diagnostics(
    mdp: TabularMDP,
    theta: Array,
    values: Array,
    log_mus: Array,
    state_dist: Array,
    posterior: Array,
    kind: Array,
    clip: Array,
    centering: Array,
    topk: int,
) -> ActorDiagnostics:
    """Exact expected actor update and its bias decomposition (single MDP).

    Args:
      theta: [S, A] current logits (pi = softmax(theta)).
      values: [S] the critic the actor's TD advantage uses.
      log_mus: [V, S, A] behaviour versions.
      state_dist: [S] sampling state distribution d; posterior: [V, S] q_l(s).
      kind, clip, centering: the actor variant (indices, traced).
      topk: static k of the top-k summary.
    """
    log_pi = jax.nn.log_softmax(theta, axis=-1)
    pi = jnp.exp(log_pi)
    mus = jnp.exp(log_mus)
    u = exact.softmax_score(pi)
    w = weight_table(log_pi[None], log_mus, kind, clip)  # [V, S, A]
    m_w = jax.vmap(lambda mu, wv: exact.mean_score(mu, u, wv))(mus, w)
    if topk == 0:
        m_hat = m_w
    else:
        topk_log_mu, topk_ids = jax.lax.top_k(log_mus, topk)

        def m_hat_version(lm, lm_top, ids):
            return jax.grad(lambda th: jnp.sum(centering_value(
                jax.nn.log_softmax(th, axis=-1), lm, lm_top, ids, kind, clip, jnp.asarray(2))))(theta)

        m_hat = jax.vmap(m_hat_version)(log_mus, topk_log_mu, topk_ids)
    m_applied = jnp.stack([jnp.zeros_like(m_w), m_w, m_hat])[centering]

    q_v = exact.q_values(mdp, v=values)
    q_pi = exact.q_values(mdp, pi)
    tmu_v = jnp.einsum("vsa,sa->vs", mus, q_v)
    cov_v = jax.vmap(lambda mu, wv: exact.score_covariance(mdp, mu, u, wv, q_v))(mus, w)
    cov_pi = jax.vmap(lambda mu, wv: exact.score_covariance(mdp, mu, u, wv, q_pi))(mus, w)
    drift_v = (tmu_v - values[None])[..., None] * (m_w - m_applied)

    dq = (state_dist[None] * posterior)[..., None]  # [V, S, 1]
    g_ref = state_dist[:, None] * exact.exact_actor_update(mdp, pi, u)
    drift = jnp.sum(dq * drift_v, axis=0)
    critic_part = jnp.sum(dq * (cov_v - cov_pi), axis=0)
    weight_part = jnp.sum(dq * cov_pi, axis=0) - g_ref
    g_app = jnp.sum(dq * (cov_v + drift_v), axis=0)
    return ActorDiagnostics(
        g_app=g_app, g_ref=g_ref, g_true=exact.policy_gradient(mdp, pi, u), drift=drift,
        critic=critic_part, weight=weight_part, m_w=m_w, m_hat=m_hat,
    )


def expected_actor_gradient(
    mdp: TabularMDP, theta: Array, values: Array, log_mus: Array, state_dist: Array,
    posterior: Array, kind: Array, clip: Array, centering: Array, topk: int,
) -> Array:
    """Exact E[grad] of the sampled actor step: the library loss over every (version, s, a)
    cell, each token's advantage scaled by (number of cells) x (cell probability), so the
    token mean is the expectation (advantages averaged over s' in closed form). [S, A]"""
    V, S, A = log_mus.shape
    mus = jnp.exp(log_mus)
    prob = state_dist[None, :, None] * posterior[:, :, None] * mus  # [V, S, A]
    adv = exact.q_values(mdp, v=values) - values[:, None]
    adv_tok = (V * S * A) * prob * adv[None]
    topk_log_mu, topk_ids = _top_k(log_mus, topk)

    def loss(th):
        lp_all = jax.nn.log_softmax(th, axis=-1)
        lp_tok = jnp.broadcast_to(lp_all[None], (V, S, A))
        c = centering_value(jnp.broadcast_to(lp_all[None], (V, S, A)), log_mus, topk_log_mu,
                            topk_ids, kind, clip, centering)  # [V, S]
        c_tok = jnp.broadcast_to(c[:, :, None], (V, S, A))
        return actor_loss(lp_tok, log_mus, adv_tok, c_tok, kind, clip)

    return -jax.grad(loss)(theta)


# ============================================================================ critic side


def _general_baseline_needed(config: ACConfig) -> bool:
    return any("baseline" in config.method_options(m) for m in config.critic_methods)


def _baseline_table(config: ACConfig, mdp: TabularMDP, log_mus: Array) -> Array:
    """The fixed general baseline b(s) of the Sec 4.2 targets: ``oldest_value`` = V of the
    oldest version in the buffer (a stale value head), or ``zero``. [S]"""
    S = log_mus.shape[1]
    if not _general_baseline_needed(config):
        return jnp.zeros((S,), log_mus.dtype)
    kinds = {config.method_options(m).get("baseline") for m in config.critic_methods} - {None}
    if len(kinds) > 1:
        raise ValueError(f"ACConfig.critic_options: all general-baseline methods must share one baseline, got {kinds}")
    kind = kinds.pop()
    v_old = exact.policy_value(mdp, jnp.exp(log_mus[0]))
    return critic.general_baseline(kind, v_old[None])


def _sampled_target(spec, options, replay, batch, vbar, clip, baseline):
    ver, s, a, s2 = batch
    clip = clip if spec.uses_clip else jnp.inf
    z_table = critic.version_z(spec, replay, clip)
    b_star = critic.mixture_optimal_baseline(replay, vbar) if spec.needs_bstar else vbar
    mdp = replay.mdp
    inputs = critic.TargetInputs(
        rewards=mdp.R[s, a, s2], discounts=next_state_discounts(mdp)[s2], values=vbar[s],
        next_values=vbar[s2], log_rhos=replay.log_pi[s, a] - replay.log_mus[ver, s, a],
        baseline=baseline[s], z=z_table[ver, s], b_star=b_star[s],
    )
    return spec.one_step(inputs, clip, options)


def _expected_target(spec, options, replay, vbar, clip, baseline):
    return critic.expected_target(spec, replay, vbar, clip, options, baseline)[0]


# ============================================================================ workers


def propagate_workers(
    mdp: TabularMDP, log_mus: Array, joint: Array, refresh_prob: Array, *, buffer_shift: bool = True
) -> Array:
    """Exact law of a rollout worker's (lag, state) one update later. [L + 1, S] -> [L + 1, S]

    ``joint[l, s]`` = P(worker at s, acting with the version of lag l); ``log_mus`` [V, S, A]
    is the buffer (oldest first, so lag l is index V - 1 - l). After the step s -> s'
    (a ~ mu_l, s' ~ P) the worker continues with probability gamma(s') -- then it fetches the
    newest weights with probability ``refresh_prob`` (lag 0), else keeps them (lag l + 1,
    forced to 0 past L) -- or resets to s' ~ init with the newest weights.
    """
    mus_by_lag = jnp.exp(log_mus)[::-1]
    M = jnp.einsum("lsa,sat->lst", mus_by_lag, mdp.P)
    flow = jnp.einsum("ls,lst->lt", joint, M)  # [L+1, S']
    g = next_state_discounts(mdp)
    cont = flow * g[None]
    reset_mass = jnp.sum(flow * (1.0 - g)[None])
    p = refresh_prob
    lag0 = p * jnp.sum(cont, axis=0) + (1.0 - p) * cont[-1] + reset_mass * mdp.init
    older = (1.0 - p) * cont[:-1]
    return jnp.concatenate([lag0[None], older], axis=0)


# ============================================================================ training


class Diagnostics(NamedTuple):
    """Per-update scalars (averaged over a chunk of updates in the returned curves).

    ret: J(pi_k) = init . V^{pi_k}; critic_err: sqrt(sum_s d(s) (V - V^{pi_k})^2) with d the
    sampling state distribution, critic_err_pi: the same weighted by d^{pi_k};
    ref_norm, true_norm, app_norm: ||g_ref||, ||g_true||, ||g_app||; bias_norm: ||g_app - g_ref||;
    drift_norm, critic_norm, weight_norm: norms of the three parts; cos_true, cos_ref:
    cosines of g_app with g_true and g_ref; topk_err, m_norm: sqrt(sum d q ||m_hat - m_w||^2)
    and sqrt(sum d q ||m_w||^2); mean_lag: E[lag] of the sampled transitions;
    kl: sum_s d(s) sum_l q_l(s) KL(pi_k(.|s) || mu_l(.|s)).
    """

    ret: Array
    critic_err: Array
    critic_err_pi: Array
    ref_norm: Array
    true_norm: Array
    app_norm: Array
    bias_norm: Array
    drift_norm: Array
    critic_norm: Array
    weight_norm: Array
    cos_true: Array
    cos_ref: Array
    topk_err: Array
    m_norm: Array
    mean_lag: Array
    kl: Array


class Carry(NamedTuple):
    theta: Array  # [S, A]
    values: Array  # [S]
    buf_log_probs: Array  # [V, S, A], oldest first; [-1] = current policy
    buf_visitation: Array  # [V, S]
    worker_state: Array  # [B] int (rollout)
    worker_lag: Array  # [B] int (rollout)
    joint: Array  # [V, S] exact (lag, state) law of a worker (rollout)


class ACResult(NamedTuple):
    """theta, values: final actor logits and critic; curves: :class:`Diagnostics` of
    [num_chunks] chunk means; final_return J(pi_final); optimal_return J*; uniform_return
    J(uniform); initial_return J(pi_0)."""

    theta: Array
    values: Array
    curves: Diagnostics
    final_return: Array
    optimal_return: Array
    uniform_return: Array
    initial_return: Array


def _norm(x):
    return jnp.sqrt(jnp.sum(jnp.square(x)))


def _cos(x, y):
    den = _norm(x) * _norm(y)
    return jnp.where(den > 0, jnp.sum(x * y) / jnp.where(den > 0, den, 1.0), 0.0)


def optimal_values(mdp: TabularMDP, tol: float = 1e-11, max_iters: int = 100_000) -> Array:
    """V* by value iteration, V <- max_a Q(s, a; V), until the sup-norm change is below
    ``tol`` (1 - gamma) / gamma (so |V - V*| < tol). Infinite-horizon, single MDP. [S]"""
    if mdp.horizon is not None:
        raise ValueError("optimal_values is defined for infinite-horizon MDPs (horizon=None)")
    g = jnp.max(mdp.gamma)
    thresh = tol * jnp.where(g < 1, (1 - g) / jnp.maximum(g, 1e-12), 1e-3)

    def cond(c):
        v, dv, i = c
        return (dv > thresh) & (i < max_iters)

    def body(c):
        v, _, i = c
        v_new = jnp.max(exact.q_values(mdp, v=v), axis=-1)
        return v_new, jnp.max(jnp.abs(v_new - v)), i + 1

    v0 = jnp.zeros((mdp.num_states,), mdp.P.dtype)
    v, _, _ = jax.lax.while_loop(cond, body, (v0, jnp.asarray(jnp.inf, v0.dtype), 0))
    return v


def sample_replay_states(key: Array, log_version_weights: Array, visitation: Array, batch_size: int):
    """Replay sampler: version i ~ w (log-weights [V]), s ~ d^{mu_i} (``visitation`` [V, S]).
    Returns (ver [B], s [B])."""
    k_v, k_s = jax.random.split(key)
    ver = jax.random.categorical(k_v, log_version_weights, shape=(batch_size,))
    return ver, jax.random.categorical(k_s, jnp.log(visitation[ver]))


def sample_transitions(key: Array, mdp: TabularMDP, log_mus: Array, ver: Array, s: Array):
    """a ~ mu_ver(.|s), s' ~ P(.|s, a) for every (ver, s) [B]. Returns (a [B], s' [B])."""
    k_a, k_p = jax.random.split(key)
    a = jax.random.categorical(k_a, log_mus[ver, s])
    return a, jax.random.categorical(k_p, jnp.log(mdp.P[s, a]))


def step_workers(key: Array, mdp: TabularMDP, next_states: Array, lags: Array, refresh_prob: Array,
                 max_lag: int):
    """Rollout workers after their step into ``next_states`` [B] (the sampled counterpart of
    :func:`propagate_workers`): continue with probability gamma(s') -- refreshing to lag 0
    with probability ``refresh_prob`` (or when lag + 1 > max_lag), else lag + 1 -- or reset to
    s ~ init at lag 0. Returns (states [B], lags [B])."""
    k_c, k_r, k_i = jax.random.split(key, 3)
    B = next_states.shape[0]
    g = next_state_discounts(mdp)[next_states]
    cont = jax.random.uniform(k_c, (B,), g.dtype) < g
    refresh = jax.random.uniform(k_r, (B,), g.dtype) < refresh_prob
    fresh = jax.random.categorical(k_i, jnp.log(mdp.init), shape=(B,))
    new_lag = jnp.where(refresh | (lags + 1 > max_lag), 0, lags + 1)
    return jnp.where(cont, next_states, fresh), jnp.where(cont, new_lag, 0)


def sampled_actor_gradient(
    mdp: TabularMDP, theta: Array, values: Array, log_mus: Array, batch, kind: Array, clip: Array,
    centering: Array, topk: int,
) -> Array:
    """Gradient-ascent direction of one sampled actor step: -grad of ``actor.policy_loss`` on
    the batch ``(ver, s, a, s')`` [B] with TD advantages r + gamma(s') V(s') - V(s) and the
    per-token centering term of the version that acted (Eq 13). [S, A]"""
    ver, s, a, s2 = batch
    B = s.shape[0]
    adv = mdp.R[s, a, s2] + next_state_discounts(mdp)[s2] * values[s2] - values[s]
    log_mu_all = log_mus[ver, s]  # [B, A]
    top_lm, top_ids = _top_k(log_mu_all, topk)

    def loss(th):
        lp_all = jax.nn.log_softmax(th, axis=-1)[s]  # [B, A]
        c = centering_value(lp_all, log_mu_all, top_lm, top_ids, kind, clip, centering)
        lp_tok = jnp.take_along_axis(lp_all, a[:, None], axis=-1)[:, 0]
        return actor_loss(lp_tok, log_mu_all[jnp.arange(B), a], adv, c, kind, clip)

    return -jax.grad(loss)(theta)


def train(mdp: TabularMDP, init_logits: Array, variant: Variant, key: Array, config: ACConfig) -> ACResult:
    """Run one asynchronous actor-critic (single MDP; ``config`` static -- use
    :func:`make_train_fn` for a jitted, vmapped version). See the module docstring."""
    if mdp.P.ndim != 3:
        raise ValueError(f"train takes a single MDP (P [S, A, S]); got P {mdp.P.shape}: use jax.vmap")
    S, A = mdp.num_states, mdp.num_actions
    if init_logits.shape != (S, A):
        raise ValueError(f"init_logits must have shape [S, A] = {(S, A)}, got {init_logits.shape}")
    if variant.lag_weights.shape != (config.num_versions,):
        raise ValueError(
            f"variant.lag_weights must have shape [max_lag + 1] = ({config.num_versions},), "
            f"got {variant.lag_weights.shape}"
        )
    if config.topk > A:
        raise ValueError(f"ACConfig.topk must be <= num_actions = {A}, got {config.topk}")
    dtype = mdp.P.dtype
    V, B = config.num_versions, config.batch_size
    specs = [critic.METHODS[m] for m in config.critic_methods]
    opts = [config.method_options(m) for m in config.critic_methods]
    log_w_ver = jnp.log(variant.lag_weights[::-1])
    lag_of_version = jnp.arange(V - 1, -1, -1)

    def update(carry: Carry, key):
        theta = carry.theta
        log_pi = jax.nn.log_softmax(theta, axis=-1)
        if config.sampling == "replay":
            replay = critic.make_replay(mdp, carry.buf_log_probs, carry.buf_visitation,
                                        variant.lag_weights[::-1])
        else:
            jv = carry.joint[::-1]  # [V, S] version order
            d = jnp.sum(jv, axis=0)
            post = jnp.where(d[None] > 0, jv / jnp.where(d > 0, d, 1.0)[None], 1.0 / V)
            replay = critic.make_replay(mdp, carry.buf_log_probs, carry.buf_visitation,
                                        jnp.sum(jv, axis=1))._replace(state_dist=d, posterior=post)
        baseline = _baseline_table(config, mdp, carry.buf_log_probs)
        vbar = carry.values

        # ---- critic (Sec 6: before the actor)
        if config.expected:
            branches = [functools.partial(_expected_target, sp, o) for sp, o in zip(specs, opts)]
            y_mean = jax.lax.switch(variant.critic, branches, replay, vbar, variant.critic_clip, baseline)
            values = jnp.where(replay.state_dist > 0, vbar + config.critic_lr * (y_mean - vbar), vbar)
            batch = None
        else:
            k_s, k_t, k_w = jax.random.split(key, 3)
            if config.sampling == "replay":
                ver, s = sample_replay_states(k_s, log_w_ver, carry.buf_visitation, B)
            else:
                ver, s = V - 1 - carry.worker_lag, carry.worker_state
            a, s2 = sample_transitions(k_t, mdp, carry.buf_log_probs, ver, s)
            batch = (ver, s, a, s2)
            branches = [functools.partial(_sampled_target, sp, o) for sp, o in zip(specs, opts)]
            y = sg(jax.lax.switch(variant.critic, branches, replay, batch, vbar,
                                  variant.critic_clip, baseline))
            onehot = jax.nn.one_hot(s, S, dtype=dtype)
            counts = jnp.sum(onehot, axis=0)
            mean_y = (y @ onehot) / jnp.maximum(counts, 1.0)
            values = jnp.where(counts > 0, vbar + config.critic_lr * (mean_y - vbar), vbar)

        # ---- actor, with the updated critic
        diag = actor_diagnostics(mdp, theta, values, carry.buf_log_probs, replay.state_dist,
                                 replay.posterior, variant.actor_kind, variant.actor_clip,
                                 variant.centering, config.topk)
        if config.expected:
            grad = expected_actor_gradient(
                mdp, theta, values, carry.buf_log_probs, replay.state_dist, replay.posterior,
                variant.actor_kind, variant.actor_clip, variant.centering, config.topk)
        else:
            grad = sampled_actor_gradient(mdp, theta, values, carry.buf_log_probs, batch,
                                          variant.actor_kind, variant.actor_clip,
                                          variant.centering, config.topk)
        theta_new = theta + config.actor_lr * grad

        # ---- diagnostics
        pi = jnp.exp(log_pi)
        v_pi = exact.policy_value(mdp, pi)
        d_pi = carry.buf_visitation[-1]
        dq = replay.state_dist[None] * replay.posterior
        kl = jnp.sum(dq * jnp.sum(pi[None] * (log_pi[None] - carry.buf_log_probs), axis=-1))
        m_err = jnp.sum(dq[..., None] * jnp.square(diag.m_hat - diag.m_w))
        out = Diagnostics(
            ret=jnp.dot(mdp.init, v_pi),
            critic_err=jnp.sqrt(jnp.sum(replay.state_dist * jnp.square(values - v_pi))),
            critic_err_pi=jnp.sqrt(jnp.sum(d_pi * jnp.square(values - v_pi))),
            ref_norm=_norm(diag.g_ref), true_norm=_norm(diag.g_true), app_norm=_norm(diag.g_app),
            bias_norm=_norm(diag.g_app - diag.g_ref), drift_norm=_norm(diag.drift),
            critic_norm=_norm(diag.critic), weight_norm=_norm(diag.weight),
            cos_true=_cos(diag.g_app, diag.g_true), cos_ref=_cos(diag.g_app, diag.g_ref),
            topk_err=jnp.sqrt(m_err),
            m_norm=jnp.sqrt(jnp.sum(dq[..., None] * jnp.square(diag.m_w))),
            mean_lag=jnp.sum(dq * lag_of_version[:, None]),
            kl=kl,
        )

        # ---- new version into the buffer; workers move on
        lp_new = jax.nn.log_softmax(theta_new, axis=-1)
        vis_new = exact.visitation(mdp, jnp.exp(lp_new))
        buf_lp = jnp.concatenate([carry.buf_log_probs[1:], lp_new[None]], axis=0)
        buf_vis = jnp.concatenate([carry.buf_visitation[1:], vis_new[None]], axis=0)
        ws, wl, joint = carry.worker_state, carry.worker_lag, carry.joint
        if config.sampling == "rollout":
            joint = propagate_workers(mdp, carry.buf_log_probs, carry.joint, variant.refresh_prob)
            if not config.expected:
                ws, wl = step_workers(k_w, mdp, s2, carry.worker_lag, variant.refresh_prob,
                                      config.max_lag)
        new = Carry(theta=theta_new, values=values, buf_log_probs=buf_lp, buf_visitation=buf_vis,
                    worker_state=ws, worker_lag=wl, joint=joint)
        return new, out

    def chunk(carry, keys):
        carry, outs = jax.lax.scan(update, carry, keys)
        return carry, jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), outs)

    lp0 = jax.nn.log_softmax(init_logits, axis=-1)
    vis0 = exact.visitation(mdp, jnp.exp(lp0))
    k_init, k_run = jax.random.split(key)
    joint0 = jnp.zeros((V, S), dtype).at[0].set(mdp.init)
    v0 = (exact.policy_value(mdp, jnp.exp(lp0)) if config.critic_init == "initial_value"
          else jnp.zeros((S,), dtype))
    carry0 = Carry(
        theta=init_logits, values=v0,
        buf_log_probs=jnp.broadcast_to(lp0[None], (V, S, A)),
        buf_visitation=jnp.broadcast_to(vis0[None], (V, S)),
        worker_state=jax.random.categorical(k_init, jnp.log(mdp.init), shape=(B,)),
        worker_lag=jnp.zeros((B,), jnp.int32), joint=joint0,
    )
    keys = jax.random.split(k_run, config.num_updates).reshape(
        (config.num_chunks, config.chunk_len) + k_run.shape)
    final, curves = jax.lax.scan(chunk, carry0, keys)
    J = lambda th: jnp.dot(mdp.init, exact.policy_value(mdp, jax.nn.softmax(th, axis=-1)))  # noqa: E731
    return ACResult(
        theta=final.theta, values=final.values, curves=curves,
        final_return=J(final.theta),
        optimal_return=jnp.dot(mdp.init, optimal_values(mdp)),
        uniform_return=J(jnp.zeros_like(init_logits)),
        initial_return=J(init_logits),
    )


@functools.lru_cache(maxsize=32)
def make_train_fn(config: ACConfig):
    """jit(vmap(train)) over (mdp, init_logits, variant, key) with a leading lane axis."""
    return jax.jit(jax.vmap(functools.partial(train, config=config)))


# ============================================================================ grid


GRID_DEFAULTS = {
    "kind": "async_ac",  # lets a sweep runner dispatch this config here
    "name": "async_ac",
    "seed": 0,
    "num_mdps": 64,
    "family": {"kind": "random", "num_states": 8, "num_actions": 4, "gamma": 0.9},
    "init_scale": 1.0,
    "ac": {},
    "modes": ["expected"],
    "actor_kinds": ["truncate"],
    "actor_clip": 1.0,
    "mask_clip": 2.0,
    "critics": ["uncorrected", "vccc"],
    "centerings": ["none", "exact"],
    "law": "geometric",
    "mean_lags": [0, 1, 2, 4, 8],
    "lanes_per_call": 1024,
}

CRITIC_LABEL = {"uncorrected": "stale critic", "vccc": "VCCC critic"}
CENTERING_LABEL = {"none": "no centering", "exact": "score centering", "topk": "top-k centering"}
CI_LEVEL = 0.95
NUMERICAL_ZERO = 1e-10  # a reference metric below this is a float64 zero: no ratio is reported


def validate_grid_config(cfg: dict) -> dict:
    """Defaults filled, keys checked (errors name the key). Returns a new dict."""
    unknown = set(cfg) - set(GRID_DEFAULTS) - {"description"}
    if unknown:
        raise ValueError(f"async_ac config: unknown keys {sorted(unknown)}")
    out = json.loads(json.dumps(GRID_DEFAULTS))
    out.update(json.loads(json.dumps(cfg)))
    if out["kind"] != "async_ac":
        raise ValueError(f"async_ac config: kind must be 'async_ac', got {out['kind']!r}")
    if out["family"].get("kind") not in ("random", "garnet"):
        raise ValueError(f"async_ac config: family.kind must be 'random' or 'garnet', got {out['family'].get('kind')!r}")
    if not (isinstance(out["num_mdps"], int) and out["num_mdps"] >= 2):
        raise ValueError(f"async_ac config: num_mdps must be an int >= 2, got {out['num_mdps']!r}")
    for m in out["modes"]:
        if m not in ("expected", "sampled"):
            raise ValueError(f"async_ac config: modes must be 'expected' or 'sampled', got {m!r}")
    for k in out["actor_kinds"]:
        if k not in ACTOR_KINDS:
            raise ValueError(f"async_ac config: actor_kinds has {k!r}; known {ACTOR_KINDS}")
    for c in out["centerings"]:
        if c not in CENTERINGS:
            raise ValueError(f"async_ac config: centerings has {c!r}; known {CENTERINGS}")
    if "topk" not in out["centerings"] and "topk" not in out["ac"]:
        out["ac"]["topk"] = 0  # compile the top-k path out when no cell uses it
    ac = dict(out["ac"])
    ac["critic_methods"] = tuple(out["critics"])
    for bad in ("expected", "critic_options"):
        if bad in ac:
            raise ValueError(f"async_ac config: ac.{bad} is set by the grid, not the config")
    ACConfig(**ac)  # validates
    for lag in out["mean_lags"]:
        history.lag_weights(out["law"], lag, ACConfig(**ac).max_lag)
    return out


def _ac_config(cfg: dict, mode: str) -> ACConfig:
    ac = dict(cfg["ac"])
    ac["critic_methods"] = tuple(cfg["critics"])
    return ACConfig(**ac, expected=(mode == "expected"))


def grid_cells(cfg: dict) -> list[dict]:
    """Every cell of a validated grid config (mode x actor kind x critic x centering x lag)."""
    cells = []
    for mode in cfg["modes"]:
        for kind in cfg["actor_kinds"]:
            for crit in cfg["critics"]:
                for cen in cfg["centerings"]:
                    for lag in cfg["mean_lags"]:
                        cells.append({"mode": mode, "actor_kind": kind, "critic": crit,
                                      "centering": cen, "mean_lag": float(lag)})
    return cells


def make_problems(cfg: dict, dtype=None):
    """(mdps [N], initial logits [N, S, A]) of a grid config; deterministic in its seed."""
    fam = dict(cfg["family"])
    kind = fam.pop("kind")
    key = jax.random.PRNGKey(cfg["seed"])
    k_mdp, k_pol = jax.random.split(key)
    n = cfg["num_mdps"]
    gen = mdp_mod.random_mdp if kind == "random" else mdp_mod.garnet_mdp
    mdps = gen(k_mdp, n, dtype=dtype, **fam)
    logits = history.initial_logits(k_pol, n, mdps.num_states, mdps.num_actions,
                                    cfg["init_scale"], dtype=dtype)
    return mdps, logits


def _t_quantile(level: float, dof: int) -> float:
    from scipy import stats  # a dependency of jax

    return float(stats.t.ppf(0.5 + level / 2, dof))


def mean_ci(x: np.ndarray) -> dict:
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    mean = float(x.mean())
    half = float(_t_quantile(CI_LEVEL, n - 1) * x.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    return {"mean": mean, "ci": half}


def per_mdp_metrics(res: ACResult) -> dict:
    """Per-run summary numbers (numpy, leading lane axis) from an :class:`ACResult`.

    gap: (J* - J(pi_final)) / (J* - J(uniform)), the remaining fraction of the uniform
    policy's suboptimality; gap_auc: the same averaged over training (learning speed). bias, drift, critic_part, weight_part: time-averaged norms over
    the time-averaged ||g_ref|| (ratios of sums, robust to ||g_ref|| -> 0 at convergence).
    cos_true, cos_ref, critic_err, critic_err_pi, topk_rel_err, mean_lag, kl: time averages.
    """
    c = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), res.curves)
    jstar = np.asarray(res.optimal_return, np.float64)
    ref = c.ref_norm.mean(-1)
    den = np.where(ref > 0, ref, 1.0)
    m = c.m_norm.mean(-1)
    scale = jstar - np.asarray(res.uniform_return)
    return {
        "gap": (jstar - np.asarray(res.final_return)) / scale,
        "gap_auc": (jstar[:, None] - c.ret).mean(-1) / scale,
        "bias": c.bias_norm.mean(-1) / den,
        "drift_part": c.drift_norm.mean(-1) / den,
        "critic_part": c.critic_norm.mean(-1) / den,
        "weight_part": c.weight_norm.mean(-1) / den,
        "cos_true": c.cos_true.mean(-1),
        "cos_ref": c.cos_ref.mean(-1),
        "critic_err": c.critic_err.mean(-1),
        "critic_err_pi": c.critic_err_pi.mean(-1),
        "topk_rel_err": c.topk_err.mean(-1) / np.where(m > 0, m, 1.0),
        "mean_lag": c.mean_lag.mean(-1),
        "kl": c.kl.mean(-1),
    }


METRICS = ("gap", "gap_auc", "bias", "drift_part", "critic_part", "weight_part", "cos_true", "cos_ref",
           "critic_err", "critic_err_pi", "topk_rel_err", "mean_lag", "kl")


def run_grid(cfg: dict, *, stream=None) -> list[dict]:
    """Run every cell of a grid config; one tidy row per cell (float64).

    Row: ``{"cell": {...}, "metrics": {name: {"mean", "ci", "per_mdp": [...]}, ...},
    "curves": {"ret", "bias", "critic_err": [num_chunks] MDP means}, "config": {...}}``
    with ``ci`` the half-width of a ``CI_LEVEL`` Student-t interval over MDPs. Sampled cells
    use one independent seed per MDP.
    """
    cfg = validate_grid_config(cfg)
    stream = sys.stderr if stream is None else stream
    cells = grid_cells(cfg)
    rows = []
    with jax.enable_x64(True):
        mdps, logits = make_problems(cfg, dtype=jnp.float64)
        n = cfg["num_mdps"]
        for mode in cfg["modes"]:
            acfg = _ac_config(cfg, mode)
            fn = make_train_fn(acfg)
            mode_cells = [c for c in cells if c["mode"] == mode]
            variants = [
                make_variant(
                    acfg, actor_kind=c["actor_kind"],
                    actor_clip=cfg["mask_clip"] if c["actor_kind"] == "mask" else cfg["actor_clip"],
                    centering=c["centering"], critic=c["critic"], law=cfg["law"],
                    mean_lag=c["mean_lag"], dtype=jnp.float64)
                for c in mode_cells
            ]
            lanes = len(mode_cells) * n
            tile = lambda x: jnp.concatenate([x] * len(mode_cells), axis=0)  # noqa: E731
            all_mdps = jax.tree_util.tree_map(tile, mdps)
            all_logits = tile(logits)
            all_vars = jax.tree_util.tree_map(lambda x: jnp.repeat(x, n, axis=0), stack_variants(variants))
            base = jax.random.PRNGKey(cfg["seed"] + 1)
            keys = jnp.stack([jax.random.fold_in(base, i % n) for i in range(lanes)])
            per = int(cfg["lanes_per_call"])
            outs = []
            t0 = time.perf_counter()
            for start in range(0, lanes, per):
                idx = np.arange(start, start + per) % lanes  # pad the last call by wrapping
                take = lambda x: x[idx]  # noqa: E731
                r = fn(jax.tree_util.tree_map(take, all_mdps), all_logits[idx],
                       jax.tree_util.tree_map(take, all_vars), keys[idx])
                r = jax.tree_util.tree_map(np.asarray, r)
                keep = min(per, lanes - start)
                outs.append(jax.tree_util.tree_map(lambda x: x[:keep], r))
                print(f"async_ac {mode}: {start + keep}/{lanes} runs "
                      f"({time.perf_counter() - t0:.1f}s)", file=stream, flush=True)
            res = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *outs)
            pm = per_mdp_metrics(res)
            for j, cell in enumerate(mode_cells):
                sl = slice(j * n, (j + 1) * n)
                metrics = {k: dict(mean_ci(v[sl]), per_mdp=v[sl].tolist()) for k, v in pm.items()}
                curves = {
                    "ret_gap": ((res.optimal_return[sl, None] - res.curves.ret[sl])
                                / (res.optimal_return[sl] - res.uniform_return[sl])[:, None]).mean(0).tolist(),
                    "bias": (res.curves.bias_norm[sl] / np.maximum(res.curves.ref_norm[sl], 1e-300)).mean(0).tolist(),
                    "critic_err": res.curves.critic_err[sl].mean(0).tolist(),
                }
                rows.append({"cell": cell, "metrics": metrics, "curves": curves,
                             "config": {"grid": {k: v for k, v in cfg.items() if k != "ac"},
                                        "ac": acfg.to_dict()}})
    return rows


def _row_index(rows):
    return {(r["cell"]["mode"], r["cell"]["actor_kind"], r["cell"]["critic"], r["cell"]["centering"],
             r["cell"]["mean_lag"]): r for r in rows}


def reduction_ratios(rows: list[dict], metric: str = "bias", reference=("uncorrected", "none"),
                     num_boot: int = 2000, seed: int = 0) -> list[dict]:
    """metric(variant) vs metric(reference variant) per (mode, actor kind, lag), paired over MDPs.

    ``ratio``: ratio of MDP means with a ``CI_LEVEL`` paired-bootstrap interval (lo, hi);
    ``diff``: mean paired difference with a ``CI_LEVEL`` t half-width ``diff_ci``. Lag-0 cells
    (where every variant is the same on-policy run) are skipped."""
    idx = _row_index(rows)
    rng = np.random.default_rng(seed)
    out = []
    for (mode, kind, crit, cen, lag), r in sorted(idx.items(), key=lambda kv: str(kv[0])):
        if lag == 0:
            continue
        ref = idx.get((mode, kind, reference[0], reference[1], lag))
        if ref is None:
            continue
        x = np.asarray(r["metrics"][metric]["per_mdp"])
        y = np.asarray(ref["metrics"][metric]["per_mdp"])
        n = len(x)
        b = rng.integers(0, n, size=(num_boot, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            boots = x[b].mean(1) / y[b].mean(1)
        lo, hi = np.nanquantile(boots, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
        d = mean_ci(x - y)
        out.append({"mode": mode, "actor_kind": kind, "critic": crit, "centering": cen,
                    "mean_lag": lag, "ratio": float(x.mean() / y.mean()) if y.mean() != 0 else float("nan"),
                    "lo": float(lo), "hi": float(hi), "diff": d["mean"], "diff_ci": d["ci"],
                    "ref_mean": float(y.mean())})
    return out


def summary_table(rows: list[dict]) -> str:
    """Markdown table: per (mode, actor kind, lag, variant) mean +- CI of the headline metrics
    (plus the top-k centering's relative error ||m_hat - m_w|| / ||m_w|| when a cell uses it)."""
    cols = ("gap", "gap_auc", "bias", "drift_part", "critic_part", "weight_part", "cos_true",
            "critic_err", "kl")
    if any(r["cell"]["centering"] == "topk" for r in rows):
        cols = cols + ("topk_rel_err",)
    head = "| mode | actor w | lag | critic | centering | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (5 + len(cols))]
    for r in sorted(rows, key=lambda r: (r["cell"]["mode"], r["cell"]["actor_kind"], r["cell"]["mean_lag"],
                                         r["cell"]["critic"], r["cell"]["centering"])):
        c = r["cell"]
        vals = " | ".join(f"{r['metrics'][k]['mean']:.3g} ± {r['metrics'][k]['ci']:.2g}" for k in cols)
        lines.append(f"| {c['mode']} | {c['actor_kind']} | {c['mean_lag']:g} | "
                     f"{CRITIC_LABEL.get(c['critic'], c['critic'])} | "
                     f"{CENTERING_LABEL.get(c['centering'], c['centering'])} | {vals} |")
    return "\n".join(lines)


def default_reference(rows: list[dict]) -> tuple:
    """(critic, centering) the ratios compare against: (uncorrected, none) when present, else
    the first critic of the rows without centering."""
    pairs = {(r["cell"]["critic"], r["cell"]["centering"]) for r in rows}
    if ("uncorrected", "none") in pairs:
        return ("uncorrected", "none")
    return sorted(p for p in pairs if p[1] == "none")[0]


def ratio_table(rows: list[dict], reference: Optional[tuple] = None) -> str:
    """Markdown table of :func:`reduction_ratios` against ``reference`` (default
    :func:`default_reference`): ratios of the bias and of its drift / critic parts, and the
    paired change of the training-averaged return gap."""
    reference = default_reference(rows) if reference is None else tuple(reference)
    lines = ["| mode | actor w | lag | variant | bias ratio [CI] | drift ratio [CI] | "
             "critic-part ratio [CI] | Δ gap_auc ± CI |",
             "|---|---|---|---|---|---|---|---|"]
    metrics = ("bias", "drift_part", "critic_part", "gap_auc")
    tabs = {m: {(d["mode"], d["actor_kind"], d["mean_lag"], d["critic"], d["centering"]): d
                for d in reduction_ratios(rows, m, reference)} for m in metrics}
    ref_name = f"{CRITIC_LABEL.get(reference[0], reference[0])} + {CENTERING_LABEL.get(reference[1], reference[1])}"
    lines[0] = lines[0].replace("| variant |", f"| variant (vs {ref_name}) |")
    for key in sorted(tabs["bias"]):
        mode, kind, lag, crit, cen = key
        if (crit, cen) == reference:
            continue
        def cellf(d):
            if d["ref_mean"] < NUMERICAL_ZERO:  # e.g. the drift of an exact-ratio actor
                return "n/a (ref = 0)"
            return f"{d['ratio']:.3g} [{d['lo']:.3g}, {d['hi']:.3g}]"

        g = tabs["gap_auc"][key]
        lines.append(f"| {mode} | {kind} | {lag:g} | {CRITIC_LABEL.get(crit, crit)} + "
                     f"{CENTERING_LABEL.get(cen, cen)} | " +
                     " | ".join(cellf(tabs[m][key]) for m in metrics[:3]) +
                     f" | {g['diff']:+.2g} ± {g['diff_ci']:.2g} |")
    return "\n".join(lines)
