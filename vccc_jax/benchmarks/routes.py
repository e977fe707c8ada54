"""``vccc bench routes``: speed, compiled memory and extra state of the decoupled pi_old routes.

Issue 13 (decoupled correction with missing old logits): the trainer's ``pi_old_route``

  exact       pi_old = the training-side log-probs of each token's behaviour version, from
              a version snapshot (the rollout records log_softmax of the behaviour logits)
  ewma        PPO-EWMA: pi_old = the actor at the debiased EMA of its parameters (one extra
              parameter copy in the state, one extra forward pass over the batch)
  behaviour   the naive pi_old := mu (the sampler's log-probs; nothing extra)
  off         pi_old = pi_k, the learner at the start of the update (the default trainer;
              not a decoupled route: no correction of the inference mismatch at all)

All rows run in the same process on the same config, compiled once and timed round-robin
(``benchmarks.train.time_rows``: every round runs every row once, odd rounds in reverse;
each row's best of ``repeats`` rounds), with ``gt_every = 0`` (the route diagnostics of
``train.route_metrics`` cost nothing then). Default config: CartPole-v1, 4 envs x 128 steps,
4 epochs x 4 minibatches, 64-unit tanh MLPs, lags uniform on {0..7} (a ring of K = 8
versions), sampler "mismatch=noise,scale=0.3", 50 updates, 1 seed.

Columns: env steps/s (wall) and its ratio to the exact route; process CPU seconds and the
ratio; the compiled training function's ``memory_analysis()`` temporaries and argument
bytes (the argument is the whole TrainState) with ratios to the exact route; the bytes of the
route-specific state actually carried (``TrainState.ewma``; the version ring is there for every
route, since it simulates the lagged inference engines, and is printed separately); and the
cost a real system pays for the route (``estimators.related.decoupled.route_cost``: extra
parameter copies for exact/snapshot = max_lag + 1, ewma = 1, behaviour = 0).

Flags and printing live in :mod:`vccc_jax.commands.bench`; this module returns rows and
strings only.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.benchmarks import train as train_bench

ROW_NAMES = ("exact", "ewma", "behaviour", "off")
DEFAULTS = dict(env="CartPole-v1", num_envs=4, num_steps=128, update_epochs=4,
                num_minibatches=4, hidden=64, lag="uniform:7", num_versions=8,
                sampler="mismatch=noise,scale=0.3", actor="truncate")


class RouteRow(NamedTuple):
    """One route's measurements (bytes as ints; ``cpu_s`` None when not measured)."""

    name: str
    compile_s: float
    run_s: float
    env_steps: int
    final_return: float
    temp_bytes: int
    argument_bytes: int
    ring_bytes: int  # TrainState.versions (every route: the simulated inference engines)
    route_state_bytes: int  # TrainState.ewma (the route's own extra state)
    model_copies: int  # decoupled.route_cost: parameter copies a real system keeps
    model_bytes: int
    cpu_s: Optional[float] = None

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.run_s


def select_rows(spec: str) -> list[str]:
    """Route names of a comma-separated ``--routes`` value; unknown names -> ValueError."""
    return train_bench.select_names(spec, ROW_NAMES, "--routes", "routes")


def config(route: str, updates: int, seeds: int = 1, **overrides):
    """The TrainConfig of one row: DEFAULTS, ``overrides``, ``updates`` updates, gt_every 0."""
    from vccc_jax.train.config import TrainConfig

    fields = dict(DEFAULTS, **overrides)
    batch = fields["num_envs"] * fields["num_steps"]
    return TrainConfig(total_timesteps=updates * batch, num_seeds=seeds, gt_every=0,
                       pi_old_route="" if route == "off" else route, **fields)


def _bytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


class _Prepared(NamedTuple):
    timing: train_bench.Prepared
    memory: dict


def prepare_route(route: str, updates: int, seeds: int = 1, **overrides) -> _Prepared:
    """Compile one route's whole training function; its memory and state accounting."""
    from vccc_jax.estimators.related import decoupled as dec
    from vccc_jax.train.programs import program_values
    from vccc_jax.train.trainer import Trainer, train_scan

    cfg = config(route, updates, seeds, **overrides)
    trainer = Trainer(cfg)
    state = trainer.init()
    n = trainer.num_updates
    values = program_values(trainer.values)  # constants of this program

    def run(s):
        return train_scan(trainer.setup, s, jnp.asarray(0, jnp.int32), n, values)

    compiled, compile_s = train_bench._compile(run, (state,))
    mem = compiled.memory_analysis()
    one_seed = jax.tree_util.tree_map(lambda x: x[0], state.actor_params)
    num_params = int(sum(x.size for x in jax.tree_util.tree_leaves(one_seed)))
    max_lag = trainer.setup.num_versions - 1
    cost = (dec.route_cost(route, num_params=num_params, max_lag=max_lag)
            if route != "off" else dict(param_copies=0, extra_params=0))
    bytes_per_param = _bytes(one_seed) // max(num_params, 1)
    memory = dict(temp_bytes=int(mem.temp_size_in_bytes),
                  argument_bytes=int(mem.argument_size_in_bytes),
                  ring_bytes=_bytes(state.versions), route_state_bytes=_bytes(state.ewma),
                  model_copies=int(cost["param_copies"]),
                  model_bytes=int(cost["extra_params"]) * bytes_per_param * seeds)

    def final(out):
        return float(np.nanmean(np.asarray(out[1]["return"])[-10:]))

    timing = train_bench.Prepared(route, compiled, (state,), compile_s,
                                  n * cfg.batch_size * seeds, final)
    return _Prepared(timing, memory)


def prepare(routes: Sequence[str], updates: int, seeds: int = 1,
            progress: Optional[Callable[[str], None]] = None, **overrides) -> list[_Prepared]:
    """Compile every route in order (``progress`` gets one line per compiled route)."""
    out = []
    for route in routes:
        out.append(prepare_route(route, updates, seeds, **overrides))
        if progress is not None:
            progress(f"  compiled {route} in {out[-1].timing.compile_s:.2f}s")
    return out


def measure(prepared: Sequence[_Prepared], repeats: int) -> list[RouteRow]:
    """Round-robin timing of the compiled routes, joined with their memory accounting."""
    timings = train_bench.time_rows([p.timing for p in prepared], repeats)
    return [RouteRow(t.name, t.compile_s, t.run_s, t.env_steps, t.final_return,
                     cpu_s=t.cpu_s, **p.memory) for t, p in zip(timings, prepared)]


def _kib(x: int) -> str:
    return f"{x / 1024:,.1f}"


def _ratio(x: float, ref: Optional[float]) -> str:
    return f"{x / ref:.2f}x" if ref else "-"


def format_table(rows: Sequence[RouteRow], base: str = "exact") -> str:
    """One line per route; ratios against the ``base`` route ("-" when it was not run)."""
    ref = {r.name: r for r in rows}.get(base)
    head = (f"| route | env steps/s | vs {base} | cpu s | vs {base} (cpu) | compile s | "
            f"temp KiB | vs {base} | argument KiB | vs {base} | route state KiB | "
            "ring KiB | model copies | model KiB | final return |")
    lines = [head, "|---|" + "---:|" * 14]
    for r in rows:
        cpu = "-" if r.cpu_s is None else f"{r.cpu_s:.2f}"
        cpu_ratio = (_ratio(ref.cpu_s, r.cpu_s) if ref is not None and ref.cpu_s and r.cpu_s
                     else "-")
        lines.append(
            f"| {r.name} | {r.steps_per_s / 1e3:,.1f}k | "
            f"{_ratio(r.steps_per_s, ref.steps_per_s if ref else None)} | {cpu} | {cpu_ratio} | "
            f"{r.compile_s:.2f} | {_kib(r.temp_bytes)} | "
            f"{_ratio(r.temp_bytes, ref.temp_bytes if ref else None)} | "
            f"{_kib(r.argument_bytes)} | "
            f"{_ratio(r.argument_bytes, ref.argument_bytes if ref else None)} | "
            f"{_kib(r.route_state_bytes)} | {_kib(r.ring_bytes)} | {r.model_copies} | "
            f"{_kib(r.model_bytes)} | {r.final_return:.1f} |")
    return "\n".join(lines)


def header(updates: int, seeds: int, repeats: int, **overrides) -> str:
    f = dict(DEFAULTS, **overrides)
    return (f"# vccc bench routes: {f['env']}, {f['num_envs']} envs x {f['num_steps']} steps, "
            f"{f['update_epochs']} epochs x {f['num_minibatches']} minibatches, "
            f"{f['hidden']}-unit MLPs, lag {f['lag']} (K = {f['num_versions']}), sampler "
            f"{f['sampler']!r}, actor {f['actor']}, {updates} updates, {seeds} seed(s), "
            f"gt_every 0, best of {repeats} round-robin rounds; jax {jax.__version__} on "
            f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs, load average "
            + "/".join(f"{x:.1f}" for x in os.getloadavg()))


def footer() -> str:
    return ("ratios: speed = route / exact (cpu: exact cpu s / route cpu s, > 1 = faster); "
            "memory = route / exact. route state = TrainState.ewma; ring = the version ring "
            "every route carries (simulated inference engines); model copies / KiB = "
            "decoupled.route_cost (parameter copies a real system keeps for the route).")


def as_rows(rows: Sequence[RouteRow]) -> list[dict]:
    """Tidy rows (one dict per route) with env steps/s."""
    return [dict(r._asdict(), steps_per_s=r.steps_per_s) for r in rows]
