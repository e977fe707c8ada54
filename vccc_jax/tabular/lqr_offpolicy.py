"""Off-policy truth on the LQR testbed (issue 31): the critic targets' conditional moments and
fixed points, and the actor's expected update, for a behaviour mu and a target pi that are
both linear-Gaussian (``tabular.lqr``).

Which numbers are closed forms and which are quadrature:

* EXACT (closed form): T_pi Vbar and so E_mu[Y | s] of the VCCC / IW-TD target (Eq 8; the
  ratio of two Gaussians integrates every polynomial in a, E_mu[rho g] = E_pi[g]);
  Var_mu[Y | s] of that target (:func:`vccc_variance`: rho^2 mu is an unnormalised Gaussian
  when 2 Sigma_pi^-1 - Sigma_mu^-1 is positive definite -- else the variance is infinite, the
  heavy-tailed case -- and the remaining degree-4 polynomial is integrated by Gauss-Hermite
  of order 3, exact for degree <= 5); the clipped targets' Z, expected update and fixed point
  (Eq 10) for a 1-d action when pi and mu share the gain K (:func:`clipped_noise_law`): the
  ratio is then a function of the innovation e = a - K s alone, so the tilted law
  pitilde = mu w / Z is a state-independent noise law whose first two moments (truncated
  normal moments, erf) fix V^{pitilde} exactly (it is quadratic: :func:`clipped_fixed_point`).
* QUADRATURE: :func:`transition_grid`, the grid on which a *given* target function (the
  library's, or a user's) is integrated -- the 1-d action by Gauss-Legendre on the pieces
  between the kinks of the clip (``rho = c``, ``rho = 1/c``) over +-L standard deviations
  (converges spectrally; the verify rows report the error against the closed forms above),
  the dynamics noise by Gauss-Hermite of order 3 per dimension (exact for targets that are
  polynomials of degree <= 5 in the noise, which all one-step targets are).
* When the gains differ, the clipped fixed point is not quadratic; only per-state conditional
  means (by the grid) are available.

The actor: :func:`expected_actor_update` integrates the library's IS policy-gradient loss on
the grid (action and noise) and over the discounted state law (Gauss-Hermite under a Gaussian
with the law's two moments: exact, the per-state update being a polynomial of degree <= 2 in
s), to compare with jax.grad of :func:`lqr.objective` (the policy-gradient theorem).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from vccc_jax.tabular import lqr as lq

Array = jax.Array


# ----------------------------------------------------------------------------- exact moments

@jax.jit
def log_ratio(pi: lq.GaussianPolicy, mu: lq.GaussianPolicy, s: Array, a: Array) -> Array:
    """log pi(a|s) - log mu(a|s), [...] for s [..., n], a [..., m]."""
    return lq.distribution(pi, s).log_prob(a) - lq.distribution(mu, s).log_prob(a)


def _gh(order: int, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss-Hermite rule for N(0, I_dims): nodes [G, dims], weights [G] (sum 1)."""
    x, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / w.sum()
    grids = np.meshgrid(*([x] * dims), indexing="ij")
    wts = np.meshgrid(*([w] * dims), indexing="ij")
    return (np.stack([g.reshape(-1) for g in grids], -1),
            np.prod(np.stack([g.reshape(-1) for g in wts], -1), -1))


@jax.jit
def noise_variance(lqr: lq.LQR, vbar: lq.Quadratic, x: Array) -> Array:
    """Var_w[Vbar(x + w)], w ~ N(0, W): (2Px + p)'W(2Px + p) + 2 tr(PWPW), [...]."""
    g = 2.0 * x @ vbar.mat
    g = g + lq.lead(vbar.vec, g)
    pw = vbar.mat @ lqr.w
    return jnp.einsum("...i,ij,...j->...", g, lqr.w, g) + 2.0 * jnp.trace(pw @ pw)


@jax.jit
def vccc_variance(lqr: lq.LQR, pi: lq.GaussianPolicy, mu: lq.GaussianPolicy, vbar: lq.Quadratic,
                  s: Array) -> Array:
    """Var_mu[Y | s] of the VCCC / IW-TD target Y = Vbar(s) + rho (r + gamma Vbar(s') - Vbar(s))
    at states s [N, n] (exact; +inf where 2/var_pi - 1/var_mu <= 0 in some action dim).

    E_mu[rho^2 g(a)] = E_mu[rho^2] E_{N(mt, 1/lam)}[g] with lam = 2/v_pi - 1/v_mu,
    mt = (2 m_pi / v_pi - m_mu / v_mu) / lam, and
    E_mu[rho^2] = prod sqrt(v_mu) / (v_pi sqrt(lam)) * exp(sum h^2 / (2 lam) - m_pi^2 / v_pi
    + m_mu^2 / (2 v_mu)), h = lam mt; g = E_w[(H - Vbar(s))^2] = (Qbar - Vbar)^2 +
    gamma^2 Var_w[Vbar(s')], a polynomial of degree 4 in a (Gauss-Hermite order 3: exact).
    """
    mp, mm = lq.mean_action(pi, s), lq.mean_action(mu, s)             # [N, m]
    vp, vm = jnp.exp(2.0 * pi.log_std)[None], jnp.exp(2.0 * mu.log_std)[None]
    lam = 2.0 / vp - 1.0 / vm                                         # [1, m]
    finite = jnp.all(lam > 0)
    lam = jnp.where(lam > 0, lam, 1.0)
    h = 2.0 * mp / vp - mm / vm
    log_e_rho2 = jnp.sum(0.5 * jnp.log(vm) - jnp.log(vp) - 0.5 * jnp.log(lam)
                         + 0.5 * h ** 2 / lam - mp ** 2 / vp + 0.5 * mm ** 2 / vm, axis=-1)
    qbar = lq.action_value(lqr, vbar)
    nodes, wts = _gh(3, lqr.m)
    a = (h / lam)[:, None, :] + jnp.asarray(nodes)[None] / jnp.sqrt(lam)[None]
    ss = jnp.broadcast_to(s[:, None, :], a.shape[:2] + s.shape[-1:])
    d = qbar(jnp.concatenate([ss, a], -1)) - vbar(ss)
    x = ss @ lqr.a.T + a @ lqr.b.T
    g = d ** 2 + lqr.gamma ** 2 * noise_variance(lqr, vbar, x)
    second = jnp.exp(log_e_rho2) * (g @ jnp.asarray(wts))
    mean_delta = lq.bellman(lqr, pi, vbar)(s) - vbar(s)
    return jnp.where(finite, second - mean_delta ** 2, jnp.inf)


# -------------------------------------------------- clipped targets (1-d action, shared gain)

class NoiseLaw(NamedTuple):
    """The tilted innovation law pitilde = mu w / Z of a clipped weight w: Z = E_mu[w] and the
    mean / variance of e = a - K s under pitilde (floats)."""

    z: float
    mean: float
    var: float


def _region(q2: float, q1: float, q0: float) -> list[tuple[float, float]]:
    """{e : q2 e^2 + q1 e + q0 >= 0} as a list of intervals (up to measure zero)."""
    inf = np.inf
    if abs(q2) < 1e-300:
        if abs(q1) < 1e-300:
            return [(-inf, inf)] if q0 >= 0 else []
        r = -q0 / q1
        return [(r, inf)] if q1 > 0 else [(-inf, r)]
    disc = q1 * q1 - 4.0 * q2 * q0
    if disc <= 0:
        return [(-inf, inf)] if q2 > 0 else []
    r1, r2 = sorted(((-q1 - np.sqrt(disc)) / (2 * q2), (-q1 + np.sqrt(disc)) / (2 * q2)))
    return [(-inf, r1), (r2, inf)] if q2 > 0 else [(r1, r2)]


def _normal_moments(mean: float, var: float, intervals) -> np.ndarray:
    """[E 1_I, E e 1_I, E e^2 1_I] for e ~ N(mean, var) over a union of disjoint intervals."""
    sd = np.sqrt(var)
    out = np.zeros(3)
    for lo, hi in intervals:
        al, be = (lo - mean) / sd, (hi - mean) / sd
        p = special.ndtr(be) - special.ndtr(al)
        phi = lambda x: 0.0 if np.isinf(x) else np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)  # noqa: E731
        xphi = lambda x: 0.0 if np.isinf(x) else x * phi(x)  # noqa: E731
        m1 = phi(al) - phi(be)
        m2 = p + xphi(al) - xphi(be)
        out += [p, mean * p + sd * m1, mean ** 2 * p + 2 * mean * sd * m1 + var * m2]
    return out


def _log_ratio_poly(pi, mu, log_level: float) -> tuple[float, float, float]:
    """Coefficients of log rho(e) - log_level as a quadratic in the innovation e (1-d)."""
    mp, mm = float(pi.offset[0]), float(mu.offset[0])
    vp, vm = float(np.exp(2 * pi.log_std[0])), float(np.exp(2 * mu.log_std[0]))
    return (0.5 / vm - 0.5 / vp, mp / vp - mm / vm,
            -0.5 * mp ** 2 / vp + 0.5 * mm ** 2 / vm - 0.5 * np.log(vp / vm) - log_level)


def _check_shared_gain(pi, mu) -> None:
    if np.shape(pi.offset) != (1,) or np.shape(mu.offset) != (1,):
        raise ValueError("clipped LQR truth: closed form only for a 1-d action")
    if not np.allclose(np.asarray(pi.gain), np.asarray(mu.gain), rtol=0, atol=0):
        raise ValueError("clipped LQR truth: closed form only when pi and mu share the gain K "
                         "(the ratio then depends on a - K s alone)")


def clipped_noise_law(pi: lq.GaussianPolicy, mu: lq.GaussianPolicy, clip: float,
                      kind: str = "truncate") -> NoiseLaw:
    """Z and the tilted innovation moments for w = min(rho, c) ("truncate") or
    w = rho 1[1/c <= rho <= c] ("mask"), exactly (truncated normal moments, 1-d, shared gain).

    truncate: E_mu[w g] = E_pi[g 1{rho < c}] + c E_mu[g 1{rho >= c}];
    mask:     E_mu[w g] = E_pi[g 1{rho >= 1/c}] - E_pi[g 1{rho > c}].
    """
    _check_shared_gain(pi, mu)
    if kind not in ("truncate", "mask") or not clip > 0:
        raise ValueError(f"clipped_noise_law: kind truncate|mask and clip > 0, got {kind!r}, {clip}")
    mp, mm = float(pi.offset[0]), float(mu.offset[0])
    vp, vm = float(np.exp(2 * pi.log_std[0])), float(np.exp(2 * mu.log_std[0]))
    above = _region(*_log_ratio_poly(pi, mu, np.log(clip)))
    if kind == "truncate":
        pm = _normal_moments(mp, vp, [(-np.inf, np.inf)]) - _normal_moments(mp, vp, above)
        mom = pm + clip * _normal_moments(mm, vm, above)
    else:
        mom = (_normal_moments(mp, vp, _region(*_log_ratio_poly(pi, mu, -np.log(clip))))
               - _normal_moments(mp, vp, above))
    z = float(mom[0])
    mean = float(mom[1] / z)
    return NoiseLaw(z=z, mean=mean, var=float(mom[2] / z - mean ** 2))


def clipped_fixed_point(lqr: lq.LQR, pi: lq.GaussianPolicy, mu: lq.GaussianPolicy, clip: float,
                        kind: str = "truncate") -> lq.Quadratic:
    """The fixed point V^{pitilde} of the clipped target (Eq 10), pitilde = mu w / Z: exact and
    quadratic (the value of the Gaussian policy with pitilde's innovation moments)."""
    law = clipped_noise_law(pi, mu, clip, kind)
    return lq.value(lqr, mu, mean_shift=jnp.asarray([law.mean]), cov=jnp.asarray([[law.var]]))


def clipped_expected_target(lqr: lq.LQR, pi: lq.GaussianPolicy, mu: lq.GaussianPolicy,
                            vbar: lq.Quadratic, clip: float, kind: str = "truncate") -> lq.Quadratic:
    """E_mu[Y | s] of the clipped target Y = Vbar + w (H - Vbar): Vbar + Z (T_pitilde Vbar - Vbar),
    a quadratic in s (exact, 1-d action, shared gain)."""
    law = clipped_noise_law(pi, mu, clip, kind)
    tv = lq.policy_expect(lq.action_value(lqr, vbar), mu, mean_shift=jnp.asarray([law.mean]),
                          cov=jnp.asarray([[law.var]]))
    return lq.Quadratic(*(v + law.z * (t - v) for v, t in zip(vbar, tv)))


# ------------------------------------------------------------------------ quadrature grid

class TransitionGrid(NamedTuple):
    """Per-node inputs of a one-step target at states [N]: each [N, G] (G quadrature nodes);
    ``prob`` the quadrature weights of the law a ~ mu(.|s), s' ~ P(.|s, a) (sum 1 per state).
    ``actions`` [N, G, m], ``next_states`` [N, G, n] for callers that need them."""

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    log_rhos: Array
    prob: Array
    actions: Array
    next_states: Array


def _action_rule(mm: float, sm: float, mp: float, sp: float, kinks, order: int, pieces: int):
    """Gauss-Legendre on ``pieces`` pieces of [-L, L] (mu standard units) split at ``kinks``
    (a values; the widest piece halved until there are ``pieces``, so every state has the
    same node count): nodes a [G], weights [G] of the N(mm, sm^2) law."""
    span = max(12.0, (abs(mp - mm) + 12.0 * sp) / sm)
    cuts = sorted({-span, span, *[(k - mm) / sm for k in kinks if abs((k - mm) / sm) < span]})
    while len(cuts) < pieces + 1:
        i = int(np.argmax(np.diff(cuts)))
        cuts.insert(i + 1, 0.5 * (cuts[i] + cuts[i + 1]))
    x, w = np.polynomial.legendre.leggauss(order)
    zs, ws = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        z = 0.5 * (hi - lo) * x + 0.5 * (hi + lo)
        zs.append(z)
        ws.append(0.5 * (hi - lo) * w * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi))
    z, wt = np.concatenate(zs), np.concatenate(ws)
    return mm + sm * z, wt


def transition_grid(lqr: lq.LQR, pi: lq.GaussianPolicy, mu: lq.GaussianPolicy, vbar: lq.Quadratic,
                    states, clips=(), order: int = 96, noise_order: int = 3) -> TransitionGrid:
    """Quadrature nodes for E_mu[f(transition) | s] at states [N, n] (1-d action; see module
    docstring). ``clips``: thresholds whose kinks (rho = c and rho = 1/c) split the action
    pieces, so clipped targets integrate to quadrature accuracy too."""
    if lqr.m != 1:
        raise ValueError(f"lqr transition_grid: 1-d actions only, got m = {lqr.m}")
    states = np.asarray(states, np.float64)
    pnp = [np.asarray(x, np.float64) for x in (pi.gain, pi.offset, pi.log_std)]
    mnp = [np.asarray(x, np.float64) for x in (mu.gain, mu.offset, mu.log_std)]
    acts, awts = [], []
    for s in states:
        mp, mm = float(pnp[0][0] @ s + pnp[1][0]), float(mnp[0][0] @ s + mnp[1][0])
        sp, sm = float(np.exp(pnp[2][0])), float(np.exp(mnp[2][0]))
        spi = lq.GaussianPolicy(np.zeros((1, 0)), np.asarray([mp]), np.asarray([np.log(sp)]))
        smu = lq.GaussianPolicy(np.zeros((1, 0)), np.asarray([mm]), np.asarray([np.log(sm)]))
        kinks = [e for c in clips for lvl in (np.log(c), -np.log(c))
                 for iv in _region(*_log_ratio_poly(spi, smu, lvl)) for e in iv if np.isfinite(e)]
        a, w = _action_rule(mm, sm, mp, sp, kinks, order, 2 + 4 * len(clips))
        acts.append(a)
        awts.append(w)
    acts, awts = np.stack(acts), np.stack(awts)                      # [N, Ga]
    xi, xw = _gh(noise_order, lqr.n)                                  # [Gw, n], [Gw]
    chol = np.linalg.cholesky(np.asarray(lqr.w, np.float64) + 1e-300 * np.eye(lqr.n))
    return _grid_eval(lqr, pi, mu, vbar, jnp.asarray(states), jnp.asarray(acts), jnp.asarray(awts),
                      jnp.asarray(xi @ chol.T), jnp.asarray(xw))


@jax.jit
def _grid_eval(lqr, pi, mu, vbar, states, acts, awts, noise, xw) -> TransitionGrid:
    """The grid's arrays from its nodes (one compiled graph per shape)."""
    s = states[:, None, None, :]
    a = acts[:, :, None, None]                                        # [N, Ga, 1, 1]
    s_next = (s @ lqr.a.T + a @ lqr.b.T + noise[None, None])          # [N, Ga, Gw, n]
    shape = s_next.shape[:3]
    s_b = jnp.broadcast_to(s, shape + (lqr.n,))
    a_b = jnp.broadcast_to(a, shape + (1,))
    flat = lambda x: x.reshape(shape[0], -1, *x.shape[3:])  # noqa: E731
    return TransitionGrid(
        rewards=flat(lq.reward(lqr, s_b, a_b)),
        discounts=jnp.full(shape[:1] + (shape[1] * shape[2],), lqr.gamma),
        values=flat(vbar(s_b)), next_values=flat(vbar(s_next)),
        log_rhos=flat(log_ratio(pi, mu, s_b, a_b)),
        prob=flat(awts[:, :, None] * xw[None, None, :]),
        actions=flat(a_b), next_states=flat(s_next))


def grid_moments(grid: TransitionGrid, y: Array) -> tuple[Array, Array]:
    """Quadrature E_mu[Y | s] and Var_mu[Y | s] of per-node values y [N, G] (two-pass)."""
    mean = jnp.sum(grid.prob * y, -1)
    return mean, jnp.sum(grid.prob * (y - mean[:, None]) ** 2, -1)


# -------------------------------------------------------------------------------- actor

def expected_actor_update(lqr: lq.LQR, pi: lq.GaussianPolicy, mu: lq.GaussianPolicy,
                          loss_fn: Callable[[Array, Array, Array], Array],
                          order: int = 96) -> lq.GaussianPolicy:
    """(1 / (1 - gamma)) E_{s ~ d_pi}[-grad E_mu[loss | s]] for a per-sample actor loss
    ``loss_fn(log_pi, log_mu, advantages) -> mean loss`` (e.g. ``estimators.actor.policy_loss``)
    fed the advantage Q^pi(s, a) - V^pi(s) on the grid: with exact ratios this is the true
    gradient of J (the policy-gradient theorem). States by Gauss-Hermite (order 3 per dim)
    under a Gaussian with d_pi's two moments (exact: the per-state update is quadratic in s).
    """
    mean, second = lq.discounted_state_moments(lqr, pi)
    cov = second - jnp.outer(mean, mean)
    xi, xw = _gh(3, lqr.n)
    states = np.asarray(mean)[None] + xi @ np.linalg.cholesky(np.asarray(cov)).T
    v_pi = lq.value(lqr, pi)
    q_pi = lq.action_value(lqr, v_pi)
    grid = transition_grid(lqr, pi, mu, v_pi, states, order=order, noise_order=1)
    s_b = jnp.broadcast_to(jnp.asarray(states)[:, None, :], grid.actions.shape[:2] + (lqr.n,))
    adv = q_pi(jnp.concatenate([s_b, grid.actions], -1)) - v_pi(s_b)
    log_mu = lq.distribution(mu, s_b).log_prob(grid.actions)
    weight = grid.prob * jnp.asarray(xw)[:, None]                     # sums to 1 over all nodes

    def total(p):
        log_pi = lq.distribution(p, s_b).log_prob(grid.actions)
        # loss_fn averages over its inputs; scaling by the node count makes it a weighted sum.
        return loss_fn(log_pi, log_mu, adv * weight * weight.size)

    g = jax.jit(jax.grad(total))(pi)
    return jax.tree_util.tree_map(lambda x: -x / (1.0 - lqr.gamma), g)
