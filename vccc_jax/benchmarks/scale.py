"""``vccc bench scale``: the sharded trainer at 1, 2, 4, 8 ... devices (issue 10).

For every device count n (a (n, 1) mesh over the first n devices) and two regimes:

  weak    fixed envs per device: num_envs = n * --envs-per-device
  strong  fixed total batch:     num_envs = --total-envs (n must divide it)

it reports updates/s and env steps/s of the compiled training step (best of ``--repeats``
calls of ``--updates`` updates each, after a warm-up call), the AOT compile time
(``jit(...).lower(...).compile()``) separately, and the collectives in the compiled HLO
text (all-reduce / all-gather / reduce-scatter / collective-permute / all-to-all
instructions; counted statically, so an op inside the minibatch loop counts once). The
layout is that of :mod:`vccc_jax.train.sharding`: env axis over "data", params replicated
(``--fsdp``: sharded), gradients reduced by compiler-inserted collectives.

The same script runs on CPU, GPU or TPU and prints the device kind; on fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) the numbers prove only that the
sharded program runs and which collectives it uses — the devices share the host's cores.
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
    collectives: dict
    by_loop: dict = {}
    per_env_step: dict = {}


def count_collectives(hlo_text: str) -> dict:
    """Instructions per collective kind in an HLO module's text (async start/done pairs
    count once, on their -start)."""
    counts = {}
    for name in COLLECTIVES:
        pat = re.compile(r"=\s*[^=]*?\b" + re.escape(name) + r"(-start)?\(")
        counts[name] = sum(1 for line in hlo_text.splitlines() if pat.search(line))
    return counts


_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(r"\b(?:to_apply|calls|condition|true_computation|false_computation)=%([\w.\-]+)")
_BODY = re.compile(r"\bbody=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'known_trip_count"?\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _loop_label(line: str) -> str:
    """``name:trip`` of a while instruction: the source scope that made the loop (the
    op_name element before its last ``/while``, e.g. ``rollout``, ``Trainer._epochs``)
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
    each. In the trainer's step: ``("_train_impl:U",)`` is the per-update body, a
    ``rollout:T`` loop inside it the per-env-step loop, ``Trainer._epochs`` / minibatch
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


def env_step_collectives(by_loop: dict, num_steps: int) -> dict:
    """Collectives inside a loop of ``num_steps`` trips nested in the update loop: the
    rollout's per-env-step loop (and any reverse scan over the T steps of the targets),
    summed over such loop nests. XLA's scope names of loops are not reliable after
    optimisation, so the trip count identifies them; keep T distinct from the epoch and
    minibatch counts."""
    total = dict.fromkeys(COLLECTIVES, 0)
    for path, counts in by_loop.items():
        if any(p.endswith(f":{num_steps}") for p in path[1:]):
            for k, v in counts.items():
                total[k] += v
    return total


# The flags of `vccc bench scale` (commands/bench.py builds its parser from these):
# (flag, type, default, help).
FLAGS = (
    ("--devices", str, "1,2,4,8",
     "comma-separated device counts (those above the available are skipped)"),
    ("--regimes", str, "weak,strong", "weak (fixed envs per device) and/or strong (fixed total)"),
    ("--envs-per-device", int, 4, "weak scaling: envs per device"),
    ("--total-envs", int, 0, "strong scaling batch (default: max devices x envs per device)"),
    ("--env", str, "CartPole-v1", "gymnax environment"),
    ("--steps", int, 128, "rollout length T"),
    ("--updates", int, 8, "updates per timed call"),
    ("--repeats", int, 3, "timed calls (best is reported)"),
    ("--epochs", int, 4, "learner epochs per update"),
    ("--minibatches", int, 4, "minibatches per epoch"),
    ("--hidden", int, 64, "hidden units"),
    ("--lag", str, "uniform:7", "lag law"),
    ("--critic", str, "vccc", "critic target"),
    ("--seeds", int, 1, "vmapped seeds"),
)
# store_true flags: --fsdp (shard params over "data")


def defaults() -> dict:
    """{attribute name: default} of :data:`FLAGS` plus ``fsdp=False``."""
    out = {f[0][2:].replace("-", "_"): f[2] for f in FLAGS}
    out["fsdp"] = False
    return out


def plan(args, avail: int) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(the measurements to run as (regime, devices, num_envs), "# skip ..." messages).

    ValueError when no requested device count fits the ``avail`` devices or a regime is
    unknown."""
    counts = [int(x) for x in str(args.devices).split(",") if x.strip()]
    counts = [n for n in counts if n <= avail]
    if not counts:
        raise ValueError(f"no device count in {args.devices!r} fits the {avail} available")
    total = args.total_envs or max(counts) * args.envs_per_device
    todo, skipped = [], []
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
    """One row: AOT compile time, best-of-``repeats`` step time, collectives (total and by
    loop nest). ``args``: any object with the :data:`FLAGS` attributes (and ``fsdp``);
    ``progress(text)`` hears "  weak n=2: compiled in ...s"."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.train import sharding as sh
    from vccc_jax.train.trainer import TrainConfig, Trainer

    cfg = TrainConfig(env=args.env, num_envs=num_envs, num_steps=args.steps,
                      total_timesteps=num_envs * args.steps * args.updates * (args.repeats + 1),
                      update_epochs=args.epochs, num_minibatches=args.minibatches,
                      hidden=args.hidden, lag=args.lag, critic=args.critic,
                      num_seeds=args.seeds, eval_envs=0)
    st = sh.ShardedTrainer(Trainer(cfg), sh.make_mesh((n, 1), jax.devices()[:n]), fsdp=args.fsdp)
    t0 = time.perf_counter()
    compiled = st.lower(args.updates).compile()
    compile_s = time.perf_counter() - t0
    if progress is not None:
        progress(f"  {regime} n={n}: compiled in {compile_s:.1f}s")
    text = compiled.as_text()
    counts = count_collectives(text)
    by_loop = collectives_by_loop(text)
    state = st.init()
    start = 0
    state, _ = compiled(state, jnp.asarray(start, jnp.int32))  # warm-up
    jax.block_until_ready(state)
    best = float("inf")
    for _ in range(args.repeats):
        start += args.updates
        t0 = time.perf_counter()
        state, m = compiled(state, jnp.asarray(start, jnp.int32))
        jax.block_until_ready((state, m))
        best = min(best, time.perf_counter() - t0)
    steps = args.updates * num_envs * args.steps * args.seeds
    return Row(regime, n, num_envs, compile_s, best, args.updates / best, steps / best, counts,
               by_loop, env_step_collectives(by_loop, args.steps))


def format_loops(row: Row) -> str:
    """One line: the collectives of each loop nest (trip counts outermost first)."""
    parts = []
    for path, counts in sorted(row.by_loop.items(), key=lambda kv: (len(kv[0]), str(kv[0]))):
        where = "top" if not path else " > ".join(path)
        parts.append(f"{where}: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    step = sum(row.per_env_step.values())
    parts.append(f"per env step: {step}" if step else "per env step: none")
    return f"{row.regime} n={row.devices}: " + " | ".join(parts)


def format_table(rows: list[Row]) -> str:
    head = (f"{'regime':7s} {'dev':>3s} {'envs':>5s} {'compile s':>9s} {'updates/s':>10s} "
            f"{'env steps/s':>12s} {'speed-up':>8s}  collectives (static HLO count)")
    lines = [head, "-" * len(head)]
    base = {}
    for r in rows:
        base.setdefault(r.regime, r)
        b = base[r.regime]
        # weak scaling: throughput ratio over n x the 1-device one; strong: time ratio
        speed = r.env_steps_per_s / b.env_steps_per_s
        coll = ", ".join(f"{k} {v}" for k, v in r.collectives.items() if v) or "none"
        lines.append(f"{r.regime:7s} {r.devices:3d} {r.num_envs:5d} {r.compile_s:9.2f} "
                     f"{r.updates_per_s:10.2f} {r.env_steps_per_s:12.0f} {speed:8.2f}  {coll}")
    return "\n".join(lines)


def loops_footer(rows: list[Row]) -> str:
    """The per-loop collective lines printed after the table."""
    return "\n".join(["# collectives by loop nest (scope:trip, outermost first; per env "
                      "step = loops of T trips inside the update loop)"]
                     + [format_loops(r) for r in rows])


def as_json(rows: list[Row], args, device, processes: int = 1, jax_version: str = "") -> dict:
    """{"meta", "rows"} for ``--json`` (read by plotting/scaling.py)."""
    return {"meta": {"device_kind": device.device_kind, "platform": device.platform,
                     "jax": jax_version, "processes": processes, "env": args.env,
                     "steps": args.steps,
                     "note": ("fake CPU devices: correctness only"
                              if device.platform == "cpu" else "")},
            "rows": [dict(r._asdict(), by_loop={" > ".join(k) or "top": v
                                                for k, v in r.by_loop.items()})
                     for r in rows]}
