"""``vccc bench train``: env steps/s of the full trainer, lagged VCCC vs synchronous GAE.

All rows run in the same process on the same inputs, one after the other:

  reference   a faithful single-file PureJaxRL-style PPO (shared-nothing copy of the widely
              used ``purejaxrl/ppo.py`` for gymnax CartPole-v1: LogWrapper, distrax
              Categorical, GAE scan, value clipping, one Adam over both towers)
  sync-gae    our trainer, lag 0, K = 1 (no ring buffer), uncorrected GAE critic — the
              synchronous PureJaxRL-style baseline of the issue
  lag8-gae    our trainer, K = 8 versions, lags uniform on {0..7}, uncorrected GAE critic
  lag8-vccc   our trainer, K = 8, uniform lags, VCCC one-step critic (the lagged target)
  lag8-vtrace our trainer, K = 8, uniform lags, V-trace(0.95) critic
  lag32-vtrace our trainer, K = 32, lags uniform on {0..31}, V-trace(0.95) critic

``vccc bench train --grid`` runs the rows of issue 28 at several seed and env counts
(:mod:`vccc_jax.benchmarks.train_grid`).

Reference config (the issue's): CartPole-v1, 4 envs x 128 steps, 4 epochs x 4
minibatches, 64-unit tanh MLPs, 5e5 env steps per seed. Compile time is the
``jax.jit(...).lower().compile()`` time of the whole training function, twice (issue 22):
**cold** with an empty persistent compilation cache (a private temporary directory, so
the user's cache neither helps nor fills), then **warm**: the in-memory caches cleared
(``jax.clear_caches()``, as in a new process) and the same function traced, lowered and
loaded from that cache -- what a second ``vccc`` run of the same config pays now that
``vccc`` keeps JAX's persistent cache on (``train.compile_cache``). Throughput is measured on the
compiled executables, round-robin (every round runs every row once, so all rows see
the same background load; odd rounds run the rows in reverse order), keeping for each of a
row's ``--placements`` (separate compiles of the same program, each with its own input
state) the best of ``--repeats`` rounds, and the median over the placements
(:func:`time_rows`); env steps of all seeds count. Each run is
timed twice: wall clock (``run s``, the env steps/s column) and the process CPU time of the
run (``cpu s``, all threads; ``time.process_time``). On a shared, oversubscribed machine the wall clock
mostly measures waiting for a core, and the CPU-time ratio is the one that compares the
programs; the header prints the load average.

Targets (issue 10): overhead of lag8-vccc over sync-gae <= 10% at 1 and at 8 seeds,
sync-gae >= 1.1x the reference, compile <= 6 s.

Flags and printing live in :mod:`vccc_jax.commands.bench_train` (``vccc bench train``); this module
returns rows and strings only.
"""

from __future__ import annotations

import tempfile
import time
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# --------------------------------------------------------------------------------------
# Reference: PureJaxRL-style PPO (single file, as widely used)
# --------------------------------------------------------------------------------------


def make_reference_train(config: dict):
    """PureJaxRL ``make_train`` (ppo.py) for gymnax discrete envs, adapted to gymnax 1.x."""
    import distrax
    import flax.linen as nn
    import gymnax
    import optax
    from flax.linen.initializers import constant, orthogonal
    from flax.training.train_state import TrainState
    from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper

    class ActorCritic(nn.Module):
        action_dim: int

        @nn.compact
        def __call__(self, x):
            def dense(n, scale):
                return nn.Dense(n, kernel_init=orthogonal(scale), bias_init=constant(0.0))

            a = nn.tanh(dense(64, np.sqrt(2))(x))
            a = nn.tanh(dense(64, np.sqrt(2))(a))
            a = dense(self.action_dim, 0.01)(a)
            pi = distrax.Categorical(logits=a)
            c = nn.tanh(dense(64, np.sqrt(2))(x))
            c = nn.tanh(dense(64, np.sqrt(2))(c))
            c = dense(1, 1.0)(c)
            return pi, jnp.squeeze(c, axis=-1)

    class Transition(NamedTuple):
        done: jnp.ndarray
        action: jnp.ndarray
        value: jnp.ndarray
        reward: jnp.ndarray
        log_prob: jnp.ndarray
        obs: jnp.ndarray
        info: dict

    cfg = dict(config)
    cfg["NUM_UPDATES"] = cfg["TOTAL_TIMESTEPS"] // cfg["NUM_STEPS"] // cfg["NUM_ENVS"]
    cfg["MINIBATCH_SIZE"] = cfg["NUM_ENVS"] * cfg["NUM_STEPS"] // cfg["NUM_MINIBATCHES"]
    env, env_params = gymnax.make(cfg["ENV_NAME"])
    env = LogWrapper(FlattenObservationWrapper(env))

    def linear_schedule(count):
        frac = 1.0 - (count // (cfg["NUM_MINIBATCHES"] * cfg["UPDATE_EPOCHS"])) / cfg["NUM_UPDATES"]
        return cfg["LR"] * frac

    network = ActorCritic(env.action_space(env_params).n)

    def init(rng):
        _, _rng = jax.random.split(rng)
        return network.init(_rng, jnp.zeros(env.observation_space(env_params).shape))

    def train(rng, params):
        # (params = init(rng), split out so several seeds can be initialised with lax.map:
        # a vmapped orthogonal init is a batched LAPACK QR that can deadlock jaxlib 0.10's
        # 2-thread CPU pool; the rest of the script is PureJaxRL's.)
        rng, _rng = jax.random.split(rng)
        tx = optax.chain(optax.clip_by_global_norm(cfg["MAX_GRAD_NORM"]),
                         optax.adam(learning_rate=linear_schedule, eps=1e-5))
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        rng, _rng = jax.random.split(rng)
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(_rng, cfg["NUM_ENVS"]), env_params)

        def _update_step(runner_state, unused):
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state
                rng, _rng = jax.random.split(rng)
                pi, value = network.apply(train_state.params, last_obs)
                action = pi.sample(seed=_rng)
                log_prob = pi.log_prob(action)
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, cfg["NUM_ENVS"])
                obsv, env_state, reward, terminated, truncated, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(rng_step, env_state, action, env_params)
                done = jnp.logical_or(terminated, truncated)
                transition = Transition(done, action, value, reward, log_prob, last_obs, info)
                return (train_state, env_state, obsv, rng), transition

            runner_state, traj_batch = jax.lax.scan(_env_step, runner_state, None,
                                                    cfg["NUM_STEPS"])
            train_state, env_state, last_obs, rng = runner_state
            _, last_val = network.apply(train_state.params, last_obs)

            def _calculate_gae(traj_batch, last_val):
                def _get_advantages(gae_and_next_value, transition):
                    gae, next_value = gae_and_next_value
                    done, value, reward = transition.done, transition.value, transition.reward
                    delta = reward + cfg["GAMMA"] * next_value * (1 - done) - value
                    gae = delta + cfg["GAMMA"] * cfg["GAE_LAMBDA"] * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                                             traj_batch, reverse=True, unroll=16)
                return advantages, advantages + traj_batch.value

            advantages, targets = _calculate_gae(traj_batch, last_val)

            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj_batch, advantages, targets = batch_info

                    def _loss_fn(params, traj_batch, gae, targets):
                        pi, value = network.apply(params, traj_batch.obs)
                        log_prob = pi.log_prob(traj_batch.action)
                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -cfg["CLIP_EPS"], cfg["CLIP_EPS"])
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()
                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor1 = ratio * gae
                        loss_actor2 = jnp.clip(
                            ratio, 1.0 - cfg["CLIP_EPS"], 1.0 + cfg["CLIP_EPS"]) * gae
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2).mean()
                        entropy = pi.entropy().mean()
                        total_loss = (loss_actor + cfg["VF_COEF"] * value_loss
                                      - cfg["ENT_COEF"] * entropy)
                        return total_loss, (value_loss, loss_actor, entropy)

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    train_state = train_state.apply_gradients(grads=grads)
                    return train_state, total_loss

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = cfg["MINIBATCH_SIZE"] * cfg["NUM_MINIBATCHES"]
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree_util.tree_map(
                    lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled = jax.tree_util.tree_map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree_util.tree_map(
                    lambda x: jnp.reshape(x, [cfg["NUM_MINIBATCHES"], -1] + list(x.shape[1:])),
                    shuffled)
                train_state, total_loss = jax.lax.scan(_update_minbatch, train_state, minibatches)
                return (train_state, traj_batch, advantages, targets, rng), total_loss

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, loss_info = jax.lax.scan(_update_epoch, update_state, None,
                                                   cfg["UPDATE_EPOCHS"])
            train_state = update_state[0]
            metric = traj_batch.info
            rng = update_state[-1]
            return (train_state, env_state, last_obs, rng), metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None, cfg["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metric}

    return init, train


REFERENCE_CONFIG = {
    "LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 500_000,
    "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5,
    "ENV_NAME": "CartPole-v1",
}


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


class Timing(NamedTuple):
    name: str
    compile_s: float
    run_s: float
    env_steps: int
    final_return: float
    cpu_s: Optional[float] = None  # best process CPU seconds of a run (None: not measured)
    warm_s: Optional[float] = None  # compile with the persistent cache warm (None: no hit)
    placement_cpu_s: Optional[tuple] = None  # best CPU s on each placement (time_rows)

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.run_s

    @property
    def cpu_steps_per_s(self) -> Optional[float]:
        return None if self.cpu_s is None else self.env_steps / self.cpu_s


class Prepared(NamedTuple):
    """A compiled row, ready to time: fn(*args) runs the whole training."""

    name: str
    fn: object
    args: tuple
    compile_s: float  # cold: empty persistent cache
    env_steps: int
    final_return: object  # callable(output) -> float
    warm_s: Optional[float] = None  # the same, loaded from the persistent cache


def _compile(fn, args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def compile_cold(fn, args) -> tuple[object, float]:
    """(executable, seconds) of ``jax.jit(fn).lower(*args).compile()`` with JAX's persistent
    cache off: a real compile even when an earlier run (``vccc`` keeps the cache on) wrote
    this program to the user's cache."""
    from vccc_jax.train.compile_cache import using

    with using(None):
        return _compile(fn, args)


_HIT = "/jax/compilation_cache/cache_hits"


def compile_cold_warm(fn, args) -> tuple[object, float, Optional[float]]:
    """(executable, cold seconds, warm seconds) of ``jax.jit(fn).lower(*args).compile()``:
    cold into an empty private persistent cache, then warm from it after
    ``jax.clear_caches()``. Warm is None when nothing was loaded from the cache (a backend
    that cannot serialise executables)."""
    from vccc_jax.train.compile_cache import using

    hits = []

    def listen(event, **_):
        if event == _HIT:
            hits.append(event)

    with tempfile.TemporaryDirectory(prefix="vccc_bench_cache_") as d, using(d):
        _, cold = _compile(fn, args)
        jax.clear_caches()
        jax.monitoring.register_event_listener(listen)
        try:
            compiled, warm = _compile(fn, args)
        finally:
            jax.monitoring.unregister_event_listener(listen)
    return compiled, cold, (warm if hits else None)


def prepare_reference(seeds: int, timesteps: int, num_envs: int = 4,
                      warm: bool = True) -> Prepared:
    """The reference at ``seeds`` seeds and ``num_envs`` envs (x 128 steps, 4 minibatches);
    ``warm``: also measure the warm compile (:func:`compile_cold_warm`)."""
    cfg = dict(REFERENCE_CONFIG, TOTAL_TIMESTEPS=timesteps, NUM_ENVS=num_envs)
    init, train = make_reference_train(cfg)
    if seeds == 1:  # as the single-file script is normally run: no vmap
        key = jax.random.PRNGKey(0)
        fn, args = train, (key, jax.jit(init)(key))
    else:
        keys = jax.random.split(jax.random.PRNGKey(0), seeds)
        fn, args = jax.vmap(train), (keys, jax.jit(lambda k: jax.lax.map(init, k))(keys))
    compiled, compile_s, warm_s = compile_cold_warm(fn, args) if warm else (
        *compile_cold(fn, args), None)

    def final(out):
        info = out["metrics"]
        done = np.asarray(info["returned_episode"])[-10:]
        rets = np.asarray(info["returned_episode_returns"])[-10:]
        return float(rets[done].mean()) if done.any() else float("nan")

    steps = (timesteps // (num_envs * 128)) * num_envs * 128 * seeds
    return Prepared("reference (PureJaxRL-style)", compiled, args, compile_s, steps, final,
                    warm_s)


def prepare_trainer(name: str, seeds: int, timesteps: int, warm: bool = True,
                    **overrides) -> Prepared:
    """Our trainer (``TrainConfig`` fields in ``overrides``); ``warm``: also measure the
    warm compile (:func:`compile_cold_warm`)."""
    from vccc_jax.train.programs import program_values
    from vccc_jax.train.trainer import TrainConfig, Trainer, train_scan

    cfg = TrainConfig(total_timesteps=timesteps, num_seeds=seeds, **overrides)
    trainer = Trainer(cfg)
    state = trainer.init()
    n = trainer.num_updates
    values = program_values(trainer.values)  # constants of this program

    def run(s):
        return train_scan(trainer.setup, s, jnp.asarray(0, jnp.int32), n, values)

    compiled, compile_s, warm_s = compile_cold_warm(run, (state,)) if warm else (
        *compile_cold(run, (state,)), None)

    def final(out):
        return float(np.nanmean(np.asarray(out[1]["return"])[-10:]))

    return Prepared(name, compiled, (state,), compile_s, n * cfg.batch_size * seeds, final,
                    warm_s)


def time_rows(rows: list[Prepared], repeats: int) -> list[Timing]:
    """Round-robin timing: every round runs every row once (odd rounds in reverse order);
    per row the best of ``repeats`` runs. Rows that share a name are one row's placements
    (:func:`prepare`: separate compiles of the same program, each with its own input
    state): its time is the median over them of each one's best (wall clock and process
    CPU time apart). Interleaving makes rows see the same background load (the CPU is
    shared). Placements: one program's best times differ by up to ~10% from one compile,
    or one copy of its input state, to another (CartPole at 1 x 512 envs, 2 threads,
    2026-12-03: lag32-vtrace 1.11-1.22 s over 3 compiles in one process, sync-gae
    1.10-1.13 s; sync-gae at 4 envs, one core, 2026-12-02: 0.593-0.659 s over 3 copies x
    2 compiles), more than the round-robin best removes."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    best = [[float("inf"), float("inf")] for _ in rows]
    finals = {}
    order = list(enumerate(rows))
    for k in range(repeats):
        for i, r in (order if k % 2 == 0 else order[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(r.fn(*r.args))
            best[i][0] = min(best[i][0], time.perf_counter() - t0)
            best[i][1] = min(best[i][1], time.process_time() - c0)
            finals[r.name] = r.final_return(out)
    out = []
    for name in dict.fromkeys(r.name for r in rows):
        mine = [i for i, r in enumerate(rows) if r.name == name]
        first = rows[mine[0]]
        out.append(Timing(
            name, first.compile_s, float(np.median([best[i][0] for i in mine])),
            first.env_steps, finals[name], float(np.median([best[i][1] for i in mine])),
            first.warm_s, tuple(best[i][1] for i in mine) if len(mine) > 1 else None))
    return out


ROWS = {
    "sync-gae": dict(lag="fixed:0", num_versions=1, critic="gae"),
    "lag8-gae": dict(lag="uniform:7", num_versions=8, critic="gae"),
    "lag8-vccc": dict(lag="uniform:7", num_versions=8, critic="vccc"),
    "lag8-vtrace": dict(lag="uniform:7", num_versions=8, critic="vtrace"),
    "lag32-vtrace": dict(lag="uniform:31", num_versions=32, critic="vtrace"),
}


def format_table(rows: list[Timing], base: str = "sync-gae") -> str:
    ref = {r.name: r for r in rows}.get(base)
    cpu = all(r.cpu_s is not None for r in rows)
    head = ("| run | env steps/s | vs sync-gae | compile s cold | compile s warm | run s "
            "| final return |")
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if cpu:
        head += " cpu s | vs sync-gae (cpu) |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        ratio = f"{r.steps_per_s / ref.steps_per_s:.2f}x" if ref else "-"
        warm = "-" if r.warm_s is None else f"{r.warm_s:.2f}"
        line = (f"| {r.name} | {r.steps_per_s / 1e3:,.1f}k | {ratio} | {r.compile_s:.2f} | "
                f"{warm} | {r.run_s:.2f} | {r.final_return:.1f} |")
        if cpu:
            cratio = f"{ref.cpu_s / r.cpu_s:.2f}x" if ref else "-"
            line += f" {r.cpu_s:.2f} | {cratio} |"
        lines.append(line)
    return "\n".join(lines)


ROW_NAMES = ("reference",) + tuple(ROWS)


def select_names(spec: str, choices, flag: str = "--rows", noun: str = "rows") -> list[str]:
    """Names of a comma-separated ``flag`` value, each one of ``choices``; else ValueError."""
    wanted = [r.strip() for r in spec.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in choices]
    if unknown:
        raise ValueError(f"unknown {noun} {unknown} (choose from {', '.join(choices)})")
    if not wanted:
        raise ValueError(f"{flag} is empty (choose from {', '.join(choices)})")
    return wanted


def select_rows(spec: str) -> list[str]:
    """Row names of a comma-separated ``--rows`` value; unknown names -> ValueError."""
    return select_names(spec, ROW_NAMES)


def prepare(names: Sequence[str], seeds: int, timesteps: int, actor: str = "truncate",
            progress: Optional[Callable[[str], None]] = None, num_envs: int = 4,
            warm: bool = True, placements: int = 1, **overrides) -> list[Prepared]:
    """Compile every row in order, cold then (``warm``) warm, ``placements`` times: each
    placement a fresh compile of the same program with its own input state, all under the
    row's name (:func:`time_rows` takes the median over them; the first one's compile times
    are the row's). ``progress`` gets one line per row. ``num_envs`` and ``overrides``
    (TrainConfig fields) apply to our rows (``num_envs`` to the reference too)."""
    prepared = []
    for name in names:
        if name == "reference":
            mine = compile_placements(lambda w: prepare_reference(
                seeds, timesteps, num_envs=num_envs, warm=w), placements, warm)
        else:
            mine = compile_placements(lambda w: prepare_trainer(
                name, seeds, timesteps, warm=w, actor=actor, num_envs=num_envs,
                **{**ROWS[name], **overrides}), placements, warm)
        prepared += mine
        if progress is not None:
            p = mine[0]
            progress(f"  compiled {name} in {p.compile_s:.2f}s cold"
                     + ("" if p.warm_s is None else f", {p.warm_s:.2f}s warm")
                     + ("" if placements == 1 else ", then " + ", ".join(
                         f"{q.compile_s:.2f}" for q in mine[1:]) + "s (placements)"))
    return prepared


def compile_placements(build: Callable[[bool], Prepared], placements: int,
                       warm: bool) -> list[Prepared]:
    """A row's ``placements``: ``build(warm)`` called that many times, each call a fresh
    compile of the row's program with its own input state; only the first measures the
    warm compile (``warm``)."""
    if placements < 1:
        raise ValueError(f"placements must be >= 1, got {placements}")
    return [build(warm and p == 0) for p in range(placements)]


def as_rows(results: Sequence[Timing]) -> list[dict]:
    """Tidy rows (one dict per run) with env steps/s."""
    return [dict(r._asdict(), steps_per_s=r.steps_per_s) for r in results]


def footer(results: Sequence[Timing], ref_target: float = 1.1) -> str:
    """The overhead of lag8-vccc over sync-gae and sync-gae vs the reference (target
    ``ref_target``; empty when the rows were not run)."""
    by = {r.name: r for r in results}
    out = ""
    if "sync-gae" in by and "lag8-vccc" in by:
        sync, lag = by["sync-gae"], by["lag8-vccc"]
        overhead = sync.steps_per_s / lag.steps_per_s - 1.0
        out = f"\noverhead of lag8-vccc over sync-gae: {100 * overhead:.1f}% (target <= 10%)"
        if sync.cpu_s is not None and lag.cpu_s is not None:
            out += f"; in CPU time {100 * (lag.cpu_s / sync.cpu_s - 1.0):.1f}%"
    ref = next((r for name, r in by.items() if name.startswith("reference")), None)
    if "sync-gae" in by and ref is not None:
        sync = by["sync-gae"]
        out += (f"\nsync-gae vs reference: {sync.steps_per_s / ref.steps_per_s:.2f}x "
                f"(target >= {ref_target:.1f}x)")
        if sync.cpu_s is not None and ref.cpu_s is not None:
            out += f"; in CPU time {ref.cpu_s / sync.cpu_s:.2f}x"
    return out
