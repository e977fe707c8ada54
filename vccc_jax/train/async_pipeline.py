"""A real asynchronous actor-learner pipeline on JAX's own runtime (issue 48; Sebulba / Cleanba).

Threads and devices, no Ray and no RPC: ``AsyncSpec.actors`` actor threads, each on a device
of the actor set, run the trainer's own jitted rollout (``trainer.rollout_step``, the
synchronous path: every env of the thread acts with the parameters it holds) on its slice of
the ``num_envs`` envs, stamp every transition with the version of those parameters
(``Trajectory.version``, per step) and put the rollout in its own queue of size
``AsyncSpec.queue``. The learner (the calling thread, on the learner device) takes one rollout
from every actor per update (Cleanba's layout: the batch is the synchronous trainer's [T, B]
with env slices in actor order), sets the lag ``k - version`` per step, recomputes log pi_k
with its own parameters (``acting.newest_log_probs``: lag-0 steps keep the actor's bits) and
runs the trainer's prepare / learn / push / metrics steps (:func:`learn_on`; no second copy
of the maths); then it publishes version k + 1 on the :class:`ParamChannel`.

Parameter channel modes (``AsyncSpec.mode``):

* ``lag1`` (Cleanba): an actor's rollout j acts with version max(j - 1, start), waiting for
  it: exactly one version stale (the first rollout of a run or a resume: 0);
* ``latest`` (Sebulba): an actor takes the newest published version without waiting;
* ``bounded:N`` (AReaL's max staleness): actors as ``latest``; the learner DROPS a rollout
  whose lag exceeds N and takes that actor's next one (counted per update: ``dropped``).

Mid-rollout weight updates (``AsyncSpec.sync_every`` = M, M divides T): an actor runs its
rollout as T / M chunks of M steps (the same jitted rollout, each chunk its slice of the
rollout's draws: :func:`chunked_rollout`) and takes parameters before every chunk, so each
step keeps its own version and one rollout may span several (an in-flight update). ``latest``
/ ``bounded:N``: the newest version before each chunk; ``lag1``: chunk 0 acts with version
j - 1 as before, every later chunk waits for version j (the simulator's ``fixed:1`` with
``switch_every`` = M, deterministic). ``bounded:N`` bounds the OLDEST step of a rollout (its
first chunk's version): a rollout is learned only if every one of its steps is at lag <= N.

The learner on several devices (``AsyncSpec.learner_devices`` I,J,...): its state and batch
lie on a ``("data", "seed")`` mesh over those devices with the sharded trainer's layout
(``train.sharding``: env axis and minibatches on "data", params replicated,
``learner_constrain`` inside the step), the actors' rollouts are placed onto it, and the
compiler reduces the gradients (one all-reduce per minibatch): the same numbers as one
learner device up to the reordered sums (float32 rounding).

Random keys: actor i keeps its own key chain (actor 0: the learner state's key; actor i > 0:
``fold_in(key, i)``), split per rollout as ``trainer.update`` splits the state's key, so one
actor thread in ``lag1`` mode draws the very numbers of the simulator's ``fixed:1`` run.
Every queue or channel wait is bounded by ``AsyncSpec.timeout``; a failing actor thread
stops the run with :class:`ActorFailed` (one line naming the thread and the error).
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import acting
from vccc_jax.train import learner
from vccc_jax.train import trainer as tr
from vccc_jax.train.programs import program_values

MODES = ("lag1", "latest", "bounded")
POLL_S = 0.05  # how often a waiting thread looks at the stop flag

__all__ = ["ActorFailed", "AsyncSpec", "Batch", "MODES", "ParamChannel", "Pipeline",
           "actor_rollout", "chunked_rollout", "initial_actor_keys", "learn_on",
           "learner_log_probs"]


@dataclasses.dataclass(frozen=True)
class AsyncSpec:
    """How the pipeline runs: actor threads, queue size, parameter mode, device indices
    (``jax.devices()``; actor thread i runs on ``actor_devices[i % len]``), the longest any
    wait may last (seconds), ``fail_at`` = (actor, rollout): a test hook that makes that
    actor raise before that rollout (counted from the run's start), and ``sync_every`` = M:
    actors take new parameters every M steps inside a rollout (0: once per rollout)."""

    actors: int = 1
    queue: int = 1
    mode: str = "lag1"
    actor_devices: tuple[int, ...] = (0,)
    learner_devices: tuple[int, ...] = (0,)
    timeout: float = 300.0
    fail_at: Optional[tuple[int, int]] = None
    sync_every: int = 0

    def __post_init__(self):
        if self.actors < 1 or self.queue < 1:
            raise ValueError(f"--actor-threads and --queue-size must be >= 1, got "
                             f"{self.actors} and {self.queue}")
        kind, _, arg = self.mode.partition(":")
        if kind not in MODES or (kind == "bounded") != bool(arg):
            raise ValueError(f"--param-mode must be lag1, latest or bounded:N, got {self.mode!r}")
        if kind == "bounded" and (not arg.isdigit()):
            raise ValueError(f"--param-mode bounded:N needs an integer N >= 0, got {arg!r}")
        if not self.actor_devices or not self.learner_devices:
            raise ValueError("--actor-devices and --learner-devices need at least one device")
        if len(set(self.learner_devices)) != len(self.learner_devices):
            raise ValueError(f"--learner-devices names a device twice: {self.learner_devices}")
        if self.timeout <= 0:
            raise ValueError(f"--queue-timeout must be > 0, got {self.timeout}")
        if self.sync_every < 0:
            raise ValueError(f"--actor-sync-every must be >= 0, got {self.sync_every}")

    @property
    def kind(self) -> str:
        return self.mode.partition(":")[0]

    @property
    def bound(self) -> Optional[int]:
        return int(self.mode.partition(":")[2]) if self.kind == "bounded" else None

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}


class ActorFailed(RuntimeError):
    """An actor thread raised: the run stops; ``str`` is one line naming thread and error."""

    def __init__(self, thread: str, error: BaseException):
        super().__init__(f"{thread} raised {type(error).__name__}: {error}")
        self.thread, self.error = thread, error


class _Stopped(Exception):
    """The stop flag was set while a thread waited."""


# --------------------------------------------------------------------------------------
# The jitted pieces: the trainer's steps, split between actor and learner
# --------------------------------------------------------------------------------------


def initial_actor_keys(key, num_actors: int):
    """[N, 2] key chains: actor 0 the learner state's key, actor i > 0 ``fold_in(key, i)``."""
    return jnp.stack([key] + [jax.random.fold_in(key, i) for i in range(1, num_actors)])


def actor_rollout(setup, values, params, env_carry, key, version, first=0, steps=None):
    """One actor rollout with ``params`` (version ``version``): (carry, trajectory stamped
    with the version at every step, the next key). Keys split as ``trainer.update`` does.
    ``steps`` (static), ``first``: only that chunk of the rollout (its draws unchanged).
    For a critic that reads the actor's critic copy (``trainer.needs_critic_copy``)
    ``params`` is (actor params, critic params) and the rollout logs the copy's values
    (``Trajectory.behaviour_values``)."""
    key, _, k_roll, _, _ = jax.random.split(key, 5)
    actor_params, critic_params = params if tr.needs_critic_copy(setup) else (params, None)
    env_carry, traj = tr.rollout_step(setup, values, actor_params, None, env_carry, k_roll, 0,
                                      steps=steps, first_step=first)
    traj = tr.with_behaviour_values(setup, None, critic_params, traj)
    return env_carry, traj.replace(version=jnp.full(traj.reward.shape, version, jnp.int32)), key


def chunked_rollout(rollout, values, take, carry, key, num_steps: int, every: int):
    """One actor rollout of ``num_steps`` steps in chunks of ``every`` (0 or ``num_steps``:
    one call, the whole rollout), taking parameters before each: ``take(c)`` -> (version,
    params) for chunk c. ``rollout``: the jitted :func:`actor_rollout` (``steps`` static).
    Returns (carry, [T, B] trajectory, per step the version of its chunk; the next key; the
    first chunk's version, the rollout's oldest when versions never go back)."""
    chunks = 1 if every in (0, num_steps) else num_steps // every
    parts, first = [], None
    for c in range(chunks):
        version, params = take(c)
        first = version if first is None else first
        if chunks == 1:
            carry, traj, next_key = rollout(values, params, carry, key, np.int32(version))
        else:
            carry, traj, next_key = rollout(values, params, carry, key, np.int32(version),
                                            np.int32(c * every), steps=every)
        parts.append(traj)
    traj = parts[0] if chunks == 1 else jax.tree_util.tree_map(
        lambda *x: jnp.concatenate(x, 0), *parts)
    return carry, traj, next_key, first


def learner_log_probs(setup, actor_params, traj):
    """``traj`` with log pi_k (the learner's ``actor_params``) where its lag is > 0; lag-0
    steps keep the actor's own rows (``acting.newest_log_probs``: exactly zero log-ratios).
    Tool steps (``is_action`` False): log mu := log pi_k, as the rollout does."""
    log_pi_all = acting.newest_log_probs(setup.actor_logits, actor_params, traj.obs, traj.lag,
                                         traj.log_pi_all, setup.head.normalize)
    traj = traj.replace(log_pi_all=log_pi_all)
    if traj.is_action is not None:
        log_mu_all = jnp.where(traj.is_action[..., None], traj.log_mu_all, log_pi_all)
        traj = traj.replace(log_mu_all=log_mu_all,
                            log_mu=setup.head.log_prob(log_mu_all, traj.action))
    return traj


def learn_on(setup, values, state: tr.TrainState, traj, env_carry, idx):
    """Steps 2-5 of ``trainer.update`` on a rollout the actors made: lag = idx - version,
    log pi_k recomputed, then prepare, learn, push the version, metrics (plus
    ``lag_value_corr``: the correlation of the lag with Vbar(s_t) over the batch)."""
    key, _, _, k_perm, k_gt = jax.random.split(state.key, 5)
    traj = traj.replace(lag=(idx - traj.version).astype(jnp.int32))
    traj = setup.constrain("traj", learner_log_probs(setup, state.actor_params, traj))
    ltraj, valid = tr.with_replay(setup, state, traj)
    prep = learner.prepare(setup, values, ltraj, tr.vbar_params(setup, state),
                           state.baseline_params)
    log_pi_old, log_pi_old_all = learner.pi_old(setup, values, state.ewma, ltraj, prep)
    batch = learner.learner_batch(setup, values, ltraj, prep, valid, log_pi_old,
                                  log_pi_old_all)
    learned, loss_stats = tr.learn_step(setup, values, state, batch, ltraj, k_perm)
    new_state = tr.push_version(setup, values, state, learned, traj, env_carry, key)
    metrics = tr.update_metrics(setup, values, state, new_state, traj, ltraj, valid, prep,
                                batch, log_pi_old_all, loss_stats, k_gt, idx)
    lag = traj.lag.astype(jnp.float32).reshape(-1)
    v = prep.inputs.transitions.values[:traj.lag.shape[0]].reshape(-1)
    cov = jnp.mean((lag - lag.mean()) * (v - v.mean()))
    metrics["lag_value_corr"] = cov / (jnp.std(lag) * jnp.std(v))  # NaN: constant lags
    return new_state, metrics


# --------------------------------------------------------------------------------------
# Threads: the parameter channel, the actors, the learner's side of the queues
# --------------------------------------------------------------------------------------


class ParamChannel:
    """Published actor versions (the last ``keep``), each already on every actor device."""

    def __init__(self, keep: int = 4):
        self._cond = threading.Condition()
        self._versions: dict[int, dict] = {}
        self.keep = keep

    def publish(self, version: int, params_by_device: dict) -> None:
        with self._cond:
            self._versions[version] = params_by_device
            for old in [v for v in self._versions if v <= version - self.keep]:
                del self._versions[old]
            self._cond.notify_all()

    def newest(self) -> tuple[int, dict]:
        with self._cond:
            v = max(self._versions)
            return v, self._versions[v]

    def wait_for(self, version: int, stop: threading.Event, timeout: float) -> dict:
        """Version ``version`` (blocking until it is published, at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while version not in self._versions:
                if stop.is_set():
                    raise _Stopped
                if max(self._versions) > version:
                    raise RuntimeError(f"version {version} was dropped from the channel")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {timeout:g}s for parameter version {version}")
                self._cond.wait(min(left, POLL_S))
            return self._versions[version]


class Batch(NamedTuple):
    """What the learner takes for one update: the [T, B] trajectory and the env carries
    after it, the actors' next keys [N, 2], rollouts dropped (``bounded``), seconds waited
    and, per actor, the versions its dropped rollouts acted with (oldest first)."""

    traj: Any
    env_carry: Any
    actor_keys: Any
    dropped: int
    wait_s: float
    drop_versions: tuple = ()


class _LearnerMesh:
    """The learner over several devices: a (data, 1) mesh, the unbatched TrainState's
    shardings (``sharding.state_specs``), the rollout's (env axis on "data") and the setup
    whose ``constrain`` hook is the sharded trainer's (``sharding.learner_constrain``)."""

    def __init__(self, trainer, state, devices):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from vccc_jax.train import sharding as sh

        cfg = trainer.setup.cfg
        mesh = sh.make_mesh((len(devices), 1), devices=devices)
        sh.check_divisible(cfg.num_envs, mesh)
        specs = sh.state_specs(state, len(devices), seed_axis=False)
        self.state = jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), specs,
                                            is_leaf=lambda x: isinstance(x, P))
        self.replicated = NamedSharding(mesh, P())
        self.traj, self.envs = NamedSharding(mesh, P(None, sh.DATA)), NamedSharding(mesh, P(sh.DATA))
        self.setup = dataclasses.replace(
            trainer.setup, constrain=sh.learner_constrain(mesh, cfg.minibatch_size))


def learner_devices(indices) -> list:
    """The learner's mesh devices: ``indices`` into each process's local devices, process by
    process (one process: ``jax.local_devices()[i]`` for i in ``indices``)."""
    by_proc: dict[int, list] = {}
    for d in jax.devices():
        by_proc.setdefault(d.process_index, []).append(d)
    return [by_proc[p][i] for p in sorted(by_proc) for i in indices]


def _global(tree, sharding, local: bool):
    """Global arrays of ``tree`` with ``sharding`` (one, or a matching tree of them) over
    processes: from this process's env slice (``local``) or from the whole value."""
    if isinstance(sharding, jax.sharding.Sharding):
        sharding = jax.tree_util.tree_map(lambda _: sharding, tree)

    def one(x, s):
        x = np.asarray(x)
        if local:
            return jax.make_array_from_process_local_data(s, x)
        return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

    return jax.tree_util.tree_map(one, tree, sharding)


def _slice_envs(tree, i: int, n: int):
    def cut(x):
        size = x.shape[0] // n
        return x[i * size:(i + 1) * size]
    return jax.tree_util.tree_map(cut, tree)


class Pipeline:
    """The actor threads and queues of one run from update ``start``: ``state`` the learner's
    (unbatched) TrainState (its ``env`` the carries the actors start from, split by env),
    ``actor_keys`` [N, 2] the actors' key chains. :meth:`next_batch`, :meth:`learn`,
    :meth:`publish` are called by the learner thread; :meth:`close` stops and joins.
    ``programs``: the jitted (rollout, learn) of another Pipeline of the same trainer (seeds
    of a study share their compiles)."""

    def __init__(self, trainer, spec: AsyncSpec, state, actor_keys, start: int,
                 programs: Optional[tuple] = None):
        cfg = trainer.setup.cfg
        if spec.sync_every and cfg.num_steps % spec.sync_every:
            raise ValueError(f"--actor-sync-every {spec.sync_every} must divide num_steps "
                             f"{cfg.num_steps} (the rollout runs in chunks of that many steps)")
        self.procs, self.proc = jax.process_count(), jax.process_index()
        if cfg.num_envs % (spec.actors * self.procs):
            raise ValueError(f"num_envs {cfg.num_envs} must be a multiple of --actor-threads "
                             f"{spec.actors} x {self.procs} processes (each actor thread runs "
                             f"num_envs / (N x processes) envs)")
        devices = jax.local_devices()
        wanted = max(spec.actor_devices + spec.learner_devices)
        if wanted >= len(devices):
            raise ValueError(f"device {wanted} asked for but JAX sees {len(devices)} "
                             f"({devices[0].platform}); on CPU set XLA_FLAGS="
                             f"--xla_force_host_platform_device_count={wanted + 1}")
        self.spec, self.start, self.setup = spec, start, trainer.setup
        self.num_steps = cfg.num_steps
        self.learner_device = devices[spec.learner_devices[0]]
        self.actor_device = [devices[spec.actor_devices[i % len(spec.actor_devices)]]
                             for i in range(spec.actors)]
        values = program_values(trainer.values)
        self._values_on = {d: jax.device_put(values, d) for d in set(self.actor_device)}
        learner_setup, self.layout = trainer.setup, None
        if len(spec.learner_devices) > 1 or self.procs > 1:
            self.layout = _LearnerMesh(trainer, state, learner_devices(spec.learner_devices))
            learner_setup = self.layout.setup
        self.values = self._place(values, None)
        if programs is None:  # (rollout, learn) jitted; pass ``pipe.programs`` to share them
            learn = functools.partial(learn_on, learner_setup)
            programs = (jax.jit(functools.partial(actor_rollout, trainer.setup),
                                static_argnames=("steps",)),
                        jax.jit(learn) if self.layout is None else
                        jax.jit(learn, out_shardings=(self.layout.state, self.layout.replicated)))
        self.programs = programs
        self._rollout, self._learn = programs
        self.channel = ParamChannel(keep=spec.queue + 3)
        self.queues = [queue.Queue(maxsize=spec.queue) for _ in range(spec.actors)]
        self.stop_event = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []
        self.publish(start, state.actor_params, state.critic_params)
        n, first = spec.actors * self.procs, spec.actors * self.proc  # over all processes
        self.threads = [threading.Thread(
            target=self._actor, name=f"actor-{i}", daemon=True,
            args=(i, _slice_envs(state.env, first + i, n), actor_keys[first + i]))
            for i in range(spec.actors)]

    # -- learner side ----------------------------------------------------------------
    def start_threads(self) -> None:
        for t in self.threads:
            t.start()

    def drive(self, state, updates: int):
        """Start the actor threads and run learner updates 0 .. ``updates`` - 1 on ``state``,
        publishing each new version; yields (update, batch, new state, metrics) after each.
        The caller closes the pipeline (``close``). ``runs.train_async`` runs its own loop
        (checkpoints, stop requests, several processes); this is the plain one."""
        self.start_threads()
        for k in range(updates):
            batch = self.next_batch(k)
            state, metrics = self.learn(state, batch, k)
            self.publish(k + 1, state.actor_params, state.critic_params)
            yield k, batch, state, metrics

    def _place(self, tree, sharding, local: bool = False):
        """``tree`` on the learner: its device, or the mesh with ``sharding`` (None:
        replicated). Several processes: ``tree`` is the same on all (``local`` False) or this
        process's slice of a global array's env axis (``local``: its actors' rollouts)."""
        if self.layout is None:
            return jax.device_put(tree, self.learner_device)
        sharding = self.layout.replicated if sharding is None else sharding
        if self.procs == 1:
            return jax.device_put(tree, sharding)
        return _global(tree, sharding, local)

    def place_state(self, state):
        """The learner's (unbatched) TrainState on the learner device(s)."""
        return self._place(state, None if self.layout is None else self.layout.state)

    def publish(self, version: int, actor_params, critic_params=None) -> None:
        """Version ``version`` for the actors; ``critic_params`` (the critic copy) is
        required by, and only sent for, a critic that reads it."""
        params = actor_params
        if tr.needs_critic_copy(self.setup):
            if critic_params is None:
                raise ValueError(f"critic {self.setup.cfg.critic!r} needs the actors' critic "
                                 "copy: publish(version, actor_params, critic_params)")
            params = (actor_params, critic_params)
        if self.procs > 1:  # this process's replica of the learner's params
            params = jax.tree_util.tree_map(
                lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, params)
        on = {d: jax.device_put(params, d) for d in set(self.actor_device)}
        self.channel.publish(version, on)

    def learn(self, state, batch: Batch, idx: int):
        return self._learn(self.values, state, batch.traj, batch.env_carry,
                           jnp.asarray(idx, jnp.int32))

    def next_batch(self, update: int) -> Batch:
        t0, dropped, items = time.monotonic(), [], []
        for i in range(self.spec.actors):
            dropped.append([])
            while True:
                version, traj, carry, key = self._get(i)
                if self.spec.bound is not None and update - version > self.spec.bound:
                    dropped[-1].append(int(version))
                    continue
                break
            items.append(jax.device_put((traj, carry, key), self.learner_device))
        if len(items) == 1:
            traj, carry, key = items[0]
            keys = key[None]
        else:
            traj = jax.tree_util.tree_map(lambda *x: jnp.concatenate(x, 1),
                                          *[it[0] for it in items])
            carry = jax.tree_util.tree_map(lambda *x: jnp.concatenate(x, 0),
                                           *[it[1] for it in items])
            keys = jnp.stack([it[2] for it in items])
        if self.layout is not None:  # onto the learner's mesh: env axis on "data"
            traj = self._place(traj, self.layout.traj, local=True)
            carry = self._place(carry, self.layout.envs, local=True)
        return Batch(traj, carry, keys, sum(map(len, dropped)), time.monotonic() - t0,
                     tuple(tuple(d) for d in dropped))

    def _raise_failure(self) -> None:
        if self.errors:
            name, err = self.errors[0]
            raise ActorFailed(name, err) from err

    def _get(self, i: int):
        """Actor i's next rollout; what it queued before failing is taken first."""
        deadline = time.monotonic() + self.spec.timeout
        while True:
            try:
                return self.queues[i].get(timeout=POLL_S)
            except queue.Empty:
                self._raise_failure()
                if not self.threads[i].is_alive():
                    raise RuntimeError(f"actor-{i} stopped without an error") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"learner waited {self.spec.timeout:g}s for a rollout "
                                       f"of actor-{i}") from None

    def close(self, timeout: float = 30.0) -> list[str]:
        """Stop every actor thread and join it (each waits at most ``POLL_S`` between looks
        at the stop flag, plus the rollout in flight); returns the threads still alive."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            if t.is_alive():
                t.join(max(deadline - time.monotonic(), 0.0))
        return [t.name for t in self.threads if t.is_alive()]

    # -- actor side ------------------------------------------------------------------
    def _params_for(self, i: int, j: int, c: int = 0) -> tuple[int, Any]:
        """Actor i's parameters for chunk c of its rollout j (``lag1``: chunk 0 version
        j - 1, later chunks version j, both waited for; else the newest)."""
        if self.spec.kind == "lag1":
            version = max(j - 1, self.start) if c == 0 else j
            on = self.channel.wait_for(version, self.stop_event, self.spec.timeout)
        else:
            version, on = self.channel.newest()
        return version, on[self.actor_device[i]]

    def _put(self, i: int, item) -> None:
        deadline = time.monotonic() + self.spec.timeout
        while True:
            if self.stop_event.is_set():
                raise _Stopped
            try:
                self.queues[i].put(item, timeout=POLL_S)
                return
            except queue.Full:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rollout queue full for {self.spec.timeout:g}s") from None

    def _actor(self, i: int, carry, key) -> None:
        name = f"actor-{i}"
        try:
            device = self.actor_device[i]
            carry, key = jax.device_put((carry, key), device)
            j = self.start
            while not self.stop_event.is_set():
                if self.spec.fail_at is not None and self.spec.fail_at == (i, j - self.start):
                    raise RuntimeError(f"injected failure before rollout {j}")
                carry, traj, key, version = chunked_rollout(
                    self._rollout, self._values_on[device],
                    functools.partial(self._params_for, i, j), carry, key, self.num_steps,
                    self.spec.sync_every)
                self._put(i, (version, traj, carry, key))
                j += 1
        except _Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - reported by the learner, run stops
            self.errors.append((name, e))
            self.stop_event.set()
