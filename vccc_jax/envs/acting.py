"""What a lagged rollout acts with: the four acting paths and their logits (issue 28).

A rollout under policy lag needs each env's BEHAVIOUR logits at every step (its own version's,
``lag[b]`` updates old in the ring of :mod:`vccc_jax.envs.lag`) and the NEWEST version's at
every visited state (pi_k of the learner, for log pi_k and exactly-zero lag-0 log-ratios).
Four ways to compute them, one per compiled program (:func:`acting_actor`,
:func:`choose_path` from B, K, the parameter count, the backend and whether the batch is on
one device); each serves every law it is chosen for exactly, lags iid per env, so the choice
moves float bits only:

* :class:`VersionTable` -- the V versions one rollout acts with (row 0 the newest), the
  actor once per VERSION on the whole batch: V x B forwards per step, memory O(V x params):
  :func:`lag_table` (rows = lags 0..V-1: any per-env lags, mid-rollout switches) or
  :func:`common_table` (rows = the newest and one common lag, as under ``fixed:L``: 2 x B);
  behaviour and newest logits per step by :func:`versioned_logits`;
* :class:`SortedVersions` (:func:`sorted_versions`) -- the envs sorted by lag once per
  rollout, the actor once per (chunk, version) pair: at most B + (K - 1) x chunk rows per
  step in chunk-row matmuls (no mid-rollout switch); behaviour logits by
  :func:`sorted_logits`;
* :class:`EnvVersions` (:func:`env_versions`) -- each env's own version gathered from the
  ring once per rollout, one forward per env (B per step, whatever K), memory
  O(B x params); behaviour logits by :func:`per_env_logits`.

Under the last two the step loop runs the behaviour forward only: the newest's logits come
after it, over the whole rollout's T x B observations (:func:`newest_after` /
:func:`newest_log_probs`; the learner does not move during a rollout; in forwards of 512
rows: :data:`NEWEST_ROWS`): at 4 envs one 512-row matmul instead of 128 4-row forwards inside
the loop. :func:`step_logits` is the one call
``rollout.rollout`` makes per step, whatever the path.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vccc_jax.envs.lag import (
    VersionBuffer,
    available,
    cap_lags,
    gather,
    get,
    switch_lags,
    version_ids,
)

Array = chex.Array
ApplyFn = Callable[[Any, Array], Array]  # (params, obs) -> logits [..., A]


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
# (B x params floats, K from which the per-env path is cheaper than the table) on CPU,
# measured (choose_path's docstring): without and with mid-rollout switches
_PER_ENV_FROM = ((1 << 17, 4), (1 << 22, 8), (None, 16))
_PER_ENV_SWITCH_FROM = ((1 << 22, 16), (None, 32))
_SORTED_FROM = 8  # K from which the sorted path is cheaper than the table


def choose_path(num_envs: int, num_versions: int, num_params: int, backend: str,
                law_fixed: bool, switch_every: int, one_device: bool = True) -> str:
    """How a lagged rollout evaluates the actor (static; one choice per compiled program).

    * ``"common"`` (:func:`common_table`): every env has the same lag (a ``fixed:L`` law and
      no mid-rollout switch): the newest and the common version, 2 x B rows per step.
    * ``"table"`` (:func:`lag_table`): the actor once per lag 0..V-1 on the whole batch:
      V x B rows per step, memory O(V x params); serves every law, switches included.
    * ``"sorted"`` (:func:`sorted_versions`): envs sorted by lag once per rollout, the actor
      once per (chunk, version) pair: at most B + (K - 1) x chunk rows per step in
      ``chunk``-row matmuls (the newest's logits after the rollout); memory
      O((B / chunk + K) x params); every law, no mid-rollout switch, one device
      (``one_device``: the sort would otherwise move rows between devices).
    * ``"per_env"`` (:func:`env_versions`): one forward per env with its own version (a
      batched matvec; the newest's logits after the rollout): memory O(B x params); serves
      every law, switches included (then re-gathered from the ring at every step).

    Every path draws each env's lag iid from the law (no grouping or stratification), so
    the choice moves float bits only, never the law.

    Rule (CPU; ``experiments/rollout_paths.py micro``: the actor 4-64-64-2 alone in a
    T = 128 scan, one compile per row, best of 3, two XLA threads, 2026-12-03, after pi_k
    left the step loop; CPU time over the table's at B = 4 / 64 / 512 / 4096; single ratios
    move by ~20% between runs at these sizes):

    ======  ========================  ========================  ========================
    K       sorted                    per_env                   per_env, switches
    ======  ========================  ========================  ========================
    2       - / 1.86 / 1.33 / 2.30    0.85 / 2.26 / 1.96 / 4.70 1.71 / 6.23 / 3.87 / 8.06
    4       - / 1.21 / 0.91 / 1.48    0.70 / 1.43 / 1.28 / 2.96 1.60 / 3.72 / 2.73 / 5.12
    8       - / 0.79 / 0.56 / 0.69    0.65 / 0.77 / 0.72 / 1.47 1.56 / 1.95 / 1.54 / 2.57
    16      - / 0.36 / 0.27 / 0.31    0.34 / 0.34 / 0.31 / 0.65 1.19 / 0.91 / 0.71 / 1.13
    32      - / 0.16 / 0.13 / 0.12    0.20 / 0.14 / 0.16 / 0.24 0.55 / 0.40 / 0.38 / 0.44
    ======  ========================  ========================  ========================

    (the sorted path needs chunk >= 2, B >= 8 K; at B = 16, K = 4 per_env read 0.71.) So
    ``sorted`` when K >= 8 and its chunk (:func:`sort_chunk`) is at least 2, on one device
    and without switches; else ``per_env`` from K >= 4 while B x params <= 2^17 floats,
    K >= 8 to 2^22 and K >= 16 beyond (the per-env copies leave the cache), and under
    switches (re-gathered every step) from K >= 16 to 2^22 and K >= 32 beyond; ``table``
    otherwise. Whole training runs agree (``rollout_paths.py profile``, before pi_k left
    the loop, which made per_env and sorted cheaper still: at 1 seed x 512 envs, K = 8, the
    rollouts cost sorted 2.1, per_env 2.8, table 5.0 times sync-gae's). Other backends:
    ``table`` (O(V x params) memory, the accelerator layout of issue 22; not measured here:
    no accelerator was lent to this).
    """
    if num_envs < 1 or num_versions < 1 or num_params < 1:
        raise ValueError(f"choose_path: sizes must be >= 1, got num_envs={num_envs}, "
                         f"num_versions={num_versions}, num_params={num_params}")
    if law_fixed and switch_every <= 0:
        return "common"
    if backend != "cpu":
        return "table"
    if (switch_every <= 0 and one_device and num_versions >= _SORTED_FROM
            and sort_chunk(num_envs, num_versions) >= 2):
        return "sorted"
    size = num_envs * num_params
    tiers = _PER_ENV_SWITCH_FROM if switch_every > 0 else _PER_ENV_FROM
    k_min = next(k for bound, k in tiers if bound is None or size <= bound)
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


# --------------------------------------------------------------------------------------
# Logits of one step
# --------------------------------------------------------------------------------------


def versioned_logits(apply_fn: ApplyFn, table: VersionTable, rows: Array,
                     obs: Array) -> tuple[Array, Array]:
    """Behaviour and newest-version logits [B, A] of per-env table ``rows`` [B] at ``obs``.

    The actor runs once per table row on the whole batch (one batched matmul over [V, B]
    rows: memory O(V x params), no per-env copy of the params); each env then picks its
    row. Everything stays on the env axis with its env, so a batch sharded over envs moves
    no rows between devices. Row 0 is the newest version, so an env at lag 0 takes the very
    bits of the target logits and its log-ratios are exactly 0.
    """
    logits = jax.vmap(apply_fn, in_axes=(0, None))(table.params, obs)  # [V, B, A]
    behaviour = jnp.take_along_axis(logits, rows[None, :, None], axis=0)[0]
    return behaviour, logits[0]


def per_env_logits(apply_fn: ApplyFn, env_params: Any, obs: Array) -> Array:
    """Behaviour logits [B, A]: env b's own version (``env_params``, leaves [B, ...]) at
    ``obs[b]``, one forward per env (``vmap`` over (params, obs): a batched matvec, memory
    O(B x params))."""
    return jax.vmap(apply_fn)(env_params, obs)


def sorted_logits(apply_fn: ApplyFn, actor: SortedVersions, obs: Array) -> Array:
    """Behaviour logits [B, A] from lag-sorted (chunk, version) pairs
    (:func:`sorted_versions`): one ``chunk``-row forward per pair, then each env picks its
    own version's row."""
    out = jax.vmap(apply_fn)(actor.params, obs[actor.rows])  # [P, chunk, A]
    return out.reshape((-1,) + out.shape[2:])[actor.pick]


def newest_after(actor: Any) -> Any:
    """The newest version's params when its logits are computed after the rollout
    (:class:`EnvVersions`, :class:`SortedVersions`: :func:`newest_log_probs`), else None
    (plain params and tables give them at every step)."""
    if isinstance(actor, (EnvVersions, SortedVersions)):
        return actor.newest
    return None


#: rows (steps x envs, per seed) of one forward of :func:`newest_log_probs`: a rollout of more
#: rows runs ``max(1, NEWEST_ROWS // B)`` steps per forward. One forward over a whole rollout
#: writes fresh activation buffers of T x B x width floats (16 MB per layer at 8 seeds x 64
#: envs x 128 steps, the seed vmap multiplying the rows) and XLA:CPU runs it at a third of
#: the rate of 512-row pieces. Measured (actor 4-64-64-2 forward + log-softmax over a
#: T = 128 rollout, seeds vmapped, best of 5, CPU time of 512-row pieces over one forward,
#: 2026-12-03): 1 x 64 envs 0.70, 1 x 512 0.27, 8 x 64 0.37, 8 x 512 0.27 (8 x 4: 4096 rows,
#: one forward); the rollouts of lag8-vccc at 8 seeds x 64 envs 0.893 -> 0.674 s CPU
#: (``experiments/rollout_paths.py profile``).
NEWEST_ROWS = 512


def newest_log_probs(apply_fn: ApplyFn, newest: Any, obs: Array, lag: Array,
                     own_log_probs: Array,
                     normalize: Callable[[Array], Array] = functools.partial(
                         jax.nn.log_softmax, axis=-1)) -> Array:
    """log pi_k [T, B, A] of a whole rollout: forwards of the ``newest`` params over its
    observations ``obs`` [T, B, ...], ``max(1, NEWEST_ROWS // B)`` steps at a time (all at
    once when that is all of them; ``vmap`` over steps: env-sharded rows stay where they
    are), log-softmaxed (``normalize``: the policy head's rows of the output); except where
    ``lag`` [T, B] is 0, which keep ``own_log_probs`` [T, B, A] (log_softmax of the
    behaviour logits): that version IS the newest, through the per-env or chunk kernel,
    which may round differently from this forward, and lag 0 must give the very bits the env
    sampled with, so that its log-ratios are exactly 0."""
    chex.assert_shape(lag, obs.shape[:2])
    chex.assert_shape(own_log_probs, obs.shape[:2] + (None,))
    num_steps, num_envs = obs.shape[:2]
    steps = max(1, NEWEST_ROWS // num_envs)
    logits = (jax.vmap(apply_fn, in_axes=(None, 0))(newest, obs) if steps >= num_steps else
              jax.lax.map(lambda o: apply_fn(newest, o), obs, batch_size=steps))
    return jnp.where((lag == 0)[..., None], own_log_probs, normalize(logits))


def step_logits(apply_fn: ApplyFn, actor: Any, lags: Optional[Array], obs: Array, t: Array, *,
                switch_every: int = 0, switch_stride: int = 1
                ) -> tuple[Array, Optional[Array], Array, Array]:
    """One rollout step's (behaviour logits [B, A], newest logits [B, A] or None, lag [B],
    version id [B]) under any acting ``actor`` of this module, or plain params (synchronous:
    both logits the same forward, lag and version 0). The newest logits are None under the
    per-env and sorted paths: they come after the rollout (:func:`newest_log_probs`).
    ``lags`` [B]: the (capped) lags at the start of the rollout, for a :class:`VersionTable`
    (the other paths carry theirs); ``t``: the step, for mid-rollout switches
    (:func:`lag.switch_lags`)."""
    if isinstance(actor, EnvVersions):
        lag_t = switch_lags(actor.lag, t, every=switch_every, stride=switch_stride)
        params_t = (actor.params if switch_every <= 0  # else re-gathered at every step
                    else gather(actor.buffer, lag_t))
        return (per_env_logits(apply_fn, params_t, obs), None, lag_t,
                version_ids(actor.buffer, lag_t))
    if isinstance(actor, SortedVersions):
        return sorted_logits(apply_fn, actor, obs), None, actor.lag, actor.version
    if isinstance(actor, VersionTable):
        rows = actor.rows(switch_lags(lags, t, every=switch_every, stride=switch_stride))
        mu, pi = versioned_logits(apply_fn, actor, rows, obs)
        return mu, pi, actor.row_lag[rows], actor.version[rows]
    pi = apply_fn(actor, obs)
    zero = jnp.zeros(obs.shape[:1], jnp.int32)
    return pi, pi, zero, zero
