"""``vccc verify --target`` for an actor weight or loss: the expected update vs Eq 12 / Eq 13.

Tabular softmax policies pi = softmax(theta / T) (the verify problems' logits), so the
score of (s, a) is u(s, a) = grad_theta log pi(a|s), nonzero only in the row theta[s]
(``tabular.exact_actor.softmax_score``). The user's loss (a weight w enters as the loss
-mean(sg(w) r A), :class:`~vccc_jax.verify.contracts.ActorTarget`) is differentiated on
every single token (s, a) with ``jax.grad`` (with the library's ``centering_term`` as the
``centering`` argument when the loss takes one), which gives the per-token update
G(s, a) = -grad_{theta[s]} loss; the exact expected update is g(s) = sum_a mu(a|s) G(s, a).
In parameter space (all states' rows stacked), per MDP and behaviour version:

- ``vpi``: g = E_pi[Q^pi u | s] (Eq 12: a target-policy critic and exact ratios give the
  current policy's per-state policy gradient), with A = Q^pi - V^pi and with A = Q^pi - b
  for an arbitrary state baseline b (the ratio-weighted update does not depend on b);
- ``clipped:c`` / ``masked:c``: g = the score-centred update of Eq 13 with that weight,
  E_mu[A (w u - m_w(s))] (``tabular.exact_actor.centred_actor_update``), which by Eq 2 does
  not depend on b either -- an uncentred clipped update carries the drift (V - b) m_w of
  Eq 1 and fails the arbitrary-b row;

each as the relative bias ||g - g*|| / ||g*|| (must be at round-off) and the cosine. Sampled:
N actions per state from mu, the user's loss on that batch, z-scores per state and
parameter of the batch's update against g* (``targets.sampled_rows``). Diagnosis: least
squares of g - g* against the updates of the known weights (w = 1, truncated / masked at each
c of the grid, centred or not, and a weight left inside the gradient).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.actor import centering_term
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.policies import log_probs
from vccc_jax.verify import diagnose
from vccc_jax.verify.cells import draw
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.contracts import ActorTarget, Claim, in_graph
from vccc_jax.verify.problems import TEMPERATURE, Problem
from vccc_jax.verify.report import Row, failing, worst
from vccc_jax.verify.targets import MAX_STATES_PADDED, TargetSpec, sampled_rows
from vccc_jax.verify.user_one_step import GRID

Array = chex.Array
REL_TOL = 1e-9
ADVANTAGES = ("A = Q^pi - V^pi (Eq 12)", "A = Q^pi - b, any b (Eq 2)")


@dataclasses.dataclass(frozen=True)
class UserActor:
    name: str
    target: ActorTarget
    claim: Claim


def _weight(p: Problem, mu: Array, kind: str, c) -> Array:
    """w(s, a) written as a ratio of masses (min(c mu, pi) / mu, pi 1[mask] / mu, pi / mu). [S, A]"""
    pi = p.pi
    if kind == "ratio":
        m = pi
    elif kind == "truncate":
        m = jnp.minimum(c * mu, pi)
    else:
        m = jnp.where((pi >= mu / c) & (pi <= c * mu), pi, 0.0)
    return m / mu


def token_updates(u: UserActor, p: Problem, mu: Array, adv: Array) -> Array:
    """G[s, a, :] = -grad_{theta[s]} of the user's loss on the single token (s, a). [S, A, A]"""
    lm = log_probs(mu)
    kind = u.claim.weight_kind
    clip = None if kind == "ratio" else u.claim.c

    def loss(theta_s, s, a):
        lp = jax.nn.log_softmax(theta_s / TEMPERATURE)
        cen = centering_term(lp, lm[s], kind=kind, clip=clip)[None] if u.target.takes_centering else None
        return u.target(lp[a][None], lm[s, a][None], adv[s, a][None], cen)

    S, A = mu.shape
    grad = jax.vmap(jax.vmap(jax.grad(loss), in_axes=(None, None, 0)), in_axes=(0, 0, None))
    return -grad(p.logits, jnp.arange(S), jnp.arange(A))


def batch_update(u: UserActor, p: Problem, mu: Array, adv: Array, actions: Array) -> Array:
    """Per-state mean update [S, A] of the user's loss on a batch with ``actions`` [S, N]
    sampled at every state: -S grad_theta of the batch loss (theta rows are per state)."""
    lm = log_probs(mu)
    kind = u.claim.weight_kind
    clip = None if kind == "ratio" else u.claim.c
    S, N = actions.shape
    rows = jnp.broadcast_to(jnp.arange(S)[:, None], actions.shape)

    def loss(theta):
        lp = jax.nn.log_softmax(theta / TEMPERATURE, axis=-1)
        cen = None
        if u.target.takes_centering:
            cen = jnp.broadcast_to(centering_term(lp, lm, kind=kind, clip=clip)[:, None], actions.shape).ravel()
        return u.target(lp[rows, actions].ravel(), lm[rows, actions].ravel(), adv[rows, actions].ravel(), cen)

    return -S * jax.grad(loss)(p.logits)


def claimed_update(p: Problem, mu: Array, adv: Array, claim: Claim, u_score: Array) -> Array:
    """g*(s) [S, A]: Eq 12 (vpi, any) or the centred Eq 13 with the claim's weight."""
    if claim.weight_kind == "ratio":
        return ex.exact_actor_update(p.mdp, p.pi, u_score)
    return ex.centred_actor_update(p.mdp, mu, u_score, _weight(p, mu, claim.weight_kind, claim.c), adv)


def atom_labels() -> list[str]:
    labels = ["no importance weight (w = 1): E_mu[A u], the behaviour's update"]
    for kind in ("truncate", "mask"):
        labels += [f"the uncentred {kind}d weight at c={c:g}: E_mu[w A u] (drift (V - b) m_w of Eq 1)" for c in GRID]
        labels += [f"the score-centred {kind}d weight at c={c:g} (Eq 13)" for c in GRID]
    labels += ["the ratio weight left inside the gradient (missing stop_gradient): E_mu[2 rho A u]"]
    labels += [f"the truncated weight left inside the gradient at c={c:g}: E_mu[(w + rho 1[rho < c]) A u]"
               for c in GRID]
    return labels


def _atoms(p: Problem, mu: Array, adv: Array, u_score: Array) -> Array:
    def upd(w):
        return jnp.einsum("sa,sab->sb", mu * w * adv, u_score)

    grid = jnp.asarray(GRID, mu.dtype)
    out = [upd(jnp.ones_like(mu))[None]]
    for kind in ("truncate", "mask"):
        ws = jax.vmap(lambda c, k=kind: _weight(p, mu, k, c))(grid)
        out.append(jax.vmap(upd)(ws))
        out.append(jax.vmap(lambda w: ex.centred_actor_update(p.mdp, mu, u_score, w, adv))(ws))
    rho = p.pi / mu
    out.append(upd(2.0 * rho)[None])
    out.append(jax.vmap(lambda c: upd(jnp.minimum(rho, c) + rho * (rho < c)))(grid))
    return jnp.concatenate(out)


class ActorOut(NamedTuple):
    rel: Array        # [2, K] ||g - g*|| / ||g*|| per advantage setting and version
    cos: Array        # [2, K]
    bias: Array       # [2, K, S, A] g - g*
    atoms: Array      # [2, K, n_atoms, S, A] g_h - g*
    z: Array          # [1, S * A]
    valid: Array
    gap: Array
    ncp: Array


def actor_checks(key: Array, p: Problem, users: tuple, num_samples: int) -> tuple:
    u_score = ex.softmax_score(p.pi, TEMPERATURE)
    q = ex.q_values(p.mdp, p.pi)
    v = jnp.sum(p.pi * q, -1)
    advs = jnp.stack([q - v[:, None], q - p.baselines[1][:, None]])
    outs = []
    for u in users:
        def expected(adv, mu):
            G = token_updates(u, p, mu, adv)
            gs = claimed_update(p, mu, adv, u.claim, u_score)
            return jnp.einsum("sa,sab->sb", mu, G), gs, _atoms(p, mu, adv, u_score) - gs[None], G

        def one(adv, mu):
            g, gs, atoms, G = expected(adv, mu)
            return _scores(g, gs) + (g - gs, atoms, G)

        if p.law:  # a lag law: the P(L)-weighted expected update over its versions (one "version")
            g, gs, atoms, G = jax.vmap(lambda a: jax.vmap(lambda mu: expected(a, mu))(p.mus))(advs)
            g, gs = (jnp.einsum("ks,xksa->xsa", p.mix, y)[:, None] for y in (g, gs))
            atoms = jnp.einsum("ks,xknsa->xnsa", p.mix, atoms)[:, None]
            rel, cos = jax.vmap(jax.vmap(_scores))(g, gs)
            bias = g - gs
        else:
            rel, cos, bias, atoms, G = jax.vmap(lambda a: jax.vmap(lambda mu: one(a, mu))(p.mus))(advs)
        # sampled: stalest version (of a law: the stalest of its support), arbitrary baseline
        mu, adv, Gs = p.mus[-1], advs[1], G[1, -1]
        actions = draw(key, mu, num_samples)
        mean_s = batch_update(u, p, mu, adv, actions)
        exact = jnp.einsum("sa,sab->sb", mu, Gs)
        var = jnp.einsum("sa,sab->sb", mu, jnp.square(Gs - exact[:, None, :]))
        gs = claimed_update(p, mu, adv, u.claim, u_score)
        ok = ~(var <= 1e-20 * (1.0 + jnp.square(exact)))  # NaN: a NaN z-score, which fails
        safe = jnp.where(ok, var, 1.0)
        z = jnp.where(ok, (mean_s - gs) / jnp.sqrt(safe / num_samples), 0.0)
        ncp = jnp.where(ok, num_samples * jnp.square(exact - gs) / safe, 0.0)
        outs.append(ActorOut(rel, cos, bias, atoms, z.ravel()[None], ok.ravel()[None], (exact - gs).ravel()[None],
                             ncp.ravel()[None]))
    return tuple(outs)


def _scores(g: Array, gs: Array) -> tuple[Array, Array]:
    """(relative bias ||g - g*|| / ||g*||, cosine) of an expected update g [S, A] against g*."""
    rel = jnp.linalg.norm(g - gs) / jnp.maximum(jnp.linalg.norm(gs), 1e-300)
    cos = jnp.sum(g * gs) / jnp.maximum(jnp.linalg.norm(g) * jnp.linalg.norm(gs), 1e-300)
    return rel, cos


GRAPH = fast_jit(jax.vmap(actor_checks, in_axes=(0, 0, None, None)), static_argnums=(2, 3))


def run(items: list, groups, keys, num_samples: int, make=None) -> list[tuple[list[Row], list[str]]]:
    from vccc_jax.verify.runner import make_problems_jit

    users = tuple(UserActor(name, wrapped, claim) for name, _, claim, wrapped in items)
    outs = []
    for g, (kp, ks) in zip(groups, keys):
        p = (make or make_problems_jit)(kp, g)
        k = jax.random.split(jax.random.fold_in(ks, 2), g.num_mdps)
        out = in_graph(", ".join(u.name for u in users), GRAPH, k, p, users, num_samples)
        outs.append(jax.tree_util.tree_map(np.asarray, out))
    names = diagnose.mdp_names(groups)
    return [_report(u, [o[j] for o in outs], names, num_samples) for j, u in enumerate(users)]


def _report(u: UserActor, outs: list[ActorOut], names, num_samples: int):
    rel = np.concatenate([np.max(o.rel, axis=-1) for o in outs])  # [B, 2]
    cos = np.concatenate([np.min(o.cos, axis=-1) for o in outs])
    target = "Eq 12" if u.claim.weight_kind == "ratio" else f"Eq 13 ({u.claim.label})"
    rows = []
    for i, text in enumerate(ADVANTAGES):
        e = rel[:, i]
        rows.append(Row(f"{u.name}: update = {target}, {text.split(' (')[0]}", text.split("(")[-1][:-1],
                        "exact", len(e), worst(e), REL_TOL, not failing(e, REL_TOL).any(),
                        (diagnose.failing_mdps(e, REL_TOL, names) + "; " if failing(e, REL_TOL).any() else "")
                        + f"relative bias in parameter space, min cosine {np.min(cos[:, i]):.6f}"))
    spec = (TargetSpec(f"{u.name}: update per state and parameter", "Eq 12/13", None, None),)
    pad = [np.pad(np.asarray(getattr(o, f)), ((0, 0), (0, 0), (0, MAX_STATES_PADDED - o.z.shape[-1])))
           for o in outs for f in ("z", "valid", "gap", "ncp")]
    rows += sampled_rows(spec, *(np.concatenate(pad[i::4]) for i in range(4)), num_samples)
    labels = atom_labels()
    ok = all(r.passed for r in rows if r.kind == "exact")
    if ok and u.claim.name != "any":
        diagnosis = [f"the expected update is {target} ({'E_pi[Q^pi u | s]' if target == 'Eq 12' else 'centred'}) "
                     "for any state baseline"]
    else:
        bias = np.concatenate([np.asarray(o.bias).ravel() for o in outs])
        atoms = np.concatenate([np.moveaxis(np.asarray(o.atoms), 3, 0).reshape(len(labels), -1) for o in outs], axis=1)
        m = diagnose.match(bias, atoms, labels + [], 1.0)
        if float(np.max(rel)) <= REL_TOL:
            diagnosis = [f"the expected update is {target}: no bias"]
        else:
            diagnosis = ["E_mu[update | s] - claim: " + m.sentence("the bias", candidate=u.claim.name == "any")]
    if u.claim.name == "any":
        for r in rows:
            diagnose.as_info(r)
        explained = "no bias" in diagnosis[0] or (" matches " in diagnosis[0] and "no known" not in diagnosis[0])
        rows.append(Row(f"{u.name}: the update is a known closed form", "user", "exact", len(rel),
                        0.0 if explained else 1.0, 0.0, explained, diagnosis[0]))
    return rows, diagnosis
