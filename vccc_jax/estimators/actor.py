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
from vccc_jax.estimators.importance import WeightKind, importance_weights, safe_ratios

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
    weights: Optional[Array] = None,
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
      weights: a precomputed w_t (same shape; a row of ``estimators.actor_registry``, e.g.
        a sequence-level one), used instead of ``kind`` / ``clip`` (always stop-gradient).
    """
    checks.check_same_shape(
        log_pi=log_pi, log_mu=log_mu, advantages=advantages, log_pi_old=log_pi_old,
        centering=centering, weights=weights,
    )
    checks.check_nonempty("log_pi", log_pi)
    checks.check_log_probs("log_mu", log_mu)
    checks.check_log_probs("log_pi", log_pi)
    if ppo_epsilon is not None and not 0 < ppo_epsilon < 1:
        raise ValueError(f"ppo_epsilon must be in (0, 1), got {ppo_epsilon}")
    advantages = sg(advantages)
    ref = sg(log_pi) if log_pi_old is None else sg(log_pi_old)
    w = sg(importance_weights(ref - log_mu, kind, clip) if weights is None else weights)
    # safe_ratios, not exp: log_pi = ref = -inf (a learner that gives the token probability 0)
    # is NaN - its weight is 0 - and must not turn 0 * NaN into a NaN loss or gradient.
    r = safe_ratios(log_pi - ref)
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
    coeff = sg(jnp.where(w > 0, jnp.exp(log_mu_all) * w, 0.0))  # 0, not NaN, at log mu = NaN
    return _weighted_sum(coeff, log_pi_all)


def _weighted_sum(coeff: Array, log_pi: Array) -> Array:
    """sum_a coeff(a) log pi(a) over the last axis with 0 * log 0 = 0: actions with coefficient
    mu(a) w(a) = 0 (mu = 0; or w = 0, e.g. pi_ref = 0 under a masked learner, or a NaN log mu,
    whose coefficient the callers set to 0) add exactly 0 to the value and to the gradient,
    even where log pi = -inf (a plain product would give 0 * -inf = NaN)."""
    return jnp.sum(coeff * jnp.where(coeff > 0, log_pi, 0.0), axis=-1)


def _topk_mask(num_actions: int, topk_ids: Array, dtype) -> Array:
    """1 at the (distinct) ``topk_ids`` [..., k], 0 elsewhere, [..., num_actions]: one scatter
    (O(V + k) per row; no [..., k, V] one-hot)."""
    zeros = jnp.zeros(topk_ids.shape[:-1] + (num_actions,), dtype)
    return jnp.put_along_axis(zeros, topk_ids, jnp.ones((), dtype), axis=-1, inplace=False)


def behaviour_support_size(log_mu_all: Array) -> Array:
    """n_s = the number of tokens the sampler kept, [...] int32: the count of finite entries
    of a full behaviour row [..., V] (-inf off the support). A real engine knows it after its
    top-k / top-p filter and logs it with the top-k summary (one integer per token; §7)."""
    return jnp.sum(jnp.isfinite(log_mu_all), axis=-1).astype(jnp.int32)


def _order_keys(x: Array) -> Array:
    """Unsigned integer keys with the order of the floats ``x`` (IEEE bits; -inf lowest)."""
    if jnp.dtype(x.dtype).itemsize < 4:
        x = x.astype(jnp.float32)  # exact
    utype = jnp.uint64 if jnp.dtype(x.dtype).itemsize == 8 else jnp.uint32
    bits = jax.lax.bitcast_convert_type(x, utype)
    sign = jnp.left_shift(jnp.ones((), utype), jnp.asarray(jnp.iinfo(utype).bits - 1, utype))
    return jnp.where((bits & sign) != 0, ~bits, bits | sign)


def _select_top(x: Array, n: Array) -> Array:
    """Boolean [..., V]: x >= the n-th largest value of its row (ties there all kept; n <= 0:
    none). An exact radix select of the threshold: one O(V) compare-and-count per key bit
    (32 passes for float32, 64 for float64), no sort and nothing larger than [..., V]."""
    keys = _order_keys(x)
    utype, nbits = keys.dtype, jnp.iinfo(keys.dtype).bits
    n = n[..., None]

    def step(b, t):  # the largest t with #{keys >= t} >= n, one bit at a time from the top
        cand = t | jnp.left_shift(jnp.ones((), utype), (nbits - 1 - b).astype(utype))
        ok = jnp.sum(keys >= cand, axis=-1, keepdims=True) >= n
        return jnp.where(ok, cand, t)

    t = jax.lax.fori_loop(0, nbits, step, jnp.zeros(n.shape, utype))
    return (keys >= t) & (n > 0)


def tail_support_mask(
    ref_log_pi_all: Array,
    not_top: Array,
    support_size: Optional[Array],
    k: int,
    *,
    max_support: Optional[int] = None,
) -> Array:
    """Where the tail model puts the unlogged behaviour mass, [..., V] (0 / 1, ``not_top``'s dtype).

    ``support_size`` None: every action outside the top-k (``not_top``, today's model).
    Given (n_s [...], the sampler's support size): the n_s - k actions outside the top-k that
    ``ref_log_pi_all`` ranks highest (ties at the boundary all kept; none when n_s <= k);
    with n_s = V this is ``not_top`` exactly. Ranking cost: with ``max_support`` (static, a
    bound n_s <= max_support the caller guarantees, e.g. a top-K sampler's K) one
    ``lax.top_k`` of size max_support - k (rows with n_s > max_support get a tail of
    max_support - k tokens); without it an exact radix select (:func:`_select_top`, 32 / 64
    O(V) passes per row). Never a sort, a [..., k, V] or a V x V array.
    """
    if max_support is not None and not (isinstance(max_support, int) and max_support >= 1):
        raise ValueError(f"max_support must be an int >= 1 or None, got {max_support!r}")
    if support_size is None:
        return not_top
    chex.assert_type(support_size, int)
    chex.assert_shape(support_size, not_top.shape[:-1])
    num_actions = not_top.shape[-1]
    n_tail = support_size.astype(jnp.int32) - k
    masked = jnp.where(not_top > 0, sg(ref_log_pi_all), -jnp.inf)
    if max_support is None or max_support >= num_actions:
        keep = _select_top(masked, n_tail)
    elif max_support <= k:
        return jnp.zeros_like(not_top)
    else:
        m = max_support - k
        ranked = jax.lax.top_k(masked, m)[0]
        thr = jnp.take_along_axis(ranked, jnp.clip(n_tail, 1, m)[..., None] - 1, axis=-1)
        keep = (masked >= thr) & (n_tail[..., None] > 0)
    return jnp.where(keep, not_top, jnp.zeros((), not_top.dtype))


def centering_coefficients_topk(
    ref_log_pi_all: Array,
    topk_log_mu: Array,
    topk_ids: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    support_size: Optional[Array] = None,
    max_support: Optional[int] = None,
) -> tuple[Array, Array]:
    """The tail model's coefficients C(a) ~ mu(a) w(s, a) of the centering term (§5.2, §7).

    ``ref_log_pi_all`` [..., A] is the policy the weights are formed from (sg(pi_theta), or
    pi_old in the decoupled / multi-epoch case). The unlogged behaviour mass
    tail_mu = 1 - sum_topk mu is spread over the tail set T in proportion to ref, so each
    tail action has mu(a) = tail_mu ref(a) / ref(T) and the common ratio
    rho_tail = ref(T) / tail_mu. T (:func:`tail_support_mask`): ``support_size`` None, every
    action outside the top-k; given (n_s [...], int: the size of the sampler's support, e.g.
    :func:`behaviour_support_size`), the n_s - k actions outside the top-k that ref ranks
    highest -- a top-k / top-p sampler never emits the others, and with n_s = V (no
    truncation) this is the first model exactly; empty when n_s <= k (the summary covers the
    support: exact).

    Returns:
      (top [..., k]: mu(a) w(a) at ``topk_ids``; tail [..., A]: tail_mu ref(a) / ref(T) x
      w(rho_tail) on T, exactly 0 elsewhere, in particular at ``topk_ids``). No gradient
      (constants). O(V + k) per row, plus the ranking of :func:`tail_support_mask` when
      ``support_size`` is given (``max_support``: its static bound).
    """
    checks.check_same_shape(topk_log_mu=topk_log_mu, topk_ids=topk_ids)
    chex.assert_type(topk_ids, int)
    chex.assert_equal_shape_prefix([ref_log_pi_all, topk_ids], topk_ids.ndim - 1)
    ref = sg(ref_log_pi_all)
    pi_all = jnp.exp(ref)
    not_top = 1.0 - _topk_mask(ref.shape[-1], topk_ids, ref.dtype)
    in_tail = tail_support_mask(ref, not_top, support_size, topk_ids.shape[-1],
                                max_support=max_support)  # the tail set T (not_top if None)
    topk_ref = jnp.take_along_axis(ref, topk_ids, axis=-1)
    tail_mu = jnp.clip(1.0 - jnp.sum(jnp.exp(topk_log_mu), axis=-1), 0.0, 1.0)
    tail_pi = jnp.clip(jnp.sum(pi_all * in_tail, axis=-1), 0.0, 1.0)
    # Top-k part: exact.
    w_top = importance_weights(topk_ref - topk_log_mu, kind, clip)
    top = sg(jnp.where(w_top > 0, jnp.exp(topk_log_mu) * w_top, 0.0))  # 0, not NaN, at log mu = NaN
    # Tail part: mu(a) = tail_mu * ref(a) / tail_ref, one common log-ratio for all tail actions.
    safe = (tail_mu > 0) & (tail_pi > 0)
    log_rho_tail = jnp.where(
        safe, jnp.log(jnp.where(safe, tail_pi, 1.0)) - jnp.log(jnp.where(safe, tail_mu, 1.0)), 0.0
    )
    w_tail = importance_weights(log_rho_tail, kind, clip)
    tail_mu_a = jnp.where(
        safe[..., None], tail_mu[..., None] * pi_all / jnp.where(safe, tail_pi, 1.0)[..., None], 0.0
    )
    tail = sg(tail_mu_a * w_tail[..., None] * in_tail)
    return top, tail


def centering_term_topk(
    log_pi_all: Array,
    topk_log_mu: Array,
    topk_ids: Array,
    *,
    kind: WeightKind = "ratio",
    clip: Optional[float] = None,
    log_pi_old_all: Optional[Array] = None,
    support_size: Optional[Array] = None,
    max_support: Optional[int] = None,
) -> Array:
    """Approximate c(s) from a top-k summary of the behaviour distribution plus a tail term.

    For large vocabularies only the k most likely behaviour tokens are logged (as the
    write-up suggests, §5.2 and §7). Tail model (:func:`centering_coefficients_topk`): the
    unlogged behaviour mass 1 - sum_topk mu is spread over the tail set T in proportion to
    the weight's reference policy (sg(pi_theta), or ``log_pi_old_all``), so each tail action
    has one common ratio rho_tail = ref(T) / tail_mu. T is every non-top-k action
    (``support_size`` None), or, support-aware, the n_s - k non-top-k actions ref ranks
    highest (``support_size`` = n_s [...], the sampler's support size: a top-k / top-p
    sampler never emits the rest; n_s = V gives the first model exactly). The result is exact
    when k covers the support, and its error is otherwise the tail-model error, which callers
    should track separately from Bellman-target error (``train.learner.topk_centering_errors``).

    Cost per row: O(V + k) (the top-k ids are marked with one scatter; no [..., k, V]
    one-hot), plus with ``support_size`` one ranking of ref: a ``lax.top_k`` of static size
    ``max_support`` - k when a bound n_s <= ``max_support`` is known, else an exact radix
    select (32 O(V) passes in float32; :func:`tail_support_mask`). No sort, no V x V.

    Args:
      log_pi_all: [..., A] current-policy log-probs (with gradient).
      topk_log_mu: [..., k] logged behaviour log-probs of the top-k tokens.
      topk_ids: [..., k] their action ids (int, distinct).
      log_pi_old_all: [..., A] proximal-policy log-probs (constants) or None, as in
        :func:`centering_term`: the weights (top-k and tail) are formed from pi_old instead
        of sg(pi_theta), the decoupled / multi-epoch PPO case.
      support_size: [...] int, the sampler's support size n_s (what the engine logs), or None.
      max_support: static int bound on n_s (e.g. a top-K sampler's K) or None.
    """
    checks.check_same_shape(log_pi_all=log_pi_all, log_pi_old_all=log_pi_old_all)
    checks.check_rank_at_least("log_pi_all", log_pi_all, 1)
    ref = log_pi_all if log_pi_old_all is None else log_pi_old_all
    top_c, tail_c = centering_coefficients_topk(ref, topk_log_mu, topk_ids, kind=kind, clip=clip,
                                                support_size=support_size, max_support=max_support)
    topk_log_pi = jnp.take_along_axis(log_pi_all, topk_ids, axis=-1)
    return _weighted_sum(top_c, topk_log_pi) + _weighted_sum(tail_c, log_pi_all)
