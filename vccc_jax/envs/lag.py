"""Simulated policy lag: a ring buffer of actor versions and the laws that pick a lag.

In asynchronous actor-critic the rollout workers act with old versions mu_i = pi_{k-L}
while the learner is at pi_k (vccc_blog_en.txt §1.4). We simulate this inside one jitted
trainer:

* :class:`VersionBuffer` keeps the last ``K`` actor parameter versions as ONE stacked pytree
  (every leaf has a leading axis of size ``K``), so it is just another array in the train
  state and can be sharded like one. ``push`` writes a new version, ``get(lag)`` /
  ``gather(lags)`` read the version ``lag`` updates old. Lags are capped by the number of
  versions actually pushed so far (early in training every worker acts with the oldest
  available version, the initial parameters).
* :class:`LagLaw` is a frozen spec parsed from strings like ``"fixed:2"``, ``"uniform:4"``,
  ``"geometric:8"``, ``"zipf:1.5"``, ``"hist:0.1,0,0.9"`` or ``"trace:0,3,1,8"``; ``sample``
  draws one lag per environment with ``jax.random``. A trace may also hold the rollouts a
  real pipeline dropped (``bounded:N``): :meth:`LagLaw.drops_at` gives them to the trainer,
  which advances those envs through them before the learned rollout.
* :func:`switch_lags`: optional mid-rollout switches — every ``m`` steps an environment
  receives newer weights, so one trajectory mixes versions (mu_3 -> mu_5 -> mu_8, §3.4).
* What a lagged rollout acts with (the versions gathered from this ring, four paths chosen per
  compiled program) is :mod:`vccc_jax.envs.acting`.

Conventions: version ids count pushes (the initial parameters are version 0; after learner
update k the buffer holds version k + 1). Lag 0 is the newest version.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = chex.Array

LAG_KINDS = ("fixed", "uniform", "geometric", "zipf", "hist", "trace")


# --------------------------------------------------------------------------------------
# Lag laws
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LagLaw:
    """A distribution over lags {0, 1, ..., K-1} (K = number of versions kept).

    kinds (``param`` meaning):
      fixed:L       every env acts with lag L.
      uniform:M     lag uniform on {0, ..., M}; mean M/2.
      geometric:m   P(l) ∝ (m / (1 + m))^l, i.e. a geometric law with untruncated mean m,
                    truncated to {0, ..., K-1} and renormalised.
      zipf:a        heavy tail, P(l) ∝ (l + 1)^(-a), truncated to {0, ..., K-1}.
      hist:w0,w1..  i.i.d. draws from the histogram P(l) ∝ w_l (weights >= 0, not all 0;
                    support: the lags with w_l > 0). ``hist:@path`` takes the counts of the
                    learned lags of a trace file (a run's ``lags.trace``): its measured
                    distribution without its time order. Mean: sum_l l w_l / sum_l w_l.
      trace:l0,l1.. a replayed trace of lags: env b at update k gets
                    trace[(k * num_envs + b) % len(trace)] (e.g. lags measured in a real
                    asynchronous system). ``trace:@path`` reads whitespace/comma separated
                    entries from a file. An entry ``L/d1/d2`` is lag L after two DROPPED
                    rollouts of that env acting at lags d1 then d2 (at the same update;
                    ``drops``): see :meth:`drops_at`. Mean and pmf: of the learned lags L.
    """

    kind: str = "fixed"
    param: float = 0.0
    trace: tuple[int, ...] = ()
    drops: tuple[tuple[int, ...], ...] = ()  # trace: per entry, its dropped rollouts' lags
    weights: tuple[float, ...] = ()  # hist: the (unnormalised) weights of lags 0, 1, ...

    def __post_init__(self):
        if self.kind not in LAG_KINDS:
            raise ValueError(f"lag kind must be one of {LAG_KINDS}, got {self.kind!r}")
        if self.kind in ("fixed", "uniform"):
            if self.param < 0 or float(self.param) != int(self.param):
                raise ValueError(f"lag {self.kind}:{self.param}: param must be an integer >= 0")
        if self.kind == "geometric" and not self.param >= 0:
            raise ValueError(f"lag geometric:{self.param}: the mean must be >= 0")
        if self.kind == "zipf" and not self.param > 0:
            raise ValueError(f"lag zipf:{self.param}: the exponent must be > 0")
        if self.kind == "trace":
            if not self.trace:
                raise ValueError("lag trace: the trace must hold at least one lag")
            if min(self.trace + sum(self.drops, ())) < 0:
                raise ValueError(f"lag trace: lags must be >= 0, got "
                                 f"{min(self.trace + sum(self.drops, ()))}")
            if self.drops and len(self.drops) != len(self.trace):
                raise ValueError(f"lag trace: {len(self.drops)} drop lists for "
                                 f"{len(self.trace)} lags")
        if self.kind == "hist":
            if not self.weights or min(self.weights) < 0 or not sum(self.weights) > 0 \
                    or not all(math.isfinite(w) for w in self.weights):
                raise ValueError(f"lag hist: weights must be finite, >= 0 and not all 0, got "
                                 f"{list(self.weights)[:8]}")

    # -- parsing / printing ------------------------------------------------------------
    @classmethod
    def parse(cls, text: "str | LagLaw") -> "LagLaw":
        """``"geometric:8"`` -> LagLaw("geometric", 8.0). A bare integer means fixed."""
        if isinstance(text, LagLaw):
            return text
        text = str(text).strip()
        if ":" not in text:
            try:
                return cls("fixed", float(int(text)))
            except ValueError:
                raise ValueError(
                    f"lag must look like KIND:PARAM with KIND in {LAG_KINDS}, got {text!r}"
                ) from None
        kind, _, arg = text.partition(":")
        kind = kind.strip().lower()
        if kind == "trace" or (kind == "hist" and arg.startswith("@")):
            lags, drops = _trace_entries(text, arg)
            if kind == "hist":  # the measured histogram of the learned lags, exactly
                return cls("hist", weights=tuple(float(c) for c in np.bincount(lags)))
            return cls("trace", 0.0, tuple(lags), tuple(drops) if any(drops) else ())
        if kind == "hist":
            try:
                weights = tuple(float(w) for w in arg.split(","))
            except ValueError:
                raise ValueError(f"lag {text!r}: hist weights must be numbers separated by "
                                 "commas") from None
            return cls("hist", weights=weights)
        try:
            value = float(arg)
        except ValueError:
            raise ValueError(f"lag {text!r}: parameter {arg!r} is not a number") from None
        return cls(kind, value)

    def __str__(self) -> str:
        if self.kind == "trace":
            return "trace:" + ",".join("/".join(map(str, (v,) + d)) for v, d in
                                       zip(self.trace, self.drops or ((),) * len(self.trace)))
        if self.kind == "hist":
            return "hist:" + ",".join(f"{w:g}" for w in self.weights)
        p = int(self.param) if float(self.param).is_integer() else self.param
        return f"{self.kind}:{p}"

    # -- static properties -------------------------------------------------------------
    def max_lag(self) -> Optional[int]:
        """Largest lag the law can produce (None: unbounded, truncated at K-1)."""
        if self.kind in ("fixed", "uniform"):
            return int(self.param)
        if self.kind == "trace":  # the ring must hold the dropped rollouts' versions too
            return max(self.trace + sum(self.drops, ()))
        if self.kind == "hist":
            return max(i for i, w in enumerate(self.weights) if w > 0)
        if self.kind == "geometric" and self.param == 0:
            return 0
        return None

    def default_num_versions(self) -> int:
        """A ring size K that holds the law without (much) truncation.

        Bounded laws get max_lag + 1; geometric:m gets the smallest K with tail mass
        P(l >= K) <= 1e-3; zipf gets 33 (its tail is truncated by design).
        """
        bound = self.max_lag()
        if bound is not None:
            return bound + 1
        if self.kind == "geometric":
            q = self.param / (1.0 + self.param)
            return int(math.ceil(math.log(1e-3) / math.log(q)))
        return 33

    def check(self, num_versions: int) -> None:
        """Raise ValueError if the law needs more versions than ``num_versions``."""
        if num_versions < 1:
            raise ValueError(f"num_versions must be >= 1, got {num_versions}")
        bound = self.max_lag()
        if bound is not None and bound > num_versions - 1:
            raise ValueError(
                f"lag {self} reaches lag {bound} but num_versions={num_versions} keeps only "
                f"lags 0..{num_versions - 1}; use num_versions >= {bound + 1}"
            )

    def pmf(self, num_versions: int) -> np.ndarray:
        """Probabilities of lags 0..K-1 (float64, sums to 1). For a trace: its histogram."""
        self.check(num_versions)
        k = np.arange(num_versions, dtype=np.float64)
        if self.kind == "fixed":
            p = (k == self.param).astype(np.float64)
        elif self.kind == "uniform":
            p = (k <= self.param).astype(np.float64)
        elif self.kind == "geometric":
            if self.param == 0:
                p = (k == 0).astype(np.float64)
            else:
                p = (self.param / (1.0 + self.param)) ** k
        elif self.kind == "zipf":
            p = (k + 1.0) ** (-self.param)
        elif self.kind == "hist":
            w = np.asarray(self.weights[:num_versions], np.float64)
            p = np.pad(w, (0, num_versions - w.size))
        else:
            p = np.bincount(np.asarray(self.trace), minlength=num_versions).astype(np.float64)
        return p / p.sum()

    def mean(self, num_versions: int) -> float:
        """Exact mean lag under the (truncated) law, before the cap by versions pushed."""
        return float(np.dot(np.arange(num_versions), self.pmf(num_versions)))

    # -- sampling ----------------------------------------------------------------------
    def sample(
        self,
        key: Array,
        num_envs: int,
        num_versions: int,
        *,
        available: Optional[Array] = None,
        step: Optional[Array] = None,
    ) -> Array:
        """Draw one lag per environment: int32 [num_envs] in [0, min(available, K) - 1].

        Args:
          key: jax.random key (unused by fixed/trace laws).
          num_envs, num_versions: static sizes.
          available: number of versions pushed so far (traced int); lags are capped at
            ``available - 1``. None: no cap beyond K-1.
          step: update index (traced int), used by ``trace`` to pick its position.
        """
        self.check(num_versions)
        if self.kind == "fixed":
            lags = jnp.full((num_envs,), int(self.param), jnp.int32)
        elif self.kind == "trace":
            trace = jnp.asarray(self.trace, jnp.int32)
            step = jnp.zeros((), jnp.int32) if step is None else jnp.asarray(step, jnp.int32)
            idx = (step * num_envs + jnp.arange(num_envs, dtype=jnp.int32)) % len(self.trace)
            lags = jnp.minimum(trace[idx], num_versions - 1)
        else:
            lags = sample_from_logits(key, jnp.asarray(self.logits(num_versions)), num_envs)
        return cap_lags(lags, available)

    def drop_tables(self, num_envs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A trace's dropped rollouts as host tables over its R = len / num_envs updates:
        lags int32 [R, M, B] (M: the most drops of any entry; padded with 0), counts int32
        [R, B] and ``before`` int32 [R + 1]: the rollouts dropped before each update, counted
        per update as the most drops of any env (``before[R]``: one pass of the trace)."""
        if self.kind != "trace" or not self.drops:
            raise ValueError(f"lag {self}: no dropped rollouts recorded")
        if len(self.trace) % num_envs:
            raise ValueError(f"lag trace with dropped rollouts: {len(self.trace)} entries are "
                             f"not whole updates of num_envs={num_envs}")
        rows = len(self.trace) // num_envs
        most = max(len(d) for d in self.drops)
        lags = np.zeros((rows, most, num_envs), np.int32)
        counts = np.zeros((rows, num_envs), np.int32)
        for i, d in enumerate(self.drops):
            lags[i // num_envs, :len(d), i % num_envs] = d
            counts[i // num_envs, i % num_envs] = len(d)
        before = np.concatenate([[0], np.cumsum(counts.max(1))]).astype(np.int32)
        return lags, counts, before

    def drops_at(self, step: Array, num_envs: int) -> tuple[Array, Array, Array]:
        """The rollouts the replayed run dropped before the one it learned at update ``step``
        (traced; the trace wraps around like :meth:`sample`): (lags int32 [M, B]: env b's
        i-th dropped rollout acted at lag ``lags[i, b]`` of this update, valid for
        i < counts[b]; counts int32 [B]; offset int32 []: rollouts dropped before this
        update, see :meth:`drop_tables`). The trainer's rollout key of a dropped or learned
        rollout is that many rollouts further along the key chain (``train.trainer``)."""
        lags, counts, before = self.drop_tables(num_envs)
        step = jnp.asarray(step, jnp.int32)
        row = step % lags.shape[0]
        offset = (step // lags.shape[0]) * before[-1] + jnp.asarray(before)[row]
        return jnp.asarray(lags)[row], jnp.asarray(counts)[row], offset

    def logits(self, num_versions: int) -> np.ndarray:
        """log pmf (float32 [K], -inf off the support): what :func:`sample_from_logits` draws
        from. A traced input of the trainer's program (``train.programs.GridValues``), so
        runs that differ only in the law's parameter share one compiled program."""
        pmf = self.pmf(num_versions)
        return np.where(pmf > 0, np.log(np.maximum(pmf, 1e-300)), -np.inf).astype(np.float32)


def _trace_entries(text: str, arg: str) -> tuple[list[int], list[tuple[int, ...]]]:
    """(learned lags, per-entry dropped lags) of a trace's entries ``L`` / ``L/d1/d2`` in
    ``arg`` (or in the file ``arg[1:]`` when it starts with ``@``)."""
    where = "lag trace"
    if arg.startswith("@"):
        where = f"lag trace file {arg[1:]}"
        try:
            with open(arg[1:]) as f:
                arg = f.read()
        except OSError as e:
            raise ValueError(f"lag {text!r}: cannot read the trace file {arg[1:]} "
                             f"({e.strerror or e})") from None
    lags, drops = [], []
    for v in arg.replace(",", " ").split():
        try:
            entry = [int(x) for x in v.split("/")]
        except ValueError:
            raise ValueError(f"{where}: {v[:20]!r} is not an integer lag (a trace is integers "
                             "separated by commas or whitespace; L/d1/d2: lag L after dropped "
                             "rollouts at lags d1, d2)") from None
        if min(entry) < 0:
            raise ValueError(f"{where}: lags must be >= 0, got {v[:20]!r}")
        lags.append(entry[0])
        drops.append(tuple(entry[1:]))
    return lags, drops


def sample_from_logits(key: Array, logits: Array, num_envs: int) -> Array:
    """One lag per env from the law with log pmf ``logits`` [K] (``LagLaw.logits``): int32."""
    return jax.random.categorical(key, logits, shape=(num_envs,)).astype(jnp.int32)


def cap_lags(lags: Array, available: Optional[Array]) -> Array:
    """min(lag, available - 1): a worker cannot act with a version that was never pushed."""
    if available is None:
        return lags
    return jnp.minimum(lags, jnp.maximum(jnp.asarray(available, jnp.int32) - 1, 0))


def switch_lags(lags: Array, step: Array, *, every: int, stride: int = 1) -> Array:
    """Lag at rollout step ``step`` with mid-rollout weight switches.

    Every ``every`` environment steps a worker receives weights ``stride`` versions newer,
    until it reaches the newest (lag 0): lag_t = max(lag_0 - stride * floor(t / every), 0).
    ``every=0`` disables switches. With lag_0 = 5, every=m, stride 2 at K = 9 a trajectory
    acts with mu_3 -> mu_5 -> mu_7 -> mu_8 (versions 8 - lag).
    """
    if every <= 0:
        return lags
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    hops = (jnp.asarray(step, jnp.int32) // every) * stride
    return jnp.maximum(lags - hops, 0)


# --------------------------------------------------------------------------------------
# Ring buffer of parameter versions
# --------------------------------------------------------------------------------------


@struct.dataclass
class VersionBuffer:
    """The last K actor versions as one stacked pytree.

    Attributes:
      params: pytree; every leaf has shape [K, *leaf_shape]. Slot ``head`` holds the newest.
      head: int32 [] slot of the newest version.
      count: int32 [] number of versions pushed so far (including the initial one).
      version: int32 [] id of the newest version (= count - 1).
    """

    params: Any
    head: Array
    count: Array
    version: Array

    @property
    def num_versions(self) -> int:
        return jax.tree_util.tree_leaves(self.params)[0].shape[0]


def init_buffer(params: Any, num_versions: int) -> VersionBuffer:
    """A buffer whose every slot holds ``params`` (version 0); one version available."""
    if num_versions < 1:
        raise ValueError(f"num_versions must be >= 1, got {num_versions}")
    stacked = jax.tree_util.tree_map(
        lambda x: jnp.broadcast_to(jnp.asarray(x)[None], (num_versions,) + jnp.shape(x)), params
    )
    zero = jnp.zeros((), jnp.int32)
    return VersionBuffer(params=stacked, head=zero, count=zero + 1, version=zero)


def push(buffer: VersionBuffer, params: Any) -> VersionBuffer:
    """Write ``params`` as the newest version (overwriting the oldest once the ring is full)."""
    k = buffer.num_versions
    head = (buffer.head + 1) % k
    stacked = jax.tree_util.tree_map(
        lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, jnp.asarray(x, buf.dtype), head, 0),
        buffer.params,
        params,
    )
    return VersionBuffer(
        params=stacked, head=head, count=buffer.count + 1, version=buffer.version + 1
    )


def available(buffer: VersionBuffer) -> Array:
    """Number of distinct versions readable now: min(count, K)."""
    return jnp.minimum(buffer.count, buffer.num_versions)


def slots(buffer: VersionBuffer, lags: Array) -> Array:
    """Ring slot of the version ``lags`` updates old (lags capped by the versions pushed)."""
    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer) - 1)
    return (buffer.head - lags) % buffer.num_versions


def version_ids(buffer: VersionBuffer, lags: Array) -> Array:
    """Version id read for each lag (after the cap): version - min(lag, available - 1)."""
    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer) - 1)
    return buffer.version - lags


def get(buffer: VersionBuffer, lag: Array) -> Any:
    """The parameter pytree ``lag`` versions old (scalar lag)."""
    s = slots(buffer, lag)
    return jax.tree_util.tree_map(lambda buf: jax.lax.dynamic_index_in_dim(buf, s, 0, False),
                                  buffer.params)


def gather(buffer: VersionBuffer, lags: Array) -> Any:
    """Per-environment parameters: leaves [n, ...] for an int array ``lags`` of shape [n]."""
    chex.assert_rank(lags, 1)
    s = slots(buffer, lags)
    return jax.tree_util.tree_map(lambda buf: jnp.take(buf, s, axis=0), buffer.params)
