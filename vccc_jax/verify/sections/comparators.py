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

DEC_LAG, DEC_NOISE, DEC_DECAY = 2, 0.5, 0.5


@functools.partial(fast_jit, static_argnums=(1,))
def _decoupled_numbers(key, fns):
    """Per route: (actor mean - ideal, critic mean - T_pi Vbar) unclipped, and (actor mean -
    exact route's) clipped; fns = (actor_update_moments, critic_target_moments) (cache key)."""
    actor_m, critic_m = fns
    k_m, k_th, k_v, k_n = jax.random.split(key, 4)
    mdp = random_mdp(k_m, 1, 3, 3, gamma=0.8)[0]
    hist = policy_history(mdp, jax.random.normal(k_th, (3, 3)), HistoryConfig(step_size=0.4, num_versions=5))
    vbar = jax.random.normal(k_v, (3,))
    mu = td.inference_policy(hist.logits[-1 - DEC_LAG], noise_scale=DEC_NOISE, key=k_n)
    pols = td.route_policies(hist.logits, DEC_LAG, mu, decay=DEC_DECAY)
    pi = pols["pi"]
    adv = ex.q_values(mdp, pi)
    adv = adv - jnp.sum(pi * adv, axis=-1, keepdims=True)
    ideal_actor = jnp.einsum("sa,sab->sb", pi * adv, ex.softmax_score(pi))
    ideal_critic = ex.bellman_operator(mdp, pi, vbar)
    free = dict(kind="ratio", clip=None, ppo_epsilon=None)
    clipped = dict(kind="truncate", clip=1.5, ppo_epsilon=0.2)
    unbiased = jnp.stack([
        jnp.maximum(jnp.max(jnp.abs(actor_m(mdp, pi, pols[r], mu, **free)[0] - ideal_actor)),
                    jnp.max(jnp.abs(critic_m(mdp, pi, pols[r], mu, vbar, **free)[0] - ideal_critic)))
        for r in td.ROUTES])
    exact_mean = actor_m(mdp, pi, pols["exact"], mu, **clipped)[0]
    naive_bias = jnp.max(jnp.abs(actor_m(mdp, pi, pols["behaviour"], mu, **clipped)[0] - exact_mean))
    return unbiased, naive_bias


def decoupled_rows(ctx) -> list[Row]:
    """Decoupled-correction routes (exact, ewma, behaviour) at lag 2 with inference noise."""
    with jax.enable_x64(True):
        unbiased, naive = (np.asarray(x) for x in _decoupled_numbers(
            jax.random.fold_in(ctx.key, 14), (td.actor_update_moments, td.critic_target_moments)))
    routes = ", ".join(td.ROUTES)
    naive = float(naive)
    return [
        exact_row("decoupled: unclipped, every pi_old route unbiased (actor, critic)", "decoupled", 1,
                  float(np.max(unbiased)), 1e-10, f"routes {routes}; lag {DEC_LAG}, inference noise {DEC_NOISE:g}"),
        Row("decoupled: clipped, naive route (pi_old = mu) biased vs exact route", "decoupled", "exact", 1,
            naive, 1e-3, naive > 1e-3,
            "truncate c=1.5, PPO eps 0.2; passes when the bias EXCEEDS the bound (a claimed nonzero effect)"),
    ]


# ------------------------------------------------------------------------------- RAC

RAC_DELAYS = (0, 2, 4)
RAC_KERNELS = ((1.0,), (0.6, 0.3, 0.1), (0.5, 0.5))


@functools.partial(fast_jit, static_argnums=(1,))
def _rac_numbers(key, fns):
    full_mass, linear, identity = fns[:3]  # fns[3:]: what the claims call (cache key only)
    k_m, k_th, k_c = jax.random.split(key, 3)
    mdp = random_mdp(k_m, 1, 4, 3, gamma=0.9)[0]
    hist = policy_history(mdp, initial_logits(k_th, 1, 4, 3, 1.0)[0], HistoryConfig(step_size=0.4, num_versions=9))
    ch = rac.split_rewards(k_c, mdp.R, 3)
    a = full_mass(mdp, ch, RAC_DELAYS, RAC_KERNELS, hist.probs)
    b = [linear(mdp, ch, RAC_DELAYS, (0.6, 0.3, 0.1), m, hist.probs, behaviour_lag=1) for m in (0.5,)]
    c = identity(mdp, ch, hist.probs, clip=1.0, behaviour_lag=2)
    return jnp.stack(a), jnp.stack([jnp.stack(x) for x in b], axis=1), jnp.stack(c)


def rac_rows(ctx) -> list[Row]:
    """RAC's three claims on one MDP (S=4 A=3, 3 reward channels, delays (0, 2, 4))."""
    with jax.enable_x64(True):
        a, b, c = (np.asarray(x) for x in _rac_numbers(
            jax.random.fold_in(ctx.key, 15),
            (rac.claim_unbiased_full_mass, rac.claim_linear_in_unreinjected, rac.claim_identity_is_vtrace,
             rac.channel_update, rac.expected_update, rac.vtrace_actor_update)))
    return [
        pair_row("RAC: no clip, kernel mass 1 -> unbiased", "RAC", 1, *a, 1e-10,
                 f"||bias|| over 3 channels, delays {RAC_DELAYS}, kernels {RAC_KERNELS}"),
        pair_row("RAC: no clip, mass K -> bias = (1-K) bias(drop)", "RAC", 1, *b, 1e-10,
                 "K = 0.5, behaviour lag 1", min_size=1e-3),
        pair_row("RAC: delay 0, identity kernel = V-trace actor update", "RAC", 1, *c, 1e-10,
                 "clip 1, behaviour lag 2", min_size=1e-3),
    ]
