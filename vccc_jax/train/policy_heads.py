"""The actor's distribution, one object per action type (issue 31; DESIGN.md Sec 8,
"Policies"): the network's output -> a distrax distribution. Everything downstream of a head
needs only ``log_prob``, ``sample`` and ``entropy``.

* :class:`CategoricalHead`: logits [..., A] -> ``distrax.Categorical``.
* :class:`GaussianHead`: (mean, log_std) [..., m] -> ``distrax.MultivariateNormalDiag``, or,
  with ``squash=True``, that Gaussian pushed through ``low + (high - low) (tanh(u) + 1) / 2``
  (``distrax.Transformed`` with a ``Block``-ed chain, so ``log_prob`` carries the log-det
  correction -sum log|d a / d u|). ``noise_scale`` != 1 is the continuous analogue of a
  sampler mismatch: the behaviour samples from std * noise_scale, and the log-prob logged is
  that of the distribution really sampled (:meth:`GaussianHead.behaviour`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import distrax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class CategoricalHead:
    """Discrete actions: logits -> Categorical."""

    def dist(self, logits) -> distrax.Distribution:
        return distrax.Categorical(logits=logits)

    def behaviour(self, logits) -> distrax.Distribution:
        return self.dist(logits)


@dataclasses.dataclass(frozen=True)
class GaussianHead:
    """Continuous actions: (mean, log_std) -> diagonal Gaussian, optionally tanh-squashed into
    [low, high] (scalars or [m] tuples; both required with ``squash``)."""

    squash: bool = False
    low: Optional[tuple] = None
    high: Optional[tuple] = None
    noise_scale: float = 1.0

    def __post_init__(self):
        if self.squash and (self.low is None or self.high is None):
            raise ValueError("GaussianHead: squash=True needs low and high")
        if not self.noise_scale > 0:
            raise ValueError(f"GaussianHead: noise_scale must be > 0, got {self.noise_scale}")

    def raw(self, out, scale: float = 1.0) -> distrax.MultivariateNormalDiag:
        """The Gaussian of the pre-squash action u (std x ``scale``). Trainers sample and
        score u: the squash's log-det is the same for pi and mu, so log-ratios on u equal
        those on a, and scoring u avoids atanh at the box edges in float32."""
        mean, log_std = out
        return distrax.MultivariateNormalDiag(loc=mean, scale_diag=jnp.exp(log_std) * scale)

    def _bijector(self, dtype):
        low = jnp.asarray(self.low, dtype)
        high = jnp.asarray(self.high, dtype)
        affine = distrax.ScalarAffine(shift=(high + low) / 2, scale=(high - low) / 2)
        return distrax.Block(distrax.Chain([affine, distrax.Tanh()]), 1)

    def squash_action(self, u):
        """a = low + (high - low) (tanh(u) + 1) / 2 (identity without ``squash``)."""
        return self._bijector(u.dtype).forward(u) if self.squash else u

    def _build(self, out, scale: float) -> distrax.Distribution:
        base = self.raw(out, scale)
        if not self.squash:
            return base
        return distrax.Transformed(base, self._bijector(out[0].dtype))

    def dist(self, out) -> distrax.Distribution:
        """The learner's policy pi(.|s)."""
        return self._build(out, 1.0)

    def behaviour(self, out) -> distrax.Distribution:
        """The distribution the rollout really samples from (std x ``noise_scale``)."""
        return self._build(out, self.noise_scale)
