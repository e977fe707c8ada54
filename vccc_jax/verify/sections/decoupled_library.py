"""The library's decoupled correction and PPO-EWMA (``estimators.related.decoupled``) checked
exactly against the tabular operators of ``tabular.decoupled``, on the decoupled rows'
problem (S = 3, A = 3, five NPG versions, behaviour version K - 2 seen through inference
noise; :func:`~vccc_jax.verify.sections.comparators.decoupled_problem`).

The exact operators come from the decoupled rows' compiled graph
(``comparators.decoupled_numbers``); this graph holds only the library side. Every (s, a)
cell is enumerated; per route (exact, ewma, behaviour) and per setting of
``comparators.DEC_SETTINGS`` (the total ratio unclipped; discrepancy truncation / mask at c = 1.5 with the
PPO clip eps = 0.2, both active):

- actor: E_mu[-grad_theta loss | s] of ``decoupled_policy_loss`` (pi_old from
  ``old_log_probs``) = ``tabular.decoupled.actor_update_moments`` (w(pi_old / mu) r
  1[PPO clip inactive] A u): pins the discrepancy factor, the staleness ratio, the clip
  region and which pi_old each route takes; the trainer's route (``route_log_pi_old``, whose
  pi_old then goes through the same ``actor.policy_loss``) gives the tabular routes'
  log pi_old tables;
- critic: E_mu[Vbar + ``decoupled_weights`` delta | s] = ``critic_target_moments``
  (w(pi_old / mu) clip(pi / pi_old) delta);
- PPO-EWMA: the library's debiased parameter EMA (``ewma_init`` / ``ewma_update`` /
  ``ewma_params``) over versions 0..K-2 at the decay ``ewma_decay_for_lag(2)`` equals the
  tabular EWMA of the logits at beta = L / (1 + L) = 2/3, and drives the ewma route above.

The library functions are looked up when the section runs (static arguments of the graph).
"""

from __future__ import annotations

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import decoupled as td
from vccc_jax.tabular.policies import log_probs
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL, maxabs
from vccc_jax.verify.report import Row, exact_row, worst
from vccc_jax.verify.sections.comparators import DEC_DECAY, DEC_LAG, DEC_SETTINGS, decoupled_numbers

dc = importlib.import_module("vccc_jax.estimators.related.decoupled")

Array = chex.Array


def library_fns() -> tuple:
    """The library functions checked here, looked up now (so a patch is seen)."""
    return (dc.decoupled_policy_loss, dc.old_log_probs, dc.route_log_pi_old, dc.decoupled_weights,
            dc.ewma_init, dc.ewma_update, dc.ewma_params)


def library_errors(problem, truth: dict, fns: tuple, decay: float, settings=DEC_SETTINGS) -> dict:
    """max abs errors {"ewma", "routes", "actor" [settings], "critic" [settings]} of the library
    against ``truth`` (the exact operators of ``comparators._decoupled_numbers``, module docstring)."""
    loss, old_log_probs, route_log_pi_old, weights, ewma_init, ewma_update, ewma_params = fns
    mdp, logits, vbar, mu = problem
    K, S, A = logits.shape[0] - 1, mdp.num_states, mdp.num_actions
    old = K - DEC_LAG
    state = ewma_init(logits[0])
    for k in range(old + 1):
        state = ewma_update(state, logits[k], decay)
    ewma_logits = ewma_params(state, decay)
    adv, delta = truth["adv"], truth["delta"]
    log_pi, log_mu = jax.nn.log_softmax(logits[K]), log_probs(mu)
    exact_old, ewma_old = jax.nn.log_softmax(logits[old]), jax.nn.log_softmax(ewma_logits)
    actions = jnp.broadcast_to(jnp.arange(A), (S, A))
    full = lambda x: jnp.broadcast_to(x[:, None, :], (S, A, A))  # noqa: E731  [S, A] -> per cell [S, A, A]
    trainer_old = jnp.stack([route_log_pi_old(r, actions, log_pi_all=full(log_pi), log_mu_all=full(log_mu),
                                              behaviour_log_pi_all=full(exact_old),
                                              ewma_logits=full(ewma_logits))[0] for r in td.ROUTES])
    lib_old = [old_log_probs(r, log_mu, exact_log_pi_old=exact_old, ewma_log_pi=ewma_old) for r in td.ROUTES]
    per_cell = lambda f: jax.vmap(jax.vmap(lambda *x: f(*(y[None] for y in x))))  # noqa: E731

    def ascent(cell_loss):  # E_mu[-grad_theta loss | s] at theta = logits[K], [S, A]
        return -jax.grad(lambda th: jnp.sum(mu * cell_loss(jax.nn.log_softmax(th))))(logits[K])

    actor_err, critic_err = [], []
    for kind, clip, eps in settings:
        kw = dict(kind=kind, clip=clip, ppo_epsilon=eps)
        i = DEC_SETTINGS.index((kind, clip, eps))  # the truth holds every setting of DEC_SETTINGS
        lib_a, lib_c = [], []
        for j, r in enumerate(td.ROUTES):
            lib_a.append(ascent(lambda lp: per_cell(lambda a, b, c, d, e: loss(
                a, b, c, route=r, exact_log_pi_old=d, ewma_log_pi=e, **kw))(lp, log_mu, adv, exact_old, ewma_old)))
            w = weights(log_pi, lib_old[j], log_mu, **kw)  # E_mu[Vbar + w delta | s], (a, s') enumerated
            lib_c.append(vbar + jnp.sum(mu[:, :, None] * mdp.P * w[:, :, None] * delta, axis=(1, 2)))
        actor_err.append(maxabs(jnp.stack(lib_a) - truth["actor"][i]))
        critic_err.append(maxabs(jnp.stack(lib_c) - truth["critic"][i]))
    routes = maxabs(jnp.where(mu > 0, trainer_old - log_probs(truth["pi_old"]), 0.0))
    return dict(ewma=maxabs(jax.nn.softmax(ewma_logits) - truth["pi_old"][td.ROUTES.index("ewma")]),
                routes=routes, actor=jnp.stack(actor_err), critic=jnp.stack(critic_err))


_ERRORS = fast_jit(library_errors, static_argnums=(2, 3, 4))


def decoupled_library_rows(ctx, settings=DEC_SETTINGS) -> list[Row]:
    """Rows checking the library decoupled correction and PPO-EWMA (problem: fold_in(ctx.key, 14))."""
    problem, (_, _, truth) = decoupled_numbers(ctx)
    with jax.enable_x64(True):
        e = jax.tree_util.tree_map(np.asarray, _ERRORS(problem, truth, library_fns(), dc.ewma_decay_for_lag(DEC_LAG),
                                                       tuple(settings)))
    kinds = ", ".join(k if c is None else f"{k} c={c:g} eps={e_:g}" for k, c, e_ in settings)
    routes = f"routes {', '.join(td.ROUTES)}; {kinds}"
    return [
        exact_row("library decoupled actor: E_mu[-grad loss] = exact update", "decoupled", 1,
                  worst(e["actor"], e["routes"]), EXACT_TOL,
                  f"decoupled_policy_loss, and route_log_pi_old's tables; {routes}"),
        exact_row("library decoupled critic: E_mu[Vbar + w delta] = exact target", "decoupled", 1,
                  float(np.max(e["critic"])), EXACT_TOL, f"decoupled_weights; {routes}"),
        exact_row("library PPO-EWMA: debiased parameter EMA = tabular EWMA", "decoupled", 1, float(e["ewma"]),
                  EXACT_TOL, f"versions 0..K-{DEC_LAG}, decay ewma_decay_for_lag({DEC_LAG}) vs L/(1+L) = {DEC_DECAY:.4g}"),
    ]
