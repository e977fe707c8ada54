"""Actor side of the asynchronous tabular actor-critic (``tabular.async_ac``): its config,
the variants of a grid (actor weight, centering, critic target, staleness law), the weight
tables w(rho) of Sec 5 (none, ratio, truncate, mask), score centering (exact and top-k;
Sec 5.2, Eq 14-15), the actor loss and its exact expected gradient with the bias
decomposition (drift / critic / weight parts).
"""


from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import actor as actor_est
from vccc_jax.estimators import actor_registry
from vccc_jax.estimators.importance import importance_weights
from vccc_jax.tabular import critic, exact, history
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array
sg = jax.lax.stop_gradient

ACTOR_KINDS = actor_registry.WEIGHT_KIND_ROWS  # the first rows of the actor table: none, ratio, truncate, mask
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
