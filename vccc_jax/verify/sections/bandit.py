"""The two-action bandit of Sec 4.1, reproduced exactly with the library's targets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular import mdp as mdplib
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row


def _bandit_numbers() -> dict:
    mdp = mdplib.bandit_mdp()
    mu = jnp.asarray([[0.9, 0.1], [0.5, 0.5]])
    pi = jnp.asarray([[0.3, 0.7], [0.5, 0.5]])
    vbar = jnp.zeros(2)
    g = ex.transition_grid(mdp, pi, mu, vbar)
    b_star = ex.optimal_baseline(mdp, pi, mu, vbar)[0]

    def target(b):
        y = ct.vccc_target(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos,
                           g.state(jnp.stack([b, jnp.zeros_like(b)])))
        mean, var = ex.target_moments(mdp, mu, y)
        return jnp.concatenate([y[0, :, 1], mean[:1], var[:1]])

    return dict(
        v_mu=ex.policy_value(mdp, mu)[0], v_pi=ex.policy_value(mdp, pi)[0], rho=ex.ratio_table(pi, mu)[0],
        h_mean=ex.target_moments(mdp, mu, ct.uncorrected_target(g.rewards, g.discounts, g.next_values))[0][0],
        b_star=b_star, y=jax.vmap(target)(jnp.stack([jnp.asarray(0.1), jnp.asarray(0.7), b_star])),
    )


_BANDIT = fast_jit(_bandit_numbers)


def bandit_rows(ctx=None) -> list[Row]:
    """The two-action bandit of Sec 4.1, reproduced exactly with the library's targets:
    r(a0) = 0, r(a1) = 1, mu(a1) = 0.1, pi(a1) = 0.7."""
    with jax.enable_x64(True):
        n = jax.tree_util.tree_map(np.asarray, _BANDIT())
    rows = []

    def row(name, got, want, detail):
        err = float(np.max(np.abs(np.asarray(got, float) - np.asarray(want, float))))
        rows.append(Row(name, "Sec 4.1", "exact", 1, err, EXACT_TOL, err <= EXACT_TOL, detail))

    rho = n["rho"]
    row("bandit: V^mu, V^pi, rho, uncorrected mean", [n["v_mu"], n["v_pi"], *rho, n["h_mean"]],
        [0.1, 0.7, 1 / 3, 7.0, 0.1],
        f"V^mu={n['v_mu']:.4f} V^pi={n['v_pi']:.4f} rho=({rho[0]:.4f}, {rho[1]:.4f}) "
        f"uncorrected -> {n['h_mean']:.4f}")
    row("bandit: b* of Eq 9", [n["b_star"]], [1.05], f"b*={n['b_star']:.4f}")
    for y, (label, y_want, var_want) in zip(
        n["y"], (("b=0.1", (1 / 15, 6.4), 3.61), ("b=0.7", (7 / 15, 2.8), 0.49), ("b=b*", (0.7, 0.7), 0.0))
    ):
        row(f"bandit: {label} -> Y(a0), Y(a1), mean, Var", y, [*y_want, 0.7, var_want],
            f"Y=({y[0]:.4f}, {y[1]:.4f}) mean={y[2]:.4f} Var={y[3]:.4f}")
    return rows
