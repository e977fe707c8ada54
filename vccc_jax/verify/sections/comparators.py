"""Rows for the related methods (issues 13, 14): BRACE, the decoupled-correction routes and
RAC, each a (computed, expected) pair from the comparator's exact tabular module.

- BRACE (``tabular.brace``, Sec 4.3 comparator): the closed-form bias
  (P_pi Gamma)^n (V^mu - V^pi) equals the exact operator's fixed point and the moment DP
  (the claims of ``bias_rows``; its numpy brute-force enumeration is tests/tabular's); the
  full importance-corrected return's variance grows like E_mu[rho^2]^H while BRACE's does
  not (``variance_growth_rows``).
- Decoupled correction (``tabular.decoupled``): without clipping every pi_old route is
  exactly unbiased for the actor (E_pi[A u], Eq 12) and the critic (T_pi Vbar); with the
  discrepancy truncation and the PPO clip the naive route (pi_old = mu) is biased against the
  exact route (pi_old = the behaviour version).
- RAC (``tabular.rac``): no clip and kernel mass 1 -> unbiased; mass K -> bias = (1 - K)
  bias(drop); delay 0 with the identity kernel = the expected V-trace actor update.

These modules compute eagerly or with their own jits; each section builds its tiny problem
inside one compiled graph where the module allows it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import brace as tb
from vccc_jax.tabular import decoupled as td
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular import rac
from vccc_jax.tabular.history import HistoryConfig, initial_logits, policy_history
from vccc_jax.tabular.mdp import make_mdp, random_mdp, with_horizon
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.report import Row, exact_row, pair_row

# ----------------------------------------------------------------------------- BRACE

BRACE_PI = ((0.7, 0.3), (0.2, 0.8))
BRACE_MU = ((0.4, 0.6), (0.5, 0.5))
BRACE_NS = (0, 2)


BRACE_H = 16  # variance growth horizon (one state, gamma = 1)


@functools.partial(fast_jit, static_argnums=(0,))
def _brace_numbers(fns, key):
    """The numbers behind ``tabular.brace.bias_rows`` (closed form, operator fixed point, moment
    DP; the numpy brute-force enumeration stays in tests/tabular) and ``variance_by_horizon``,
    in one compiled graph. fns = (bias_closed_form, brace_fixed_point, target_moments)."""
    closed_form, fixed_point, moments = fns
    mdp = with_horizon(random_mdp(key, 1, 2, 2, gamma=0.9)[0], 3)
    pi, mu = jnp.asarray(BRACE_PI, mdp.P.dtype), jnp.asarray(BRACE_MU, mdp.P.dtype)
    vbar = jnp.asarray([0.3, -0.2], mdp.P.dtype)
    fm, pf, mf, _ = tb.fold(mdp, pi, mu)
    v_pi = ex.policy_value(mdp, pi)
    kw = dict(clip_rho_threshold=None, clip_c_threshold=None)
    bias = []
    for n in BRACE_NS:
        closed = closed_form(mdp, pi, mu, n)
        fixed = fixed_point(fm, pf, mf, n=n, **kw)[:2] - v_pi
        dp = moments(mdp, pi, mu, vbar, n=n, **kw)[0][0] - v_pi
        bias.append(jnp.stack([closed, fixed, dp]))
    one = make_mdp(jnp.ones((1, 2, 1)), jnp.asarray([[[0.0], [1.0]]]), 1.0, horizon=BRACE_H)
    p1, m1 = jnp.asarray([[0.3, 0.7]]), jnp.asarray([[0.9, 0.1]])
    var_b = moments(one, p1, m1, jnp.zeros(1), n=2, clip_rho_threshold=1.0, clip_c_threshold=1.0)[1][:, 0]
    var_f = moments(one, p1, m1, jnp.zeros(1), n=BRACE_H, **kw)[1][:, 0]
    second = jnp.sum(m1 * (p1 / m1) ** 2)
    # time slice 0 has H steps to go, slice 1 has H - 1: growth per step at the longest horizon
    return jnp.stack(bias), jnp.log(var_f[0] / var_f[1]), jnp.log(var_b[0] / var_b[1]), jnp.log(second)


def brace_rows(ctx) -> list[Row]:
    """BRACE: closed-form bias vs the operator's fixed point and the moment DP, and variance
    growth per step (one state, gamma = 1, H = 16: the full IS return grows at
    log E_mu[rho^2] = log 5 per step, BRACE n = 2 at ~0) -- the claims of
    ``tabular.brace.bias_rows`` / ``variance_growth_rows`` (same tolerances)."""
    with jax.enable_x64(True):
        bias, g_full, g_brace, g_rate = (np.asarray(x) for x in _brace_numbers(
            (tb.bias_closed_form, tb.brace_fixed_point, tb.target_moments), jax.random.fold_in(ctx.key, 13)))
    closed, brute = bias[:, 0], bias[:, 1:]
    g_full, g_brace, g_rate = float(g_full), float(g_brace), float(g_rate)
    return [
        pair_row("BRACE bias = (P_pi Gamma)^n (V^mu - V^pi)", "BRACE", 1, brute,
                 np.broadcast_to(closed[:, None], brute.shape), 1e-10,
                 f"S=2 A=2 H=3 n in {BRACE_NS}, unclipped: operator fixed point and moment DP", min_size=1e-2),
        exact_row("full IS return: log Var growth/step = log E_mu[rho^2]", "Sec 4.3", 1,
                  abs(g_full - g_rate), 0.05, f"one state, gamma=1, H={BRACE_H}: {g_full:.5f} vs {g_rate:.5f}"),
        exact_row("BRACE n=2: no exponential variance growth", "Sec 4.3", 1, abs(g_brace), 3.0 / BRACE_H,
                  f"log Var_H/Var_(H-1) = {g_brace:.4f}, tolerance 3/H"),
    ]


# ------------------------------------------------------------------- decoupled routes

DEC_LAG, DEC_NOISE = 2, 0.5
DEC_DECAY = DEC_LAG / (1.0 + DEC_LAG)  # PPO-EWMA's rate for a mean lag L (mean EMA age L), written out
# (kind, clip, ppo_epsilon): the total ratio unclipped; truncation / mask with the PPO clip
DEC_SETTINGS = (("ratio", None, None), ("truncate", 1.5, 0.2), ("mask", 1.5, 0.2))


@fast_jit
def decoupled_problem(key):
    """(mdp S=3 A=3, logits of 5 NPG versions [5, S, A], Vbar [S], inference-side mu of version
    K - DEC_LAG with logit noise DEC_NOISE): the decoupled rows' problem."""
    k_m, k_th, k_v, k_n = jax.random.split(key, 4)
    mdp = random_mdp(k_m, 1, 3, 3, gamma=0.8)[0]
    hist = policy_history(mdp, jax.random.normal(k_th, (3, 3)), HistoryConfig(step_size=0.4, num_versions=5))
    mu = td.inference_policy(hist.logits[-1 - DEC_LAG], noise_scale=DEC_NOISE, key=k_n)
    return mdp, hist.logits, jax.random.normal(k_v, (3,)), mu


@functools.partial(fast_jit, static_argnums=(1,))
def _decoupled_numbers(problem, fns):
    """(per route max |mean - ideal| of actor and critic unclipped [R], max |actor mean of the
    naive route - exact route's| clipped, the exact operators of every route and setting of
    ``DEC_SETTINGS`` (the truth of ``decoupled_library``)); fns = (actor_update_moments,
    critic_target_moments)."""
    actor_m, critic_m = fns
    mdp, logits, vbar, mu = problem
    pols = td.route_policies(logits, DEC_LAG, mu, decay=DEC_DECAY)
    pi = pols["pi"]
    olds = jnp.stack([pols[r] for r in td.ROUTES])
    adv = ex.q_values(mdp, pi)
    adv = adv - jnp.sum(pi * adv, axis=-1, keepdims=True)
    ideal_actor = jnp.einsum("sa,sab->sb", pi * adv, ex.softmax_score(pi))
    ideal_critic = ex.bellman_operator(mdp, pi, vbar)
    actor, critic = (jnp.stack([jax.vmap(lambda o: f(o, dict(kind=k, clip=c, ppo_epsilon=e)))(olds)
                                for k, c, e in DEC_SETTINGS])
                     for f in (lambda o, kw: actor_m(mdp, pi, o, mu, **kw)[0],
                               lambda o, kw: critic_m(mdp, pi, o, mu, vbar, **kw)[0]))  # [K, R, ...]
    unbiased = jnp.maximum(jnp.max(jnp.abs(actor[0] - ideal_actor[None]), axis=(1, 2)),
                           jnp.max(jnp.abs(critic[0] - ideal_critic[None]), axis=1))
    ex_i, naive_i = td.ROUTES.index("exact"), td.ROUTES.index("behaviour")
    naive_bias = jnp.max(jnp.abs(actor[1, naive_i] - actor[1, ex_i]))  # truncate c=1.5, eps 0.2
    truth = dict(pi_old=olds, adv=adv, delta=ex.bellman_targets(mdp, vbar) - vbar[:, None, None],
                 actor=actor, critic=critic)
    return unbiased, naive_bias, truth


def decoupled_numbers(ctx):
    """``_decoupled_numbers`` of the problem ``decoupled_problem(fold_in(ctx.key, 14))``, float64."""
    with jax.enable_x64(True):
        problem = decoupled_problem(jax.random.fold_in(ctx.key, 14))
        return problem, _decoupled_numbers(problem, (td.actor_update_moments, td.critic_target_moments))


def decoupled_rows(ctx) -> list[Row]:
    """Decoupled-correction routes (exact, ewma, behaviour) at lag 2 with inference noise."""
    unbiased, naive = (np.asarray(x) for x in decoupled_numbers(ctx)[1][:2])
    routes = ", ".join(td.ROUTES)
    naive = float(naive)
    return [
        exact_row("decoupled: unclipped, every pi_old route unbiased (actor, critic)", "decoupled", 1,
                  float(np.max(unbiased)), 1e-10, f"routes {routes}; lag {DEC_LAG}, inference noise {DEC_NOISE:g}"),
        Row("decoupled: clipped, naive route (pi_old = mu) biased vs exact route", "decoupled", "exact", 1,
            naive, 1e-3, bool(1e-3 < naive < np.inf),  # a NaN or inf bias is no measured effect
            "truncate c=1.5, PPO eps 0.2; passes when the bias EXCEEDS the bound (a claimed nonzero effect)"),
    ]


# ------------------------------------------------------------------------------- RAC

RAC_DELAYS = (0, 2, 4)
RAC_KERNELS = ((1.0,), (0.6, 0.3, 0.1), (0.5, 0.5))
# The library rows' configuration (``rac_library``): a delay-1 channel, clip active, lag 1.
RAC_LIB_DELAYS, RAC_LIB_KERNELS, RAC_LIB_CLIP, RAC_LIB_LAG = (0, 1, 3), ((1.0,), (0.6, 0.3, 0.1), (0.5, 0.5)), 1.0, 1


@fast_jit
def rac_problem(key):
    """(mdp S=4 A=3, a history of 9 NPG versions' probabilities [9, S, A], 3 reward channels
    [3, S, A, S']): the RAC rows' problem."""
    k_m, k_th, k_c = jax.random.split(key, 3)
    mdp = random_mdp(k_m, 1, 4, 3, gamma=0.9)[0]
    hist = policy_history(mdp, initial_logits(k_th, 1, 4, 3, 1.0)[0], HistoryConfig(step_size=0.4, num_versions=9))
    return mdp, hist.probs, rac.split_rewards(k_c, mdp.R, 3)


@functools.partial(fast_jit, static_argnums=(1,))
def _rac_numbers(problem, fns):
    """(the three claims' pairs, the truth of ``rac_library``: the exact expected update of the
    library rows' configuration, the channel values V_c^pi [C, S] and d^pi [S] of pi_K)."""
    full_mass, linear, identity, expected_update = fns[:4]  # fns[4:]: what the claims call (cache key only)
    mdp, probs, ch = problem
    a = full_mass(mdp, ch, RAC_DELAYS, RAC_KERNELS, probs)
    b = [linear(mdp, ch, RAC_DELAYS, (0.6, 0.3, 0.1), m, probs, behaviour_lag=1) for m in (0.5,)]
    c = identity(mdp, ch, probs, clip=1.0, behaviour_lag=2)
    pi = probs[-1]
    truth = dict(update=expected_update(mdp, ch, RAC_LIB_DELAYS, RAC_LIB_KERNELS, probs, "rac", clip=RAC_LIB_CLIP,
                                        behaviour_lag=RAC_LIB_LAG),
                 channel_values=jax.vmap(lambda r: ex.policy_value(mdp.replace(R=r), pi))(ch),
                 visitation=ex.visitation(mdp, pi, normalize=False))
    return (jnp.stack(a), jnp.stack([jnp.stack(x) for x in b], axis=1), jnp.stack(c)), truth


def rac_numbers(ctx):
    """(problem, ``_rac_numbers`` of it) for ``rac_problem(fold_in(ctx.key, 15))``, float64."""
    with jax.enable_x64(True):
        problem = rac_problem(jax.random.fold_in(ctx.key, 15))
        return problem, _rac_numbers(problem, (
            rac.claim_unbiased_full_mass, rac.claim_linear_in_unreinjected, rac.claim_identity_is_vtrace,
            rac.expected_update, rac.channel_update, rac.vtrace_actor_update))


def rac_rows(ctx) -> list[Row]:
    """RAC's three claims on one MDP (S=4 A=3, 3 reward channels, delays (0, 2, 4))."""
    a, b, c = (np.asarray(x) for x in rac_numbers(ctx)[1][0])
    return [
        pair_row("RAC: no clip, kernel mass 1 -> unbiased", "RAC", 1, *a, 1e-10,
                 f"||bias|| over 3 channels, delays {RAC_DELAYS}, kernels {RAC_KERNELS}"),
        pair_row("RAC: no clip, mass K -> bias = (1-K) bias(drop)", "RAC", 1, *b, 1e-10,
                 "K = 0.5, behaviour lag 1", min_size=1e-3),
        pair_row("RAC: delay 0, identity kernel = V-trace actor update", "RAC", 1, *c, 1e-10,
                 "clip 1, behaviour lag 2", min_size=1e-3),
    ]
