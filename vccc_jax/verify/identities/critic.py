"""Exact identity sections for the critic: policy values (Sec 1.4), the covariance of Eq 3,
the VCCC target's mean under every version / baseline / replay mixture (Eq 4-6, 8) and
the variance-optimal baseline of Eq 9."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular import mdp as mdplib
from vccc_jax.verify.cells import cell_moments, replay_cells
from vccc_jax.verify.identities.shared import Prelude, grid_mean
from vccc_jax.verify.problems import Problem, maxabs
from vccc_jax.verify.targets import bellman_h


def values_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi = p.mdp, p.pi
    S = mdp.num_states
    v_pi = pre.v_pi
    errs = {}

    errs["vpi_fixed_point"] = maxabs(ex.bellman_operator(mdp, pi, v_pi) - v_pi)
    H = 4
    v_h = ex.policy_value(mdplib.with_horizon(mdp, H), pi)
    v_fold = ex.policy_value(mdplib.fold_time(mdplib.with_horizon(mdp, H)), mdplib.fold_policy(pi, H))
    errs["finite_horizon_fold"] = maxabs(v_h - v_fold[:S])

    return errs


def critic_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi, mus, vbar = p.mdp, p.pi, p.mus, p.vbar
    mu = mus[-1]
    t_pi, v_pi, v_mus = pre.t_pi, pre.v_pi, pre.v_mus
    errs = {}

    # Eq 3: T_pi V - T_mu V = Cov_mu(rho, H | s), every version.
    def eq3(m):
        g = ex.transition_grid(mdp, pi, m, vbar)
        h = ct.bellman_sample(g.rewards, g.discounts, g.next_values)
        cov = ex.target_covariance(mdp, m, safe_ratios(g.log_rhos), h)
        return maxabs(t_pi - ex.bellman_operator(mdp, m, vbar) - cov)

    errs["eq3"] = jnp.max(jax.vmap(eq3)(mus))

    # Eq 5: E_mu_k[Y_b] = T_pi V for every version k and baseline b (arbitrary, V^mu, b*, V^pi).
    def eq5(m, v_m):
        g = ex.transition_grid(mdp, pi, m, vbar)
        b_star = ex.optimal_baseline(mdp, pi, m, vbar)
        bs = jnp.concatenate([p.baselines, jnp.stack([v_m, b_star, v_pi, vbar, -vbar])], axis=0)

        def one(b):
            y = ct.vccc_target(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos, g.state(b))
            return maxabs(ex.target_moments(mdp, m, y)[0] - t_pi)

        return jnp.max(jax.vmap(one)(bs))

    errs["eq5"] = jnp.max(jax.vmap(eq5)(mus, v_mus))

    # Eq 6: replay mixtures (random q_k(s), and q_k(s) ∝ d^{mu_k}(s), the replay conditional).
    vccc_b = lambda c: ct.vccc_target(c.rewards, c.discounts, c.values, c.next_values, c.log_rhos, c.baseline)
    cells = replay_cells(mdp, pi, mus, p.mix, vbar, p.baselines[1])
    errs["eq6_random_mix"] = maxabs(cell_moments(cells, vccc_b(cells))[0] - t_pi)
    d = jax.vmap(lambda m: ex.visitation(mdp, m))(mus)  # [K, S]
    mix_vis = d / jnp.sum(d, axis=0, keepdims=True)
    cells_vis = replay_cells(mdp, pi, mus, mix_vis, vbar, p.baselines[1])
    errs["eq6_visitation_mix"] = maxabs(cell_moments(cells_vis, vccc_b(cells_vis))[0] - t_pi)
    h_replay = cell_moments(cells, bellman_h(cells))[0]
    errs["replay_uncorrected"] = maxabs(
        h_replay - ex.bellman_operator(mdp, ex.replay_policy(mus, p.mix), vbar)
    )
    errs["uncorrected_tmu"] = jnp.max(jax.vmap(
        lambda m: maxabs(grid_mean(mdp, pi, m, vbar, lambda g: ct.uncorrected_target(
            g.rewards, g.discounts, g.next_values)) - ex.bellman_operator(mdp, m, vbar))
    )(mus))

    # Eq 4 with b = Vbar equals Eq 8 (pointwise on every reachable cell).
    g = ex.transition_grid(mdp, pi, mu, vbar)
    y4 = ct.vccc_target(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos, g.values)
    y8 = ct.vccc_target(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos)
    rho = safe_ratios(g.log_rhos)
    y8_manual = g.values + rho * (g.rewards + g.discounts * g.next_values - g.values)
    reach = g.prob > 0
    errs["eq4_is_eq8"] = jnp.max(jnp.where(reach, jnp.abs(y4 - y8) + jnp.abs(y8 - y8_manual), 0.0))

    return errs


def eq9_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi, mus, vbar = p.mdp, p.pi, p.mus, p.vbar
    dtype = vbar.dtype
    v_pi, v_mus = pre.v_pi, pre.v_mus
    errs = {}

    # Eq 9: b* minimises Var(Y_b) (against a grid) and is orthogonal: E[(rho-1) Y_b*] = 0.
    offsets = jnp.asarray([-5.0, -2.0, -1.0, -0.5, -0.1, -1e-2, -1e-3, 1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 5.0], dtype)

    def eq9(m, v_m):
        gm = ex.transition_grid(mdp, pi, m, vbar)
        b_star = ex.optimal_baseline(mdp, pi, m, vbar)
        var_of = lambda b: ex.target_moments(mdp, m, ct.vccc_target(
            gm.rewards, gm.discounts, gm.values, gm.next_values, gm.log_rhos, gm.state(b)))[1]
        grid = jnp.concatenate([b_star[None] + offsets[:, None], p.baselines, jnp.stack([v_m, v_pi, vbar])])
        v_star = var_of(b_star)
        v_grid = jax.vmap(var_of)(grid)
        excess = jnp.max(jnp.maximum(v_star - jnp.min(v_grid, axis=0), 0.0))
        y_star = ct.vccc_target(gm.rewards, gm.discounts, gm.values, gm.next_values, gm.log_rhos, gm.state(b_star))
        rho_m = safe_ratios(gm.log_rhos)
        orth = maxabs(jnp.sum(gm.prob * jnp.where(gm.prob > 0, (rho_m - 1.0) * y_star, 0.0), axis=(1, 2)))
        closed = maxabs(ex.baseline_variance(mdp, pi, m, vbar, grid) - v_grid)
        return excess, orth, closed

    excess, orth, closed = jax.vmap(eq9)(mus, v_mus)
    errs["eq9_minimises"] = jnp.max(excess)
    errs["eq9_orthogonal"] = jnp.max(orth)
    errs["eq9_closed_form_var"] = jnp.max(closed)

    return errs

