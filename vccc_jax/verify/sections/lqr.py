"""Continuous actions with exact truth (issue 31): the library's critic targets and actor loss on
the linear-quadratic testbed (``tabular.lqr``, ``tabular.lqr_offpolicy``), float64.

Exact side (closed forms): T_pi Vbar, T_mu Vbar, V^pi by the Lyapunov equation, Var_mu[Y|s]
of the VCCC target (a tilted Gaussian), the clipped targets' Z, expected target and fixed
point V^{pitilde} (1-d action, pi and mu sharing the gain: truncated normal moments), and
grad J (jax.grad through the Lyapunov solve). Library side: the library's target functions
and ``actor.policy_loss`` integrated on a quadrature grid (Gauss-Legendre between the clip's
kinks in the action, Gauss-Hermite in the dynamics noise) -- quadrature, converged to about
1e-13 here, hence the shared exact tolerance. Two problems: a hand-written one and a random
one from ``ctx.key`` (fold_in 23). The library functions are looked up when the section runs,
so a patched library is what gets checked.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import actor
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import lqr as lq
from vccc_jax.tabular import lqr_offpolicy as lo
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, exact_row, pair_row, worst

CLIP = 1.3
STATES = np.array([[0.5, -1.0], [1.0, 0.3], [0.0, 0.0], [-0.7, 0.4]])


def problems(key) -> list[tuple]:
    """(lqr, pi, mu, vbar) for a hand-written problem and a random one (2-d state, 1-d action)."""
    f = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    hand = (lq.LQR(a=f([[0.9, 0.2], [0.0, 0.7]]), b=f([[0.0], [0.5]]), w=f([[0.05, 0.01], [0.01, 0.08]]),
                   q=f([[1.0, 0.0], [0.0, 0.5]]), r=f([[0.3]]), gamma=f(0.9), s0_mean=f([0.5, -0.3]),
                   s0_cov=0.2 * jnp.eye(2)),
            lq.GaussianPolicy(f([[-0.4, -0.6]]), f([0.2]), f([np.log(0.5)])),
            lq.GaussianPolicy(f([[-0.2, -0.3]]), f([-0.3]), f([np.log(0.6)])),
            lq.Quadratic(f([[-2.0, 0.3], [0.3, -1.0]]), f([0.2, -0.1]), f(-1.5)))
    ks = jax.random.split(key, 7)
    rand_lqr = lq.random_lqr(ks[0], 2, 1, gamma=0.9)
    pol = lambda k1, k2, std: lq.GaussianPolicy(0.2 * jax.random.normal(k1, (1, 2)),  # noqa: E731
                                                 0.3 * jax.random.normal(k2, (1,)), f([np.log(std)]))
    vb = jax.random.normal(ks[5], (2, 2))
    rand = (rand_lqr, pol(ks[1], ks[2], 0.5), pol(ks[3], ks[4], 0.6),
            lq.Quadratic(-(vb @ vb.T) - 0.1 * jnp.eye(2), 0.3 * jax.random.normal(ks[6], (2,)), f(-1.0)))
    return [hand, rand]


def _coef_err(a: lq.Quadratic, b: lq.Quadratic) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(a, b))


def lqr_numbers(key) -> dict:
    """Every (library, closed form) pair of the section, as lists over the problems."""
    vccc, clipped, unc, loss = ct.vccc_target, ct.clipped_target, ct.uncorrected_target, actor.policy_loss
    out = {k: [] for k in ("lyap", "mean", "var", "stale", "stale_gap", "clip_mean", "clip_fp",
                           "fp_bias", "actor", "grad")}
    s = jnp.asarray(STATES)
    for lqr, pi, mu, vbar in problems(key):
        lq.check(lqr, pi, mu)
        v_pi = lq.value(lqr, pi)
        out["lyap"].append(_coef_err(v_pi, lq.bellman(lqr, pi, v_pi)))
        g = lo.transition_grid(lqr, pi, mu, vbar, STATES)
        y = vccc(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos)
        mean, var = lo.grid_moments(g, y)
        out["mean"].append((mean, lq.bellman(lqr, pi, vbar)(s)))
        out["var"].append((var, lo.vccc_variance(lqr, pi, mu, vbar, s)))
        t_mu = lq.bellman(lqr, mu, vbar)(s)
        out["stale"].append((lo.grid_moments(g, unc(g.rewards, g.discounts, g.next_values))[0], t_mu))
        out["stale_gap"].append(float(jnp.max(jnp.abs(t_mu - lq.bellman(lqr, pi, vbar)(s)))))
        shared = mu._replace(gain=pi.gain)
        gc = lo.transition_grid(lqr, pi, shared, vbar, STATES, clips=(CLIP,))
        for kind in ("truncate", "mask"):
            yc = clipped(gc.rewards, gc.discounts, gc.values, gc.next_values, gc.log_rhos, clip=CLIP, kind=kind)
            out["clip_mean"].append((lo.grid_moments(gc, yc)[0],
                                     lo.clipped_expected_target(lqr, pi, shared, vbar, CLIP, kind)(s)))
            fp = lo.clipped_fixed_point(lqr, pi, shared, CLIP, kind)
            gf = lo.transition_grid(lqr, pi, shared, fp, STATES, clips=(CLIP,))
            yf = clipped(gf.rewards, gf.discounts, gf.values, gf.next_values, gf.log_rhos, clip=CLIP, kind=kind)
            out["clip_fp"].append((lo.grid_moments(gf, yf)[0], fp(s)))
            out["fp_bias"].append(float(jnp.max(jnp.abs(fp(s) - v_pi(s)))))
        upd = lo.expected_actor_update(lqr, pi, mu, jax.jit(loss, static_argnames=("kind",)))
        grad = jax.grad(lq.objective, argnums=1)(lqr, pi)
        scale = 1.0 + max(float(jnp.max(jnp.abs(x))) for x in grad)
        out["actor"].append(worst(*(jnp.abs(a - b) for a, b in zip(upd, grad))) / scale)
        out["grad"].append(scale - 1.0)
    return out


def _pairs_err(pairs, relative=False) -> float:
    errs = []
    for got, want in pairs:
        got, want = np.asarray(got, float), np.asarray(want, float)
        d = np.abs(got - want)
        errs.append(np.max(d / (1.0 + np.abs(want)) if relative else d))
    return worst(*errs)


def lqr_rows(ctx) -> list[Row]:
    """The LQR rows of ``vccc verify`` (exact, float64)."""
    with jax.enable_x64(True):
        n = lqr_numbers(jax.random.fold_in(ctx.key, 23))
    k = len(n["lyap"])
    rows = [
        exact_row("lqr: V^pi (Lyapunov) = T_pi V^pi", "Sec 6", k, worst(n["lyap"]), EXACT_TOL,
                  "Gaussian policy, quadratic V^pi by a Kronecker Lyapunov solve"),
        exact_row("lqr: E_mu[Y_VCCC|s] = T_pi Vbar(s)", "Eq 8", k, _pairs_err(n["mean"]), EXACT_TOL,
                  "library target on the quadrature grid vs the closed-form backup"),
        exact_row("lqr: Var_mu[Y_VCCC|s] (tilted Gaussian)", "Eq 8", k, _pairs_err(n["var"], True),
                  EXACT_TOL, "relative; closed form needs 2/v_pi > 1/v_mu, else infinite"),
        pair_row("lqr: E_mu[H|s] = T_mu Vbar (stale)", "Eq 4", k,
                 *map(np.concatenate, zip(*[(np.asarray(a), np.asarray(b)) for a, b in n["stale"]])),
                 EXACT_TOL, f"|T_mu - T_pi| up to {max(n['stale_gap']):.3g}"),
        exact_row(f"lqr: E_mu[Y_clipped|s] (c={CLIP}, truncate+mask)", "Eq 10", k,
                  _pairs_err(n["clip_mean"]), EXACT_TOL,
                  "= Vbar + Z (T_pitilde Vbar - Vbar); shared gain, 1-d action (erf closed form)"),
        exact_row("lqr: clipped fixed point V^pitilde", "Eq 10", k, _pairs_err(n["clip_fp"]), EXACT_TOL,
                  f"E[Y|s] = Vbar(s) at Vbar = V^pitilde; |V^pitilde - V^pi| up to {max(n['fp_bias']):.3g}"),
        exact_row("lqr: IS actor update = grad J", "Eq 12", k, worst(n["actor"]), EXACT_TOL,
                  f"policy_loss on the grid vs jax.grad of J (relative; |grad| up to {max(n['grad']):.3g})"),
    ]
    return rows


# ------------------------------------------------------------- a user's target (--target)

class _Cells(NamedTuple):
    """The fields a ``contracts.OneStepTarget`` reads, on the LQR grid ([N, G] each)."""

    rewards: jax.Array
    discounts: jax.Array
    values: jax.Array
    next_values: jax.Array
    log_rhos: jax.Array
    baseline: jax.Array
    baseline_vmu: jax.Array
    baseline_star: jax.Array
    z_truncate: jax.Array
    z_mask: jax.Array


def lqr_user_rows(name: str, target, claim) -> list[Row]:
    """``vccc verify --target`` on continuous actions: E_mu[Y | s] of a one-step target
    (``contracts.OneStepTarget``) on the LQR grid against its claim -- ``vpi``: T_pi Vbar
    (general gains); ``clipped:c`` / ``masked:c``: Vbar + Z (T_pitilde Vbar - Vbar) (pi and mu
    sharing the gain, where it is exact). Baseline fields are Vbar (b* is not known in closed
    form here). No row for ``any``."""
    if claim.name not in ("vpi", "clipped", "masked"):
        return []
    errs = []
    with jax.enable_x64(True):
        s = jnp.asarray(STATES)
        for lqr, pi, mu, vbar in problems(jax.random.PRNGKey(22)):
            if claim.name == "vpi":
                g = lo.transition_grid(lqr, pi, mu, vbar, STATES)
                want, zt, zm = lq.bellman(lqr, pi, vbar)(s), 1.0, 1.0
            else:
                mu = mu._replace(gain=pi.gain)
                g = lo.transition_grid(lqr, pi, mu, vbar, STATES, clips=(claim.c,))
                want = lo.clipped_expected_target(lqr, pi, mu, vbar, claim.c, claim.weight_kind)(s)
                zt = lo.clipped_noise_law(pi, mu, claim.c, "truncate").z
                zm = lo.clipped_noise_law(pi, mu, claim.c, "mask").z
            full = lambda x: jnp.full(g.values.shape, x, g.values.dtype)  # noqa: E731
            cells = _Cells(g.rewards, g.discounts, g.values, g.next_values, g.log_rhos, g.values,
                           g.values, g.values, full(zt), full(zm))
            mean = lo.grid_moments(g, jnp.asarray(target(cells), g.values.dtype))[0]
            errs.append(float(jnp.max(jnp.abs(mean - want))))
    claimed = "T_pi Vbar" if claim.name == "vpi" else "Vbar + Z (T_pit Vbar - Vbar)"
    return [exact_row(f"{name}: LQR E_mu[Y|s] = {claimed} (continuous actions)", "user", len(errs),
                      max(errs), EXACT_TOL, "Gaussian pi, mu; quadrature grid, float64")]
