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

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from vccc_jax.estimators.registry import TargetExtras
from vccc_jax.estimators.types import Transitions
from vccc_jax.tabular import critic, exact
from vccc_jax.tabular.async_actor import (  # noqa: F401  (re-exported)
    ACTOR_KINDS,
    CENTERINGS,
    ONE_STEP_CRITICS,
    SAMPLINGS,
    ACConfig,
    ActorDiagnostics,
    Array,
    Variant,
    _top_k,
    _unit_centering,
    _unit_centering_topk,
    actor_diagnostics,
    actor_loss,
    centering_value,
    expected_actor_gradient,
    make_variant,
    sg,
    stack_variants,
    weight_table,
)
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts

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
    t = Transitions(
        rewards=mdp.R[s, a, s2], discounts=next_state_discounts(mdp)[s2], values=vbar[s],
        next_values=vbar[s2], log_rhos=replay.log_pi[s, a] - replay.log_mus[ver, s, a],
    )
    extras = TargetExtras(baseline=baseline[s], z=z_table[ver, s], b_star=b_star[s])
    return spec.one_step(t, extras, clip, options)


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
