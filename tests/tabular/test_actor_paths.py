"""Exact expected updates of the actor-correction rows on tabular MDPs (issue 21), against
NumPy references written here: a brute-force path enumeration (itertools) for the sequence
rows on a finite horizon with GAE(lambda) advantages, and the per-state formula of a
sign-dependent and a centred row on an infinite-horizon MDP. One compiled graph, float64."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import actor_paths as ap
from vccc_jax.tabular import exact, exact_actor
from vccc_jax.tabular.mdp import random_mdp, with_horizon

S, A, H, L, LAM = 2, 2, 3, 2, 0.5
SEQ = {"seq_tis": {"clip": 1.3}, "seq_mis": {"alpha": 0.5, "beta": 1.6},
       "gspo": {"eps_low": 0.05, "eps_high": 0.05}, "topr": {}}


def _problem():
    mdp = with_horizon(random_mdp(jax.random.PRNGKey(4), 1, S, A, gamma=0.8)[0], H)
    rng = np.random.default_rng(5)
    pi = jax.nn.softmax(jnp.asarray(rng.normal(size=(S, A))), -1)
    mus = jax.nn.softmax(jnp.asarray(rng.normal(size=(L, S, A))), -1)
    vw = jnp.asarray([0.3, 0.7])
    crit = jnp.asarray(rng.normal(size=(H + 1, S))).at[H].set(0.0)
    return mdp, pi, mus, vw, crit


@jax.jit
def _library(mdp, pi, mus, vw, crit):
    paths = ap.tabular_paths(mdp, pi, mus)
    adv = ap.path_advantages(paths, crit.reshape(-1), LAM)
    out = {n: ap.expected_update(paths, adv, vw, correction=n, params=p, num_ids=S, num_actions=A)
           for n, p in SEQ.items()}
    out["pi"] = ap.pi_update(paths, adv, num_ids=S, num_actions=A)
    out["occupancy"] = ap.occupancy(paths, vw, S)
    return out


def _numpy_enumeration(mdp, pi, mus, vw, crit):
    P, R, g, init = (np.asarray(x) for x in (mdp.P, mdp.R, mdp.gamma, mdp.init))
    term = np.asarray(mdp.terminal)
    pi, mus, vw, crit = (np.asarray(x) for x in (pi, mus, vw, crit))
    out = {n: np.zeros((S, A)) for n in SEQ}
    out["pi"], out["occupancy"] = np.zeros((S, A)), np.zeros(S)
    for s0 in range(S):
        for steps in itertools.product(range(A * S), repeat=H):
            s, alive, sa, deltas, discs, live = s0, term[s0] == 0, [], [], [], []
            p_pi, p_mu, log_r = init[s0], vw * init[s0], np.zeros(L)
            for t, d in enumerate(steps):
                a, s2 = d // S, d % S
                disc = g * (1 - term[s2]) if alive else 0.0
                delta = (R[s, a, s2] + disc * crit[t + 1, s2] - crit[t, s]) if alive else 0.0
                p_pi *= pi[s, a] * P[s, a, s2]
                p_mu = p_mu * mus[:, s, a] * P[s, a, s2]
                if alive:
                    log_r += np.log(pi[s, a]) - np.log(mus[:, s, a])
                sa.append((s, a)), deltas.append(delta), discs.append(disc), live.append(alive)
                alive = alive and term[s2] == 0
                s = s2
            adv, nxt = np.zeros(H), 0.0
            for t in reversed(range(H)):
                nxt = deltas[t] + LAM * discs[t] * nxt
                adv[t] = nxt
            n_act = sum(live)
            for t in range(H):
                if not live[t]:
                    continue
                (st, at), r = sa[t], np.exp(log_r)
                out["pi"][st, at] += p_pi * adv[t]
                out["occupancy"][st] += p_mu.sum()
                s_g = np.exp(log_r / n_act)
                keep = ~(((adv[t] > 0) & (s_g > 1.05)) | ((adv[t] < 0) & (s_g < 0.95)))
                ws = {"seq_tis": np.minimum(r, 1.3),
                      "seq_mis": np.where((r >= 0.5) & (r <= 1.6), r, 0.0),
                      "gspo": s_g * keep,
                      "topr": np.where(adv[t] >= 0, 1.0, np.minimum(r, 1.0))}
                for n, w in ws.items():
                    out[n][st, at] += np.sum(p_mu * w) * adv[t]
    return out


def test_sequence_rows_match_numpy_enumeration():
    with jax.enable_x64(True):
        prob = _problem()
        got = jax.device_get(_library(*prob))
    ref = _numpy_enumeration(*prob)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-10, atol=1e-12, err_msg=name)
    # the rows differ from each other and from pi's own update (the check is not vacuous)
    assert np.abs(ref["seq_tis"] - ref["pi"]).max() > 1e-3
    assert np.abs(ref["gspo"] - ref["topr"]).max() > 1e-3


def _numpy_per_state(mdp, pi, mus, d, post, v, name):
    P, R, g, term = (np.asarray(x) for x in (mdp.P, mdp.R, mdp.gamma, mdp.terminal))
    adv = R + g * (1 - term)[None, None] * v[None, None] - v[:, None, None]  # [S, A, S']
    u = np.eye(A)[None] - pi[:, None, :]  # softmax score [S, A, A]
    g_out = np.zeros((S, A))
    for l in range(mus.shape[0]):
        rho = pi / mus[l]
        for s in range(S):
            m_w = np.zeros(A)
            e_a = 0.0
            terms = np.zeros(A)
            for a in range(A):
                for s2 in range(S):
                    x = adv[s, a, s2]
                    if name == "ppo":
                        w = rho[s, a] * (not ((x > 0 and rho[s, a] > 1.2) or (x < 0 and rho[s, a] < 0.8)))
                    else:  # centred truncate, c = 1.1
                        w = min(rho[s, a], 1.1)
                    terms += mus[l, s, a] * P[s, a, s2] * w * x * u[s, a]
                    m_w += mus[l, s, a] * P[s, a, s2] * w * u[s, a]
                    e_a += mus[l, s, a] * P[s, a, s2] * x
            centred = terms - (e_a * m_w if name == "truncate" else 0.0)
            g_out[s] += d[s] * post[l, s] * centred
    return g_out


@pytest.mark.parametrize("name, params, centred", [("ppo", {"epsilon": 0.2}, False),
                                                   ("truncate", {"clip": 1.1}, True)])
def test_infinite_horizon_update_matches_numpy(name, params, centred):
    with jax.enable_x64(True):
        mdp = random_mdp(jax.random.PRNGKey(7), 1, S, A, gamma=0.8)[0]
        rng = np.random.default_rng(8)
        pi = jax.nn.softmax(jnp.asarray(rng.normal(size=(S, A))), -1)
        mus = jax.nn.softmax(jnp.asarray(2.0 * rng.normal(size=(L, S, A))), -1)
        d = jnp.asarray(rng.dirichlet(np.ones(S)))
        post = jnp.asarray(rng.dirichlet(np.ones(L), size=S).T)
        v = jnp.asarray(rng.normal(size=S))
        got = exact_actor.correction_update(mdp, pi, mus, d, post, v, correction=name,
                                            params=params, centred=centred)
        ref = _numpy_per_state(mdp, *(np.asarray(x) for x in (pi, mus, d, post, v)), name)
        np.testing.assert_allclose(np.asarray(got.expected), ref, rtol=1e-10, atol=1e-12)
        eq12 = np.asarray(d)[:, None] * np.asarray(exact.exact_actor_update(mdp, pi, exact.softmax_score(pi)))
        np.testing.assert_allclose(np.asarray(got.eq12), eq12, atol=1e-12)
