"""Exact checks that run library estimators which the per-problem identities do not reach:

- ``importance.expected_weight`` (Z(s) = E_mu[w | s], Sec 4.2) against independent closed
  forms (sum_a pi for the ratio, sum_a min(c mu, pi), sum_a pi 1[mask]), every version;
- stop-gradient: the critic targets, V-trace's ``vs`` / ``pg_advantages`` and the
  policy loss's advantages carry no gradient by default (grad of a loss through them is 0);
- the actor: grad of ``actor.centering_term`` = m_w(s) = E_mu[w u | s] (Sec 5.2), and grad
  of ``policy_loss`` with centering = Eq 13, via ``jax.grad``.

The library functions are looked up when the section runs and passed to the compiled
graph as static arguments, so a patched library is what gets checked.
"""

from __future__ import annotations

import functools
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import actor, importance
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.policies import log_probs
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import (
    CLIP,
    MASK_CLIP,
    TEMPERATURE,
    GroupSpec,
    Problem,
    make_problems,
    masked_policy,
    maxabs,
    truncated_policy,
)
from vccc_jax.verify.report import Row, exact_row

vt = importlib.import_module("vccc_jax.estimators.vtrace")  # the module (the package exports the function)

Array = chex.Array

GAP_GROUP = GroupSpec("dirichlet", 5, 4, 24)
WEIGHTS = (("ratio", None), ("truncate", CLIP), ("mask", MASK_CLIP), ("truncate", 1.0))


def library_fns() -> dict:
    """The library functions checked here, looked up now (so a patch is seen)."""
    return dict(expected_weight=importance.expected_weight, uncorrected=ct.uncorrected_target,
                vccc=ct.vccc_target, clipped=ct.clipped_target, naive=ct.naive_clipped_target,
                centered=ct.centered_clipped_target, vtrace=vt.vtrace, vtrace_associative=vt.vtrace_associative,
                policy_loss=actor.policy_loss, centering_term=actor.centering_term)


def _z_closed_form(pi: Array, mu: Array, kind: str, clip) -> Array:
    if kind == "ratio":
        return jnp.sum(pi, axis=-1)
    if kind == "truncate":
        return truncated_policy(pi, mu, clip)[0]
    return masked_policy(pi, mu, clip)[0]


def expected_weight_error(p: Problem, fns) -> Array:
    """max |library expected_weight - closed-form Z(s)| over versions, states and WEIGHTS."""
    f = dict(fns)["expected_weight"]
    lp = log_probs(p.pi)

    def one(mu):
        lm = log_probs(mu)
        return jnp.stack([maxabs(f(lp, lm, kind=k, clip=c) - _z_closed_form(p.pi, mu, k, c)) for k, c in WEIGHTS])

    return jnp.max(jax.vmap(one)(p.mus))


def target_gradient_norm(p: Problem, fns) -> Array:
    """max |d sum(w * target) / d inputs| over the library's critic targets on the (s, a, s')
    grid of the stalest version, V-trace on trajectories built from the same grid, and the
    policy loss w.r.t. its advantages: 0 exactly when every target is stop-gradient-ed."""
    f = dict(fns)
    g = ex.transition_grid(p.mdp, p.pi, p.mus[-1], p.vbar)
    inputs = dict(rewards=g.rewards, discounts=g.discounts, values=g.values, next_values=g.next_values,
                  log_rhos=g.log_rhos, baseline=g.state(p.baselines[1]), z=g.state(p.vbar / 10.0))
    weights = jnp.cos(jnp.arange(g.rewards.size, dtype=g.rewards.dtype)).reshape(g.rewards.shape)
    targets = (
        lambda x: f["uncorrected"](x["rewards"], x["discounts"], x["next_values"]),
        lambda x: f["vccc"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"],
                            x["baseline"]),
        lambda x: f["vccc"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"]),
        lambda x: f["clipped"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"],
                               clip=CLIP, kind="truncate"),
        lambda x: f["clipped"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"],
                               clip=MASK_CLIP, kind="mask"),
        lambda x: f["naive"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"],
                             x["baseline"], clip=CLIP),
        lambda x: f["centered"](x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"],
                                x["baseline"], x["z"], clip=CLIP),
    )
    norms = []
    for t in targets:
        grads = jax.grad(lambda x: jnp.sum(weights * t(x)))(inputs)
        norms.append(jnp.max(jnp.stack([maxabs(v) for v in jax.tree_util.tree_leaves(grads)])))

    # V-trace: the grid's cells as a time-major [T, B] batch (rows of the flattened grid).
    S = g.rewards.shape[0]
    traj = {k: v.reshape(S, -1) for k, v in inputs.items() if k in ("rewards", "discounts", "values", "log_rhos")}
    traj["bootstrap_value"] = g.next_values.reshape(S, -1)[-1]
    for name, n in (("vtrace", None), ("vtrace_associative", 2)):
        def loss(x, fn=f[name], n=n):
            out = fn(x["log_rhos"], x["discounts"], x["rewards"], x["values"], x["bootstrap_value"],
                     lambda_=0.9, clip_rho_threshold=1.5, clip_c_threshold=0.8, n_steps=n)
            return jnp.sum(jnp.cos(out.vs)) + jnp.sum(jnp.sin(out.pg_advantages))
        grads = jax.grad(loss)(traj)
        norms.append(jnp.max(jnp.stack([maxabs(v) for v in jax.tree_util.tree_leaves(grads)])))

    lp, lm = log_probs(p.pi), log_probs(p.mus[-1])
    adv = ex.q_values(p.mdp, v=p.vbar) - p.vbar[:, None]
    norms.append(maxabs(jax.grad(lambda a: f["policy_loss"](lp, lm, a, kind="truncate", clip=CLIP))(adv)))
    return jnp.max(jnp.stack(norms))


def actor_gradient_errors(p: Problem, fns) -> tuple[Array, Array]:
    """(grad centering_term - m_w, grad of policy_loss with centering - Eq 13), max abs over the
    versions and the weights ratio / truncate / mask, tabular softmax logits (temperature T)."""
    f = dict(fns)
    mdp, S, A = p.mdp, p.mdp.num_states, p.mdp.num_actions
    u = ex.softmax_score(p.pi, TEMPERATURE)

    def log_pi_of(th):
        return jax.nn.log_softmax(th / TEMPERATURE, axis=-1)

    adv = ex.q_values(mdp, v=p.vbar) - p.vbar[:, None] - p.baselines[1][:, None]

    def one(mu, kind, clip):
        lm = log_probs(mu)
        w = importance.importance_weights(log_probs(p.pi) - lm, kind, clip)
        g_c = jax.grad(lambda th: jnp.sum(f["centering_term"](log_pi_of(th), lm, kind=kind, clip=clip)))(p.logits)
        e_c = maxabs(g_c - ex.mean_score(mu, u, w))

        def loss(th):
            lp = log_pi_of(th)
            c = f["centering_term"](lp, lm, kind=kind, clip=clip)
            return f["policy_loss"](lp, lm, S * A * mu * adv, kind=kind, clip=clip,
                                    centering=jnp.broadcast_to(c[:, None], (S, A)))

        e_13 = maxabs(-jax.grad(loss)(p.logits) - ex.centred_actor_update(mdp, mu, u, w, adv))
        return e_c, e_13

    errs = [jax.vmap(lambda m, k=k, c=c: one(m, k, c))(p.mus) for k, c in WEIGHTS[:3]]
    return jnp.max(jnp.stack([e[0] for e in errs])), jnp.max(jnp.stack([e[1] for e in errs]))


# One compiled graph per part, each keyed by the library functions it uses, so that a test
# patching one function recompiles only the part that checks it.
PARTS = (
    (expected_weight_error, ("expected_weight",)),
    (target_gradient_norm, ("uncorrected", "vccc", "clipped", "naive", "centered", "vtrace",
                            "vtrace_associative", "policy_loss")),
    (actor_gradient_errors, ("centering_term", "policy_loss")),
)


@functools.partial(fast_jit, static_argnums=(1, 2))
def _part(p: Problem, check, fns):
    return jax.vmap(lambda q: check(q, fns))(p)


_MAKE_PROBLEMS = fast_jit(make_problems, static_argnums=(1, 2))


def estimator_rows(ctx) -> list[Row]:
    """Rows for ``expected_weight``, stop-gradients and the actor's gradients (problems from
    ``fold_in(ctx.key, 2)``, group :data:`GAP_GROUP`)."""
    with jax.enable_x64(True):
        p = _MAKE_PROBLEMS(jax.random.fold_in(ctx.key, 2), GAP_GROUP)
        lib = library_fns()
        z, grad, (cen, eq13) = (jax.tree_util.tree_map(np.asarray, _part(p, check, tuple((k, lib[k]) for k in keys)))
                                for check, keys in PARTS)
    n = GAP_GROUP.num_mdps
    weights = ", ".join(k if c is None else f"{k} c={c:g}" for k, c in WEIGHTS)
    return [
        exact_row("library expected_weight Z(s) = E_mu[w|s]", "Sec 4.2", n, np.max(z), 1e-12,
                  f"3 versions; {weights}"),
        exact_row("targets are stop_gradient-ed (grad through target = 0)", "Eq 4-11", n, np.max(grad), 0.0,
                  "5 critic targets, vtrace(+associative) vs and pg, policy_loss advantages"),
        exact_row("grad of library centering_term = m_w = E_mu[w u]", "Eq 13", n, np.max(cen), 1e-12,
                  "3 versions; ratio, truncate, mask"),
        exact_row("grad of policy_loss + centering = Eq 13 (jax.grad)", "Eq 13", n, np.max(eq13), 1e-10,
                  "3 versions; ratio, truncate, mask; arbitrary baseline in A"),
    ]
