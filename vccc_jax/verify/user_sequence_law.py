"""The sequence contract under a lag law (``--lag-law``): the P(L)-weighted expectations.

A law's problem (:func:`vccc_jax.verify.lags.lagged_law`, ``Problem.law``) holds one behaviour
version mu_L per lag of the law's support and P(L) in ``mix``. Each trajectory comes from one
version (drawn from the law) and carries its own ratios pi / mu_L, so every expectation is the
P(L)-weighted sum of the per-version expectations of :mod:`.user_sequence`, computed from the
same enumerations (vectorised over the versions):

- given the start state (E[vs_0 | s_0], Var(vs_0 | s_0), the fixed point of V -> E[vs_0 | s_0; V],
  the sampled z-scores): the versions' trajectories joined per start state, with probability
  P(L) P_L(trajectory | s_0);
- given a longer prefix (the at-claim and Markov rows, the pg advantages):
  sum_L P(L) E_L[. | prefix] -- one critic meets every version, so the row asks whether the
  law's expected target is the claim after every prefix (not the posterior over versions given
  the prefix, which would make every target depend on its prefix);
- the claim: V^pi, or for ``clipped:c`` the fixed point of the law's claimed operator
  sum_L P(L) R_L (R_L: V-trace with rho_bar = c_bar = c on version L, whose own fixed point is
  V^pitilde_L).

With one version (``fixed:L``) every number equals :func:`.user_sequence.seq_checks` at lag L
up to round-off (tests/verify/test_lag_law.py).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from vccc_jax.tabular import exact as ex
from vccc_jax.verify.cells import draw
from vccc_jax.verify.claimed import behaviour_mass, claimed_value, normalised
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import Problem, maxabs
from vccc_jax.verify.user_one_step import GRID, _basis, solve_affine
from vccc_jax.verify.user_sequence import (
    SeqOut,
    _atoms,
    _claim_operator,
    _evaluate,
    _moments0,
    _prefix_ratio,
    _prefix_states,
    _z_scores,
    enumerate_trajectories,
    prefix_means,
)

Array = chex.Array


def join(x: Array, S: int) -> Array:
    """Per-version trajectories [K, ..., N] as one batch [..., K N], grouped by start state
    (each start state's block holds every version's trajectories from it)."""
    y = x.reshape(x.shape[:-1] + (S, x.shape[-1] // S))
    y = jnp.moveaxis(y, 0, -2)                                       # [..., S, K, N / S]
    return y.reshape(y.shape[:-3] + (-1,))


def _weighted(w: Array, x: Array) -> Array:
    """sum_k w_k x_k over the leading version axis."""
    return jnp.tensordot(w, x, axes=1)


def law_value(p: Problem, claim, T: int) -> Array:
    """The claimed value under the law: V^pi, or the fixed point of sum_L P(L) R_L (clipped)."""
    w = p.mix[:, 0]
    if claim.weight_kind != "truncate":
        return claimed_value(p, p.mix, claim)
    c = jnp.asarray(claim.clip, p.vbar.dtype)
    ops = jax.vmap(lambda v: _weighted(w, jax.vmap(lambda mu: _claim_operator(p, mu, v, c, T))(p.mus)))(_basis(p))
    return solve_affine(ops)[0]


def law_checks(key: Array, p: Problem, users: tuple, T: int, num_samples: int) -> tuple:
    """:func:`.user_sequence.seq_checks` for a law's problem (module docstring): one SeqOut per
    target with a single "version", the law."""
    S, A = p.mdp.num_states, p.mdp.num_actions
    C = A * S
    w = p.mix[:, 0]                                                        # P(L) [K]
    prefix_states = [_prefix_states(S, A, T, t) for t in range(T)]
    onehots = [jax.nn.one_hot(ps, S, dtype=p.vbar.dtype) for ps in prefix_states]
    t_pi = jnp.sum(p.pi * ex.q_values(p.mdp, v=p.vbar), -1)

    def enum(v):
        return jax.vmap(lambda mu: enumerate_trajectories(p, mu, v, T))(p.mus)  # ([K, T, N], [K, N])

    arbitrary = enum(p.vbar)
    prob = join(arbitrary[1] * w[:, None], S)                               # the law's P(traj | s_0)
    fp_batches = jax.vmap(lambda v: enum(v)[0])(_basis(p))                  # [S + 1, K, T, N]
    fp_flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), fp_batches)
    claims: dict = {}
    outs = []
    for u in users:
        if u.claim not in claims:
            v = law_value(p, u.claim, T)
            seq, pk = enum(v)
            pj = join(pk * w[:, None], S)
            idx = draw(key, pj.reshape(S, -1), num_samples) + (jnp.arange(S) * (pj.size // S))[:, None]
            sample = jax.tree_util.tree_map(lambda x: join(x, S)[..., idx.ravel()], seq)
            c = jnp.asarray(u.claim.clip, p.vbar.dtype)
            ref = jnp.stack([_weighted(w, jax.vmap(lambda mu: _claim_operator(p, mu, v, c, T))(p.mus)),
                             _weighted(w, jax.vmap(lambda mu: _claim_operator(p, mu, p.vbar, c, T))(p.mus))])
            atoms = _weighted(w, jax.vmap(lambda mu: _atoms(p, mu, v, T))(p.mus))
            fp = [ex.policy_value(p.mdp, normalised(behaviour_mass(p, p.mix, "none", None))[1])[None]]
            fp.append(jax.vmap(lambda c: ex.policy_value(p.mdp, normalised(behaviour_mass(p, p.mix, "truncate", c))[1]))(
                jnp.asarray(GRID, p.vbar.dtype)))
            claims[u.claim] = (v, (seq, pk), pj, sample, ref, atoms, jnp.concatenate(fp) - v[None])
        v, (seq_c, pk), pj, sample, ref, atoms, fp_atoms = claims[u.claim]

        pieces = [seq_c, arbitrary[0], fp_flat, jax.tree_util.tree_map(lambda x: x[None], sample)]
        (vs_k, pg_k), grads = _evaluate(u, pieces)
        vs_claim, vs_all, vs_fp, vs_s = vs_k                                # [K, T, N] ...

        def law_prefix(vs, pk, t):
            """(sum_L P(L) E_L[vs_t | prefix], P(prefix | s_0) > 0) [S C^t]."""
            m, pw = jax.vmap(lambda x, q: prefix_means(x[t], q, S, C, t))(vs, pk)
            return _weighted(w, m), pw[0] > 0

        errs = []
        for t in range(T):
            m, ok = law_prefix(vs_claim, pk, t)
            errs.append(maxabs(jnp.where(ok, m - v[prefix_states[t]], 0.0)))
        if pg_k is None:
            pg_err = jnp.asarray(jnp.nan, v.dtype)
        else:
            mass = behaviour_mass(p, p.mix, u.claim.weight_kind, u.claim.c)
            per = jax.vmap(lambda q, g: jnp.sum((q * g[0]).reshape(S, A, -1), -1))(pk, pg_k[0])
            pg_err = maxabs(_weighted(w, per) - mass * (ex.q_values(p.mdp, v=v) - v[:, None]))
        mean_claim, var_claim = _moments0(join(vs_claim[:, 0], S), pj, S)

        spread = [jnp.zeros((), p.vbar.dtype)]
        devs, dev_atoms = [], []
        for t in range(1, T):
            m, ok = law_prefix(vs_all, arbitrary[1], t)
            oh = onehots[t] * ok[:, None]
            hi = jnp.max(jnp.where(oh > 0, m[:, None], -jnp.inf), axis=0)
            lo = jnp.min(jnp.where(oh > 0, m[:, None], jnp.inf), axis=0)
            spread.append(jnp.max(jnp.where(jnp.any(oh > 0, axis=0), hi - lo, 0.0)))
            dev, dev_atom = jax.vmap(lambda x, s, q, t=t: _deviations(x[t], s, q, S, C, t, onehots[t],
                                                                      prefix_states[t], t_pi - p.vbar))(
                vs_all, arbitrary[0], arbitrary[1])
            devs.append(_weighted(w, dev))
            dev_atoms.append(_weighted(w, dev_atom))
        mean_arb, var0 = _moments0(join(vs_all[:, 0], S), prob, S)
        fp_means = jax.vmap(lambda x: _moments0(join(x[:, 0], S), prob, S)[0])(
            vs_fp.reshape((S + 1, -1) + vs_fp.shape[1:]))
        fixed, _ = solve_affine(fp_means)
        z, valid, gap, ncp = _z_scores(jnp.mean(vs_s[0, 0].reshape(S, -1), axis=-1), mean_claim, var_claim, v,
                                       num_samples)
        zero = jnp.zeros((1,), p.vbar.dtype)
        outs.append(SeqOut(
            claim_err=jnp.max(jnp.stack(errs))[None], markov=jnp.max(jnp.stack(spread)), fixed_err=maxabs(fixed - v),
            var0=var0, grads=grads, pg_err=pg_err[None], z=z[None], valid=valid[None], gap=gap[None], ncp=ncp[None],
            means0=jnp.stack([mean_claim, mean_arb])[:, None], atoms0=jnp.stack([atoms, _weighted(
                w, jax.vmap(lambda mu: _atoms(p, mu, p.vbar, T))(p.mus))])[:, None],
            ref0=ref[:, None], dev=jnp.concatenate(devs) if devs else zero,
            dev_atom=jnp.concatenate(dev_atoms) if dev_atoms else zero, fixed=fixed - v, fp_atoms=fp_atoms))
    return tuple(outs)


GRAPH = fast_jit(jax.vmap(law_checks, in_axes=(0, 0, None, None, None)), static_argnums=(2, 3, 4))


def _deviations(x: Array, seq, prob: Array, S: int, C: int, t: int, onehot: Array, ps, delta: Array):
    """One version's E[vs_t | prefix] - E[vs_t | s_t] and the same for the prefix-ratio closed
    form (the Markov diagnosis of :func:`.user_sequence.seq_checks`). ([P], [P])"""
    m, pw = prefix_means(x, prob, S, C, t)
    ratio = _prefix_ratio(seq, S, C, t)
    oh = onehot * (pw > 0)[:, None]
    wsum = jnp.sum(oh * pw[:, None], axis=0)
    mbar = jnp.sum(oh * (pw * m)[:, None], axis=0) / jnp.where(wsum > 0, wsum, 1.0)
    rbar = jnp.sum(oh * (pw * ratio)[:, None], axis=0) / jnp.where(wsum > 0, wsum, 1.0)
    return jnp.where(pw > 0, m - mbar[ps], 0.0), jnp.where(pw > 0, (ratio - rbar[ps]) * delta[ps], 0.0)
