"""The trainer over a device mesh: named axes, shardings, one jitted sharded step (issue 10).

Layout (DESIGN.md §8 "Rollout layout"; the write-up's §1.4 asynchronous setting, simulated
on one mesh):

* mesh ``("data", "seed")``, default ``(num_devices, 1)``; both axes ``AxisType.Auto``;
* on ``"seed"``: the leading seed axis of every leaf of the (vmapped) TrainState, so S
  seeds on an S-way seed axis run side by side with no communication at all (the cheap
  way to use many devices for many seeds); ``num_seeds`` must be a multiple of its size;
* on ``"data"``: everything with an env axis — env states, observations, running episode
  statistics (the ``TrainState.env`` carry), and inside the step the trajectories (the
  ``constrain`` hook of ``train.setup.Setup`` pins them to P(None, "data")) and every learner minibatch
  (P("data")). Per-env quantities stay on the env axis with their env: the rollout runs the
  actor once per version on the whole local batch or per env from a device-local gather of
  the replicated ring (``envs.acting.acting_actor``), so NOTHING is communicated inside the
  env-step loop, and learner minibatches shuffle each env's own steps
  (``learner.env_minibatches``): the learner's collectives are one gradient all-reduce per
  minibatch, two per epoch (advantage statistics) and the metrics' per update (counted in
  docs/scaling.md; params agree with one device to float32 rounding, not bit for bit: the
  gradient sums are reordered);
* actor / critic params and optimiser states replicated over "data" (default) or FSDP:
  the largest dimension of every leaf divisible by the data size goes over ``"data"``
  (gradients are then reduce-scattered and params all-gathered per minibatch);
* the version ring (``lag.VersionBuffer``) replicated while small (``ring="auto"``: under
  ``RING_REPLICATE_BYTES``), otherwise sharded like the params; the versions a rollout acts
  with (``acting.VersionTable``, V rows) are replicated once per update, before the env loop;
* seed keys, counters: on "seed" with their seed; the update index and the grid values
  (``train.programs.GridValues``) replicated.

The step is ``jax.jit(..., in_shardings, out_shardings, donate_argnums=0)`` around
``trainer.train_scan`` (a scan of ``trainer.update``); the state is pinned to its sharding
with ``jax.lax.with_sharding_constraint`` after every update; gradients are reduced by the
collectives the compiler derives from these shardings (no hand-written psum). Initial
states are created inside jit with ``out_shardings`` so arrays spanning processes are never
assembled on one host. ShardedTrainers whose configs differ only in grid values share one
program per mesh and layout through a ``train.programs.ProgramCache``.

Randomness does not depend on the device count: ``rollout.reset`` and ``rollout.rollout``
already split keys per env (``jax.random.split(key, num_envs)``), lags are drawn for
``num_envs`` at once, minibatch shuffles draw bits for the whole [B, T] grid, and
``jax_threefry_partitionable`` (on by default) makes sharded random draws equal to
unsharded ones.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING, Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# (train.trainer / train.programs are imported where used: this module also starts
# jax.distributed, which must run before gymnax initialises a backend)
if TYPE_CHECKING:
    from vccc_jax.train.programs import ProgramCache

DATA, SEED = "data", "seed"
AXES = (DATA, SEED)
RING_REPLICATE_BYTES = 64 << 20  # ring buffers below this (all slots, one seed) are replicated
ENV_VARS = ("VCCC_COORDINATOR", "VCCC_NUM_PROCESSES", "VCCC_PROCESS_ID")


# --------------------------------------------------------------------------------------
# Multi-host start-up and the mesh
# --------------------------------------------------------------------------------------


def initialize_distributed(coordinator: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           *, environ: Optional[dict] = None,
                           timeout_s: int = 300) -> bool:
    """``jax.distributed.initialize`` from flags, else ``VCCC_COORDINATOR`` /
    ``VCCC_NUM_PROCESSES`` / ``VCCC_PROCESS_ID``. Returns False (and does nothing) when
    neither names a coordinator: the single-process path is the same code.

    Must run before anything touches a jax backend.
    """
    env = os.environ if environ is None else environ
    coordinator = coordinator or env.get(ENV_VARS[0]) or None
    if coordinator is None:
        return False
    if num_processes is None and env.get(ENV_VARS[1]):
        num_processes = int(env[ENV_VARS[1]])
    if process_id is None and env.get(ENV_VARS[2]):
        process_id = int(env[ENV_VARS[2]])
    if num_processes is None or process_id is None:
        raise ValueError(
            f"coordinator {coordinator!r} needs num_processes and process_id (flags "
            f"--num-processes/--process-id or {ENV_VARS[1]}/{ENV_VARS[2]})")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} must be in [0, {num_processes})")
    # CPU processes need a cross-process collectives backend (no effect on GPU / TPU)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=timeout_s)
    return True


def parse_mesh(spec: Optional[str] = None, num_devices: Optional[int] = None) -> tuple[int, int]:
    """``"data=4,seed=2"`` / ``"4,2"`` / ``"data=8"`` -> (data, seed); None -> (n, 1).

    ``num_devices`` defaults to ``jax.device_count()``; the mesh may use fewer devices.
    """
    n = jax.device_count() if num_devices is None else int(num_devices)
    if spec is None or not str(spec).strip():
        return (n, 1)
    sizes = {DATA: 1, SEED: 1}
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    for i, part in enumerate(parts):
        name, eq, value = part.partition("=")
        if not eq:
            if i >= len(AXES):
                raise ValueError(f"mesh {spec!r}: at most {len(AXES)} axes {AXES}")
            name, value = AXES[i], part
        name = name.strip()
        if name not in sizes:
            raise ValueError(f"mesh {spec!r}: unknown axis {name!r}; axes are {AXES}")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"mesh {spec!r}: size {value!r} of {name} is not an integer") from None
        if sizes[name] < 1:
            raise ValueError(f"mesh {spec!r}: axis {name} must be >= 1")
    shape = (sizes[DATA], sizes[SEED])
    if shape[0] * shape[1] > n:
        raise ValueError(f"mesh {spec!r} needs {shape[0] * shape[1]} devices; {n} available")
    return shape


def make_mesh(shape: Optional[Sequence[int]] = None,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
    """A (data, seed) mesh with Auto axis types over the first prod(shape) devices.

    The device array is laid out seed-major (``"data"`` the inner, most local axis: the
    gradient all-reduce runs between neighbouring devices; seeds span hosts for free)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = (len(devices), 1) if shape is None else tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise ValueError(f"mesh shape must be (data, seed), got {shape}")
    need = shape[0] * shape[1]
    if need > len(devices):
        raise ValueError(f"mesh {shape} needs {need} devices; {len(devices)} available")
    return jax.make_mesh((shape[1], shape[0]), (SEED, DATA),
                         axis_types=(AxisType.Auto, AxisType.Auto), devices=devices[:need])


def mesh_from_flags(mesh: Optional[str] = None, devices: Optional[int] = None) -> Mesh:
    """``--mesh data=4,seed=2`` / ``--devices N`` (first N devices, (N, 1)) -> Mesh."""
    if mesh and devices:
        shape = parse_mesh(mesh, devices)
        if shape[0] * shape[1] != devices:
            raise ValueError(f"--mesh {mesh} uses {shape[0] * shape[1]} devices, --devices {devices}")
    else:
        shape = parse_mesh(mesh, devices)
    return make_mesh(shape)


# --------------------------------------------------------------------------------------
# Shardings of a TrainState
# --------------------------------------------------------------------------------------


def _fsdp_spec(shape: Sequence[int], lead: int, data: int, head: tuple = ()) -> P:
    """Largest dimension after ``lead`` leading axes that ``data`` divides goes on "data";
    ``head``: the specs of the leading axes (the seed axis)."""
    dims = [(shape[d], d) for d in range(lead, len(shape)) if shape[d] % data == 0]
    if data == 1 or not dims:
        return P(*head)
    _, best = max(dims)  # ties: the later axis (an output dimension of a kernel)
    spec = list(head) + [None] * (len(shape) - len(head))
    spec[best] = DATA
    return P(*spec)


def _tree_bytes(tree: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def state_specs(abstract_state: Any, data_size: int, *, seed_axis: bool = True,
                fsdp: bool = False, ring: str = "auto") -> Any:
    """PartitionSpecs for every leaf of a TrainState (shape-only tree accepted).

    ``seed_axis``: leaves carry the leading seed axis, which goes on "seed". ``ring``:
    "auto" | "replicated" | "params" (shard the version ring like the params).
    """
    if ring not in ("auto", "replicated", "params"):
        raise ValueError(f"ring must be auto | replicated | params, got {ring!r}")
    s = 1 if seed_axis else 0
    head = (SEED,) if seed_axis else ()
    per_seed = lambda tree: jax.tree_util.tree_map(lambda _: P(*head), tree)  # noqa: E731

    def params_like(tree, lead):
        if not fsdp:
            return per_seed(tree)
        return jax.tree_util.tree_map(lambda x: _fsdp_spec(x.shape, lead, data_size, head),
                                      tree)

    st = abstract_state

    def ring_spec(versions):  # a VersionBuffer of actor (or critic) params, or None
        if versions is None:
            return None
        one_seed = _tree_bytes(versions.params) // max(
            1, jax.tree_util.tree_leaves(versions.params)[0].shape[0] if seed_axis else 1)
        shard_ring = ring == "params" or (ring == "auto" and one_seed > RING_REPLICATE_BYTES)
        return versions.replace(
            params=params_like(versions.params, s + 1) if shard_ring else per_seed(versions.params),
            head=P(*head), count=P(*head), version=P(*head))

    versions = ring_spec(st.versions)
    env_spec = P(*head, DATA) if seed_axis else P(DATA)
    return st.replace(
        actor_params=params_like(st.actor_params, s),
        critic_params=params_like(st.critic_params, s),
        target_critic_params=params_like(st.target_critic_params, s),
        actor_opt_state=params_like(st.actor_opt_state, s),
        critic_opt_state=params_like(st.critic_opt_state, s),
        versions=versions,
        env=jax.tree_util.tree_map(lambda _: env_spec, st.env),
        key=P(*head), last_return=P(*head), update=P(*head),
        # optional protocol state (None unless its option is on): the learned baseline head
        # and the PPO-EWMA actor are params; the replay buffer is per seed
        baseline_params=params_like(st.baseline_params, s),
        baseline_opt_state=params_like(st.baseline_opt_state, s),
        ewma=params_like(st.ewma, s),
        replay=per_seed(st.replay),
        critic_versions=ring_spec(st.critic_versions),
    )


def check_divisible(num_envs: int, mesh: Mesh, num_seeds: Optional[int] = None) -> None:
    """ValueError unless "data" divides ``num_envs`` and "seed" divides ``num_seeds``."""
    data = mesh.shape[DATA]
    if num_envs % data:
        raise ValueError(
            f"num_envs={num_envs} must be divisible by the mesh's data axis ({data}; mesh "
            f"{dict(mesh.shape)}): use num_envs a multiple of {data} or a smaller data axis")
    seeds = mesh.shape.get(SEED, 1)
    if num_seeds is not None and num_seeds % seeds:
        raise ValueError(
            f"num_seeds={num_seeds} must be divisible by the mesh's seed axis ({seeds}; mesh "
            f"{dict(mesh.shape)}): use num_seeds a multiple of {seeds} or a smaller seed axis")


def learner_constrain(mesh: Mesh, minibatch_size: Optional[int] = None):
    """The ``Setup.constrain`` hook: pins the rollout ("traj", leaves [T, B, ...]) to
    P(None, "data"), every minibatch ("minibatch", leaves [mb, ...]) to P("data") and the
    ring the rollout reads its versions from ("rollout_actor") to replicated (gathered once
    per update, before the env-step loop; ``acting.acting_actor`` then reads it device-locally), so the learner's forward/backward runs split over "data" and
    the compiler reduces the gradients with one all-reduce per minibatch. A minibatch that
    "data" does not divide is left to the partitioner. Other names pass through unchanged.
    Inside ``vmap(..., spmd_axis_name="seed")`` each spec gets the seed axis in front.
    """
    data = mesh.shape[DATA]
    split_mb = minibatch_size is None or minibatch_size % data == 0

    def spec(name: str, x) -> Optional[P]:
        if name == "traj" and x.ndim >= 2:
            return P(None, DATA)
        if name == "minibatch" and split_mb and x.ndim >= 1:
            return P(DATA)
        if name == "rollout_actor":
            return P()
        return None

    def hook(name: str, tree: Any) -> Any:
        def one(x):
            s = spec(name, x)
            return x if s is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))

        return jax.tree_util.tree_map(one, tree)

    return hook


def _named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), specs,
                                  is_leaf=lambda x: isinstance(x, P))


# --------------------------------------------------------------------------------------
# The sharded trainer
# --------------------------------------------------------------------------------------


class ShardedTrainer:
    """A :class:`~vccc_jax.train.trainer.Trainer` run over ``mesh``.

    ``init()`` builds the sharded initial states inside jit; ``train(state, n, start)``
    runs ``n`` updates of every seed in one jitted, donated call and returns (state,
    metrics) like ``Trainer.train`` (metrics [n, num_seeds, ...], replicated). The grid
    values (``train.programs.GridValues``: learning rates, clips, the lag law's parameter)
    are an argument of the program, so ShardedTrainers whose configs differ only in them
    (grid cells) share one compiled program through ``cache`` (a
    ``train.programs.ProgramCache``, key ``(program_key, mesh, fsdp, ring,
    split_learner)``); without one each compiles its own.
    """

    def __init__(self, trainer: Any, mesh: Mesh, *, fsdp: bool = False, ring: str = "auto",
                 split_learner: bool = True, cache: Optional[ProgramCache] = None):
        from vccc_jax.train.programs import program_values

        self.config = cfg = trainer.config
        self.mesh = mesh
        self.values = program_values(trainer.values)  # the programs' argument
        self.trainer = trainer
        check_divisible(cfg.num_envs, mesh, cfg.num_seeds)
        self.fsdp, self.ring = fsdp, ring
        self.num_seeds = cfg.num_seeds
        self.keys = trainer.seed_keys
        # the learner hook on a copy of the static pieces: the caller's Trainer is unchanged
        setup = dataclasses.replace(
            trainer.setup, spmd_axis=SEED,
            constrain=(learner_constrain(mesh, cfg.minibatch_size) if split_learner
                       else trainer.setup.constrain))
        key = (setup.cfg, mesh, fsdp, ring, split_learner)
        build = functools.partial(_ShardedPrograms, setup, mesh, self, fsdp, ring)
        programs = build() if cache is None else cache.get(key, build)
        self.setup = programs.setup
        for name in ("abstract_state", "specs", "shardings", "replicated", "_init", "_train"):
            setattr(self, name, getattr(programs, name))

    # -- pieces ------------------------------------------------------------------------
    def init(self) -> Any:
        """Initial states of all seeds, created sharded (never assembled on one host)."""
        return self._init(self.keys(), self.values)

    def abstract(self) -> Any:
        """ShapeDtypeStructs carrying this mesh's shardings (restore targets)."""
        return jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self.abstract_state, self.shardings)

    # -- running -----------------------------------------------------------------------
    def train(self, states: Any, num_updates: int, start: Optional[int] = None):
        """``num_updates`` updates from update index ``start`` (default: states.update).

        ``states`` is donated: do not use it afterwards.
        """
        if start is None:
            start = int(jax.device_get(
                jax.tree_util.tree_leaves(states.update)[0].addressable_shards[0].data)
                .reshape(-1)[0])
        return self._train(states, jnp.asarray(start, jnp.int32), int(num_updates),
                           self.values)

    def lower(self, num_updates: int):
        """AOT: the lowered step on abstract sharded inputs (``.compile()`` it to time it)."""
        from vccc_jax.train.programs import abstract_values

        return self._train.lower(self.abstract(), jax.ShapeDtypeStruct((), jnp.int32),
                                 int(num_updates), abstract_values(self.values))

    def rollout_fn(self):
        """A jitted first-rollout probe: (state) -> (env carry, Trajectory) of seed 0.

        Runs exactly the rollout ``trainer.update`` starts with (same key split, this
        config's values), with the env axis on "data"; tests compare it across meshes.
        """
        from vccc_jax.train import trainer as trainer_lib

        setup, values = self.setup, self.values

        def probe(states):
            s = jax.tree_util.tree_map(lambda x: x[0], states)
            _, k_lag, k_roll, _, _ = jax.random.split(s.key, 5)
            return trainer_lib.rollout_step(setup, values, s.actor_params, s.versions, s.env,
                                            k_roll, s.update, k_lag)

        data_first = NamedSharding(self.mesh, P(DATA))
        traj_sh = NamedSharding(self.mesh, P(None, DATA))
        return jax.jit(probe, in_shardings=(self.shardings,),
                       out_shardings=(data_first, traj_sh))


class _ShardedPrograms:
    """The shardings and compiled programs of one (program key, mesh, layout)."""

    def __init__(self, setup, mesh: Mesh, sharded: ShardedTrainer, fsdp: bool, ring: str):
        from vccc_jax.train import trainer as trainer_lib

        self.setup = setup
        cfg = setup.cfg
        self.abstract_state = jax.eval_shape(
            lambda: trainer_lib.init_states(setup, sharded.keys(), sharded.values))
        data = mesh.shape[DATA]
        self.specs = state_specs(self.abstract_state, data, seed_axis=True, fsdp=fsdp, ring=ring)
        self.shardings = _named(mesh, self.specs)
        self.replicated = NamedSharding(mesh, P())
        inner = self.specs if cfg.num_seeds > 1 else state_specs(
            jax.eval_shape(lambda s: jax.tree_util.tree_map(lambda x: x[0], s),
                           self.abstract_state), data, seed_axis=False, fsdp=fsdp, ring=ring)
        inner_shardings = _named(mesh, inner)
        pin = functools.partial(jax.lax.with_sharding_constraint, shardings=inner_shardings)
        self._init = jax.jit(functools.partial(trainer_lib.init_states, setup),
                             out_shardings=self.shardings)
        self._train = jax.jit(functools.partial(trainer_lib.train_scan, setup, finish=pin),
                              static_argnums=(2,),
                              in_shardings=(self.shardings, self.replicated, self.replicated),
                              out_shardings=(self.shardings, self.replicated),
                              donate_argnums=(0,))


def gather_to_host(tree: Any) -> Any:
    """Numpy copies of every leaf, also of arrays spanning processes (for checks / saving)."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)
