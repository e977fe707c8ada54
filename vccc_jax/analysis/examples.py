"""Exact small examples of the write-up, in NumPy (no JAX): the Sec 4.1 bandit, the Eq 3
Bellman covariance per state, and V-trace's multi-step trade-offs (Eq 11).

Each ``*_example`` returns a JSON-able dict; ``runs.examples`` stores them under
``results/examples/`` and the notebooks plot them. Everything is computed by enumeration
(no sampling) except the Monte-Carlo column of the covariance example.
"""

from __future__ import annotations

import itertools

import numpy as np

# ------------------------------------------------------------------ Sec 4.1 bandit


def _corrected(h, rho, b):
    """Eq 4 with a state baseline: Y_b = H + (rho - 1)(H - b)."""
    return h + (rho - 1.0) * (h - b)


def bandit_example(mu1: float = 0.1, pi1: float = 0.7, rewards=(0.0, 1.0),
                   num_curve: int = 121) -> dict:
    """The two-action bandit of Sec 4.1: per baseline b, the targets Y_b(a), their mean
    under mu and variance; b* from Eq 9; and Var_mu(Y_b) as a function of b (a parabola
    with minimum at b*). Also the uncorrected target H (mean V^mu, biased)."""
    mu = np.array([1.0 - mu1, mu1])
    pi = np.array([1.0 - pi1, pi1])
    r = np.asarray(rewards, np.float64)
    rho = pi / mu
    v_mu, v_pi = float(mu @ r), float(pi @ r)
    b_star = float(mu @ ((rho - 1) * rho * r) / (mu @ (rho - 1) ** 2))  # Eq 9

    def row(name, b):
        y = r if b is None else _corrected(r, rho, b)
        m = float(mu @ y)
        return {"baseline": name, "b": None if b is None else float(b), "y_a0": float(y[0]),
                "y_a1": float(y[1]), "mean": m, "var": float(mu @ (y - m) ** 2)}

    table = [row("uncorrected H (no correction)", None), row(r"stale value $b = V^\mu$", v_mu),
             row(r"target value $b = V^\pi$", v_pi), row(r"variance-minimising $b^*$ (Eq 9)", b_star)]
    bs = np.linspace(min(-0.5, b_star - 1.5), max(2.0, b_star + 1.0), num_curve)
    ys = _corrected(r[None], rho[None], bs[:, None])
    var = ((ys - v_pi) ** 2) @ mu
    return {"mu": mu.tolist(), "pi": pi.tolist(), "rewards": r.tolist(), "rho": rho.tolist(),
            "v_mu": v_mu, "v_pi": v_pi, "b_star": b_star, "table": table,
            "curve": {"b": bs.tolist(), "var": var.tolist()}}


# ------------------------------------------------------------------ random tabular MDPs


def random_mdp(rng, num_states: int, num_actions: int, gamma: float):
    """Dirichlet(1) transitions [S, A, S], N(0, 1) rewards [S, A]."""
    p = rng.dirichlet(np.ones(num_states), size=(num_states, num_actions))
    r = rng.normal(size=(num_states, num_actions))
    return p, r, gamma


def softmax(x, axis=-1):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def policy_value(p, r, gamma, pol) -> np.ndarray:
    """V^pol = (I - gamma P_pol)^-1 r_pol."""
    s = p.shape[0]
    p_pol = np.einsum("sa,sat->st", pol, p)
    return np.linalg.solve(np.eye(s) - gamma * p_pol, (pol * r).sum(-1))


def stationary(p, pol) -> np.ndarray:
    p_pol = np.einsum("sa,sat->st", pol, p)
    w, v = np.linalg.eig(p_pol.T)
    d = np.real(v[:, np.argmin(np.abs(w - 1))])
    return d / d.sum()


# ------------------------------------------------------------------ Eq 3


def covariance_example(num_mdps: int = 4, num_states: int = 6, num_actions: int = 3,
                       gamma: float = 0.9, shifts=(0.5, 1.5), num_samples: int = 400,
                       seed: int = 0) -> dict:
    """Eq 3 per state: T_pi V(s) - T_mu V(s) (operator difference) against
    Cov_mu(rho, H_V | s) (covariance over the joint law of (a, s') under mu), for random
    MDPs, a random frozen critic V and target policies ``shift`` logit-noise away from mu.
    Also a Monte-Carlo estimate of the covariance from ``num_samples`` transitions per state
    (sample covariance and its standard error). Rows: one per (mdp, shift, state)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(num_mdps):
        p, r, g = random_mdp(rng, num_states, num_actions, gamma)
        logits = rng.normal(size=(num_states, num_actions))
        mu = softmax(logits)
        v = rng.normal(size=num_states) * 2.0
        h = r[:, :, None] + g * v[None, None, :]  # H(s, a, s')
        for shift in shifts:
            pi = softmax(logits + shift * rng.normal(size=logits.shape))
            rho = pi / mu
            t_pi = np.einsum("sa,sat,sat->s", pi, p, h)
            t_mu = np.einsum("sa,sat,sat->s", mu, p, h)
            joint = mu[:, :, None] * p                                      # [S, A, S']
            e_rho_h = np.einsum("sat,sa,sat->s", joint, rho, h)
            e_rho = np.einsum("sat,sa->s", joint, rho)
            e_h = np.einsum("sat,sat->s", joint, h)
            cov = e_rho_h - e_rho * e_h
            for s in range(num_states):
                flat = joint[s].ravel()
                idx = rng.choice(flat.size, size=num_samples, p=flat / flat.sum())
                a, s2 = np.divmod(idx, num_states)
                x, y = rho[s, a], h[s, a, s2]
                prod = (x - x.mean()) * (y - y.mean())
                rows.append({"mdp": k, "shift": float(shift), "state": s,
                             "diff": float(t_pi[s] - t_mu[s]), "cov_exact": float(cov[s]),
                             "cov_mc": float(prod.sum() / (num_samples - 1)),
                             "cov_mc_se": float(prod.std(ddof=1) / np.sqrt(num_samples)),
                             "kl": float(np.sum(pi[s] * np.log(pi[s] / mu[s])))})
    return {"num_samples": num_samples, "gamma": gamma, "num_states": num_states,
            "num_actions": num_actions, "rows": rows}


# ------------------------------------------------------------------ V-trace (Eq 11)


def _paths(num_states: int, num_actions: int, n: int):
    """All (a_0, s_1, ..., a_{n-1}, s_n) index tuples as [P, n] arrays."""
    combos = np.array(list(itertools.product(range(num_actions * num_states), repeat=n)))
    return combos // num_states, combos % num_states


def vtrace_target_moments(p, r, gamma, pi, mu, v, n, rho_bar, c_bar, lam):
    """Exact mean and variance of the n-step V-trace target v_s (Eq 11, min(rho_bar, rho)
    per-step correction, lam * min(c_bar, rho) traces, bootstrap V(s_n)) from every start
    state, by enumerating all action / next-state paths under mu. Returns ([S], [S])."""
    S, A = r.shape
    acts, nxt = _paths(S, A, n)                                   # [P, n]
    rho = pi / mu
    means, vars_ = np.zeros(S), np.zeros(S)
    for s0 in range(S):
        states = np.concatenate([np.full((acts.shape[0], 1), s0), nxt], axis=1)  # [P, n+1]
        prob = np.ones(acts.shape[0])
        target = v[s0] * np.ones(acts.shape[0])
        trace = np.ones(acts.shape[0])
        for t in range(n):
            s, a, s2 = states[:, t], acts[:, t], states[:, t + 1]
            prob *= mu[s, a] * p[s, a, s2]
            delta = r[s, a] + gamma * v[s2] - v[s]
            target += gamma ** t * trace * np.minimum(rho_bar, rho[s, a]) * delta
            trace = trace * lam * np.minimum(c_bar, rho[s, a])
        m = prob @ target
        means[s0], vars_[s0] = m, prob @ (target - m) ** 2
    return means, vars_


def vtrace_fixed_point(p, r, gamma, pi, mu, n, rho_bar, c_bar, lam):
    """Fixed point of the expected V-trace operator (affine in V: solved exactly) and the
    operator's max-norm contraction factor ||M||_inf."""
    S = r.shape[0]
    b, _ = vtrace_target_moments(p, r, gamma, pi, mu, np.zeros(S), n, rho_bar, c_bar, lam)
    m = np.stack([vtrace_target_moments(p, r, gamma, pi, mu, e, n, rho_bar, c_bar, lam)[0] - b
                  for e in np.eye(S)], axis=1)
    v_star = np.linalg.solve(np.eye(S) - m, b)
    return v_star, float(np.abs(m).sum(1).max())


def clipped_policy(pi, mu, rho_bar):
    """pi_rho_bar(a|s) proportional to min(rho_bar mu, pi): V-trace's fixed-point policy."""
    w = np.minimum(rho_bar * mu, pi)
    return w / w.sum(-1, keepdims=True)


def vtrace_example(num_states: int = 4, num_actions: int = 2, gamma: float = 0.9,
                   shift: float = 3.0, ns=(1, 2, 3), lams=(0.0, 0.5, 0.9, 1.0),
                   rho_bars=(0.5, 1.0, 2.0, 4.0, np.inf), c_bars=(0.5, 1.0, 2.0, np.inf),
                   seed: int = 5) -> dict:
    """V-trace trade-offs on one random MDP with one behaviour mu and target pi: for every
    (n, lambda, rho_bar, c_bar) the exact fixed point's RMS bias to V^pi (mu-stationary
    weights), the exact target variance at that fixed point, and the contraction factor.
    The fixed point depends on rho_bar only (V^{pi_rho_bar}); c_bar, lambda and n move
    variance and contraction. Rows: one per setting (inf written as None)."""
    rng = np.random.default_rng(seed)
    p, r, g = random_mdp(rng, num_states, num_actions, gamma)
    logits = rng.normal(size=(num_states, num_actions))
    mu = softmax(logits)
    pi = softmax(logits + shift * rng.normal(size=logits.shape))
    v_pi = policy_value(p, r, g, pi)
    d = stationary(p, mu)
    rows = []
    for n, lam, rb, cb in itertools.product(ns, lams, rho_bars, c_bars):
        v_star, contraction = vtrace_fixed_point(p, r, g, pi, mu, n, rb, cb, lam)
        _, var = vtrace_target_moments(p, r, g, pi, mu, v_star, n, rb, cb, lam)
        closed = policy_value(p, r, g, clipped_policy(pi, mu, rb))
        rows.append({"n": n, "lam": lam, "rho_bar": None if np.isinf(rb) else rb,
                     "c_bar": None if np.isinf(cb) else cb,
                     "bias_rms": float(np.sqrt(d @ (v_star - v_pi) ** 2)),
                     "target_var": float(d @ var), "contraction": contraction,
                     "closed_form_err": float(np.abs(v_star - closed).max())})
    rho = pi / mu
    return {"num_states": num_states, "num_actions": num_actions, "gamma": gamma,
            "max_rho": float(rho.max()), "mean_rho_sq": float(d @ (mu * rho ** 2).sum(-1)),
            "rows": rows}
