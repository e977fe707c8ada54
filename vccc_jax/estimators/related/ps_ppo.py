"""PS-PPO: prefix-sampling critic-free PPO, and its GRPO-style reference (related_abstracts.txt #3).

The abstract: "PS-PPO introduces a prompt-conditioned cutoff distribution and samples a cutoff
timestep for each trajectory. During the update pass, PS-PPO backpropagates only through the
sampled prefix of each trajectory and applies an importance-weighting correction so that the
resulting truncated gradient estimator remains unbiased with respect to the full-trajectory
objective." (issue 14; DESIGN.md §5.)

How we read it where it leaves a choice open
--------------------------------------------
* **Cutoff = number of kept steps.** Per trajectory a cutoff T in {1, ..., H} is drawn and the
  steps t = 0 .. T-1 (position in the sequence, tool steps included) are kept. Step t is kept
  with probability S(t) = P(T > t) (the survival function; S(0) = 1), and a kept step's
  contribution is multiplied by 1 / S(t). Since E_T[1[T > t] / S(t)] = 1 for every t with
  S(t) > 0, the expectation over T of the prefix estimator equals the full-trajectory
  estimator *for every trajectory* (hence for any per-trajectory advantage, any PPO clip and
  any per-trajectory normalisation). Steps with S(t) = 0 are never kept: the estimator is
  unbiased only if no trajectory lives that long (a law with a full-length atom avoids this).
* **Independence.** T is drawn independently of the trajectory's actions given the prompt.
  "Prompt-conditioned" = the law's length scale L_p is a per-prompt number known before the
  batch (in our trainer: a running mean of that prompt's episode lengths from earlier batches).
  A law fitted to the current trajectory's own length would make T depend on the actions and
  break the identity above (not offered).
* **Laws** (``CutoffLaw.parse``): ``full`` (T = H: the GRPO reference), ``uniform`` (T uniform
  on {1..ceil(L_p)}: S(t) = (L - t) / L; weights up to L; steps >= L never kept),
  ``mixture:eps`` (with probability eps T = H, else uniform: S(t) = eps + (1 - eps)(L - t)^+/L;
  weights <= 1/eps; always unbiased), ``geometric:q`` (S(t) = q^t: P(T > t | T > t-1) = q,
  truncated at H; weights q^-t, variance growing exponentially in the length).
* **Normalisation.** A trajectory's loss is the SUM over its kept steps (each weighted), divided
  by a per-trajectory constant (its live length for GRPO's token mean, or 1); never by the
  number of kept steps, which is random and would bias the estimator.
* **GRPO reference.** Advantage of a trajectory = its return normalised within its prompt's
  group of G rollouts, (R - mean_g R) / (std_g R + eps) (``group_advantages``), the same for
  every token; PPO's clipped surrogate on pi/mu per token. PS-PPO = the same loss with the
  prefix weights.
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators.importance import safe_ratios

Array = chex.Array
LAW_KINDS = ("full", "uniform", "mixture", "geometric")


@dataclasses.dataclass(frozen=True)
class CutoffLaw:
    """A prompt-conditioned cutoff law (see the module docstring); ``param``: eps or q."""

    kind: str = "full"
    param: float = 0.0

    def __post_init__(self):
        if self.kind not in LAW_KINDS:
            raise ValueError(f"cutoff law kind must be one of {LAW_KINDS}, got {self.kind!r}")
        if self.kind == "mixture" and not 0.0 < self.param <= 1.0:
            raise ValueError(f"cutoff law mixture:{self.param}: eps must be in (0, 1]")
        if self.kind == "geometric" and not 0.0 < self.param <= 1.0:
            raise ValueError(f"cutoff law geometric:{self.param}: q must be in (0, 1]")

    @classmethod
    def parse(cls, text: "str | CutoffLaw") -> "CutoffLaw":
        """``"full"``, ``"uniform"``, ``"mixture:0.2"``, ``"geometric:0.9"``."""
        if isinstance(text, CutoffLaw):
            return text
        kind, _, arg = str(text).strip().partition(":")
        try:
            return cls(kind.lower(), float(arg) if arg else 0.0)
        except ValueError as err:
            raise ValueError(f"cutoff law {text!r}: {err}") from None

    def __str__(self) -> str:
        return self.kind if self.kind in ("full", "uniform") else f"{self.kind}:{self.param:g}"

    @property
    def always_unbiased(self) -> bool:
        """True if S(t) > 0 for every t < H whatever the length scale."""
        return self.kind != "uniform"

    def survival(self, lengths: Array, horizon: int) -> Array:
        """S(t) = P(T > t), t = 0..H-1, for length scales ``lengths`` [...] -> [..., H]."""
        t = jnp.arange(horizon, dtype=jnp.result_type(float))
        lengths = jnp.asarray(lengths, t.dtype)[..., None]
        t = t.reshape((1,) * (lengths.ndim - 1) + (horizon,))
        shape = lengths.shape[:-1] + (horizon,)
        if self.kind == "full":
            return jnp.ones(shape, t.dtype)
        if self.kind == "geometric":
            return jnp.broadcast_to(jnp.asarray(self.param, t.dtype) ** t, shape)
        big_l = jnp.clip(jnp.ceil(lengths), 1.0, horizon)
        uni = jnp.maximum(big_l - t, 0.0) / big_l
        if self.kind == "uniform":
            return uni
        return self.param + (1.0 - self.param) * uni

    def pmf(self, lengths: Array, horizon: int) -> Array:
        """P(T = k), k = 1..H -> [..., H] (index k - 1); the mass beyond H sits on T = H."""
        s = self.survival(lengths, horizon)
        nxt = jnp.concatenate([s[..., 1:], jnp.zeros_like(s[..., :1])], axis=-1)
        return s - nxt


def sample_cutoffs(key: Array, survival: Array) -> Array:
    """T = #{t : S(t) > u}, u ~ U(0, 1): P(T > t) = S(t) for a non-increasing S with S(0) = 1.
    survival [..., H] -> int32 [...] in {1..H} (0 only if S(0) < 1)."""
    u = jax.random.uniform(key, survival.shape[:-1], survival.dtype)
    return jnp.sum(survival > u[..., None], axis=-1).astype(jnp.int32)


def prefix_weights(cutoffs: Array, survival: Array, alive: Array | None = None) -> Array:
    """w_t = 1[t < T] / S(t) (times ``alive``): the importance weights of the kept prefix.
    Time-major: cutoffs [B], survival [T, B] (``law.survival(...).T``), alive [T, B] -> [T, B]."""
    chex.assert_rank(survival, 2)
    t = jnp.arange(survival.shape[0])[:, None]
    keep = (t < cutoffs[None, :]) & (survival > 0)  # S = 0 steps are never kept
    w = jnp.where(keep, 1.0 / jnp.where(keep, survival, 1.0), 0.0)
    return w if alive is None else w * alive


def group_advantages(returns: Array, *, normalize: bool = True, eps: float = 1e-6) -> Array:
    """GRPO's group baseline: (R - mean_g R) / (std_g R + eps) within each group. [N, G]"""
    chex.assert_rank(returns, 2)
    centred = returns - jnp.mean(returns, axis=-1, keepdims=True)
    if not normalize:
        return centred
    return centred / (jnp.std(returns, axis=-1, keepdims=True) + eps)


def ppo_token_loss(log_pi: Array, log_mu: Array, advantages: Array, weights: Array, *,
                   clip_eps: float | None = 0.2) -> Array:
    """Per-token clipped surrogate weighted by ``weights`` (prefix weights x live mask x any
    per-trajectory normalisation): -sum_t w_t min(r A, clip(r) A), summed over time, [B].
    ``advantages`` broadcast against log_pi (e.g. [1, B] for sequence-level)."""
    chex.assert_equal_shape([log_pi, log_mu, weights])
    ratio = safe_ratios(log_pi - jax.lax.stop_gradient(log_mu))  # 0 for -inf / +inf / NaN
    surr = ratio * advantages
    if clip_eps is not None:
        surr = jnp.minimum(surr, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)
    return -jnp.sum(weights * surr, axis=0)


def kept_fraction(weights: Array, alive: Array) -> Array:
    """Share of live steps that are backpropagated (weights > 0)."""
    return jnp.sum((weights > 0) & (alive > 0)) / jnp.maximum(jnp.sum(alive > 0), 1)


def expected_kept(law: CutoffLaw, lengths: Array, horizon: int, alive: Array) -> Array:
    """E_T[#kept live steps] = sum_t S(t) alive_t. lengths [B], alive [T, B] -> [B]."""
    return jnp.sum(law.survival(lengths, horizon).T * alive, axis=0)


def capacity_for(law: CutoffLaw, horizon: int, num_sequences: int, slack: float = 1.25) -> int:
    """A static token budget for packing the kept steps of ``num_sequences`` sequences at the
    worst-case length scale H: slack x E[kept] (all of them for ``full``)."""
    if law.kind == "full":
        return horizon * num_sequences
    mean_kept = float(jnp.sum(law.survival(jnp.asarray(float(horizon)), horizon)))
    return min(horizon * num_sequences, int(math.ceil(slack * mean_kept * num_sequences)))
