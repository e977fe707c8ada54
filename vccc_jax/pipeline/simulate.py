"""Event-driven simulation of an asynchronous RL pipeline (DESIGN.md §6; issue 14).

:func:`simulate` runs a :class:`~vccc_jax.pipeline.config.PipelineConfig` with a ``heapq``
event queue and NumPy randomness seeded from ``config.seed``, so the result is a
deterministic function of the config. Events (ties broken by insertion order):

* ``done``    a worker finishes an episode; every reward channel draws its arrival time
              (channels with ``servers > 0`` serve episodes FIFO with that many reviewers);
              the episode becomes *ready* when its last blocking channel has arrived.
* ``ready``   an episode may be consumed by the trainer.
* ``update``  the trainer finishes update u; version u + 1 is broadcast after ``sync_time``.
* ``sync``    version v reaches the workers (partial rollout: in-flight episodes switch).

Versions: the initial weights are version 0; update u (0-based) consumes one batch and
produces version u + 1. A transition generated with version v and consumed by update u has
**lag u - v** (the trainer's ``LagLaw`` convention, vccc_jax/envs/lag.py: lag 0 = newest).

Schedules (episodes are assigned to batches at generation time for the first two):

* ``sync``          batch k is generated with version k after update k - 1 and its sync;
                    workers idle while the trainer trains. Every lag is 0.
* ``one_step_off``  batch k >= 1 is generated with version k - 1, starting when batch k - 1
                    is fully generated and version k - 1 is synced, so generation of batch
                    k overlaps update k - 1. Lag is 1 (0 for batch 0).
* ``async``         workers start episodes whenever the buffer bound allows, with the newest
                    synced version; the trainer consumes the oldest ``batch_size`` ready
                    episodes as soon as it is idle. With ``partial_rollout`` an in-flight
                    episode continues with the new weights (one episode, several versions).

Reward arrivals of a non-blocking channel are also expressed in optimiser steps:
``reward_update`` = index of the first update that starts at or after the arrival, i.e. the
first optimiser step that could use it (D = reward_update - consumed_update steps late);
-1 when it arrives after the last simulated update started (censored).
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from vccc_jax.pipeline.config import PipelineConfig


@dataclasses.dataclass(frozen=True)
class PipelineTrace:
    """What the simulator emits (only episodes consumed by some update are kept).

    Segments (a run of tokens of one episode generated with one version), [N_seg]:
      seg_episode, seg_version, seg_tokens (int), seg_consumed (update that consumed it).
    Episodes, [E] (row order = consumption order):
      ep_worker, ep_tokens, ep_start_time, ep_done_time, ep_ready_time, ep_consumed,
      ep_first_version, ep_last_version,
      ep_reward_time [E, C] (seconds), ep_reward_update [E, C] (see the module docstring).
    Updates, [U]: update_start, update_end (seconds).
    channel_names: tuple of C names; channel_blocking: tuple of C bools.
    """

    seg_episode: np.ndarray
    seg_version: np.ndarray
    seg_tokens: np.ndarray
    seg_consumed: np.ndarray
    ep_worker: np.ndarray
    ep_tokens: np.ndarray
    ep_start_time: np.ndarray
    ep_done_time: np.ndarray
    ep_ready_time: np.ndarray
    ep_consumed: np.ndarray
    ep_first_version: np.ndarray
    ep_last_version: np.ndarray
    ep_reward_time: np.ndarray
    ep_reward_update: np.ndarray
    update_start: np.ndarray
    update_end: np.ndarray
    channel_names: tuple
    channel_blocking: tuple

    # ---- derived views
    def segment_lags(self) -> np.ndarray:
        """consumed_update - version for every segment. int64 [N_seg]"""
        return self.seg_consumed - self.seg_version

    def transition_lags(self) -> np.ndarray:
        """One lag per generated token (transition), in consumption order. int64 [sum tokens]"""
        return np.repeat(self.segment_lags(), self.seg_tokens)

    def episode_lags(self) -> np.ndarray:
        """Lag of each episode's first token (its oldest version). int64 [E]"""
        return self.ep_consumed - self.ep_first_version

    def version_switches(self) -> np.ndarray:
        """Number of mid-trajectory version switches per episode. int64 [E]"""
        return np.bincount(self.seg_episode, minlength=len(self.ep_tokens)) - 1

    def wallclock_per_update(self) -> np.ndarray:
        """Seconds between consecutive update ends (the first counts from t = 0). [U]"""
        return np.diff(self.update_end, prepend=0.0)

    def reward_delay_steps(self, channel: "int | str") -> np.ndarray:
        """Optimiser steps by which channel ``channel``'s reward arrives after its episode
        was consumed, max(reward_update - consumed, 0); censored arrivals dropped. [<=E]"""
        c = self.channel_names.index(channel) if isinstance(channel, str) else int(channel)
        ru = self.ep_reward_update[:, c]
        keep = ru >= 0
        return np.maximum(ru[keep] - self.ep_consumed[keep], 0)


class _Sim:
    """Mutable state of one run (private; :func:`simulate` is the entry point)."""

    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.speed = cfg.tokens_per_second * np.exp(
            cfg.speed_sigma * self.rng.standard_normal(cfg.num_workers))
        self.heap: list = []
        self.seq = 0
        self.latest = 0  # newest version synced to the workers
        self.idle = list(range(cfg.num_workers))
        self.busy: dict[int, int] = {}  # worker -> episode
        self.ep: list[dict] = []
        self.servers = [[0.0] * c.servers for c in cfg.channels]
        # batches (sync / one_step_off)
        self.batch_version: dict[int, int] = {}
        self.batch_assigned: dict[int, int] = {}
        self.batch_done: dict[int, int] = {}
        self.batch_ready: dict[int, list] = {}
        # async
        self.ready: list[int] = []
        self.pending = 0  # in flight + ready and not consumed
        # trainer
        self.trainer_busy = False
        self.started = 0
        self.update_start: list[float] = []
        self.update_end: list[float] = []

    def push(self, t, kind, payload):
        heapq.heappush(self.heap, (t, self.seq, kind, payload))
        self.seq += 1

    # ---- generation
    def _draw_length(self) -> int:
        cfg = self.cfg
        x = cfg.length_median * np.exp(cfg.length_sigma * self.rng.standard_normal())
        return int(min(max(round(x), 1), cfg.max_length))

    def _open_batch(self, b: int, version: int):
        if b < self.cfg.num_updates and b not in self.batch_version:
            self.batch_version[b] = version
            self.batch_assigned[b] = self.batch_done[b] = 0
            self.batch_ready[b] = []

    def _slot(self):
        """(batch, version) for a new episode, or None if no work may start now."""
        cfg = self.cfg
        if cfg.schedule == "async":
            if self.pending >= (cfg.max_ahead + 1) * cfg.batch_size:
                return None
            return -1, self.latest
        for b in sorted(self.batch_version):
            if self.batch_assigned[b] < cfg.batch_size:
                return b, self.batch_version[b]
        return None

    def start_idle(self, t):
        for w in sorted(self.idle):
            slot = self._slot()
            if slot is None:
                break
            b, v = slot
            self.idle.remove(w)
            length = self._draw_length()
            e = len(self.ep)
            self.ep.append(dict(worker=w, tokens=length, start=t, batch=b, segs=[[v, t, 0]],
                                consumed=-1))
            if b >= 0:
                self.batch_assigned[b] += 1
            self.pending += 1
            self.busy[w] = e
            self.push(t + length / self.speed[w], "done", (w, e))

    def _tokens_by(self, e, t) -> int:
        rec = self.ep[e]
        done = int(np.floor((t - rec["start"]) * self.speed[rec["worker"]] + 1e-9))
        return min(done, rec["tokens"])

    # ---- handlers
    def on_done(self, t, payload):
        w, e = payload
        rec = self.ep[e]
        rec["done"] = t
        del self.busy[w]
        self.idle.append(w)
        arrivals = []
        for c, chan in enumerate(self.cfg.channels):
            lat = chan.latency * np.exp(chan.latency_sigma * self.rng.standard_normal())
            if chan.servers:
                free = heapq.heappop(self.servers[c])
                end = max(t, free) + lat
                heapq.heappush(self.servers[c], end)
            else:
                end = t + lat
            arrivals.append(end)
        rec["rewards"] = arrivals
        ready = max(a for a, ch in zip(arrivals, self.cfg.channels) if ch.blocking)
        rec["ready"] = ready
        self.push(ready, "ready", e)
        b = rec["batch"]
        if b >= 0:
            self.batch_done[b] += 1
            if (self.cfg.schedule == "one_step_off" and self.batch_done[b] == self.cfg.batch_size
                    and self.latest >= b):
                self._open_batch(b + 1, b)
        self.start_idle(t)

    def on_ready(self, t, e):
        b = self.ep[e]["batch"]
        if b >= 0:
            self.batch_ready[b].append(e)
        else:
            self.ready.append(e)
        self.try_train(t)

    def try_train(self, t):
        cfg = self.cfg
        if self.trainer_busy or self.started >= cfg.num_updates:
            return
        u = self.started
        if cfg.schedule == "async":
            if len(self.ready) < cfg.batch_size:
                return
            batch, self.ready = self.ready[: cfg.batch_size], self.ready[cfg.batch_size:]
        else:
            if len(self.batch_ready.get(u, ())) < cfg.batch_size:
                return
            batch = self.batch_ready[u]
        for e in batch:
            self.ep[e]["consumed"] = u
        self.pending -= len(batch)
        self.trainer_busy = True
        self.started += 1
        self.update_start.append(t)
        self.push(t + cfg.update_time, "update", u)
        self.start_idle(t)

    def on_update(self, t, u):
        self.update_end.append(t)
        self.trainer_busy = False
        self.push(t + self.cfg.sync_time, "sync", u + 1)
        self.try_train(t)

    def on_sync(self, t, v):
        cfg = self.cfg
        self.latest = v
        if cfg.schedule == "sync":
            self._open_batch(v, v)
        elif cfg.schedule == "one_step_off":
            if self.batch_done.get(v, -1) == cfg.batch_size:
                self._open_batch(v + 1, v)
        elif cfg.partial_rollout:
            for w in sorted(self.busy):
                e = self.busy[w]
                segs = self.ep[e]["segs"]
                segs.append([v, t, self._tokens_by(e, t)])
        self.start_idle(t)

    def run(self) -> PipelineTrace:
        cfg = self.cfg
        self._open_batch(0, 0)
        if cfg.schedule == "one_step_off":
            pass  # batch 1 opens when batch 0 is generated (version 0 is already synced)
        self.start_idle(0.0)
        handlers = dict(done=self.on_done, ready=self.on_ready, update=self.on_update,
                        sync=self.on_sync)
        while self.heap and len(self.update_end) < cfg.num_updates:
            t, _, kind, payload = heapq.heappop(self.heap)
            handlers[kind](t, payload)
        if len(self.update_end) < cfg.num_updates:  # pragma: no cover - defensive
            raise RuntimeError("pipeline simulation stalled before num_updates updates")
        return self._trace()

    def _trace(self) -> PipelineTrace:
        eps = sorted((r for r in self.ep if r["consumed"] >= 0),
                     key=lambda r: (r["consumed"], r["ready"]))
        seg_e, seg_v, seg_n, seg_u = [], [], [], []
        for i, r in enumerate(eps):
            cuts = [s[2] for s in r["segs"]] + [r["tokens"]]
            for (v, _, _), lo, hi in zip(r["segs"], cuts[:-1], cuts[1:]):
                if hi > lo or len(r["segs"]) == 1:
                    seg_e.append(i), seg_v.append(v), seg_n.append(hi - lo)
                    seg_u.append(r["consumed"])
        starts = np.asarray(self.update_start)
        rt = np.asarray([r["rewards"] for r in eps], np.float64).reshape(len(eps), -1)
        ru = np.searchsorted(starts, rt, side="left").astype(np.int64)
        ru[ru >= len(starts)] = -1
        ints = lambda x: np.asarray(x, np.int64)  # noqa: E731
        seg_e, seg_v = ints(seg_e), ints(seg_v)
        first = np.full(len(eps), np.iinfo(np.int64).max)
        last = np.full(len(eps), -1)
        np.minimum.at(first, seg_e, seg_v)
        np.maximum.at(last, seg_e, seg_v)
        return PipelineTrace(
            seg_episode=seg_e, seg_version=seg_v, seg_tokens=ints(seg_n), seg_consumed=ints(seg_u),
            ep_worker=ints([r["worker"] for r in eps]), ep_tokens=ints([r["tokens"] for r in eps]),
            ep_start_time=np.asarray([r["start"] for r in eps]),
            ep_done_time=np.asarray([r["done"] for r in eps]),
            ep_ready_time=np.asarray([r["ready"] for r in eps]),
            ep_consumed=ints([r["consumed"] for r in eps]),
            ep_first_version=first, ep_last_version=last,
            ep_reward_time=rt, ep_reward_update=ru,
            update_start=starts, update_end=np.asarray(self.update_end),
            channel_names=tuple(c.name for c in self.cfg.channels),
            channel_blocking=tuple(c.blocking for c in self.cfg.channels),
        )


def simulate(config: PipelineConfig) -> PipelineTrace:
    """Run the pipeline described by ``config`` until ``num_updates`` updates have finished.

    Deterministic: the same config (seed included) gives an identical trace.
    """
    if not isinstance(config, PipelineConfig):
        raise ValueError(f"config must be a PipelineConfig, got {type(config).__name__}")
    return _Sim(config).run()
