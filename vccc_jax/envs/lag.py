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
  ``"geometric:8"``, ``"zipf:1.5"`` or ``"trace:0,3,1,8"``; ``sample`` draws one lag per
  environment with ``jax.random``.
* :func:`switch_lags`: optional mid-rollout switches — every ``m`` steps an environment
  receives newer weights, so one trajectory mixes versions (mu_3 -> mu_5 -> mu_8, §3.4).
* What a lagged rollout acts with, four paths (:func:`acting_actor`, chosen per compiled
  program by :func:`choose_path` from B, K, the parameter count, the backend and whether the
  batch is on one device; each serves every law it is chosen for exactly, lags iid per env):
  :class:`VersionTable` -- the V versions one rollout acts with (row 0 the newest), the
  actor once per VERSION on the whole batch: V x B forwards per step, memory O(V x params):
  :func:`lag_table` (rows = lags 0..V-1: any per-env lags, mid-rollout switches) or
  :func:`common_table` (rows = the newest and one common lag, as under ``fixed:L``: 2 x B);
  :class:`SortedVersions` (:func:`sorted_versions`) -- the envs sorted by lag once per
  rollout, the actor once per (chunk, version) pair: at most B + (K - 1) x chunk rows per
  step in chunk-row matmuls, plus the newest's plain forward (no mid-rollout switch);
  :class:`EnvVersions` (:func:`env_versions`) -- each env's own version gathered from the
  ring once per rollout, one forward per env (B per step, whatever K) plus the newest's
  plain forward, memory O(B x params).

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

LAG_KINDS = ("fixed", "uniform", "geometric", "zipf", "trace")


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
      trace:l0,l1.. a replayed trace of lags: env b at update k gets
                    trace[(k * num_envs + b) % len(trace)] (e.g. lags measured in a real
                    asynchronous system). ``trace:@path`` reads whitespace/comma separated
                    integers from a file.
    """

    kind: str = "fixed"
    param: float = 0.0
    trace: tuple[int, ...] = ()

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
            if min(self.trace) < 0:
                raise ValueError(f"lag trace: lags must be >= 0, got {min(self.trace)}")

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
        if kind == "trace":
            where = "lag trace"
            if arg.startswith("@"):
                where = f"lag trace file {arg[1:]}"
                try:
                    with open(arg[1:]) as f:
                        arg = f.read()
                except OSError as e:
                    raise ValueError(f"lag {text!r}: cannot read the trace file {arg[1:]} "
                                     f"({e.strerror or e})") from None
            values = []
            for v in arg.replace(",", " ").split():
                try:
                    values.append(int(v))
                except ValueError:
                    raise ValueError(f"{where}: {v[:20]!r} is not an integer lag (a trace is "
                                     "integers separated by commas or whitespace)") from None
            return cls("trace", 0.0, tuple(values))
        try:
            value = float(arg)
        except ValueError:
            raise ValueError(f"lag {text!r}: parameter {arg!r} is not a number") from None
        return cls(kind, value)

    def __str__(self) -> str:
        if self.kind == "trace":
            return "trace:" + ",".join(str(v) for v in self.trace)
        p = int(self.param) if float(self.param).is_integer() else self.param
        return f"{self.kind}:{p}"

    # -- static properties -------------------------------------------------------------
    def max_lag(self) -> Optional[int]:
        """Largest lag the law can produce (None: unbounded, truncated at K-1)."""
        if self.kind in ("fixed", "uniform"):
            return int(self.param)
        if self.kind == "trace":
            return max(self.trace)
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

    def logits(self, num_versions: int) -> np.ndarray:
        """log pmf (float32 [K], -inf off the support): what :func:`sample_from_logits` draws
        from. A traced input of the trainer's program (``train.programs.GridValues``), so
        runs that differ only in the law's parameter share one compiled program."""
        pmf = self.pmf(num_versions)
        return np.where(pmf > 0, np.log(np.maximum(pmf, 1e-300)), -np.inf).astype(np.float32)


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


# --------------------------------------------------------------------------------------
# The versions one rollout acts with
# --------------------------------------------------------------------------------------


@struct.dataclass
class VersionTable:
    """The V actor versions a rollout acts with; row 0 is the newest (lag 0).

    Attributes:
      params: pytree, leaves [V, *leaf_shape].
      row_lag: int32 [V] the (capped) lag each row holds.
      version: int32 [V] the version id each row holds.
      complete: static; True when row j holds lag j for j < V (:func:`lag_table`), so an env
        at lag l acts with row min(l, V - 1) and lags may change mid-rollout; False for
        :func:`common_table`, whose rows hold lags {0, L} only.
    """

    params: Any
    row_lag: Array
    version: Array
    complete: bool = struct.field(pytree_node=False, default=True)

    @property
    def num_rows(self) -> int:
        return self.row_lag.shape[0]

    def rows(self, lags: Array) -> Array:
        """The row each env acts with for its (capped) lag, int32 [B]."""
        lags = jnp.asarray(lags, jnp.int32)
        if self.complete:
            return jnp.clip(lags, 0, self.num_rows - 1)
        # the first row holding the lag (row 0 when it is 0: the behaviour row IS the newest)
        return jnp.argmax(lags[:, None] == self.row_lag[None, :], axis=1).astype(jnp.int32)


def _table(buffer: VersionBuffer, lags: Array, complete: bool) -> VersionTable:
    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer) - 1)
    return VersionTable(params=gather(buffer, lags), row_lag=lags,
                        version=version_ids(buffer, lags), complete=complete)


def lag_table(buffer: VersionBuffer, num_lags: Optional[int] = None) -> VersionTable:
    """Rows = lags 0..num_lags-1 (default: every slot of the ring), capped by the versions
    pushed so far (early rows repeat the oldest available version)."""
    num_lags = buffer.num_versions if num_lags is None else int(num_lags)
    if not 1 <= num_lags <= buffer.num_versions:
        raise ValueError(f"num_lags must be in [1, {buffer.num_versions}], got {num_lags}")
    return _table(buffer, jnp.arange(num_lags, dtype=jnp.int32), True)


def common_table(buffer: VersionBuffer, lag: Array) -> VersionTable:
    """Two rows, the newest and the version ``lag`` (a scalar, traced or not) updates old:
    every env acts with the same version (``fixed:L`` laws), at 2 x B rows per step."""
    lag = jnp.asarray(lag, jnp.int32)
    chex.assert_rank(lag, 0)
    return _table(buffer, jnp.stack([jnp.zeros_like(lag), lag]), False)


# --------------------------------------------------------------------------------------
# Each env's own version (one forward per env)
# --------------------------------------------------------------------------------------


@struct.dataclass
class EnvVersions:
    """Each env's acting version, gathered from the ring once per rollout.

    Attributes:
      buffer: the :class:`VersionBuffer` it was gathered from (mid-rollout switches re-gather
        from it at every step).
      params: pytree, leaves [B, *leaf_shape]: env b's version at the start of the rollout.
      newest: the newest version's plain params (lag 0; pi_k of the learner).
      lag: int32 [B] each env's (capped) lag at the start of the rollout.
    """

    buffer: VersionBuffer
    params: Any
    newest: Any
    lag: Array


def env_versions(buffer: VersionBuffer, lags: Array) -> EnvVersions:
    """Gather env b's version ``lags[b]`` updates old (capped by the versions pushed) with one
    ``jnp.take`` per leaf on the ring's slots: memory O(B x params). On a mesh the ring is
    replicated and the lags env-sharded, so the gather is local to each device."""
    chex.assert_rank(lags, 1)
    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, available(buffer) - 1)
    return EnvVersions(buffer=buffer, params=gather(buffer, lags), newest=get(buffer, 0),
                       lag=lags)


@struct.dataclass
class SortedVersions:
    """Envs grouped by their lag for one rollout: the actor runs once per (chunk, version)
    pair of the lag-sorted batch, each pair a ``chunk``-row forward (matmul efficiency, unlike
    the per-env path's matvecs).

    Attributes:
      params: pytree, leaves [P, *leaf_shape]: the version of each pair (P = B / chunk + K - 1;
        unused padding pairs hold some version and are never picked).
      rows: int32 [P, chunk] the env at each row of each pair.
      pick: int32 [B] the flat row (pair x chunk + j) that holds env b under its own version.
      newest: the newest version's plain params (lag 0; pi_k of the learner).
      lag: int32 [B] each env's (capped) lag.
      version: int32 [B] each env's version id.
    """

    params: Any
    rows: Array
    pick: Array
    newest: Any
    lag: Array
    version: Array


def sorted_versions(buffer: VersionBuffer, lags: Array, chunk: int,
                    num_lags: Optional[int] = None) -> SortedVersions:
    """Sort the envs by their (capped) lags, cut the sorted batch into chunks of ``chunk``
    envs and pair each chunk with every lag between its first and last env's. Consecutive
    chunks share at most one lag, so there are at most B / chunk + K - 1 pairs: a static
    bound, whatever the lag counts (they stay multinomial: no env's lag is changed). Every
    env is evaluated under its own version. Within one program (one device): a global sort
    over an env-sharded batch would move rows between devices. ``num_lags``: lags are below it
    (default: every slot of the ring), as in :func:`lag_table`; larger ones act with lag
    ``num_lags - 1``."""
    chex.assert_rank(lags, 1)
    num_envs = lags.shape[0]
    K = buffer.num_versions if num_lags is None else int(num_lags)
    if chunk < 1 or num_envs % chunk:
        raise ValueError(f"sorted_versions: chunk must divide num_envs={num_envs}, got {chunk}")
    lags = jnp.clip(jnp.asarray(lags, jnp.int32), 0, jnp.minimum(available(buffer), K) - 1)
    n_chunks, n_pairs = num_envs // chunk, num_envs // chunk + K - 1
    order = jnp.argsort(lags, stable=True)  # sorted position -> env
    sl = lags[order]
    lo, hi = sl[::chunk], sl[chunk - 1::chunk]
    start = jnp.cumsum(hi - lo + 1) - (hi - lo + 1)  # first pair of each chunk
    p = jnp.arange(n_pairs, dtype=jnp.int32)
    pair_chunk = jnp.clip(jnp.searchsorted(start, p, side="right") - 1, 0, n_chunks - 1)
    pair_lag = jnp.minimum(lo[pair_chunk] + p - start[pair_chunk], K - 1)
    rows = order[pair_chunk[:, None] * chunk + jnp.arange(chunk, dtype=jnp.int32)[None, :]]
    i = jnp.arange(num_envs, dtype=jnp.int32)
    pick_sorted = (start[i // chunk] + sl - lo[i // chunk]) * chunk + i % chunk
    pick = jnp.zeros((num_envs,), jnp.int32).at[order].set(pick_sorted.astype(jnp.int32))
    return SortedVersions(params=gather(buffer, pair_lag), rows=rows.astype(jnp.int32),
                          pick=pick, newest=get(buffer, 0), lag=lags,
                          version=version_ids(buffer, lags))


ROLLOUT_PATHS = ("table", "common", "per_env", "sorted")
# (B x params floats, K from which the per-env path is cheaper) on CPU, measured (docstring)
_PER_ENV_FROM = ((1 << 20, 4), (None, 16))


def choose_path(num_envs: int, num_versions: int, num_params: int, backend: str,
                law_fixed: bool, switch_every: int, one_device: bool = True) -> str:
    """How a lagged rollout evaluates the actor (static; one choice per compiled program).

    * ``"common"`` (:func:`common_table`): every env has the same lag (a ``fixed:L`` law and
      no mid-rollout switch): the newest and the common version, 2 x B rows per step.
    * ``"table"`` (:func:`lag_table`): the actor once per lag 0..V-1 on the whole batch:
      V x B rows per step, memory O(V x params); serves every law, switches included.
    * ``"sorted"`` (:func:`sorted_versions`): envs sorted by lag once per rollout, the actor
      once per (chunk, version) pair: at most B + (K - 1) x chunk rows per step in
      ``chunk``-row matmuls, plus the newest's plain forward; memory O((B / chunk + K) x
      params); every law, no mid-rollout switch, one device (``one_device``: the sort
      would otherwise move rows between devices).
    * ``"per_env"`` (:func:`env_versions`): one forward per env with its own version (a
      batched matvec) plus the newest's plain forward over B rows: memory O(B x params);
      serves every law, switches included (then re-gathered from the ring at every step).

    Every path draws each env's lag iid from the law (no grouping or stratification), so
    the choice moves float bits only, never the law.

    Rule (CPU, measured, actor 4-64-64-2, T = 128, one XLA thread so that CPU times repeat
    to ~1%; ``experiments/rollout_paths.py``, 2026-12-02): the rollouts of a whole training
    run (sync-gae's: 1.0) cost, at 1 seed x 512 envs, K = 8: sorted 2.1, per_env 2.8, table
    5.0; K = 32: sorted 2.1, per_env 2.9; at 8 seeds x 512 envs, K = 8: sorted 1.8, per_env
    4.0, table 4.2 (the per-env copies, 8 x 512 x params, leave the cache); at 8 x 64,
    K = 8: sorted 2.2, per_env 2.3, table 4.5, but K = 32 (chunk 1): sorted 5.2, per_env 2.4.
    So ``sorted`` when its chunk (:func:`sort_chunk`) is at least 2 (B >= 8 K), on one
    device and without switches. Below that, the per-env forward is a matvec per env whose
    cost grows with B x params faster than the table's matmul once the per-env copies leave
    the cache: per-env / table CPU time was 0.85 / 0.98 / 1.92 at K = 4 and 0.26 / 0.58 /
    0.99 at K = 8 (B = 4 / 64 / 512, two XLA threads), 0.13-0.26 at K = 32; at B = 4096
    4.8 (K = 2), 1.19 (K = 8), 0.47 (K = 16). Re-gathering at every step (switches) costs
    1.5-2.1x the table at K = 8 and 0.38-0.47x at K = 32. So ``per_env`` when K >= 4 and B x
    params <= 2^20 floats (4 MiB), or K >= 16; twice that K under mid-rollout switches;
    ``table`` otherwise. Other backends: ``table`` (O(V x params) memory, the accelerator
    layout of issue 22; not measured here: no accelerator was lent to this).
    """
    if num_envs < 1 or num_versions < 1 or num_params < 1:
        raise ValueError(f"choose_path: sizes must be >= 1, got num_envs={num_envs}, "
                         f"num_versions={num_versions}, num_params={num_params}")
    if law_fixed and switch_every <= 0:
        return "common"
    if backend != "cpu":
        return "table"
    if switch_every <= 0 and one_device and sort_chunk(num_envs, num_versions) >= 2:
        return "sorted"
    size = num_envs * num_params
    k_min = next(k for bound, k in _PER_ENV_FROM if bound is None or size <= bound)
    if switch_every > 0:
        k_min *= 2
    return "per_env" if num_versions >= k_min else "table"


def sort_chunk(num_envs: int, num_versions: int) -> int:
    """Envs per chunk of the sorted path: the largest divisor of B that is at most
    B / (4 K) (at least 1), so the B / chunk + K - 1 pairs cost at most 1.25 B rows."""
    target = max(1, num_envs // (4 * num_versions))
    return max(c for c in range(1, target + 1) if num_envs % c == 0)


def num_params(buffer: VersionBuffer) -> int:
    """Parameters of one version in the ring."""
    return sum(int(np.prod(x.shape[1:])) for x in jax.tree_util.tree_leaves(buffer.params))


def acting_actor(buffer: VersionBuffer, lags: Array, *, num_lags: Optional[int] = None,
                 common_lag: Optional[Array] = None, switch_every: int = 0,
                 path: str = "auto", one_device: bool = True
                 ) -> "VersionTable | EnvVersions | SortedVersions":
    """What ``rollout.rollout`` acts with for per-env ``lags`` [B] (capped here).

    ``common_lag``: the one lag every env has (a ``fixed:L`` law, traced or not), or None.
    ``path``: one of :data:`ROLLOUT_PATHS`, or ``"auto"`` (:func:`choose_path` on B, the
    ring's ``num_lags`` (default: all slots), its parameter count, the default backend and
    ``one_device``: False when the env batch is split over a mesh).
    """
    lags = cap_lags(jnp.asarray(lags, jnp.int32), available(buffer))
    if path == "auto":
        path = choose_path(lags.shape[0], buffer.num_versions if num_lags is None else num_lags,
                           num_params(buffer), jax.default_backend(), common_lag is not None,
                           switch_every, one_device)
    if path == "common":
        if common_lag is None or switch_every > 0:
            raise ValueError("the common path needs one lag for every env (common_lag) and "
                             "no mid-rollout switch")
        return common_table(buffer, cap_lags(common_lag, available(buffer)))
    if path == "table":
        return lag_table(buffer, num_lags)
    if path == "per_env":
        return env_versions(buffer, lags)
    if path == "sorted":
        if switch_every > 0:
            raise ValueError("the sorted path fixes each env's lag for the rollout: no "
                             "mid-rollout switches")
        K = buffer.num_versions if num_lags is None else num_lags
        return sorted_versions(buffer, lags, sort_chunk(lags.shape[0], K), K)
    raise ValueError(f"rollout path must be 'auto' or one of {ROLLOUT_PATHS}, got {path!r}")
