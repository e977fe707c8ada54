"""``vccc train``: the lagged actor-critic trainer on gymnax, one run or a grid.

Single run (flags are TrainConfig fields)::

    vccc train --env CartPole-v1 --lag geometric:8 --critic vccc --actor centered-mask --seeds 8

Grid (``kind = "train"`` experiment; flags override its ``[base]``)::

    vccc train --config experiments/train_lag_quick.toml --out results/train

Scaling (issue 10; README "Scaling")::

    vccc train ... --devices 8                      # (8, 1) mesh: envs over "data"
    vccc train ... --mesh data=4,seed=2 --num-seeds 2 --fsdp  # seeds over "seed", FSDP
    vccc train ... --coordinator HOST:PORT --num-processes 2 --process-id I   # each host
    vccc train ... --out DIR --resume            # continue DIR's run bit for bit (orbax)

Critic-free (issue 14; GRPO = law ``full``, PS-PPO = a cutoff law; token envs only)::

    vccc train --critic-free mixture:0.2 --env token:V=16,H=12 --lag uniform:4 --seeds 3
    vccc train --config experiments/ps_ppo.toml     # kind = "critic_free": as vccc sweep

(``runs.critic_free``: one resumable row per run in ``<out>/<name>.jsonl``, default
``results/`` as ``vccc sweep``; a table of J, kept-token fraction, learner rows, memory, time.)

(``VCCC_COORDINATOR`` / ``VCCC_NUM_PROCESSES`` / ``VCCC_PROCESS_ID`` replace the three
multi-host flags.) ``jax.distributed`` starts before the trainer is imported: gymnax builds
arrays at import time, which would start a single-process backend.

Ground truth is on for a run from flags: without ``--gt-every`` it is evaluated about 10
times over the run (``runs.train.with_ground_truth``; Monte Carlo V^{pi_k} on gymnax, exact
on ``tabular:`` / ``token:``), so the first run's curves.png shows the critic error;
``--gt-every 0`` turns it off (a ``--config`` keeps its own value).

Outputs: ``runs.train`` (metrics.csv, summary.json, config.json, checkpoint/) plus
curves.png per run, and for a grid a markdown table and ``<out>/<name>.png``; written by
process 0 only.

Run directories (``runs.run_dir``): the default ``results/train/<env>_..._<hash>_<time>`` is
new for every run; an ``--out`` holding another run is refused unless ``--resume`` (alone:
the run its config.json records; from its latest checkpoint, or from update 0 when it stopped
before the first) or ``--overwrite``. Checkpoints are written every
``--checkpoint-every`` (default 5 minutes of wall time), at the end, and on Ctrl-C: the
first Ctrl-C is acknowledged at once (one line, even mid-compile), finishes the jitted chunk
in flight, checkpoints it and exits 130 with one more line; a second one stops at once (the
last checkpoint is kept). Bad input is reported (one line,
exit 2) before JAX is imported where it can be checked in pure Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

from vccc_jax.commands import train_async, train_grid
from vccc_jax.commands.common import Parser, dry_run, guarded
from vccc_jax.commands.interrupt import EXIT_INTERRUPTED
from vccc_jax.commands.interrupt import SigintStops as _SigintStops
from vccc_jax.commands.interrupt import exit_interrupted as _exit_interrupted
from vccc_jax.commands.interrupt import interruptible as _interruptible
from vccc_jax.commands.shards import add_shard_flags, scaled
from vccc_jax.commands.train_help import FIELD_HELP

# Wall time between periodic checkpoints by default: a SIGKILL (OOM, preemption) loses at
# most this much (plus the chunk in flight). A save of the default CartPole run (976
# updates) costs 0.2 CPU-s with 1 seed and 0.4 with 8 (state + every metric row so far):
# < 0.2% of a run at this interval. Ctrl-C and the end always checkpoint.
DEFAULT_CHECKPOINT_EVERY = "5m"

ALIASES = {"num_seeds": ["--seeds"], "total_timesteps": ["--timesteps"]}
SUMMARY_KEYS = ("final_return", "final_eval_return", "gt_mse", "gt_rel_err", "exact_err_pi",
                "lag_mean", "ess")


def _parse_value(text: str, default: Any):
    if text.lower() in ("none", "null"):
        return None
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")
    if isinstance(default, int):
        return _whole(text)
    if isinstance(default, float):
        return _finite(float(text), text)
    if default is None:  # Optional numeric fields
        try:
            return int(text)
        except ValueError:
            return _finite(float(text), text)
    return text


def _finite(x: float, text: str) -> float:
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def _whole(text: str) -> int:
    """An integer flag: ``4``, ``1e6``, ``500_000``; ``4.9`` is refused, not truncated to 4
    (a ValueError -- ``many`` -- shows as argparse's "invalid int value")."""
    try:
        return int(text)
    except ValueError:
        x = float(text)
    if not math.isfinite(x) or x != int(x):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(x)


def _field_type(default: Any):
    """The argparse ``type`` of a TrainConfig field (its name shows in argparse's errors:
    ``invalid int value: 'many'``)."""

    def parse(text: str):
        return _parse_value(text, default)

    parse.__name__ = "number" if default is None else type(default).__name__
    return parse


def add_distributed_flags(p) -> None:
    """--coordinator / --num-processes / --process-id (shared with ``vccc sweep``)."""
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="jax.distributed coordinator (multi-host; env VCCC_COORDINATOR); "
                   "'auto': let JAX detect the cluster (SLURM, Open MPI and TPU pod "
                   "launches are detected without it)")
    p.add_argument("--num-processes", type=int, default=None,
                   help="processes in a multi-host run (env VCCC_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=None,
                   help="this process's index, 0 writes the results (env VCCC_PROCESS_ID)")


def add_mesh_flags(p) -> None:
    """--devices / --mesh (shared with ``vccc sweep``)."""
    p.add_argument("--devices", type=int, default=None,
                   help="use the first N devices as an (N, 1) mesh (default: all devices)")
    p.add_argument("--mesh", default=None, metavar="data=D,seed=S",
                   help="mesh shape over named axes: envs over data, seeds over seed "
                   "(default: data=<devices>,seed=1)")


def start_distributed(argv: Optional[list[str]]) -> bool:
    """Start ``jax.distributed`` from the multi-host flags (or VCCC_* variables) before
    anything imports gymnax or creates an array. Returns whether it started."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        return False
    pre = Parser(add_help=False)
    add_distributed_flags(pre)
    known, _ = pre.parse_known_args(argv)
    from vccc_jax.runs.distributed import start

    return start(known.coordinator, known.num_processes, known.process_id)


def mesh_of(args):
    """The mesh of --mesh / --devices (ValueError: more devices than available, ...)."""
    from vccc_jax.train.sharding import mesh_from_flags

    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices must be >= 1, got {args.devices}")
    return mesh_from_flags(args.mesh, args.devices)


def parse_every(text: str) -> tuple[int, float]:
    """``--checkpoint-every``: ``N`` updates, or wall time ``Ns`` / ``Nm`` / ``Nh``
    -> (updates, seconds); ``0``: only the final state (and Ctrl-C)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", str(text))
    if m is None or (m.group(2) is None and "." in m.group(1)):
        raise argparse.ArgumentTypeError(
            f"expected N (updates) or a wall time like 90s, 5m, 1h; got {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    if unit is None:
        return int(value), 0.0
    return 0, value * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]


def _description(names: bool) -> str:
    if not names:  # the name lists import JAX: only --help shows them
        return ("Asynchronous actor-critic with simulated policy lag on gymnax, tabular: and "
                "token: envs (--help lists envs and critics).")
    from vccc_jax.envs.make import ENVS
    from vccc_jax.train.targets import CRITIC_TARGETS

    return ("Asynchronous actor-critic with simulated policy lag on gymnax "
            f"({', '.join(ENVS)}), tabular:KEY=VALUE,... and token:KEY=VALUE,... envs. "
            f"Critics: {', '.join(sorted(CRITIC_TARGETS))}. Actors: "
            "[centered-]ratio|truncate|mask. Lags: fixed:L uniform:M geometric:m zipf:a "
            "hist:w0,w1,... hist:@FILE trace:l0,l1,... trace:@FILE")


def build_parser(names: bool = False) -> Parser:
    """The parser (pure Python unless ``names``: the env and critic lists of --help)."""
    from vccc_jax.train.config import TrainConfig

    p = Parser(
        prog="vccc train",
        description=_description(names),
        epilog="--critic-free LAW: GRPO (full) / PS-PPO (uniform | mixture:EPS | geometric:Q) "
        "on a token env instead; it takes --env token:..., --lag, --seed, --num-seeds, "
        "--actor-lr, --ppo-epsilon, --hidden and the critic-free flags above.",
    )
    p.add_argument("--config", help="experiment .toml (kind \"train\": base + grid; kind "
                   "\"critic_free\": the GRPO / PS-PPO grid, as vccc sweep)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override the --config file: base.FIELD=V, grid.FIELD=a,b "
                   "(repeatable); values with commas as a TOML list: "
                   "grid.env='[\"tabular:S=8,gamma=0.9\", \"tabular:S=16,gamma=0.9\"]'")
    p.add_argument("--out", help="run directory (default: a new results/train/<env>_..._<config "
                   "hash>_<time>; critic-free: results, the store vccc sweep uses)")
    p.add_argument("--chunk", type=int, default=0,
                   help="updates per jitted call (progress and Ctrl-C granularity; 0: about "
                   "20 calls)")
    p.add_argument("--checkpoint-every", type=parse_every, default=DEFAULT_CHECKPOINT_EVERY,
                   metavar="N|TIME", help="checkpoint every N updates or every TIME of wall "
                   "time (90s, 5m, 1h; default %(default)s), always at the end and on Ctrl-C; "
                   "0: only then")
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept (the latest N)")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--resume", action="store_true",
                      help="continue the run in --out from its latest checkpoint, bit for bit "
                      "(no other flag needed: its config.json says what it is)")
    runs.add_argument("--overwrite", action="store_true",
                      help="replace the run in --out (its files only) with this one")
    p.add_argument("--fsdp", action="store_true",
                   help="shard params and optimiser states over \"data\" (largest dimension)")
    add_mesh_flags(p)
    add_distributed_flags(p)
    p.add_argument("--no-figure", action="store_true", help="skip the PNG figure")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything and compute nothing: a --config grid prints its "
                   "size, the cells already stored and an ETA; one run what it would do")
    p.add_argument("--track", default="none", metavar="SPEC",
                   help="experiment tracking, one tracked run per run (a grid: per cell): the "
                   "mean over seeds of every metric per update, stepped by env steps. none "
                   "(default), tensorboard (event files in <run>/tensorboard; a grid's cells "
                   "in <out>/<name>/<cell id>/tensorboard: tensorboard --logdir <out>/<name>), "
                   "tensorboard:DIR (a grid: DIR/<name>/<cell id>), or wandb[:PROJECT] (a W&B "
                   "run in <run>/wandb, offline unless WANDB_MODE is set); pip install "
                   "'vccc_jax[tracking]'")
    add_critic_free_flags(p)
    add_shard_flags(p)
    train_async.add_async_flags(p)  # issue 48: --async and its flags
    for f in dataclasses.fields(TrainConfig):
        default = f.default
        flags = ["--" + f.name.replace("_", "-")] + ALIASES.get(f.name, [])
        p.add_argument(*flags, dest=f.name, default=None, type=_field_type(default),
                       help=f"{FIELD_HELP.get(f.name, '')} (default {default})".lstrip())
    from vccc_jax.runs.train import GT_POINTS

    gt = next(a for a in p._actions if a.dest == "gt_every")
    gt.help = (f"ground truth every N updates (default for a run from flags: about {GT_POINTS} "
               "times over the run; 0: off; a --config keeps its own)")
    return p


def add_critic_free_flags(p) -> None:
    """--critic-free LAW and the flags of its own (``runs.critic_free.FLAGS``)."""
    from vccc_jax.runs.critic_free import FLAGS
    from vccc_jax.runs.schema_kinds import CriticFreeBase

    g = p.add_argument_group("critic-free: GRPO / PS-PPO on token envs (issue 14)")
    g.add_argument("--critic-free", metavar="LAW", default=None,
                   help="train critic-free with cutoff law LAW: full (GRPO) | uniform | "
                   "mixture:EPS | geometric:Q (PS-PPO)")
    for name, kind, text in FLAGS:
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None,
                       help=f"{text} (default {getattr(CriticFreeBase(), name)})")


def _given(p, argv, args) -> dict:
    """dest -> value of the flags on the command line (argparse sets a default only where
    the namespace lacks the attribute, so unset flags keep a sentinel; an ``append`` flag
    starts from an empty list and counts as given when it collected a value)."""
    unset = object()
    # list-valued flags (--set: action "append") need a list to append to: given if non-empty
    lists = {k for k, v in vars(args).items() if isinstance(v, list)}
    again = p.parse_args(argv, namespace=argparse.Namespace(
        **{k: [] if k in lists else unset for k in vars(args)}))
    return {k: v for k, v in vars(again).items()
            if v is not unset and not (k in lists and v == [])}


def _overrides(args) -> dict:
    from vccc_jax.train.config import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


@guarded("train")
def main(argv: Optional[list[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _prepare(argv)
    except KeyboardInterrupt:  # during imports or compile, before any run started
        _exit_interrupted("interrupted before training started; nothing was written")


def _prepare(argv: list[str]):
    """Check the input (pure Python first, then what needs JAX) and return the run."""
    from vccc_jax.runs import run_dir, schema
    from vccc_jax.runs import train as runs_train

    parser = build_parser(names="-h" in argv or "--help" in argv)
    args = parser.parse_args(argv)
    if args.keep < 1:
        raise ValueError(f"--keep must be >= 1, got {args.keep}")
    if args.chunk < 0:
        raise ValueError(f"--chunk must be >= 0 (0: about 20 calls), got {args.chunk}")
    if args.overrides and not args.config:
        raise ValueError("--set overrides a --config file; without one, use the flags")
    from vccc_jax.runs.tracking import parse_spec

    parse_spec(args.track)
    exp = schema.load(args.config, args.overrides) if args.config else None
    train_async.check(args, exp)  # issue 48: --async (pure Python)
    train_async.force_host_devices(args)  # before JAX starts
    given = {k: v for k, v in _given(parser, argv, args).items()
             if k not in ("config", "out", "quiet", "no_figure", "overrides", "track",
                          "dry_run")}
    from vccc_jax.runs import critic_free as runs_cf

    if runs_cf.wants(given, exp):  # --devices / --mesh: episodes over "data"
        cf_exp = runs_cf.from_flags({k: v for k, v in given.items()
                                     if k not in ("devices", "mesh")}, exp)
        cf_out = Path(args.out or "results")
        on_mesh = "devices" in given or "mesh" in given
        cf_mesh = []  # the mesh, made after the distributed start

        run = scaled("train", main, argv, args,
                     lambda: _interruptible(train_grid.critic_free, cf_exp, cf_out, args,
                                             cf_mesh[0]),
                     cf_out)
        start_distributed(argv)
        cf_mesh.append(mesh_of(args) if on_mesh else None)
        return run
    if exp is not None and exp.kind != "train":
        raise ValueError(f"{exp.path}: kind {exp.kind!r} runs with `vccc sweep`, not `vccc train`")
    overrides = _overrides(args)
    command = ["vccc", "train", *argv]
    if exp is not None and exp.grid.axes:
        if args.resume or args.overwrite:
            raise ValueError("--resume / --overwrite are for one run; a grid resumes by itself "
                             "(rerun the same command)")
        axes = dict(exp.grid.axes)
        shadowed = sorted(set(overrides) & set(axes))
        if shadowed:  # the grid sets these in every cell: the flag would be ignored
            k = shadowed[0]
            raise ValueError(f"--{k.replace('_', '-')} {overrides[k]}: {k} is a grid axis of "
                             f"{exp.path} ({list(axes[k])}), which sets it in every "
                             f"cell: use --set grid.{k}=V1,V2 (or edit the file)")
        fields = runs_train.cell_fields(exp, overrides)  # pure Python checks first
        for f in fields:
            runs_train.check_whole_updates(f, exp.path)
        out = Path(args.out) if args.out else Path("results") / "train"
        if args.dry_run:
            from vccc_jax.runs.store import cell_id

            cells = [runs_train.config_from(f, exp.path) for f in fields]
            return lambda: dry_run(exp, [cell_id(c.to_dict()) for c in cells],
                                   out / f"{exp.name}.jsonl")
        start_distributed(argv)  # before gymnax is imported
        args.mesh_obj = mesh_of(args)
        cells = [runs_train.config_from(f, exp.path) for f in fields]
        from vccc_jax.train.sharding import check_divisible

        for c in cells:
            check_divisible(c.num_envs, args.mesh_obj, c.num_seeds)
        return scaled("train", main, argv, args,
                      lambda: _interruptible(train_grid.grid, exp.name, cells, out, args), out)
    if args.shard is not None or args.shards is not None:
        raise ValueError("--shard/--shards split a grid (--config with a [grid]) into shards; "
                         "one run scales with --devices / --coordinator")
    where = exp.path if exp is not None else "train flags"
    saved = _resumed_config(args, exp, overrides)
    if saved is not None:  # --out X --resume alone: the run as its config.json records it
        where = f"{args.out}/config.json"
        fields = runs_train.resolve_fields(saved, where)
    else:
        fields = runs_train.resolve_fields(
            dict(exp.base if exp is not None else {}, **overrides), where)
    if exp is None and saved is None:
        fields = runs_train.with_ground_truth(fields, overrides)
    runs_train.check_whole_updates(fields, where)
    if args.out is not None:
        out = Path(args.out)
        mode = run_dir.prepare(out, fields, resume=args.resume, overwrite=args.overwrite)
    elif args.resume or args.overwrite:
        raise ValueError(f"--{'resume' if args.resume else 'overwrite'} needs --out DIR (the "
                         "run directory)")
    else:
        out, mode = None, run_dir.START
    # -- JAX from here on (the checks above are pure Python) ---------------------------
    start_distributed(argv)  # before gymnax is imported
    cfg = runs_train.config_from(fields, where)
    if not args.async_run:  # (--async: its devices are --actor-devices / --learner-devices)
        args.mesh_obj = mesh_of(args)
        from vccc_jax.train.sharding import check_divisible

        check_divisible(cfg.num_envs, args.mesh_obj, cfg.num_seeds)
    if args.dry_run:
        return lambda: _dry_run_one(cfg, out, mode)
    # every check passed: only now touch the file system. Process 0 (the writer) locks the
    # run directory until the run ends: a second vccc train there exits 3
    from vccc_jax.runs.distributed import is_main

    held = None
    if out is None:
        out = run_dir.new_dir(Path("results") / "train", run_dir.run_name(fields))
        held = run_dir.lock(out) if is_main() else None
    elif is_main():
        held = run_dir.make(out, mode, fields)
    else:  # the other processes of a multi-host run: the directory, as before (no lock)
        out.mkdir(parents=True, exist_ok=True)

    def run() -> int:
        try:
            body = train_async.single if args.async_run else _single  # issue 48: --async
            return _interruptible(body, cfg, out, args, mode == run_dir.RESUME, command)
        finally:
            if held is not None:
                os.close(held)

    return run


def _resumed_config(args, exp, overrides: dict) -> Optional[dict]:
    """The config a ``--resume`` without ``--config`` continues: the one ``<out>/config.json``
    records (None: not resuming that way, or no run recorded there -- ``run_dir.prepare``
    says so). Config flags may repeat its values; one that changes a value is refused."""
    from vccc_jax.runs.run_dir import saved_config

    if not args.resume or args.out is None or exp is not None:
        return None
    saved = saved_config(Path(args.out))
    if saved is None:
        return None
    changed = {k: v for k, v in overrides.items() if saved.get(k, v) != v}
    if changed:
        shown = ", ".join(f"--{k.replace('_', '-')} {v} (the run's: {saved.get(k)})"
                          for k, v in sorted(changed.items()))
        raise ValueError(f"--resume continues the run in {args.out} as its config.json records "
                         f"it; these flags change it: {shown}. Drop them to resume, or give "
                         "a new --out to start a run with them")
    return saved


def _dry_run_one(cfg, out: Optional[Path], mode: str) -> int:
    """``--dry-run`` of one run: every check has passed (flags, config, env, --out); say
    what the run would do, compute nothing, write nothing."""
    updates = cfg.total_timesteps // cfg.batch_size
    where = f"--out {out} ({mode})" if out is not None else "a new results/train/<run name>"
    gt = ("no ground truth" if not cfg.gt_every else "ground truth every update"
          if cfg.gt_every == 1 else f"ground truth every {cfg.gt_every} updates")
    print(f"one run: {cfg.env}, {updates} updates of {cfg.batch_size} env steps x "
          f"{cfg.num_seeds} seeds, {gt}; it would write {where}. Checked; nothing computed")
    return 0


def _stopped(out: Path, e) -> str:
    from vccc_jax.runs.run_dir import checkpoint_steps

    steps = checkpoint_steps(out)
    if hasattr(e, "update"):
        return (f"interrupted after update {e.update} of {e.total}; checkpoint saved: "
                f"`--out {out} --resume` continues it")
    if not steps:
        return (f"interrupted before the first checkpoint; `--out {out} --resume` starts "
                "it again from update 0")
    return (f"interrupted; last checkpoint at update {steps[-1]} in {out}: `--out {out} "
            "--resume` continues it")


def _single(cfg, out: Path, args, resume: bool, command: list) -> int:
    from vccc_jax.runs.distributed import is_main
    from vccc_jax.runs.train import Interrupted, run_one

    every, seconds = args.checkpoint_every
    try:
        with _SigintStops(lambda: _stopped(out, None)) as stop:
            summary, rows = run_one(cfg, out, chunk=args.chunk, checkpoint_every=every,
                                    checkpoint_seconds=seconds, resume=resume,
                                    quiet=args.quiet, mesh=args.mesh_obj, fsdp=args.fsdp,
                                    keep=args.keep, stop=stop, command=command,
                                    track=args.track)
    except Interrupted as e:  # the graceful path: no compile was cut short, exit normally
        if is_main():
            print(f"vccc train: {_stopped(out, e)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt as e:  # second Ctrl-C: at once (run_one waited for its saves)
        _exit_interrupted(_stopped(out, e))
    if not is_main():
        return 0
    if not args.no_figure:
        from vccc_jax import plotting

        plotting.plot_learning_curves(
            rows, out / "curves.png",
            f"{cfg.env}  lag {cfg.lag}  critic {cfg.critic}  actor {cfg.actor}"
            f"  ({cfg.num_seeds} seeds)")
    from vccc_jax.analysis.train import format_interval

    for k in SUMMARY_KEYS:
        if k in summary:
            print(f"{k:>18}: {format_interval(summary[k])}; {summary[k]['window']}")
    print(f"results: {out}")
    return 0
