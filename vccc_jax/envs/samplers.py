"""Behaviour samplers that log what they actually sample from (issue 12; Sec 6, Sec 7).

A sampler turns one logits row [..., V] into the distribution tokens are drawn from,

    logits -> inference mismatch -> hard mask -> temperature -> top-k -> top-p | greedy

(the Hugging Face order), and :func:`sample` returns the token AND the log-probability of
that very distribution, which is what the write-up says must be logged as log mu (Sec 1.4,
Sec 7); :func:`raw_log_probs` is what a buggy pipeline logs instead (the negative control).

* temperature tau: mu ∝ exp(z / tau).
* top-k: keep the k tokens with the largest (tempered) logits (``lax.top_k``: no sort of
  the row).
* top-p (nucleus): sort the row once (O(V log V)) and keep the smallest prefix of most
  likely tokens with mass >= p (a token is kept when the mass strictly before it in the
  sorted order is < p; at least one token).
* ties (``SamplerSpec.ties``): ``"position"`` (default) cuts both filters by position in a
  stable descending order, so of tokens tied at the k-th logit or at the top-p crossing
  the lower token ids are kept (exactly k tokens for top-k). That is what the engines do
  for top-p (vLLM's ``apply_top_k_top_p`` and SGLang's torch sampler keep a prefix of the
  sorted row; Hugging Face's ``TopPLogitsWarper`` too) and SGLang does for top-k (its sorted
  row is cut at index k); note vLLM's and Hugging Face's top-k keep every token tied with
  the k-th logit, i.e. ``"value"``. Which tied tokens an engine keeps depends on its sort
  (torch's default sort is not stable); ours is the stable order (``lax.top_k`` and
  ``argsort(stable=True)`` put the lower index first). ``"value"`` keeps every token whose
  logit equals the one at the cut (the older behaviour: p = 0.8 on probabilities
  (1/2, 1/4, 1/8, 1/8) keeps 4 tokens where the position cut keeps 3).
* greedy: a point mass on the argmax (lowest index on ties); log mu = 0 there.
* hard mask: a boolean [..., V] of allowed tokens (at least one per row).
* inference mismatch: the inference engine's logits differ from the trainer's pi_old of
  the same version: "bf16" (round to bfloat16), "int8" (symmetric per-row int8
  quantisation, scale max|z| / 127), "noise" (z + scale * N(0, 1), needs a key). The
  logged log mu is that of the mismatched distribution; the trainer's pi_old is clean.

Nothing here is V x V: every op is elementwise on the row, one ``lax.top_k`` or one sort.

Diagnostics: :func:`support_violation_mass` (pi mass on tokens mu cannot emit), and Z(s) /
m_w(s) from a top-k summary of mu plus the tail model of ``estimators.actor``
(:func:`expected_weight_topk`, :func:`z_topk`, :func:`m_w_topk`), each returned with the
exact value so the tail-model error is measured (Sec 5.2, Sec 7). With ``support_size`` (the
sampler's support size n_s, :func:`support_size`: what an engine logs after its top-k / top-p
filter) the tail lives on the n_s - k most likely remaining tokens only (support-aware).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.actor import (
    behaviour_support_size,
    centering_coefficients_topk,
    centering_term,
    centering_term_topk,
)
from vccc_jax.estimators.importance import expected_weight, importance_weights

Array = chex.Array
MISMATCH_KINDS = ("none", "bf16", "int8", "noise")
TIE_RULES = ("position", "value")


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """A behaviour sampler (static config). ``top_k=0`` / ``top_p=1`` disable those filters."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    mismatch: str = "none"
    mismatch_scale: float = 0.0
    ties: str = "position"

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.mismatch not in MISMATCH_KINDS:
            raise ValueError(f"mismatch must be one of {MISMATCH_KINDS}, got {self.mismatch!r}")
        if self.mismatch == "noise" and not self.mismatch_scale > 0:
            raise ValueError("mismatch='noise' needs mismatch_scale > 0")
        if self.ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {TIE_RULES}, got {self.ties!r}")

    @classmethod
    def parse(cls, text: str) -> "SamplerSpec":
        """From ``"temperature=0.7,top_k=50,top_p=0.9,greedy=0,mismatch=bf16,ties=value"`` (any
        subset; "" gives the plain sampler). Aliases: temp, k, p."""
        alias = {"temp": "temperature", "k": "top_k", "p": "top_p", "scale": "mismatch_scale"}
        kwargs = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            if "=" not in item:
                raise ValueError(f"sampler spec item {item!r} must look like name=value")
            name, value = (x.strip() for x in item.split("=", 1))
            name = alias.get(name, name)
            if name in ("temperature", "top_p", "mismatch_scale"):
                kwargs[name] = float(value)
            elif name == "top_k":
                kwargs[name] = int(value)
            elif name == "greedy":
                kwargs[name] = value.lower() in ("1", "true", "yes")
            elif name in ("mismatch", "ties"):
                kwargs[name] = value
            else:
                raise ValueError(f"unknown sampler field {name!r}")
        return cls(**kwargs)

    @property
    def needs_key(self) -> bool:
        return self.mismatch == "noise"


def mismatch_logits(logits: Array, spec: SamplerSpec, key: Optional[Array] = None) -> Array:
    """The inference engine's logits for the trainer's ``logits`` (same version)."""
    if spec.mismatch == "none":
        return logits
    if spec.mismatch == "bf16":
        return logits.astype(jnp.bfloat16).astype(logits.dtype)
    if spec.mismatch == "int8":
        scale = jnp.max(jnp.abs(logits), axis=-1, keepdims=True) / 127.0
        scale = jnp.where(scale > 0, scale, 1.0)
        return jnp.round(logits / scale) * scale
    if key is None:
        raise ValueError("mismatch='noise' needs a key")
    return logits + spec.mismatch_scale * jax.random.normal(key, logits.shape, logits.dtype)


def _top_k_keep(z: Array, k: int, ties: str) -> Array:
    """Tokens kept by top-k, boolean [..., V]: the k largest (ties at the k-th logit: lower
    ids, ``"position"``; all of them, ``"value"``). One ``lax.top_k``, no sort."""
    values, ids = jax.lax.top_k(z, k)  # lower index first among equal values
    if ties == "value":
        return z >= values[..., -1:]
    none = jnp.zeros(z.shape, bool)
    return jnp.put_along_axis(none, ids, jnp.ones((), bool), axis=-1, inplace=False)


def _top_p_keep(z: Array, p: float, ties: str) -> Array:
    """Tokens kept by top-p, boolean [..., V]: the shortest prefix of the stable descending
    order whose mass reaches p (at least one token); ``"value"`` also keeps every token tied
    with the last one kept. One sort of the row."""
    order = jnp.argsort(-z, axis=-1, stable=True)  # descending, lower id first among ties
    srt = jnp.take_along_axis(z, order, axis=-1)
    probs = jax.nn.softmax(srt, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum(before < p, axis=-1, keepdims=True), 1)
    if ties == "value":
        return z >= jnp.take_along_axis(srt, n_keep - 1, axis=-1)
    rank = jnp.arange(z.shape[-1]).reshape((1,) * (z.ndim - 1) + (-1,))
    in_prefix = rank < n_keep  # [..., V] in sorted order
    return jnp.put_along_axis(jnp.zeros(z.shape, bool), order, in_prefix, axis=-1, inplace=False)


def sampler_log_probs(
    logits: Array, spec: SamplerSpec, mask: Optional[Array] = None, key: Optional[Array] = None
) -> Array:
    """log mu(.|s) [..., V] of the distribution the sampler draws from (-inf off support)."""
    z = mismatch_logits(logits, spec, key)
    if mask is not None:
        chex.assert_equal_shape([z, mask])
        z = jnp.where(mask, z, -jnp.inf)
    if spec.greedy:
        best = jnp.argmax(z, axis=-1)[..., None]
        ids = jnp.arange(z.shape[-1]).reshape((1,) * (z.ndim - 1) + (-1,))
        return jnp.where(ids == best, 0.0, -jnp.inf).astype(logits.dtype)
    z = z if spec.temperature == 1.0 else z / spec.temperature
    if 0 < spec.top_k < z.shape[-1]:
        z = jnp.where(_top_k_keep(z, spec.top_k, spec.ties), z, -jnp.inf)
    if spec.top_p < 1.0:
        z = jnp.where(_top_p_keep(z, spec.top_p, spec.ties), z, -jnp.inf)
    return jax.nn.log_softmax(z, axis=-1)


def raw_log_probs(logits: Array) -> Array:
    """log_softmax(raw logits): what a pipeline that ignores its sampler logs (Sec 7 control)."""
    return jax.nn.log_softmax(logits, axis=-1)


class Sample(NamedTuple):
    """token [...]: the sampled token; log_prob [...]: log mu(token); log_probs [..., V]:
    the whole sampling distribution (for Z(s), m_w, support diagnostics)."""

    token: Array
    log_prob: Array
    log_probs: Array


def sample(
    key: Array, logits: Array, spec: SamplerSpec, mask: Optional[Array] = None
) -> Sample:
    """Draw a token from the sampler and return it with the log-prob actually sampled from."""
    k_noise, k_draw = jax.random.split(key)
    log_mu = sampler_log_probs(logits, spec, mask, k_noise if spec.needs_key else None)
    token = jax.random.categorical(k_draw, log_mu, axis=-1).astype(jnp.int32)
    log_prob = jnp.take_along_axis(log_mu, token[..., None], axis=-1)[..., 0]
    return Sample(token, log_prob, log_mu)


# ------------------------------------------------------------------------- diagnostics


def support_violation_mass(log_pi_all: Array, log_mu_all: Array) -> Array:
    """sum_a pi(a|s) 1[mu(a|s) = 0], [...]: the pi mass the sampler can never emit (Sec 7)."""
    chex.assert_equal_shape([log_pi_all, log_mu_all])
    return jnp.sum(jnp.where(jnp.isneginf(log_mu_all), jnp.exp(log_pi_all), 0.0), axis=-1)


def support_size(log_mu_all: Array) -> Array:
    """n_s [...]: how many tokens the sampler kept (finite log mu), logged next to the top-k
    summary (``estimators.actor.behaviour_support_size``)."""
    return behaviour_support_size(log_mu_all)


def topk_summary(log_mu_all: Array, k: int) -> tuple[Array, Array]:
    """(top-k log mu [..., k], their token ids [..., k]) — what a pipeline logs per token."""
    return jax.lax.top_k(log_mu_all, k)


def expected_weight_topk(
    log_pi_all: Array, topk_log_mu: Array, topk_ids: Array, *, kind: str, clip: Optional[float],
    support_size: Optional[Array] = None, max_support: Optional[int] = None,
) -> Array:
    """Z(s) = E_mu[w | s] from a top-k summary of mu plus the tail model of
    ``actor.centering_term_topk`` (the unlogged mass 1 - sum_topk mu is spread over the tail
    tokens in proportion to pi, so they share the ratio tail_pi / tail_mu). Tail: every other
    token (``support_size`` None; O(k) per row beyond reading pi at the top-k ids), or the
    n_s - k others pi ranks highest (``support_size`` = n_s [...]; the sum of
    ``actor.centering_coefficients_topk``, O(V + k) plus its ranking). Exact when the
    summary covers mu's support."""
    chex.assert_equal_shape([topk_log_mu, topk_ids])
    if support_size is not None:
        top, tail = centering_coefficients_topk(
            log_pi_all, topk_log_mu, topk_ids, kind=kind, clip=clip,
            support_size=support_size, max_support=max_support)
        return jnp.sum(top, axis=-1) + jnp.sum(tail, axis=-1)
    top_pi = jnp.take_along_axis(log_pi_all, topk_ids, axis=-1)
    mu_top = jnp.exp(topk_log_mu)
    top = jnp.sum(jnp.where(mu_top > 0, mu_top * importance_weights(top_pi - topk_log_mu, kind, clip), 0.0), -1)
    tail_mu = jnp.clip(1.0 - jnp.sum(mu_top, axis=-1), 0.0, 1.0)
    tail_pi = jnp.clip(1.0 - jnp.sum(jnp.exp(top_pi), axis=-1), 0.0, 1.0)
    safe = (tail_mu > 0) & (tail_pi > 0)
    log_rho_tail = jnp.log(jnp.where(safe, tail_pi, 1.0)) - jnp.log(jnp.where(safe, tail_mu, 1.0))
    return top + jnp.where(safe, tail_mu * importance_weights(log_rho_tail, kind, clip), 0.0)


def z_topk(
    log_pi_all: Array, log_mu_all: Array, k: int, *, kind: str = "truncate", clip: Optional[float] = 1.0,
    support_size: Optional[Array] = None,
) -> tuple[Array, Array]:
    """(Z(s) from the top-k summary + tail model, exact Z(s)) [...] each (Sec 4.2, Sec 7).
    ``support_size``: n_s [...] (e.g. :func:`support_size` of ``log_mu_all``) for the
    support-aware tail, None for the tail over all other tokens."""
    ids_lp, ids = topk_summary(log_mu_all, k)
    approx = expected_weight_topk(log_pi_all, ids_lp, ids, kind=kind, clip=clip,
                                  support_size=support_size)
    return approx, expected_weight(log_pi_all, log_mu_all, kind=kind, clip=clip)


def m_w_topk(
    logits_pi: Array, log_mu_all: Array, k: int, *, kind: str = "truncate", clip: Optional[float] = 1.0,
    support_size: Optional[Array] = None,
) -> tuple[Array, Array]:
    """(m_w(s) from the top-k summary + tail model, exact m_w(s)), each [..., V]: the
    gradient of the centering term with respect to the policy logits z, i.e.
    m_w = E_mu[w grad_z log pi] = mu w - Z pi for a softmax policy (Sec 5.2, Eq 13).
    ``support_size`` as in :func:`z_topk`. (Diagnostic, by autodiff; the trainer uses the
    closed forms of ``train.learner``.)"""
    ids_lp, ids = topk_summary(log_mu_all, k)

    def approx_c(z):
        return jnp.sum(centering_term_topk(jax.nn.log_softmax(z, -1), ids_lp, ids, kind=kind, clip=clip,
                                           support_size=support_size))

    def exact_c(z):
        return jnp.sum(centering_term(jax.nn.log_softmax(z, -1), log_mu_all, kind=kind, clip=clip))

    return jax.grad(approx_c)(logits_pi), jax.grad(exact_c)(logits_pi)
