"""Exact identity sections for V-trace's expected operator (Eq 11 reductions) and the actor
side (Eq 1, 2, 12, 13 and the policy gradient), for a softmax pi with tabular logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vccc_jax.estimators import actor
from vccc_jax.estimators.importance import importance_weights, safe_ratios
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.policies import log_probs, log_ratio_table, softmax_policy
from vccc_jax.verify.identities.shared import Prelude
from vccc_jax.verify.problems import CLIP, MASK_CLIP, TEMPERATURE, Problem, maxabs


def vtrace_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi, mus, vbar = p.mdp, p.pi, p.mus, p.vbar
    dtype = vbar.dtype
    v_pi = pre.v_pi
    errs = {}

    # Eq 11 reductions of the expected V-trace operator.
    untrunc = dict(lambda_=1.0, clip_rho_threshold=None, clip_c_threshold=None)

    def untruncated(m):
        e = [maxabs(ex.expected_vtrace_operator(mdp, pi, m, vbar, n_steps=n, **untrunc)
                     - ex.n_step_backup(mdp, pi, vbar, n)) for n in (1, 4)]
        e.append(maxabs(ex.expected_vtrace_operator(mdp, pi, m, vbar, n_steps=None, **untrunc) - v_pi))
        return jnp.max(jnp.stack(e))

    errs["eq11_untruncated"] = jnp.max(jax.vmap(untruncated)(mus))

    def on_policy(lam):
        return jnp.max(jnp.stack([
            maxabs(ex.expected_vtrace_operator(mdp, pi, pi, vbar, n_steps=n, lambda_=lam)
                    - ex.lambda_return_operator(mdp, pi, vbar, lam, n)) for n in (1, 4)]))

    errs["eq11_on_policy_gae"] = jnp.max(jax.vmap(on_policy)(jnp.asarray([0.0, 0.5, 0.9, 1.0], dtype)))
    return errs


def actor_section(p: Problem, pre: Prelude) -> dict:
    mdp, pi, mus, vbar = p.mdp, p.pi, p.mus, p.vbar
    S, A = mdp.num_states, mdp.num_actions
    mu = mus[-1]
    v_pi, v_mus = pre.v_pi, pre.v_mus
    errs = {}

    # Actor side (softmax pi = softmax(logits / T), tabular logits).
    u = ex.softmax_score(pi, TEMPERATURE)
    log_pi_of = lambda th: jax.nn.log_softmax(th / TEMPERATURE, axis=-1)
    q_mu = ex.q_values(mdp, mu)
    v_mu = v_mus[-1]
    eq1_bs = jnp.concatenate([p.baselines, jnp.stack([v_mu, v_pi])], axis=0)

    def eq1(b):
        g_auto = jax.grad(lambda th: jnp.sum(mu * (q_mu - b[:, None]) * log_pi_of(th)))(p.logits)
        g_b, cov, drift = ex.actor_drift_decomposition(mdp, pi, mu, b, TEMPERATURE)
        return jnp.maximum(maxabs(g_auto - (cov + drift)), maxabs(g_auto - g_b))

    errs["eq1"] = jnp.max(jax.vmap(eq1)(eq1_bs))

    weights = {
        "ratio": safe_ratios(log_ratio_table(pi, mu)),
        "truncate": importance_weights(log_ratio_table(pi, mu), "truncate", CLIP),
        "mask": importance_weights(log_ratio_table(pi, mu), "mask", MASK_CLIP),
    }

    def eq2(w):
        rhs = ex.score_covariance(mdp, mu, u, w, q_mu)
        return jnp.max(jax.vmap(lambda b: maxabs(
            ex.centred_actor_update(mdp, mu, u, w, q_mu - b[:, None]) - rhs))(eq1_bs))

    errs["eq2"] = jnp.max(jax.vmap(eq2)(jnp.stack(list(weights.values()))))

    # Eq 13 through the library's actor loss: tokens = all (s, a) cells, advantages scaled by
    # S A mu(a|s) so the mean over tokens is the expectation under mu; TD advantages from Vbar
    # minus an arbitrary state baseline (which centering must make irrelevant).
    adv_td = ex.q_values(mdp, v=vbar) - vbar[:, None]

    def eq13(kind, clip, w, b):
        adv = adv_td - b[:, None]

        def loss(th):
            lp = log_pi_of(th)
            lm = log_probs(mu)
            c = actor.centering_term(lp, lm, kind=kind, clip=clip)
            return actor.policy_loss(lp, lm, S * A * mu * adv, kind=kind, clip=clip,
                                     centering=jnp.broadcast_to(c[:, None], (S, A)))

        g_lib = -jax.grad(loss)(p.logits)
        g_exact = ex.centred_actor_update(mdp, mu, u, w, adv)
        g_no_b = ex.centred_actor_update(mdp, mu, u, w, adv_td)
        return jnp.maximum(maxabs(g_lib - g_exact), maxabs(g_exact - g_no_b))

    errs["eq13_library"] = jnp.max(jnp.stack([
        jnp.max(jax.vmap(lambda b: eq13(kind, clip, weights[kind], b))(p.baselines[1:]))
        for kind, clip in (("ratio", None), ("truncate", CLIP), ("mask", MASK_CLIP))
    ]))

    errs["eq12"] = jnp.max(jax.vmap(lambda m: maxabs(
        ex.importance_weighted_actor_update(mdp, pi, m, v_pi, u) - ex.exact_actor_update(mdp, pi, u)))(mus))
    pg_auto = jax.grad(lambda th: jnp.dot(
        mdp.init, ex.policy_value(mdp, softmax_policy(th, TEMPERATURE))))(p.logits)
    errs["policy_gradient"] = maxabs(pg_auto - ex.policy_gradient(mdp, pi, u))
    return errs

