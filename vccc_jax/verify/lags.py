"""Staleness as a lag: the verify problems re-set so that the behaviour is the learner L
updates ago (``vccc verify --field-audit``, :mod:`vccc_jax.verify.field_audit`).

Each problem of a ``vccc verify`` group keeps its MDP, critic and baselines; its policy
becomes the end of an exact natural-policy-gradient history started at the problem's own
logits: pi_{k+1} ∝ pi_k exp(eta A^{pi_k}) (in logits, theta_{k+1} = theta_k + eta T A^{pi_k}),
k = 0 .. H - 1. The learner is pi_H; the behaviour at lag L is pi_{H - L}, the same for
every version of the problem (so every row of a check sees exactly that lag). The history
(H = :data:`HORIZON`, eta = :data:`STEP`) is the one ``docs/actor_map.md`` uses for its
lag axis, on the verify problems.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.policies import softmax_policy
from vccc_jax.verify.problems import TEMPERATURE, Problem

Array = chex.Array

LAGS = (0, 1, 4, 16)
HORIZON = 16
STEP = 0.1


def history(p: Problem, steps: int = HORIZON, eta: float = STEP) -> Array:
    """Logits theta_0 .. theta_steps of the exact NPG history of one problem. [steps + 1, S, A]"""

    def step(theta, _):
        pi = softmax_policy(theta, TEMPERATURE)
        q = ex.q_values(p.mdp, pi)
        adv = q - jnp.sum(pi * q, -1, keepdims=True)
        nxt = theta + eta * TEMPERATURE * adv
        return nxt, nxt

    _, path = jax.lax.scan(step, p.logits, None, length=steps)
    return jnp.concatenate([p.logits[None], path])


def lagged(p: Problem, lag: int, steps: int = HORIZON, eta: float = STEP) -> Problem:
    """The problem with learner pi_steps and every behaviour version pi_{steps - lag}."""
    if not 0 <= lag <= steps:
        raise ValueError(f"lag must be in [0, {steps}], got {lag}")
    thetas = history(p, steps, eta)
    pi = softmax_policy(thetas[-1], TEMPERATURE)
    mu = softmax_policy(thetas[steps - lag], TEMPERATURE)
    return p.replace(logits=thetas[-1], pi=pi, mus=jnp.broadcast_to(mu[None], p.mus.shape))


def kl(p: Problem) -> Array:
    """Mean over states of KL(pi || mu) for the stalest version (the lag's distance). []"""
    mu = p.mus[-1]
    return jnp.mean(jnp.sum(p.pi * (jnp.log(p.pi) - jnp.log(mu)), -1))


_MAKERS: dict = {}


def maker(lag: int):
    """``make(key, group) -> Problem``: the verify problems of ``runner.make_problems_jit``
    at ``lag`` (:func:`lagged`), one compiled function per lag (``user.check_all(make=)``)."""
    if lag not in _MAKERS:
        from vccc_jax.verify.compile import fast_jit
        from vccc_jax.verify.runner import make_problems_jit

        shift = fast_jit(jax.vmap(lambda p: lagged(p, lag)))

        def make(key, group):
            return shift(make_problems_jit(key, group))

        make.lag = lag  # the group contract (verify.group) reads the lag
        _MAKERS[lag] = make
    return _MAKERS[lag]


def law_maker(law: str):
    """A ``make`` carrying a lag law for the group contract (:mod:`.group`, which draws each
    slot's behaviour version from it); the MDP contracts take one lag (:func:`maker`), so
    calling it raises ValueError."""
    def make(key, group):
        raise ValueError(f"--lag-law {law} applies to group (critic-free) estimators; the MDP contracts take "
                         "one lag: --lag L")

    make.lag = law
    return make
