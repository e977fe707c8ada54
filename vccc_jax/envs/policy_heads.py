"""The actor's distribution, one object per action space (DESIGN.md Sec 8, "Policies"): what
differs between discrete and continuous control lives here, not in the trainer's loop.

A head reads the actor network's output ``out`` [..., P] and works on "rows": the parameters
of one state's distribution as one array [..., P] (the trainer logs, stores and minibatches
them like any other field):

* :class:`CategoricalHead`: logits [..., A] -> rows = log-probabilities [..., A]
  (``distrax.Categorical``); the behaviour rows are those of the sampler really used
  (temperature / top-k: ``samplers.sampler_log_probs``).
* :class:`GaussianHead`: ``out`` = [mean, log_std] [..., 2m] -> rows = the same
  (``distrax.MultivariateNormalDiag`` of the pre-squash action u). The behaviour samples u from
  std x ``noise_scale`` (the continuous analogue of a sampler mismatch) and logs that density.
  The env receives u clipped to the action box (PureJaxRL's ClipAction) or, with ``squash``,
  ``low + (high - low) (tanh(u) + 1) / 2``. Log-ratios are formed on u: the squash's log-det
  is the same for pi and mu, so they equal those on a (and atanh at the box edges in float32
  is avoided); :meth:`GaussianHead.dist` is the distribution of a (``distrax.Transformed``
  with the log-det) for anyone who scores env actions.

Every head has the same methods, so the rollout, learner, targets and metrics call them
without asking which head they hold: ``normalize`` (output -> rows), ``behaviour`` (output ->
the rows really sampled from), ``noise`` / ``sample`` (all randomness drawn before the step
loop), ``log_prob``, ``entropy``, ``kl``, ``env_action``, ``expected_weight`` (Z(s) =
E_mu[w(rho)], Sec 4.2) and ``interpolate`` (A-3PO's proximal policy).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import chex
import distrax
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr

from vccc_jax.envs import samplers
from vccc_jax.estimators import importance

Array = chex.Array

__all__ = ["CategoricalHead", "GaussianHead"]


# heads are static (hashable, no array leaves): a pytree that carries one (``TargetInputs``)
# passes through jit and tree_map untouched
@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class CategoricalHead:
    """Discrete actions: logits -> log-probability rows (temperature / top-k behaviour)."""

    temperature: float = 1.0
    top_k: int = 0
    continuous = False

    def normalize(self, out: Array) -> Array:
        return jax.nn.log_softmax(out, axis=-1)

    def behaviour(self, out: Array) -> Array:
        """log mu(.|s) of the sampler really used (temperature, top-k)."""
        spec = samplers.SamplerSpec(temperature=self.temperature, top_k=self.top_k)
        return samplers.sampler_log_probs(out, spec)

    def noise(self, key: Array, out: jax.ShapeDtypeStruct) -> Array:
        """Gumbel noise of one step's draw: ``argmax(rows + noise)`` is
        ``jax.random.categorical(key, rows)``, bit for bit."""
        return jax.random.gumbel(key, out.shape, out.dtype)

    def sample(self, rows: Array, noise: Array) -> Array:
        return jnp.argmax(rows + noise, axis=-1).astype(jnp.int32)

    def sample_out(self, key: Array, out: Array) -> Array:
        """An action of the unmodified policy (temperature 1) from network outputs."""
        return jax.random.categorical(key, out, axis=-1).astype(jnp.int32)

    def log_prob(self, rows: Array, action: Array) -> Array:
        return jnp.take_along_axis(rows, action[..., None], axis=-1)[..., 0]

    def log_prob_as(self, rows: Array, action: Array, known_rows: Array, known: Array) -> Array:
        """:meth:`log_prob` (a gather: equal rows give equal bits by themselves)."""
        return self.log_prob(rows, action)

    def entropy(self, rows: Array) -> Array:
        return -jnp.sum(jnp.exp(rows) * rows, axis=-1)

    def kl(self, rows_p: Array, rows_q: Array) -> Array:
        """KL(p || q); actions q cannot emit count with log-ratio MAX_LOG_RHO."""
        floor = jnp.maximum(rows_q, rows_p - importance.MAX_LOG_RHO)
        return jnp.sum(jnp.exp(rows_p) * (rows_p - floor), axis=-1)

    def env_action(self, action: Array) -> Array:
        return action

    def expected_weight(self, rows_pi: Array, rows_mu: Array, kind: str, clip) -> Array:
        """Z(s) = sum_a mu(a|s) w(pi(a|s) / mu(a|s)), exactly (``importance.expected_weight``)."""
        return importance.expected_weight(rows_pi, rows_mu, kind=kind, clip=clip)

    def interpolate(self, rows_mu: Array, rows_pi: Array, alpha: Array) -> Array:
        """A-3PO's per-action (1 - alpha) log mu + alpha log pi_k (unnormalised)."""
        return (1.0 - alpha) * rows_mu + alpha * rows_pi

    def dist(self, rows: Array) -> distrax.Distribution:
        return distrax.Categorical(logits=rows)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class GaussianHead:
    """Continuous actions: rows [mean, log_std] [..., 2m] of a diagonal Gaussian over the
    pre-squash action u (module docstring). ``low`` / ``high``: the action box (m-tuples)."""

    low: tuple = (-1.0,)
    high: tuple = (1.0,)
    squash: bool = False
    noise_scale: float = 1.0
    continuous = True

    def __post_init__(self):
        if len(self.low) != len(self.high):
            raise ValueError(f"GaussianHead: low {self.low} and high {self.high} differ in size")
        if not self.noise_scale > 0:
            raise ValueError(f"GaussianHead: noise_scale must be > 0, got {self.noise_scale}")
        if self.squash and not all(map(math.isfinite, self.low + self.high)):
            raise ValueError("GaussianHead: squash=True needs a finite action box")

    @property
    def action_dim(self) -> int:
        return len(self.low)

    @staticmethod
    def split(rows: Array) -> tuple[Array, Array]:
        """(mean, log_std) [..., m] of rows [..., 2m]."""
        m = rows.shape[-1] // 2
        return rows[..., :m], rows[..., m:]

    def normalize(self, out: Array) -> Array:
        return out

    def behaviour(self, out: Array) -> Array:
        """Rows of N(mean, (std x noise_scale)^2): the distribution really sampled."""
        mean, log_std = self.split(out)
        if self.noise_scale == 1.0:
            return out
        return jnp.concatenate([mean, log_std + math.log(self.noise_scale)], axis=-1)

    def noise(self, key: Array, out: jax.ShapeDtypeStruct) -> Array:
        return jax.random.normal(key, out.shape[:-1] + (out.shape[-1] // 2,), out.dtype)

    def sample(self, rows: Array, noise: Array) -> Array:
        mean, log_std = self.split(rows)
        return mean + jnp.exp(log_std) * noise

    def sample_out(self, key: Array, out: Array) -> Array:
        return self.sample(out, self.noise(key, out))

    def log_prob(self, rows: Array, action: Array) -> Array:
        """log N(u; mean, diag std^2), summed over the m dimensions."""
        mean, log_std = self.split(rows)
        z = (action - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * jnp.square(z) - log_std, axis=-1) - 0.5 * self.action_dim * math.log(2 * math.pi)

    def log_prob_as(self, rows: Array, action: Array, known_rows: Array, known: Array) -> Array:
        """:meth:`log_prob`, but ``known`` (the logged log-prob of ``action`` under
        ``known_rows``) wherever ``rows`` are those very bits: the same density at the same
        point, so an env at lag 0 has log rho = 0 exactly, not 0 up to the rounding of two
        compilations of the same formula."""
        same = jnp.all(rows == known_rows, axis=-1)
        return jnp.where(same, known, self.log_prob(rows, action))

    def entropy(self, rows: Array) -> Array:
        _, log_std = self.split(rows)
        return jnp.sum(log_std, axis=-1) + 0.5 * self.action_dim * (1.0 + math.log(2 * math.pi))

    def kl(self, rows_p: Array, rows_q: Array) -> Array:
        """KL(p || q) of two diagonal Gaussians, closed form."""
        mp, lp = self.split(rows_p)
        mq, lq = self.split(rows_q)
        return jnp.sum(lq - lp + 0.5 * (jnp.exp(2 * (lp - lq)) + jnp.square((mp - mq) * jnp.exp(-lq)))
                       - 0.5, axis=-1)

    def env_action(self, u: Array) -> Array:
        """What the env receives: u squashed into the box, or clipped to it."""
        low = jnp.broadcast_to(jnp.asarray(self.low, u.dtype), u.shape)
        high = jnp.broadcast_to(jnp.asarray(self.high, u.dtype), u.shape)
        if self.squash:
            return low + (high - low) * (jnp.tanh(u) + 1.0) / 2.0
        return jnp.clip(u, low, high)

    def expected_weight(self, rows_pi: Array, rows_mu: Array, kind: str, clip) -> Array:
        """Z(s) = E_mu[w(rho)] in closed form for one action dimension (``gaussian_z``);
        the config check refuses Z-centred targets for m > 1 (docs/continuous.md)."""
        if self.action_dim != 1:
            raise ValueError("Z(s) has a closed form for 1-d Gaussian actions only")
        mp, lp = self.split(rows_pi)
        mm, lm = self.split(rows_mu)
        return gaussian_z(mp[..., 0], lp[..., 0], mm[..., 0], lm[..., 0], kind, clip)

    def interpolate(self, rows_mu: Array, rows_pi: Array, alpha: Array) -> Array:
        """The normalised geometric mixture mu^(1-alpha) pi_k^alpha (a Gaussian: precisions
        add), whose log-density is A-3PO's (1 - alpha) log mu + alpha log pi_k up to a
        per-state constant."""
        mm, lm = self.split(rows_mu)
        mp, lp = self.split(rows_pi)
        prec_m, prec_p = (1.0 - alpha) * jnp.exp(-2 * lm), alpha * jnp.exp(-2 * lp)
        prec = prec_m + prec_p
        mean = (prec_m * mm + prec_p * mp) / prec
        return jnp.concatenate([mean, -0.5 * jnp.log(prec)], axis=-1)

    def dist(self, rows: Array) -> distrax.Distribution:
        """The distribution of the env action a (squashed: with the tanh log-det)."""
        mean, log_std = self.split(rows)
        base = distrax.MultivariateNormalDiag(loc=mean, scale_diag=jnp.exp(log_std))
        if not self.squash:
            return base
        low = jnp.asarray(self.low, rows.dtype)
        high = jnp.asarray(self.high, rows.dtype)
        affine = distrax.ScalarAffine(shift=(high + low) / 2, scale=(high - low) / 2)
        return distrax.Transformed(base, distrax.Block(distrax.Chain([affine, distrax.Tanh()]), 1))


def gaussian_z(m_pi: Array, log_s_pi: Array, m_mu: Array, log_s_mu: Array, kind: str,
               clip: Optional[float]) -> Array:
    """Z = E_{u ~ mu}[w(rho(u))], rho = N(u; m_pi, s_pi^2) / N(u; m_mu, s_mu^2), 1-d, closed form.

    log rho(u) is a quadratic in u, so {rho <= c} is an interval or its complement (a half-line
    when s_pi = s_mu), and E_mu[rho 1{u in S}] = P_pi(S): ``truncate`` (w = min(rho, c)):
    Z = P_pi(rho <= c) + c P_mu(rho > c); ``mask`` (w = rho 1{1/c <= rho <= c}):
    Z = P_pi(rho <= c) - P_pi(rho < 1/c); ``ratio``: Z = 1. Interval probabilities from normal
    CDFs (``ndtr``)."""
    if kind == "ratio" or clip is None:
        return jnp.ones_like(m_pi)
    c = jnp.asarray(clip, m_pi.dtype)
    if kind == "mask":
        return _p_rho_le(m_pi, log_s_pi, m_mu, log_s_mu, jnp.log(c))[0] - _p_rho_le(
            m_pi, log_s_pi, m_mu, log_s_mu, -jnp.log(c))[0]
    le_pi, le_mu = _p_rho_le(m_pi, log_s_pi, m_mu, log_s_mu, jnp.log(c))
    return le_pi + c * (1.0 - le_mu)


def _p_rho_le(m_pi, log_s_pi, m_mu, log_s_mu, log_c):
    """(P_pi(rho <= c), P_mu(rho <= c)) for 1-d Gaussians pi, mu."""
    s_pi, s_mu = jnp.exp(log_s_pi), jnp.exp(log_s_mu)
    # q(u) = log rho(u) - log c = a u^2 + b u + k
    a = 0.5 * (1.0 / s_mu ** 2 - 1.0 / s_pi ** 2)
    b = m_pi / s_pi ** 2 - m_mu / s_mu ** 2
    k = 0.5 * (m_mu ** 2 / s_mu ** 2 - m_pi ** 2 / s_pi ** 2) + log_s_mu - log_s_pi - log_c
    lin = jnp.abs(a) <= 1e-7 * (1.0 / s_mu ** 2 + 1.0 / s_pi ** 2)
    safe_a = jnp.where(lin, 1.0, a)
    disc = b * b - 4.0 * safe_a * k
    root = jnp.sqrt(jnp.maximum(disc, 0.0))
    r1, r2 = (-b - root) / (2.0 * safe_a), (-b + root) / (2.0 * safe_a)
    lo, hi = jnp.minimum(r1, r2), jnp.maximum(r1, r2)
    safe_b = jnp.where(b == 0, 1.0, b)
    x = -k / safe_b
    always = (k <= 0).astype(m_pi.dtype)

    def prob(m, s):
        inside = jnp.where(disc > 0, ndtr((hi - m) / s) - ndtr((lo - m) / s), 0.0)
        # a > 0: q convex, {q <= 0} = [lo, hi]; a < 0: q concave, its complement
        quad = jnp.where(a > 0, inside, 1.0 - inside)
        # a = 0: q = b u + k, {q <= 0} = {u <= x} (b > 0), {u >= x} (b < 0), all / none (b = 0)
        cdf = ndtr((x - m) / s)
        line = jnp.where(b > 0, cdf, jnp.where(b < 0, 1.0 - cdf, always))
        return jnp.where(lin, line, quad)

    return prob(m_pi, s_pi), prob(m_mu, s_mu)
