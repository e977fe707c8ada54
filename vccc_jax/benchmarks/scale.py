"""``vccc bench scale``: the sharded trainer at 1, 2, 4, 8 ... devices (issues 10, 22).

For every device count n (a (n, 1) mesh; under ``jax.distributed`` n / processes devices of
every process) and two regimes:

  weak    fixed envs per device: num_envs = n * --envs-per-device
  strong  fixed total batch:     num_envs = --total-envs (n must divide it)

it reports updates/s and env steps/s of the compiled training step (best of ``--repeats``
calls of ``--updates`` updates each, after a warm-up call), the speed-up over the first
row of the same regime (env steps/s ratio: ideal n / n0 in BOTH regimes) and the efficiency
(speed-up / (n / n0), ideal 1), the AOT compile time (``jit(...).lower(...).compile()``),
the per-device memory of the compiled step (``memory_analysis``: temp + arguments) and the
collectives of its HLO (all-reduce / all-gather / reduce-scatter / collective-permute /
all-to-all) as EXECUTED counts per update: each instruction times the trip counts of the
loops around it, split into the env-step loop (T trips per update: the column "per env
step x T"), the learner and the rest. The layout is that of :mod:`vccc_jax.train.sharding`:
env axis over "data", params replicated (``--fsdp``: sharded), gradients reduced by
compiler-inserted collectives.

Defaults measure throughput on an accelerator (2048 envs per device, T = 128, hidden 64,
4 epochs x 4 minibatches); ``--small`` is a CPU / test size (4 envs per device, T = 16,
hidden 16, 1 epoch x 2 minibatches, 2 updates x 1 repeat). The same script runs on CPU, GPU
or TPU and prints the device kind; on fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) the numbers prove only that the
sharded program runs and which collectives it uses: the devices share the host's cores.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


class Row(NamedTuple):
    regime: str
    devices: int
    num_envs: int
    compile_s: float
    step_s: float
    updates_per_s: float
    env_steps_per_s: float
    collectives: dict  # static instruction counts of the whole compiled step
    by_loop: dict = {}  # static counts by loop nest
    per_env_step: dict = {}  # EXECUTED per update inside the env-step loop (static x T)
    per_update: dict = {}  # EXECUTED per update, every loop
    memory_bytes: dict = {}  # per device: temp, argument, output (memory_analysis)


def count_collectives(hlo_text: str) -> dict:
    """Instructions per collective kind in an HLO module's text (async start/done pairs
    count once, on their -start). Quoted strings (op names and source files in metadata,
    backend configs) are dropped first: a scope named after a collective is not one."""
    lines = [_QUOTED.sub('""', line) for line in hlo_text.splitlines()]
    counts = {}
    for name in COLLECTIVES:
        pat = re.compile(r"=\s*[^=]*?\b" + re.escape(name) + r"(-start)?\(")
        counts[name] = sum(1 for line in lines if pat.search(line))
    return counts


_QUOTED = re.compile(r'"[^"]*"')


_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(r"\b(?:to_apply|calls|condition|true_computation|false_computation)=%([\w.\-]+)")
_BODY = re.compile(r"\bbody=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'known_trip_count"?\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _loop_label(line: str) -> str:
    """``name:trip`` of a while instruction: the source scope that made the loop (the
    op_name element before its last ``/while``, e.g. ``rollout``, ``epochs``)
    and its trip count (``?`` unknown)."""
    trip = _TRIP.search(line)
    op = _OP_NAME.search(line)
    scope = "while"
    if op:
        parts = [p for p in op.group(1).split("/") if p]
        if parts and parts[-1] == "while":
            parts = parts[:-1]
        if parts:
            scope = re.sub(r"^(jit|vmap|jvp|transpose)\((.*)\)$", r"\2", parts[-1]) or "while"
    return f"{scope}:{trip.group(1) if trip else '?'}"


def _computations(hlo_text: str) -> tuple[dict, str]:
    """{computation name: its instruction lines}, and the ENTRY computation's name."""
    comps, entry, name = {}, None, None
    for line in hlo_text.splitlines():
        head = _COMP_HEAD.match(line)
        if head and not line.startswith(" "):
            name = head.group(2)
            comps[name] = []
            if head.group(1):
                entry = name
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps, entry


def collectives_by_loop(hlo_text: str) -> dict:
    """Collectives of a compiled HLO module grouped by the while loops that enclose them.

    Keys: tuples of the enclosing loops, outermost first, each ``scope:trip`` (the source
    scope that made the loop and its trip count, :func:`_loop_label`); ``()`` is
    straight-line code. A computation reached through several loop nests counts once in
    each. In the trainer's step: ``("train_scan:U",)`` is the per-update body, a
    ``rollout:T`` loop inside it the per-env-step loop, ``epochs`` / minibatch
    loops the learner's.
    """
    comps, entry = _computations(hlo_text)
    out: dict = {}
    seen = set()

    def visit(name: str, path: tuple) -> None:
        if (name, path) in seen or name not in comps:
            return
        seen.add((name, path))
        counts = count_collectives("\n".join(comps[name]))
        if any(counts.values()):
            bucket = out.setdefault(path, dict.fromkeys(COLLECTIVES, 0))
            for k, v in counts.items():
                bucket[k] += v
        for line in comps[name]:
            body = _BODY.search(line)
            if body:
                visit(body.group(1), path + (_loop_label(line),))
            for callee in _CALLEE.findall(line):
                visit(callee, path)
            for group in _BRANCHES.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    visit(callee, path)

    if entry is not None:
        visit(entry, ())
    return out


def _trips(path: tuple) -> int:
    """Product of the trip counts of a loop nest (an unknown count ``?`` counts as 1)."""
    out = 1
    for label in path:
        trip = label.rpartition(":")[2]
        out *= int(trip) if trip.isdigit() else 1
    return out


def _is_env_step(path: tuple, num_steps: int) -> bool:
    return any(p.endswith(f":{num_steps}") for p in path[1:])


def env_step_collectives(by_loop: dict, num_steps: int) -> dict:
    """STATIC collectives inside a loop of ``num_steps`` trips nested in the update loop:
    the rollout's per-env-step loop (and any reverse scan over the T steps of the targets),
    summed over such loop nests. XLA's scope names of loops are not reliable after
    optimisation, so the trip count identifies them; keep T distinct from the epoch and
    minibatch counts."""
    total = dict.fromkeys(COLLECTIVES, 0)
    for path, counts in by_loop.items():
        if _is_env_step(path, num_steps):
            for k, v in counts.items():
                total[k] += v
    return total


def executed_collectives(by_loop: dict, num_updates: int, num_steps: int) -> tuple[dict, dict]:
    """(inside the env-step loops, everywhere) collectives EXECUTED per update: every
    instruction's static count times the trip counts of the loops around it, over the
    ``num_updates`` updates of one call."""
    step, every = dict.fromkeys(COLLECTIVES, 0), dict.fromkeys(COLLECTIVES, 0)
    for path, counts in by_loop.items():
        n = _trips(path)
        for k, v in counts.items():
            every[k] += v * n
            if _is_env_step(path, num_steps):
                step[k] += v * n
    per = lambda d: {k: v / num_updates for k, v in d.items()}  # noqa: E731
    return per(step), per(every)


LEVELS = ("per call", "per update", "per epoch", "per minibatch", "per env step", "other")


def _level(path: tuple, num_steps: int, epochs: int, minibatches: int) -> str:
    """Where a loop nest sits in the trainer's step: outside the update loop ("per call"),
    in the update body, an epoch body, a minibatch body, a loop of ``num_steps`` trips (the
    env-step loop or a scan over the T steps), else "other". Epoch and minibatch loops are
    known by their trip counts and nesting; keep T distinct from both."""
    if not path:
        return "per call"
    rest = path[1:]
    trips = [p.rpartition(":")[2] for p in rest]
    if str(num_steps) in trips:
        return "per env step"
    if trips == []:
        return "per update"
    if trips == [str(epochs)]:
        return "per epoch"
    if trips == [str(epochs), str(minibatches)]:
        return "per minibatch"
    return "other"


def collectives_by_level(by_loop: dict, num_steps: int, epochs: int,
                         minibatches: int) -> dict:
    """STATIC collective instructions by level of the trainer's step (:data:`LEVELS`):
    {level: {kind: count}}, every level present (zeros where none). The executed count per
    update is per update + epochs x (per epoch + minibatches x per minibatch) + T x per env
    step (:func:`executed_per_update`)."""
    out = {lv: dict.fromkeys(COLLECTIVES, 0) for lv in LEVELS}
    for path, counts in by_loop.items():
        bucket = out[_level(path, num_steps, epochs, minibatches)]
        for k, v in counts.items():
            bucket[k] += v
    return out


def executed_per_update(levels: dict, num_steps: int, epochs: int, minibatches: int,
                        num_updates: int) -> dict:
    """Collectives executed per update from :func:`collectives_by_level` ("other" loops
    counted once per update, "per call" spread over the ``num_updates`` of a call)."""
    times = {"per call": 1 / num_updates, "per update": 1, "per epoch": epochs,
             "per minibatch": epochs * minibatches, "per env step": num_steps, "other": 1}
    return {k: sum(levels[lv][k] * n for lv, n in times.items()) for k in COLLECTIVES}


def format_levels(row: "Row", args) -> str:
    """One line: a row's static collectives per level and the executed total per update."""
    levels = collectives_by_level(row.by_loop, args.steps, args.epochs, args.minibatches)
    total = executed_per_update(levels, args.steps, args.epochs, args.minibatches, args.updates)
    parts = [f"{lv}: {_fmt(c)}" for lv, c in levels.items() if any(c.values()) or
             lv in ("per env step", "per minibatch", "per epoch", "per update")]
    return (f"{row.regime} n={row.devices}: " + " | ".join(parts)
            + f" | executed per update ({args.epochs} epochs x {args.minibatches} "
              f"minibatches, T={args.steps}): {_fmt(total)}")


# The flags of `vccc bench scale` (commands/bench.py builds its parser from these):
# (flag, type, default, help).
FLAGS = (
    ("--devices", str, "1,2,4,8",
     "comma-separated device counts (those above the available are skipped)"),
    ("--regimes", str, "weak,strong", "weak (fixed envs per device) and/or strong (fixed total)"),
    ("--envs-per-device", int, 2048, "weak scaling: envs per device"),
    ("--total-envs", int, 0, "strong scaling batch (default: max devices x envs per device)"),
    ("--env", str, "CartPole-v1", "gymnax environment"),
    ("--steps", int, 128, "rollout length T (keep it distinct from epochs and minibatches)"),
    ("--updates", int, 8, "updates per timed call"),
    ("--repeats", int, 3, "timed calls (best is reported)"),
    ("--epochs", int, 4, "learner epochs per update"),
    ("--minibatches", int, 4, "minibatches per epoch"),
    ("--hidden", int, 64, "hidden units"),
    ("--lag", str, "uniform:7", "lag law"),
    ("--critic", str, "vccc", "critic target"),
    ("--seeds", int, 1, "vmapped seeds"),
)
# store_true flags: --fsdp (shard params over "data"), --small (SMALL: a CPU / test size)

#: ``--small``: the sizes it sets (a CPU or test run; explicit flags still win)
SMALL = {"envs_per_device": 4, "steps": 16, "hidden": 16, "epochs": 1, "minibatches": 2,
         "updates": 2, "repeats": 1}


def defaults() -> dict:
    """{attribute name: default} of :data:`FLAGS` plus ``fsdp=False``."""
    out = {f[0][2:].replace("-", "_"): f[2] for f in FLAGS}
    out["fsdp"] = False
    return out


def apply_small(args, given: set) -> None:
    """``--small``: set the :data:`SMALL` sizes on ``args`` except the flags in ``given``."""
    for k, v in SMALL.items():
        if k not in given:
            setattr(args, k, v)


def plan(args, avail: int, processes: int = 1) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(the measurements to run as (regime, devices, num_envs), "# skip ..." messages).

    Under ``processes`` > 1 a device count must be a multiple of it (every process takes
    part). ValueError when no requested device count fits the ``avail`` devices or a regime
    is unknown."""
    counts = [int(x) for x in str(args.devices).split(",") if x.strip()]
    skipped = [f"# skip n={n}: not a multiple of the {processes} processes"
               for n in counts if n <= avail and n % processes]
    counts = [n for n in counts if n <= avail and n % processes == 0]
    if not counts:
        raise ValueError(f"no device count in {args.devices!r} fits the {avail} available"
                         + (f" as a multiple of {processes} processes" if processes > 1 else ""))
    total = args.total_envs or max(counts) * args.envs_per_device
    todo = []
    for regime in [r.strip() for r in str(args.regimes).split(",") if r.strip()]:
        if regime not in ("weak", "strong"):
            raise ValueError(f"regime {regime!r}: expected weak or strong")
        for n in counts:
            envs = n * args.envs_per_device if regime == "weak" else total
            if envs % n:
                skipped.append(f"# skip {regime} n={n}: {envs} envs not divisible")
                continue
            todo.append((regime, n, envs))
    return todo, skipped


def devices_for(n: int) -> list:
    """The n devices of a measurement: the first n / processes of every process."""
    import jax

    per = n // jax.process_count()
    by_proc: dict = {}
    for d in jax.devices():
        by_proc.setdefault(d.process_index, []).append(d)
    return [d for p in sorted(by_proc) for d in by_proc[p][:per]]


def header(args, avail: int, device, processes: int = 1, jax_version: str = "") -> str:
    """The "# vccc bench scale: ..." lines (device, config, and the fake-CPU note)."""
    lines = [f"# vccc bench scale: {avail} x {device.device_kind} ({device.platform}), "
             f"{processes} process(es), jax {jax_version}",
             f"# {args.env}, T={args.steps}, {args.epochs} epochs x {args.minibatches} "
             f"minibatches, hidden {args.hidden}, lag {args.lag}, critic {args.critic}, "
             f"seeds {args.seeds}, {args.updates} updates per call, best of {args.repeats}"
             + (", FSDP" if args.fsdp else "")]
    if device.platform == "cpu" and avail > 1:
        lines.append("# fake CPU devices share the host's cores: correctness only, not speed")
    return "\n".join(lines)


def measure(args, regime: str, n: int, num_envs: int, progress=None) -> Row:
    """One row: AOT compile time, best-of-``repeats`` step time, per-device memory,
    collectives (static, by loop nest, executed per update). ``args``: any object with the
    :data:`FLAGS` attributes (and ``fsdp``); ``progress(text)`` hears "  weak n=2: compiled
    in ...s"."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.train import sharding as sh
    from vccc_jax.train.trainer import TrainConfig, Trainer

    cfg = TrainConfig(env=args.env, num_envs=num_envs, num_steps=args.steps,
                      total_timesteps=num_envs * args.steps * args.updates * (args.repeats + 1),
                      update_epochs=args.epochs, num_minibatches=args.minibatches,
                      hidden=args.hidden, lag=args.lag, critic=args.critic,
                      num_seeds=args.seeds, eval_envs=0)
    st = sh.ShardedTrainer(Trainer(cfg), sh.make_mesh((n, 1), devices_for(n)), fsdp=args.fsdp)
    t0 = time.perf_counter()
    compiled = st.lower(args.updates).compile()
    compile_s = time.perf_counter() - t0
    if progress is not None:
        progress(f"  {regime} n={n}: compiled in {compile_s:.1f}s")
    text = compiled.as_text()
    counts = count_collectives(text)
    by_loop = collectives_by_loop(text)
    per_step, per_update = executed_collectives(by_loop, args.updates, args.steps)
    mem = compiled.memory_analysis()
    memory = {"temp": int(mem.temp_size_in_bytes), "argument": int(mem.argument_size_in_bytes),
              "output": int(mem.output_size_in_bytes)}
    state = st.init()
    values = st.values()
    start = 0
    state, _ = compiled(state, jnp.asarray(start, jnp.int32), values)  # warm-up
    jax.block_until_ready(state)
    best = float("inf")
    for _ in range(args.repeats):
        start += args.updates
        t0 = time.perf_counter()
        state, m = compiled(state, jnp.asarray(start, jnp.int32), values)
        jax.block_until_ready((state, m))
        best = min(best, time.perf_counter() - t0)
    steps = args.updates * num_envs * args.steps * args.seeds
    return Row(regime, n, num_envs, compile_s, best, args.updates / best, steps / best, counts,
               by_loop, per_step, per_update, memory)


def _fmt(counts: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in counts.items() if v) or "none"


def format_loops(row: Row) -> str:
    """One line: the collectives of each loop nest (static; trip counts outermost first)."""
    parts = []
    for path, counts in sorted(row.by_loop.items(), key=lambda kv: (len(kv[0]), str(kv[0]))):
        where = "top" if not path else " > ".join(path)
        parts.append(f"{where}: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    step = sum(row.per_env_step.values())
    parts.append(f"per env step: {step:g} executed per update" if step else "per env step: none")
    return f"{row.regime} n={row.devices}: " + " | ".join(parts)


def speed_ups(rows: list[Row]) -> list[tuple[float, float]]:
    """(speed-up, efficiency) per row: env steps/s over the FIRST row of the same regime
    (n0 devices; ideal n / n0 in both regimes: weak scaling adds work with devices, strong
    keeps it), efficiency = speed-up / (n / n0) (ideal 1)."""
    base: dict = {}
    out = []
    for r in rows:
        b = base.setdefault(r.regime, r)
        speed = r.env_steps_per_s / b.env_steps_per_s
        out.append((speed, speed / (r.devices / b.devices)))
    return out


def format_table(rows: list[Row]) -> str:
    head = (f"{'regime':7s} {'dev':>3s} {'envs':>6s} {'compile s':>9s} {'updates/s':>10s} "
            f"{'env steps/s':>12s} {'speed-up':>8s} {'eff':>5s} {'MiB/dev':>8s}  "
            "collectives executed per update: env-step loop (x T) | all")
    lines = [head, "-" * len(head)]
    for r, (speed, eff) in zip(rows, speed_ups(rows)):
        mb = (r.memory_bytes.get("temp", 0) + r.memory_bytes.get("argument", 0)) / 2 ** 20
        lines.append(f"{r.regime:7s} {r.devices:3d} {r.num_envs:6d} {r.compile_s:9.2f} "
                     f"{r.updates_per_s:10.2f} {r.env_steps_per_s:12.0f} {speed:8.2f} "
                     f"{eff:5.2f} {mb:8.3g}  {_fmt(r.per_env_step)} | {_fmt(r.per_update)}")
    lines.append("# speed-up: env steps/s over the first row of its regime (ideal n / n0 in "
                 "both regimes); eff = speed-up / (n / n0); MiB/dev: temp + argument bytes "
                 "(memory_analysis)")
    return "\n".join(lines)


def loops_footer(rows: list[Row], args=None) -> str:
    """The per-loop collective lines printed after the table (with ``args``, the flags: also
    the static counts per level of the step, :func:`format_levels`)."""
    lines = (["# static collectives by loop nest (scope:trip, outermost first; per env step = "
              "loops of T trips inside the update loop)"] + [format_loops(r) for r in rows])
    if args is not None:
        lines += (["# static collectives per level of the step (an all-reduce of a tuple counts "
                   "once: XLA combines reductions)"] + [format_levels(r, args) for r in rows])
    return "\n".join(lines)


def as_json(rows: list[Row], args, device, processes: int = 1, jax_version: str = "") -> dict:
    """{"meta", "rows"} for ``--json`` (read by plotting/scaling.py)."""
    return {"meta": {"device_kind": device.device_kind, "platform": device.platform,
                     "jax": jax_version, "processes": processes, "env": args.env,
                     "steps": args.steps, "hidden": args.hidden,
                     "envs_per_device": args.envs_per_device,
                     "note": ("fake CPU devices: correctness only"
                              if device.platform == "cpu" else "")},
            "rows": [dict(r._asdict(), speed_up=sp, efficiency=eff,
                          by_loop={" > ".join(k) or "top": v for k, v in r.by_loop.items()})
                     for r, (sp, eff) in zip(rows, speed_ups(rows))]}
