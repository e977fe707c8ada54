"""Staleness as a lag: the verify problems re-set so that the behaviour is the learner L
updates ago (``vccc verify --field-audit``, :mod:`vccc_jax.verify.field_audit`).

Each problem of a ``vccc verify`` group keeps its MDP, critic and baselines; its policy
becomes the end of an exact natural-policy-gradient history started at the problem's own
logits: pi_{k+1} ∝ pi_k exp(eta A^{pi_k}) (in logits, theta_{k+1} = theta_k + eta T A^{pi_k}),
k = 0 .. H - 1. The learner is pi_H; the behaviour at lag L is pi_{H - L}, the same for
every version of the problem (so every row of a check sees exactly that lag). The history
(H = :data:`HORIZON`, eta = :data:`STEP`) is the one ``docs/actor_map.md`` uses for its
lag axis, on the verify problems.

A lag law (``--lag-law``, :func:`law_maker`) keeps one version per lag of its support, built
the same way (pi_{H - L}), with P(L) in the problem's ``mix``: the actor and sequence
contracts then check the P(L)-weighted sum of the per-version expectations (each sample
carries its own behaviour log-prob), so ``fixed:L`` is lag L.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

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
    """Mean over states of KL(pi || mu) for the stalest version (the lag's distance); for a lag
    law's problem the P(L)-weighted KL over its versions. []"""
    per = jnp.sum(p.pi[None] * (jnp.log(p.pi)[None] - jnp.log(p.mus)), -1)  # [K, S]
    return jnp.mean(jnp.sum(p.mix * per, 0)) if p.law else jnp.mean(per[-1])


_MAKERS: dict = {}


def maker(lag: int):
    """``make(key, group) -> Problem``: the verify problems of ``runner.make_problems_jit``
    at ``lag`` (:func:`lagged`), one compiled function per lag (``user.check_all(make=)``)."""
    if lag not in _MAKERS:
        _MAKERS[lag] = _maker(jax.vmap(lambda p: lagged(p, lag)), lag)
    return _MAKERS[lag]


def _maker(shift, tag):
    from vccc_jax.verify.compile import fast_jit
    from vccc_jax.verify.runner import make_problems_jit

    shift = fast_jit(shift)

    def make(key, group):
        return shift(make_problems_jit(key, group))

    make.lag = tag  # the group contract (verify.group) reads the lag (or the law's text)
    return make


def make_for(lag):
    """:func:`maker` for an int lag, :func:`law_maker` for a law's text."""
    return maker(lag) if isinstance(lag, int) else law_maker(lag)


# ------------------------------------------------------------------------------ lag laws


@dataclasses.dataclass(frozen=True)
class Law:
    """A ``vccc train --lag`` law on the versions this history holds (lags 0..HORIZON):
    ``lags`` its support (P > 0, ascending), ``probs`` P(L) there, ``trainer_k`` the ring the
    trainer keeps for it (``LagLaw.default_num_versions``) and ``cut`` the mass of the trainer's
    law beyond lag HORIZON, truncated and renormalised away (0 for a bounded law)."""

    text: str
    lags: tuple
    probs: tuple
    trainer_k: int
    cut: float

    @property
    def mean(self) -> float:
        return float(np.dot(self.lags, self.probs))

    def describe(self) -> str:
        """One line: the law, its mean, its support and where it is truncated."""
        lo, hi = self.lags[0], self.lags[-1]
        support = (f"{{{', '.join(map(str, self.lags))}}}" if len(self.lags) <= 4 or hi - lo + 1 != len(self.lags)
                   else f"{lo}..{hi}") + f" ({len(self.lags)} lag{'s' if len(self.lags) > 1 else ''})"
        trunc = (f"truncated at K = {HORIZON + 1} versions (lags 0..{HORIZON}, the history's length; the trainer "
                 f"keeps K = {self.trainer_k}, and {self.cut:.2%} of its law lies beyond lag {HORIZON}, renormalised "
                 "away)" if self.cut > 0 else f"no truncation (K = {HORIZON + 1} versions hold it)")
        return f"lag law `{self.text}`: mean lag {self.mean:.3g}, support {support}; {trunc}"


def parse_law(text: str) -> Law:
    """The :class:`Law` of a ``vccc train --lag`` string (``trace:@file`` read as its histogram);
    ValueError (one line) for a bad law or one that needs a lag beyond HORIZON."""
    from vccc_jax.envs.lag import LagLaw

    law = LagLaw.parse(text)
    bound = law.max_lag()
    if bound is not None and bound > HORIZON:
        raise ValueError(f"{law} reaches lag {bound}: the audit's behaviour versions are the {HORIZON + 1} steps of "
                         f"a {HORIZON}-step history (lags 0..{HORIZON})")
    k = max(law.default_num_versions(), HORIZON + 1)
    full = law.pmf(k)
    pmf = law.pmf(HORIZON + 1)
    lags = tuple(int(x) for x in np.flatnonzero(pmf > 0))
    return Law(str(text), lags, tuple(float(pmf[x]) for x in lags), law.default_num_versions(),
               float(np.sum(full[HORIZON + 1:])))


def lagged_law(p: Problem, law: Law, steps: int = HORIZON, eta: float = STEP) -> Problem:
    """The problem with learner pi_steps and one behaviour version per lag of the law's support,
    pi_{steps - L} (as :func:`lagged`), P(L) in ``mix`` and ``law`` set (the contracts then
    check the P(L)-weighted expectation)."""
    thetas = history(p, steps, eta)
    pi = softmax_policy(thetas[-1], TEMPERATURE)
    mus = softmax_policy(thetas[steps - jnp.asarray(law.lags)], TEMPERATURE)
    mix = jnp.broadcast_to(jnp.asarray(law.probs, pi.dtype)[:, None], mus.shape[:2])
    return p.replace(logits=thetas[-1], pi=pi, mus=mus, mix=mix, law=True)


def law_maker(text: str):
    """``make(key, group) -> Problem`` under a lag law (:func:`lagged_law`); ``make.lag`` the
    law's text (the group contract draws each slot's version from it), ``make.law`` the
    :class:`Law`. ValueError (one line) as :func:`parse_law`."""
    law = parse_law(text)
    if ("law", law) not in _MAKERS:
        _MAKERS["law", law] = _maker(jax.vmap(lambda p: lagged_law(p, law)), text)
        _MAKERS["law", law].law = law
    return _MAKERS["law", law]
