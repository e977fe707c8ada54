"""Exact expected actor updates of every actor-correction row x every critic correction on the
tabular and token testbeds, against Eq 12 and the true policy gradient (issue 21, part 2).

**Problems.** ``kind="tabular"``: a ``tabular.mdp.TabularMDP``, policy logits [S, A]
(infinite horizon: discounted, per-state closed forms; finite ``horizon``: every path is
enumerated, ``tabular.actor_paths``). ``kind="token"``: a ``tabular.token.TokenTask``, policy
logits [P, H, Q, V] (a table over prompt, position, automaton state: the limit of the token
env's actor), backward induction over positions; tool-observation states carry no actor
parameters. The parameter space of every update below is the policy's logit table: a
coefficient table c(s, a) (update = sum c u) becomes the logit gradient c - pi sum_a c.

**One update of the map** (:func:`lane_update`): learner pi, behaviour mu = the sampler's
distribution (temperature T, then top-p; :func:`behaviour_log_probs`) applied to the logits of
the version ``lag`` updates old -- one version, no mixture. Then, with D_mu the behaviour's
state occupancy at policy states (tabular: normalised discounted visitation d^mu; token and
finite-horizon tabular: expected number of visits per episode),

* **the critic** of a critic correction is the fixed point of its expected one-step target
  under this replay (:func:`critic_policies`, :func:`policy_values`): a target Vbar + w delta
  (w = 1: uncorrected; rho: VCCC / IW-TD, Eq 8; min(rho, c): truncated, Eq 10; min(rho,
  rhobar): V-trace, Eq 11 with lambda = 1, rhobar = cbar) has, under ONE behaviour version,
  the fixed point V^{pitilde} with pitilde = mu w / Z (Sec 4.2; V-trace's fixed point depends
  on rhobar only). So uncorrected = V^mu (the fixed point of the uncorrected lambda-return
  for every lambda: "uncorrected GAE"), VCCC = V^pi where mu covers pi (else pi renormalised
  on mu's support), truncated c / V-trace rhobar = V^{pi_c}, pi_c ∝ min(c mu, pi). Checked
  against the registry targets' own fixed points (``tabular.fixed_point.fixed_point``) and
  the token target expectations (``tabular.token.expected_targets``) in the tests;
* **the actor** is the one-step TD actor of Sec 5.1 with that critic (A = r + d V(s') -
  V(s), lambda = 0), weighted by the registry row ``row`` (``estimators.actor_registry``),
  optionally score-centred (Eq 13): per-state closed forms for token / batch rows
  (``tabular.exact_actor.correction_update``, ``envs.token_actor_truth.update_coefficients``;
  M2PO in its infinite-batch limit), path enumeration for sequence rows (finite horizons
  with at most ``MAX_PATHS`` paths; elsewhere :func:`row_is_exact` is False: "n/a (no closed
  form)"). AReaL's staleness cap eta reads the version lag: its update is 0 when lag > eta;
* **references**: ``eq12`` = sum_s D_mu(s) E_pi[(Q^pi - V^pi) u | s] (Eq 12: the behaviour's
  state weights, what every token-level row aims at) and ``pg`` = the same with D_pi, the
  true policy gradient (normalised d^pi for the discounted tabular MDP: the theorem up to
  1 / (1 - gamma));
* **decomposition** (:func:`lane_update`), exact by construction (a telescoping sum), as the
  tabular async actor-critic table (``tabular.async_actor.actor_diagnostics``):
  g - pg = drift + critic + weight + state with G(V, c) the row's update with critic V and
  centring c: drift = G(V, c) - G(V, 1) (Eq 1's baseline drift, removed by centring), critic =
  G(V, 1) - G(V^pi, 1) (the future-policy mismatch the critic fix removes), weight =
  G(V^pi, 1) - eq12 (clipping / masking / support), state = eq12 - pg (token rows never
  correct the state distribution). Sequence rows have no per-state centring: their drift is
  0 by definition and G(., 1) reads G(., 0).

Everything is float64 (call inside ``jax.enable_x64(True)``) and jit / vmap safe with the
problem ``kind``, the row and its parameters static.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import samplers
from vccc_jax.envs import token_actor_truth as tat
from vccc_jax.estimators import actor_registry
from vccc_jax.tabular import actor_paths as ap
from vccc_jax.tabular import evaluation, exact_actor
from vccc_jax.tabular import token as tk
from vccc_jax.tabular.mdp import TabularMDP

Array = chex.Array

KINDS = ("tabular", "token")
CRITICS = ("uncorrected", "vccc", "truncated", "vtrace")
MAX_PATHS = 1_000_000

__all__ = ["KINDS", "CRITICS", "MAX_PATHS", "num_paths", "row_is_per_state", "row_is_exact", "behaviour_log_probs",
           "critic_policies", "policy_values", "start_value", "optimal_start_value",
           "occupancy", "reference", "row_update", "LaneUpdate", "lane_update", "npg_versions",
           "cosine", "relative"]


# ------------------------------------------------------------------------------ rows


def num_paths(kind: str, env) -> Optional[int]:
    """Paths a finite-horizon problem enumerates (None: infinite horizon)."""
    if kind == "tabular":
        H = env.horizon
        return None if H is None else env.num_states * (env.num_actions * env.num_states) ** H
    return env.num_prompts * env.num_tokens ** env.horizon


def _per_state(kind: str, env) -> bool:
    """Token / batch rows have per-state closed forms here (not the finite-horizon tabular
    MDP, whose stationary policy is enumerated)."""
    return kind == "token" or env.horizon is None


def row_is_per_state(kind: str, env, row: str) -> bool:
    """The row's update is computed per state here (token / batch rows on a per-state problem;
    score centring applies); otherwise it is enumerated path by path."""
    return actor_registry.get_actor_correction(row).level != "sequence" and _per_state(kind, env)


def row_is_exact(kind: str, env, row: str) -> bool:
    """The row's expected update has a closed form on this problem: token / batch rows on
    every per-state problem, every row where the paths can be enumerated (<= MAX_PATHS)."""
    level = actor_registry.get_actor_correction(row).level
    n = num_paths(kind, env)
    enumerable = n is not None and n <= MAX_PATHS
    return enumerable or (level != "sequence" and _per_state(kind, env))


# -------------------------------------------------------------------------- policies


def behaviour_log_probs(logits: Array, temperature, top_p) -> Array:
    """log mu [..., A] of the sampler: temperature, then top-p (``envs.samplers``'s order and
    nucleus rule, ties cut by position; both traced: top_p = 1 keeps every token). -inf off the support."""
    z = logits / temperature
    keep = samplers._top_p_keep(z, top_p, "position")
    z = jnp.where((top_p < 1.0) & ~keep, -jnp.inf, z)
    return jax.nn.log_softmax(z, axis=-1)


def critic_policies(log_pi: Array, log_mu: Array, clip, rhobar) -> Array:
    """log pitilde [4, ..., A] of the critics of :data:`CRITICS`: pitilde = mu w / Z with w =
    1, rho, min(rho, clip), min(rho, rhobar) on mu's support (module docstring)."""
    on = jnp.isfinite(log_mu)
    mu = jnp.where(on, jnp.exp(log_mu), 0.0)
    pi_on = jnp.where(on, jnp.exp(log_pi), 0.0)  # mu * rho
    masses = jnp.stack([mu, pi_on, jnp.minimum(pi_on, clip * mu), jnp.minimum(pi_on, rhobar * mu)])
    z = jnp.sum(masses, axis=-1, keepdims=True)
    return jnp.log(masses / z)


def _token_fn(log_table: Array):
    """log-prob table [P, H, Q, V] -> ``tabular.token`` LogProbFn (t -> [P, Q, V])."""
    return lambda t: log_table[:, t]


def policy_values(kind: str, env, log_p: Array) -> Array:
    """V of a policy: tabular [S] (infinite) or [H + 1, S] (finite, row H = 0); token
    [H + 1, P, Q, K] (``tabular.token.policy_values``)."""
    if kind == "tabular":
        pi = jnp.exp(log_p)
        if env.horizon is None:
            return evaluation.policy_value(env, pi)
        return evaluation.policy_values_by_time(env, pi)
    return tk.policy_values(env, _token_fn(log_p)).v


def start_value(kind: str, env, values: Array) -> Array:
    """J = E[V(s_0)] (tabular: init . V; token: mean over prompts of V at the start)."""
    if kind == "tabular":
        return jnp.dot(env.init, values if env.horizon is None else values[0])
    return jnp.mean(tk.start_values(env, values))


def optimal_start_value(kind: str, env, tol: float = 1e-11) -> Array:
    """J* (value iteration for the discounted MDP; backward induction with a max otherwise:
    on the token task the max runs over token classes, Q depends on a token only through
    its class)."""
    if kind == "tabular" and env.horizon is None:
        from vccc_jax.tabular.async_ac import optimal_values

        return jnp.dot(env.init, optimal_values(env, tol))
    if kind == "tabular":
        def back(v, _):
            v = jnp.max(evaluation.q_values(env, v=v), axis=-1)
            return v, None

        v0, _ = jax.lax.scan(back, jnp.zeros(env.num_states, env.P.dtype), None, length=env.horizon)
        return jnp.dot(env.init, v0)
    present = jnp.zeros(env.num_classes, bool).at[env.token_class].set(True)

    def back(v_next, t):
        b = tk._backup_grid(env, v_next, t)
        act = jnp.max(jnp.where(present[None, None], b.h[:, :, 0, :], -jnp.inf), axis=-1)
        tool = jnp.sum(tk.tool_class_probs(env)[None, None, None] * b.h[:, :, 1:, :], axis=-1)
        return jnp.concatenate([act[..., None], tool], axis=-1), None

    zero = jnp.zeros((env.num_prompts, env.num_states, env.num_counters), env.gamma.dtype)
    v0, _ = jax.lax.scan(back, zero, jnp.arange(env.horizon), reverse=True)
    return jnp.mean(v0[jnp.arange(env.num_prompts), env.prompt_state, 0])


def occupancy(kind: str, env, log_p: Array) -> Array:
    """State weights D of a policy at its policy states: tabular infinite horizon: the
    normalised discounted visitation [S]; finite: P(s_t = s, episode running) [H, S];
    token: expected visits of (t, p, q, k = 0) [H, P, Q] (``policy_occupancy``)."""
    if kind == "tabular":
        pi = jnp.exp(log_p)
        if env.horizon is None:
            return evaluation.visitation(env, pi)
        live = 1.0 - env.terminal
        m_pi = evaluation.transition_matrix(env, pi)

        def fwd(m, _):
            return (m @ m_pi) * live, m

        _, d = jax.lax.scan(fwd, env.init * live, None, length=env.horizon)
        return d
    return tat.policy_occupancy(env, _token_fn(log_p))[..., 0]


# ------------------------------------------------------------------------- updates


def _logit_grad(coeff: Array, pi: Array) -> Array:
    """update = sum_a coeff(a) u(a) with u = e_a - pi: the logit gradient coeff - pi sum coeff."""
    return coeff - pi * jnp.sum(coeff, axis=-1, keepdims=True)


def _tabular_q(env: TabularMDP, v: Array) -> Array:
    """Q(s, a) = E[r + gamma(s') v(s')] [S, A] (v [S]) or per time [H, S, A] (v [H + 1, S])."""
    if v.ndim == 1:
        return evaluation.q_values(env, v=v)
    return jax.vmap(lambda vn: evaluation.q_values(env, v=vn))(v[1:])


def reference(kind: str, env, log_pi: Array, v_pi: Array, weights: Array) -> Array:
    """sum_s D(s) E_pi[(Q^pi - V^pi) u | s] in logit space (``weights`` = D, :func:`occupancy`
    shape; ``v_pi`` = :func:`policy_values` of pi): Eq 12 with D_mu, the policy gradient with
    D_pi."""
    pi = jnp.exp(log_pi)
    if kind == "tabular":
        q = _tabular_q(env, v_pi)
        if env.horizon is None:
            return weights[:, None] * pi * (q - v_pi[:, None])
        return jnp.einsum("ts,tsa->sa", weights, pi[None] * (q - v_pi[:-1, :, None]))
    H = env.horizon
    vbar = v_pi

    def one(t):
        adv = tk.token_view(env, tk.class_backup(env, vbar[t + 1], t) - vbar[t, :, :, 0, None])
        return weights[t][..., None] * pi[:, t] * adv

    return jnp.moveaxis(jax.lax.map(one, jnp.arange(H, dtype=jnp.int32)), 0, 1)


def _staleness_cap(row, params: dict, lag):
    """(params without AReaL's max_staleness, 0/1 factor 1[lag <= eta]) for rows reading lags."""
    params = dict(params)
    if "lags" not in row.data or params.get("max_staleness") is None:
        return params, 1.0
    eta = params.pop("max_staleness")
    return params, (jnp.asarray(lag) <= eta).astype(jnp.float64)


def row_update(kind: str, env, row: str, params: dict, log_pi: Array, log_mu: Array,
               critic: Array, d_mu: Array, *, centred: bool = False, lag=0,
               v_pi: Optional[Array] = None) -> Array:
    """The exact expected update of actor row ``row`` (parameters ``params``) in logit space
    (module docstring): learner ``log_pi``, behaviour ``log_mu`` (logit-table shapes), critic
    values ``critic`` (:func:`policy_values` shape), behaviour state weights ``d_mu``
    (:func:`occupancy`). ``centred``: Eq 13 (per-state rows only; ValueError on enumerated
    problems). ``v_pi``: V^pi if already computed (token)."""
    spec = actor_registry.get_actor_correction(row)
    params, factor = _staleness_cap(spec, params, lag)
    pi = jnp.exp(log_pi)
    per_state = row_is_per_state(kind, env, row)
    if not per_state and not row_is_exact(kind, env, row):
        raise ValueError(f"actor row {row!r} has no closed form on this {kind} problem "
                         f"(sequence rows need <= {MAX_PATHS} enumerable paths)")
    if centred and not per_state:
        raise ValueError(f"centred: row {row!r} on this {kind} problem is enumerated path by "
                         "path; score centring is per state (token / batch rows, per-state problems)")
    if kind == "tabular" and per_state:
        one = jnp.ones((1, env.num_states), log_pi.dtype)
        out = exact_actor.correction_update(env, pi, jnp.exp(log_mu)[None], d_mu, one, critic,
                                            correction=spec.name, params=params,
                                            centred=centred).expected
        return factor * out
    if kind == "tabular":
        paths = ap.tabular_paths(env, pi, jnp.exp(log_mu)[None])
        adv = ap.path_advantages(paths, critic.reshape(-1), 0.0)
        coeff = ap.expected_update(paths, adv, jnp.ones((1,), log_pi.dtype), correction=spec.name,
                                   params=params, num_ids=env.num_states,
                                   num_actions=env.num_actions)
        return factor * _logit_grad(coeff, pi)
    H, P, Q = env.horizon, env.num_prompts, env.num_states
    pi_fn, mu_fn = _token_fn(log_pi), (lambda t: log_mu[None, :, t])
    if per_state:
        vals = tk.policy_values(env, pi_fn) if v_pi is None else tk.Values(
            v=v_pi, q_class=_token_q_class(env, v_pi))
        coeff = tat.update_coefficients(env, pi_fn, mu_fn, jnp.ones((1, H, P, Q), log_pi.dtype),
                                        d_mu, critic, kind=spec.name, centred=centred,
                                        pi_values=vals, params=params).expected
    else:
        coeff = tat.sequence_update_coefficients(env, pi_fn, mu_fn, jnp.ones((1,), log_pi.dtype),
                                                 critic, correction=spec.name,
                                                 params=params).expected
    return factor * _logit_grad(jnp.moveaxis(coeff, 0, 1), pi)


def _token_q_class(env, v: Array) -> Array:
    """Q per token class at policy states [H, P, Q, C] of a value table [H + 1, P, Q, K]."""
    return jax.lax.map(lambda t: tk.class_backup(env, v[t + 1], t),
                       jnp.arange(env.horizon, dtype=jnp.int32))


# ------------------------------------------------------------------------ one lane


def cosine(x: Array, ref: Array) -> Array:
    """Cosine of an update with a reference (flattened): 0 when the update is 0 (no step
    points anywhere), NaN when the reference is 0 (nothing to point at: a degenerate
    problem instance, left out of seed means)."""
    x, ref = x.reshape(-1), ref.reshape(-1)
    nx, nr = jnp.linalg.norm(x), jnp.linalg.norm(ref)
    den = nx * nr
    cos = jnp.where(den > 0, jnp.dot(x, ref) / jnp.where(den > 0, den, 1.0), 0.0)
    return jnp.where(nr > 0, cos, jnp.nan)


def relative(x: Array, ref: Array) -> Array:
    """|x| / |ref| (flattened; inf when ref = 0 and x != 0)."""
    n = jnp.linalg.norm(ref.reshape(-1))
    return jnp.linalg.norm(x.reshape(-1)) / n


class LaneUpdate(NamedTuple):
    """Exact updates of one (learner, behaviour) lane, in logit space; ``g`` and the parts
    [C, ...] (one per critic of :data:`CRITICS`): g = the row's update; drift + critic +
    weight + state = g - pg (module docstring); eq12 / pg the references; critic_err [C]:
    RMS_{D_mu}(V_critic - V^pi) at policy states over RMS_{D_mu}(V^pi); kl: E_{D_mu}
    KL(mu || pi) per state visit (normalised D; finite under top-p); support: E_{D_mu}
    pi-mass off mu's support;
    j_pi: J(pi)."""

    g: Array
    drift: Array
    critic: Array
    weight: Array
    state: Array
    eq12: Array
    pg: Array
    critic_err: Array
    kl: Array
    support: Array
    j_pi: Array


def _policy_state_values(kind: str, env, v: Array) -> Array:
    """Values at the policy states, the shape of :func:`occupancy`."""
    if kind == "tabular":
        return v if env.horizon is None else v[:-1]
    return v[:-1, :, :, 0]


def lane_update(kind: str, env, row: str, params: dict, logits_pi: Array, logits_mu: Array,
                temperature, top_p, lag, *, clip: float, rhobar: float,
                centred: bool = False) -> LaneUpdate:
    """Every critic's exact update of row ``row`` at one lane (module docstring): learner
    softmax(logits_pi), behaviour = the sampler (temperature, top_p) of ``logits_mu`` at
    version lag ``lag``; critics of :data:`CRITICS` with truncation ``clip`` and V-trace
    ``rhobar``."""
    log_pi = jax.nn.log_softmax(logits_pi, axis=-1)
    log_mu = behaviour_log_probs(logits_mu, temperature, top_p)
    v_pi = policy_values(kind, env, log_pi)
    d_mu = occupancy(kind, env, log_mu)
    d_pi = occupancy(kind, env, log_pi)
    if kind == "tabular" and env.horizon is None:
        d_pi = d_pi / jnp.sum(d_pi)
    eq12 = reference(kind, env, log_pi, v_pi, d_mu)
    pg = reference(kind, env, log_pi, v_pi, d_pi)
    crit = jax.vmap(lambda lp: policy_values(kind, env, lp))(
        critic_policies(log_pi, log_mu, clip, rhobar))
    per_state = row_is_per_state(kind, env, row)

    def upd(v, c):
        return row_update(kind, env, row, params, log_pi, log_mu, v, d_mu, centred=c, lag=lag,
                          v_pi=v_pi)

    g = jax.vmap(lambda v: upd(v, centred))(crit)
    g1 = jax.vmap(lambda v: upd(v, True))(crit) if (per_state and not centred) else g
    g_pi = upd(v_pi, per_state)
    w = d_mu / jnp.sum(d_mu)
    vs_pi = _policy_state_values(kind, env, v_pi)
    rms = jnp.sqrt(jnp.sum(w * vs_pi ** 2))
    err = jax.vmap(lambda v: jnp.sqrt(jnp.sum(w * (_policy_state_values(kind, env, v) - vs_pi) ** 2)))(crit)
    pi = jnp.exp(log_pi)
    on = jnp.isfinite(log_mu)
    mu = jnp.where(on, jnp.exp(log_mu), 0.0)
    kl_s = jnp.sum(jnp.where(on, mu * (jnp.where(on, log_mu, 0.0) - log_pi), 0.0), axis=-1)
    off = jnp.sum(jnp.where(on, 0.0, pi), axis=-1)
    if kind == "token":
        kl_s, off = jnp.moveaxis(kl_s, 0, 1), jnp.moveaxis(off, 0, 1)
    elif env.horizon is not None:
        kl_s, off = kl_s[None], off[None]
    return LaneUpdate(
        g=g, drift=g - g1, critic=g1 - g_pi[None], weight=jnp.broadcast_to(g_pi - eq12, g.shape),
        state=jnp.broadcast_to(eq12 - pg, g.shape), eq12=eq12, pg=pg,
        critic_err=err / jnp.maximum(rms, 1e-300), kl=jnp.sum(w * kl_s), support=jnp.sum(w * off),
        j_pi=start_value(kind, env, v_pi))


# ----------------------------------------------------------------------- histories


def npg_versions(kind: str, env, logits0: Array, step_size: float, versions: tuple) -> Array:
    """Logits of pi_i for i in ``versions`` (static, sorted) [len(versions), ...] of the history
    pi_0, pi_1, ... made by exact natural policy gradient (tabular softmax: theta(s, a) +=
    eta A^pi(s, a) at every state, ``tabular.history.npg_step``; a finite horizon uses the
    time-averaged advantage of the stationary policy; token: theta(p, t, q, v) += eta (Q^pi -
    V^pi)(t, p, q, class(v)) at the policy states). Only the requested versions are kept."""
    versions = tuple(int(v) for v in versions)
    want = jnp.asarray(versions)

    def npg(theta):
        log_p = jax.nn.log_softmax(theta, axis=-1)
        v = policy_values(kind, env, log_p)
        if kind == "tabular":
            q = _tabular_q(env, v)
            if env.horizon is not None:
                q, v = jnp.mean(q, axis=0), jnp.mean(v[:-1], axis=0)
            return theta + step_size * (q - v[:, None])
        q = tk.token_view(env, _token_q_class(env, v))  # [H, P, Q, V]
        return theta + step_size * jnp.moveaxis(q - v[:-1, :, :, 0, None], 0, 1)

    def step(carry, i):
        theta, buf = carry
        hit = (want == i).reshape((-1,) + (1,) * theta.ndim)
        buf = jnp.where(hit, theta[None], buf)
        return (npg(theta), buf), None

    buf0 = jnp.zeros((len(versions),) + logits0.shape, logits0.dtype)
    (_, buf), _ = jax.lax.scan(step, (logits0, buf0), jnp.arange(max(versions) + 1))
    return buf
