"""The ONE actor-correction table (issue 21): the mirror of ``estimators.registry`` for actors.

Every asynchronous LLM RL system corrects its actor in its own way. Each way is one
:class:`ActorCorrection` row here, under one name, read by the trainer
(``train.actor_weights``), the exact tabular actor (``tabular.exact_actor``), the exact
token-env actor truth (``envs.token_actor_truth``) and ``vccc verify``
(``verify.sections.actor_corrections``). The first rows are ``importance.WEIGHT_KINDS``.

Contract (every row, and any user function checked by the same machinery)::

    w = weight(log_rhos, advantages, *, mask=None, **params)

* ``log_rhos`` [T, ...] time-major: log pi(a_t|s_t) - log mu(a_t|s_t), the log-ratio of the
  policy the update is evaluated at (pi_k; for ``reference="proximal"`` rows the proximal
  policy pi_prox) to the behaviour that sampled a_t. ``advantages`` [T, ...], same shape
  (only their sign is read, and only by ``sign_dependent`` rows). ``mask`` [T, ...] (bool or
  0/1; None = all 1): 1 at tokens that are actions of the sequence (0: tool-observation
  tokens, padding); w is exactly 0 where mask is 0 and masked tokens never enter a
  sequence's ratio nor a batch statistic.
* ``w`` (same shape, float, a stop-gradient constant) is the coefficient on
  grad log pi_theta(a_t|s_t): the row's expected update is

      g = E[ sum_t w_t A_t grad log pi_theta(a_t|s_t) ]                 (docs/method.md A0)

  i.e. the gradient, at theta = the evaluation policy, of the surrogate sum_t sg(w_t) A_t
  log pi_theta(a_t|s_t). How tokens are aggregated (sum per sequence, token mean over the
  batch, GRPO's mean over sequences of per-sequence token means) is the CALLER's choice and
  the same for every row: a row never divides by a length. GSPO's own gradient
  (1/|y|) s_i A_i sum_t u_t is this w (= s_i) under GRPO's aggregation.
* ``level``: ``"token"`` rows are elementwise (any shape, no time axis needed: the exact
  truths evaluate them on [S, A] tables); ``"sequence"`` rows give w constant along a
  sequence up to the advantage sign: a sequence is one column of axis 0 (``starts`` [T, ...]
  bool, True where a new sequence begins, splits a column into several; None = one per
  column); ``"batch"`` rows couple every token of the arrays passed (M2PO).
* ``params``: the row's scalar parameters ((name, default), ...) -- the clip / band
  thresholds; ``data``: array-valued keyword inputs the row also accepts (``starts``;
  ``lags`` for AReaL's staleness cap; ``probs`` / ``threshold`` for M2PO's population mask;
  ``log_mu``, the behaviour's log-probabilities of the tokens, for DPPO's probability band).

:meth:`ActorCorrection.__call__` fills defaults, rejects unknown parameters (ValueError
naming them) and applies the contract's masking; ``row.weight`` is the raw function.

Rows (docs/method.md, section "Actor corrections", gives each equation and citation):
none, ratio, truncate (token TIS), mask (symmetric MIS), icepop (band [alpha, beta]),
seq_tis, seq_mis, gspo, topr, topr_token, cispo, ppo, areal, m2po; from verl's policy-loss
registry (issue 29, ``estimators.actor_rows_verl``): geo_mean (GMPO), sapo, dppo_tv, dppo_kl
(alias gpg = none; clip_cov, kl_cov, dro and bypass_mode: that module's docstring).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import checks
from vccc_jax.estimators.actor_rows_verl import (
    dppo_kl_weight,
    dppo_tv_weight,
    geo_mean_weight,
    sapo_weight,
)
from vccc_jax.estimators.actor_stats import (
    band,
    geometric_mean_log_ratio,
    mask_on,
    ppo_keep,
    second_moment_keep,
    second_moment_threshold,
    sequence_log_ratio,
    sequence_sum,
    threshold_keep,
)
from vccc_jax.estimators.importance import WEIGHT_KINDS, safe_ratios

Array = chex.Array
sg = jax.lax.stop_gradient
WeightFn = Callable[..., Array]

LEVELS = ("token", "sequence", "batch")
REFERENCES = ("behaviour", "proximal")
DATA_INPUTS = ("starts", "lags", "probs", "threshold", "log_mu")
# Short names practitioners use for the first rows (the trainer's ``actor`` accepts them).
ALIASES = {"is": "ratio", "tis": "truncate", "mis": "mask",
           "gpg": "none"}  # verl's gpg loss is -A log pi: w = 1 (GPG is its advantage estimator)


@dataclasses.dataclass(frozen=True)
class ActorCorrection:
    """One row of the actor-correction table.

    name: canonical key. description: one line for tables and legends.
    level: ``token`` | ``sequence`` | ``batch`` (module docstring).
    weight: ``weight(log_rhos, advantages, *, mask=None, **params) -> w`` (module docstring).
    params: ((name, default), ...) scalar parameters (clip / band thresholds).
    data: array-valued keyword inputs the weight accepts beyond ``mask``.
    sign_dependent: w reads sign(A_t) (PPO / GSPO clip, TOPR's split).
    trust_region: the trainer multiplies the row by its PPO clip of pi_theta / pi_old
      (``TrainConfig.ppo_epsilon``); False for rows that replace the trust region (their own
      clip or mask) or are REINFORCE-style (CISPO, TOPR).
    reference: ``behaviour`` (log_rhos = log pi - log mu) or ``proximal`` (log pi_prox -
      log mu: the decoupled routes, ``estimators.related.decoupled``).
    weight_kind: the ``importance.WEIGHT_KINDS`` kind this row is (None for the new rows):
      code that needs Z(s) / m_w from full log-prob rows (score centring) handles these.
    equation: the docs/method.md anchor. citation: the system / paper the row follows.
    """

    name: str
    description: str
    level: str
    weight: WeightFn
    params: tuple = ()
    data: tuple = ()
    sign_dependent: bool = False
    trust_region: bool = True
    reference: str = "behaviour"
    weight_kind: Optional[str] = None
    equation: str = ""
    citation: str = ""

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"actor correction {self.name!r}: level must be one of {LEVELS}, "
                             f"got {self.level!r}")
        if self.reference not in REFERENCES:
            raise ValueError(f"actor correction {self.name!r}: reference must be one of "
                             f"{REFERENCES}, got {self.reference!r}")
        if self.weight_kind is not None and self.weight_kind not in WEIGHT_KINDS:
            raise ValueError(f"actor correction {self.name!r}: weight_kind must be one of "
                             f"{WEIGHT_KINDS} or None, got {self.weight_kind!r}")
        bad = set(self.data) - set(DATA_INPUTS)
        if bad:
            raise ValueError(f"actor correction {self.name!r}: unknown data inputs {sorted(bad)}")

    @property
    def param_names(self) -> tuple:
        return tuple(k for k, _ in self.params)

    def resolve(self, params: Optional[dict] = None) -> dict:
        """The row's scalar parameters: defaults updated by ``params`` (ValueError naming an
        unknown one, or a None left without a default)."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            raise ValueError(f"actor correction {self.name!r} takes parameters "
                             f"{list(self.param_names)}, got unknown {unknown}")
        out = dict(self.params)
        out.update(params)
        _check_params(self.name, out)
        return out

    def __call__(self, log_rhos: Array, advantages: Array, *, mask: Optional[Array] = None,
                 **kwargs) -> Array:
        """w of the contract (defaults filled, data inputs passed through, w = 0 off mask)."""
        data = {k: kwargs.pop(k) for k in list(kwargs) if k in DATA_INPUTS}
        bad = sorted(set(data) - set(self.data))
        if bad:
            raise ValueError(f"actor correction {self.name!r} takes data inputs "
                             f"{list(self.data)}, got {bad}")
        chex.assert_type(log_rhos, float)
        chex.assert_equal_shape([log_rhos, advantages])
        if mask is not None:
            chex.assert_equal_shape([log_rhos, mask])
        w = self.weight(log_rhos, advantages, mask=mask, **self.resolve(kwargs), **data)
        if mask is not None:
            w = jnp.where(mask_on(mask), w, 0.0)
        return sg(w.astype(log_rhos.dtype))


ACTOR_CORRECTIONS: dict[str, ActorCorrection] = {}


def register_actor_correction(spec: ActorCorrection, *, overwrite: bool = False) -> ActorCorrection:
    """Add a row to :data:`ACTOR_CORRECTIONS` (a comparator registers itself this way)."""
    if spec.name in ACTOR_CORRECTIONS and not overwrite:
        raise ValueError(f"actor correction {spec.name!r} is already registered")
    ACTOR_CORRECTIONS[spec.name] = spec
    return spec


def get_actor_correction(name: str) -> ActorCorrection:
    """The row ``name`` (or an alias of ``ALIASES``); ValueError listing the names otherwise."""
    name = ALIASES.get(name, name)
    if name not in ACTOR_CORRECTIONS:
        raise ValueError(f"actor correction must be one of {sorted(ACTOR_CORRECTIONS)} "
                         f"(aliases {sorted(ALIASES)}), got {name!r}")
    return ACTOR_CORRECTIONS[name]


# ----------------------------------------------------------------------------- helpers


def _check_params(name: str, p: dict) -> None:
    """Static checks of concrete parameter values; ValueError naming the parameter."""
    def num(k):
        v = p.get(k)
        return None if v is None or not checks.is_concrete(v) else float(v)

    def need(cond, k, what):
        if not cond:
            raise ValueError(f"actor correction {name!r}: {k} must be {what}, got {p[k]!r}")

    if num("clip") is not None:
        need(num("clip") >= (1.0 if name == "mask" else 0.0) and num("clip") > 0, "clip",
             ">= 1 (a band [1/clip, clip])" if name == "mask" else "> 0")
    for k in ("tau_pos", "tau_neg"):
        if num(k) is not None:
            need(num(k) > 0, k, "> 0")
    for k in ("alpha", "beta", "tau", "epsilon", "eps_low", "eps_high"):
        if num(k) is not None:
            need(num(k) >= 0, k, ">= 0")
    if num("alpha") is not None and num("beta") is not None:
        need(num("alpha") <= num("beta"), "beta", f">= alpha = {p['alpha']}")
    if name == "cispo" and num("eps_low") is not None:
        need(num("eps_low") <= 1.0, "eps_low", "<= 1 (the lower clip 1 - eps_low >= 0)")
    if num("cap") is not None:
        need(num("cap") > 0, "cap", "> 0 or None")
    if p.get("max_staleness") is not None and checks.is_concrete(p["max_staleness"]):
        need(float(p["max_staleness"]) >= 0, "max_staleness", ">= 0 or None")


# --------------------------------------------------------------------------------- rows


def _none(log_rhos, advantages, *, mask=None):
    return jnp.ones_like(log_rhos)


def _ratio(log_rhos, advantages, *, mask=None):
    return safe_ratios(log_rhos)


def _truncate(log_rhos, advantages, *, mask=None, clip):
    return jnp.minimum(safe_ratios(log_rhos), clip)


def _mask(log_rhos, advantages, *, mask=None, clip):
    rho = safe_ratios(log_rhos)
    return rho * band(rho, 1.0 / clip, clip)


def _icepop(log_rhos, advantages, *, mask=None, alpha, beta):
    rho = safe_ratios(log_rhos)
    return rho * band(rho, alpha, beta)


def _seq_tis(log_rhos, advantages, *, mask=None, clip, starts=None):
    return jnp.minimum(safe_ratios(sequence_log_ratio(log_rhos, mask, starts)), clip)


def _seq_mis(log_rhos, advantages, *, mask=None, alpha, beta, starts=None):
    r = safe_ratios(sequence_log_ratio(log_rhos, mask, starts))
    return r * band(r, alpha, beta)


def _gspo(log_rhos, advantages, *, mask=None, eps_low, eps_high, starts=None):
    s = safe_ratios(geometric_mean_log_ratio(log_rhos, mask, starts))
    return s * ppo_keep(s, advantages, eps_low, eps_high)


def _topr(log_rhos, advantages, *, mask=None, starts=None):
    r = safe_ratios(sequence_log_ratio(log_rhos, mask, starts))
    return jnp.where(advantages >= 0, 1.0, jnp.minimum(r, 1.0))


def _topr_token(log_rhos, advantages, *, mask=None):
    return jnp.where(advantages >= 0, 1.0, jnp.minimum(safe_ratios(log_rhos), 1.0))


def _cispo(log_rhos, advantages, *, mask=None, eps_low, eps_high):
    return jnp.clip(safe_ratios(log_rhos), 1.0 - eps_low, 1.0 + eps_high)


def _ppo(log_rhos, advantages, *, mask=None, epsilon):
    rho = safe_ratios(log_rhos)
    return rho * ppo_keep(rho, advantages, epsilon, epsilon)


def _areal(log_rhos, advantages, *, mask=None, cap, max_staleness, lags=None):
    rho = safe_ratios(log_rhos)
    w = rho if cap is None else jnp.where(rho <= cap, rho, 0.0)
    if max_staleness is not None:
        if lags is None:
            raise ValueError("areal: max_staleness needs the per-token lags (data input 'lags')")
        chex.assert_equal_shape([log_rhos, lags])
        w = jnp.where(lags <= max_staleness, w, 0.0)
    return w


def _m2po(log_rhos, advantages, *, mask=None, tau, probs=None, threshold=None):
    rho = safe_ratios(log_rhos)
    if threshold is not None:
        keep = threshold_keep(log_rhos, *threshold)
    elif probs is not None:
        p = probs if mask is None else jnp.where(mask_on(mask), probs, 0.0)
        keep = threshold_keep(log_rhos, *second_moment_threshold(log_rhos, p, tau))
    else:
        keep = second_moment_keep(log_rhos, tau, mask)
    return rho * keep


_ROWS = (
    # --- importance.WEIGHT_KINDS, the first rows (same numbers as importance_weights)
    ActorCorrection("none", "uncorrected, w = 1", "token", _none, weight_kind="none",
                    equation="A0", citation="-"),
    ActorCorrection("ratio", "exact IS, w = rho (Eq 12)", "token", _ratio, weight_kind="ratio",
                    equation="Eq 12", citation="-"),
    ActorCorrection("truncate", "token TIS vs the inference engine, w = min(rho, c)", "token",
                    _truncate, params=(("clip", 2.0),), weight_kind="truncate",
                    equation="A1", citation="TIS (Yao et al. 2025), as shipped by verl / slime / OpenRLHF"),
    ActorCorrection("mask", "token MIS, w = rho 1[1/c <= rho <= c]", "token", _mask,
                    params=(("clip", 2.0),), weight_kind="mask", equation="A2",
                    citation="MIS (Liu et al. 2025); verl rollout_is mode=mask"),
    # --- the corrections of LLM RL systems (issue 21)
    ActorCorrection("icepop", "IcePop band mask, w = rho 1[alpha <= rho <= beta]", "token",
                    _icepop, params=(("alpha", 0.5), ("beta", 5.0)), equation="A2",
                    citation="IcePop (Ling Team, Ring-1T, 2025)"),
    ActorCorrection("seq_tis", "sequence TIS, w = min(R, c), R = prod_t rho_t", "sequence",
                    _seq_tis, params=(("clip", 2.0),), data=("starts",), equation="A3",
                    citation="verl rollout_is level=sequence; Yao et al. 2025"),
    ActorCorrection("seq_mis", "sequence MIS, w = R 1[alpha <= R <= beta]", "sequence",
                    _seq_mis, params=(("alpha", 0.5), ("beta", 2.0)), data=("starts",),
                    equation="A3", citation="MIS (Liu et al. 2025); verl rollout_is mode=mask"),
    ActorCorrection("gspo", "GSPO, s = R^(1/|y|) clipped per sequence", "sequence", _gspo,
                    params=(("eps_low", 3e-4), ("eps_high", 4e-4)), data=("starts",),
                    sign_dependent=True, trust_region=False, equation="A4",
                    citation="GSPO (Zheng et al. 2025, Qwen)"),
    ActorCorrection("topr", "TOPR, w = 1 if A >= 0 else min(R, 1)", "sequence", _topr,
                    data=("starts",), sign_dependent=True, trust_region=False, equation="A5",
                    citation="TOPR (Le Roux et al. 2025)"),
    ActorCorrection("topr_token", "TOPR per token, w = 1 if A >= 0 else min(rho, 1)", "token",
                    _topr_token, sign_dependent=True, trust_region=False, equation="A5",
                    citation="TOPR (Le Roux et al. 2025), token-level variant"),
    ActorCorrection("cispo", "CISPO, w = sg(clip(rho, 1 - eps_low, 1 + eps_high))", "token",
                    _cispo, params=(("eps_low", 1.0), ("eps_high", 2.0)), trust_region=False,
                    equation="A6", citation="CISPO (MiniMax-M1, 2025)"),
    ActorCorrection("ppo", "PPO clip vs the behaviour, w = rho 1[unclipped]", "token", _ppo,
                    params=(("epsilon", 0.2),), sign_dependent=True, trust_region=False,
                    equation="A7", citation="PPO (Schulman et al. 2017) with pi_old = mu"),
    ActorCorrection("areal", "AReaL decoupled PPO, w = pi_prox / mu (cap, staleness cap)",
                    "token", _areal, params=(("cap", None), ("max_staleness", None)),
                    data=("lags",), reference="proximal", equation="A8",
                    citation="AReaL (Fu et al. 2025)"),
    ActorCorrection("m2po", "M2PO second-moment mask, w = rho M", "batch", _m2po,
                    params=(("tau", 0.04),), data=("probs", "threshold"), trust_region=False,
                    equation="A9", citation="M2PO (Zheng, Zhao & Chen 2025)"),
    # --- verl's policy-loss registry (issue 29; estimators.actor_rows_verl)
    ActorCorrection("geo_mean", "GMPO, w = exp(mean_t clipped log r) 1[unclipped]", "sequence",
                    geo_mean_weight, params=(("eps_low", 0.4), ("eps_high", 0.4)),
                    data=("starts",), sign_dependent=True, trust_region=False, equation="A10",
                    citation="GMPO (Zhao et al. 2025); verl loss_mode=geo_mean"),
    ActorCorrection("sapo", "SAPO soft gate, w = 4 rho sig(x) sig(-x), x = tau (rho - 1)",
                    "token", sapo_weight, params=(("tau_pos", 1.0), ("tau_neg", 1.05)),
                    sign_dependent=True, trust_region=False, equation="A11",
                    citation="SAPO (Gao et al. 2025, Qwen); verl loss_mode=sapo"),
    ActorCorrection("dppo_tv", "DPPO-TV, w = min(rho, c) 1[p - p_mu inside the TV band]", "token",
                    dppo_tv_weight, params=(("eps_low", 0.15), ("eps_high", 0.15), ("clip", 20.0)),
                    data=("log_mu",), sign_dependent=True, trust_region=False, equation="A12",
                    citation="DPPO (arXiv 2602.04879); verl loss_mode=dppo_tv"),
    ActorCorrection("dppo_kl", "DPPO-KL, w = min(rho, c) 1[binary KL inside the band]", "token",
                    dppo_kl_weight, params=(("eps_low", 0.05), ("eps_high", 0.05), ("clip", 20.0)),
                    data=("log_mu",), sign_dependent=True, trust_region=False, equation="A12",
                    citation="DPPO (arXiv 2602.04879); verl loss_mode=dppo_kl"),
)
for _row in _ROWS:
    register_actor_correction(_row)

# The rows that are importance.WEIGHT_KINDS, in that order.
WEIGHT_KIND_ROWS = tuple(r.name for r in _ROWS if r.weight_kind is not None)

__all__ = [
    "ACTOR_CORRECTIONS", "ALIASES", "ActorCorrection", "DATA_INPUTS", "LEVELS", "REFERENCES",
    "WEIGHT_KIND_ROWS", "geometric_mean_log_ratio", "get_actor_correction", "ppo_keep",
    "register_actor_correction", "second_moment_keep", "second_moment_threshold",
    "sequence_log_ratio", "sequence_sum", "threshold_keep",
]
