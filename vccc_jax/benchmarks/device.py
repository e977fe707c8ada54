"""``vccc bench device --out DIR``: everything a GPU / TPU host should measure, in one run
of under 8 minutes, into ``DIR/device.json`` and ``DIR/device.md``.

Sections (each with its own time budget; one that fails or runs out of time is recorded as
skipped with the reason, and the JSON is rewritten after every section, so a killed run
still leaves what it measured):

  host       devices, platform, jax / jaxlib versions, device memory, load average
  bandwidth  the memory-bandwidth ceiling: a donated in-place update of a large buffer
             (``benchmarks.estimators.measure_ceiling``; bytes read + written / time)
  vtrace     V-trace, every variant (scan, in-place, associative) vs rlax (batch- and
             time-major callers) and vs that ceiling (``benchmarks.estimators``), then the
             loop against the associative scan over a (T, B) grid: the crossover that
             ``estimators.vtrace.ASSOCIATIVE_WINS`` records per backend
  trainer    env steps/s of our trainer (synchronous GAE and lagged VCCC) vs the
             PureJaxRL-style reference in the same process (``benchmarks.train``), at 1
             and 64 seeds (4 envs) and at 1k and 4k envs (1 seed); cold and warm compile
  token      the trainer on the LLM-shaped token env at V = 32k, H = 1024
  scale      the sharded trainer over 1, 2, 4, ... all local devices, weak and strong
             (``benchmarks.scale``' own ``plan`` / ``measure``)
  compile    the compile times of every row above: the trainer's cold (empty persistent
             cache) and warm (loaded from it); token and scale rows as compiled under the
             command's own cache setting (``host.compile_cache``)

Every ratio is against a reference run in the same process. On a CPU host the sizes are
small (``small``, automatic on CPU): a smoke test of the script, not a measurement.
Flags and printing: :mod:`vccc_jax.commands.bench`; this module returns data and strings.
"""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import jax

SECTIONS = ("host", "bandwidth", "vtrace", "trainer", "token", "scale", "compile")
BUDGET_S = 450.0  # the whole run (the issue's target: under 8 minutes)
# Share of the whole budget each section may use (what is left over passes on).
SHARE = {"host": 0.01, "bandwidth": 0.04, "vtrace": 0.18, "trainer": 0.44, "token": 0.13,
         "scale": 0.20, "compile": 0.0}

FULL = {
    "ceiling_mib": 1024, "vtrace_sizes": ((128, 4096), (1024, 4096), (512, 65536)),
    "vtrace_reps": 9,
    # loop vs associative scan: T down, B across (cells up to 2^24 transitions)
    "crossover": {"num_ts": (32, 128, 1024, 4096, 16384), "batches": (1, 16, 256, 4096, 65536),
                  "max_size": 2**24, "reps": 5},
    # (label, seeds, envs, env steps per seed, rows): steps make a run of ~0.1-2 s on a GPU
    "trainer": (("1 seed x 4 envs", 1, 4, 2**17, ("reference", "sync-gae", "lag8-vccc")),
                ("64 seeds x 4 envs", 64, 4, 2**16, ("reference", "lag8-vccc")),
                ("1 seed x 1024 envs", 1, 1024, 1024 * 128 * 16, ("reference", "lag8-vccc")),
                ("1 seed x 4096 envs", 1, 4096, 4096 * 128 * 8, ("reference", "lag8-vccc"))),
    "repeats": 2, "warm": ("1 seed x 4 envs",), "trainer_overrides": {},
    "token": {"env": "token:V=32768,H=1024", "num_envs": 64, "num_steps": 128, "updates": 4,
              "hidden": 64},
    "scale": {"envs_per_device": 1024, "steps": 128, "updates": 4, "repeats": 2,
              "hidden": 64},
}
SMALL = {
    "ceiling_mib": 16, "vtrace_sizes": ((32, 256), (64, 1024)), "vtrace_reps": 3,
    "crossover": {"num_ts": (8, 64), "batches": (1, 16), "max_size": 2**10, "reps": 2},
    # one config: a CPU compiles each trainer in 10-80 s (the reference needs 4 x 128 steps)
    "trainer": (("1 seed x 4 envs", 1, 4, 4 * 128, ("reference", "lag8-vccc")),),
    "repeats": 1, "warm": ("1 seed x 4 envs",), "trainer_overrides": {},
    "token": {"env": "token:V=64,H=16", "num_envs": 4, "num_steps": 16, "updates": 2,
              "hidden": 16},
    "scale": {"envs_per_device": 4, "steps": 16, "updates": 2, "repeats": 1, "hidden": 16},
}


class Skip(Exception):
    """A section or step that cannot run here (the message is the reason)."""


class Clock:
    """Seconds left until a deadline."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + max(0.0, float(seconds))

    def left(self) -> float:
        return self.end - time.monotonic()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------------ sections


def host(cfg: dict, clock: Clock, log: Callable[[str], None]) -> dict:
    devs = jax.local_devices()
    memory = None
    try:
        stats = devs[0].memory_stats() or {}
        memory = stats.get("bytes_limit")
    except Exception:  # noqa: BLE001  (CPU devices have no memory stats)
        pass
    import jaxlib

    return {"platform": devs[0].platform, "device_kind": devs[0].device_kind,
            "local_devices": len(devs), "devices": jax.device_count(),
            "processes": jax.process_count(), "memory_bytes": memory,
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine(), "load": _load(),
            # where compiled programs persist (token / scale compile times are with it;
            # the trainer's cold / warm columns use a private empty cache)
            "compile_cache": (jax.config.jax_compilation_cache_dir
                              if jax.config.jax_enable_compilation_cache else None)}


def bandwidth(cfg: dict, clock: Clock, log: Callable[[str], None]) -> dict:
    from vccc_jax.benchmarks import estimators as est

    num = cfg["ceiling_mib"] * 2**20
    bps = est.measure_ceiling(num, reps=7)
    log(f"  bandwidth ceiling {bps / 1e9:.1f} GB/s ({cfg['ceiling_mib']} MiB buffer)")
    return {"buffer_mib": cfg["ceiling_mib"], "bytes_per_s": bps,
            "vtrace_ceiling_mts": bps / est.BYTES_PER_TRANSITION / 1e6,
            "bytes_per_transition": est.BYTES_PER_TRANSITION}


def vtrace(cfg: dict, clock: Clock, log: Callable[[str], None], ceiling: Optional[float] = None
           ) -> dict:
    from vccc_jax.benchmarks import estimators as est

    rlax = est.load_rlax()
    fns = est.build_functions(rlax)
    rows, skipped = [], []
    for num_t, batch in cfg["vtrace_sizes"]:
        if rows and clock.left() < 5.0:
            skipped.append(f"T={num_t} B={batch}: section time budget spent")
            continue
        row = {"T": num_t, "B": batch, **est.bench_size(fns, num_t, batch, cfg["vtrace_reps"])}
        if "rlax-BM" in row:
            row["ours_vs_rlax_bm"] = row["ours"] / row["rlax-BM"]
            row["ours_vs_rlax_tm"] = row["ours"] / row["rlax-TM"]
        if ceiling:
            row["ours_of_ceiling"] = row["ours"] / ceiling
            row["inplace_of_ceiling"] = row["inplace"] / ceiling
        rows.append(row)
        log(f"  vtrace T={num_t} B={batch}: ours {row['ours']:.0f} M/s")
    # The measurement behind vtrace.ASSOCIATIVE_WINS on this backend (docs/scaling.md).
    grid = cfg["crossover"]
    cross = est.crossover(grid["reps"], grid["num_ts"], grid["batches"], grid["max_size"],
                          stop=lambda: clock.left() < 3.0)
    cells = len([1 for t in grid["num_ts"] for b in grid["batches"] if t * b <= grid["max_size"]])
    if len(cross) < cells:
        skipped.append(f"crossover: {cells - len(cross)} of {cells} cells (section time budget spent)")
    return {"variants": list(fns), "rlax": rlax is not None, "rows": rows, "skipped": skipped,
            "crossover": cross, "crossover_table": est.format_crossover(cross) if cross else "",
            "note": "" if rlax else "rlax not installed (pip install 'vccc_jax[bench]')"}


def _time_pair(prepared: list, repeats: int, label: str, seeds: int, envs: int) -> list[dict]:
    from vccc_jax.benchmarks import train as tb

    timings = tb.time_rows(prepared, repeats)
    ref = next((t for t in timings if t.name.startswith("reference")), None)
    out = []
    for t in timings:
        out.append({"config": label, "seeds": seeds, "envs": envs, "row": t.name,
                    "env_steps_per_s": t.steps_per_s,
                    "vs_reference": None if ref is None else t.steps_per_s / ref.steps_per_s,
                    "compile_s": t.compile_s, "warm_compile_s": t.warm_s, "run_s": t.run_s,
                    "env_steps": t.env_steps, "final_return": t.final_return})
    return out


def trainer(cfg: dict, clock: Clock, log: Callable[[str], None]) -> dict:
    from vccc_jax.benchmarks import train as tb

    rows, skipped = [], []
    for label, seeds, envs, steps, names in cfg["trainer"]:
        if "reference" in names and steps < envs * tb.REFERENCE_CONFIG["NUM_STEPS"]:
            raise ValueError(f"{label}: {steps} steps per seed is less than one reference "
                             f"update ({envs} envs x {tb.REFERENCE_CONFIG['NUM_STEPS']} steps)")
        # a config compiles len(names) programs: ~10-40 s each on a loaded CPU or a GPU
        if rows and clock.left() < 30.0 * len(names):
            skipped.append(f"{label}: section time budget spent ({clock.left():.0f}s left)")
            continue
        warm = label in cfg["warm"]
        prepared = []
        try:
            for name in names:
                if name == "reference":
                    prepared.append(tb.prepare_reference(seeds, steps, num_envs=envs, warm=warm))
                else:
                    over = dict(tb.ROWS[name], **cfg["trainer_overrides"])
                    prepared.append(tb.prepare_trainer(name, seeds, steps, warm=warm,
                                                       num_envs=envs, **over))
                log(f"  {label} {name}: compiled in {prepared[-1].compile_s:.1f}s")
            rows += _time_pair(prepared, cfg["repeats"], label, seeds, envs)
            log(f"  {label}: " + ", ".join(f"{r['row'].split()[0]} {r['env_steps_per_s']:.3g}/s"
                                           for r in rows if r["config"] == label))
        except Exception as e:  # noqa: BLE001  (e.g. out of memory at 4k envs x 64 seeds)
            skipped.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return {"rows": rows, "skipped": skipped,
            "note": "reference = single-file PureJaxRL-style PPO (benchmarks.train)"}


def token(cfg: dict, clock: Clock, log: Callable[[str], None]) -> dict:
    from vccc_jax.benchmarks import train as tb

    t = cfg["token"]
    steps = t["num_envs"] * t["num_steps"] * t["updates"]
    rows = {}
    for name in ("sync-gae", "lag8-vccc"):
        if rows and clock.left() < 30.0:
            break
        p = tb.prepare_trainer(name, 1, steps, warm=False, env=t["env"], num_envs=t["num_envs"],
                               num_steps=t["num_steps"], hidden=t["hidden"], eval_envs=0,
                               gt_every=0, gamma=1.0, **tb.ROWS[name])
        (timing,) = tb.time_rows([p], 2)  # best of 2: the first call pays one-off costs
        rows[name] = {"env_steps_per_s": timing.steps_per_s, "compile_s": timing.compile_s,
                      "run_s": timing.run_s, "env_steps": timing.env_steps}
        log(f"  token {t['env']} {name}: {timing.steps_per_s:.3g} tokens/s")
    return {"env": t["env"], "num_envs": t["num_envs"], "num_steps": t["num_steps"],
            "hidden": t["hidden"], "rows": rows}


def scale(cfg: dict, clock: Clock, log: Callable[[str], None]) -> dict:
    from vccc_jax.benchmarks import scale as sb

    n = jax.device_count()
    counts = sorted({2**k for k in range(n.bit_length()) if 2**k <= n} | {n})
    s = cfg["scale"]
    wanted = {"devices": ",".join(map(str, counts)), "regimes": "weak,strong",
              "envs_per_device": s["envs_per_device"], "total_envs": 0, "steps": s["steps"],
              "updates": s["updates"], "repeats": s["repeats"], "hidden": s["hidden"]}
    base = sb.defaults()
    args = SimpleNamespace(**{**base, **{k: v for k, v in wanted.items() if k in base}})
    todo, skipped = sb.plan(args, n)
    rows = []
    for regime, devices, envs in todo:
        if rows and clock.left() < 20.0:
            skipped.append(f"# skip {regime} n={devices}: section time budget spent")
            continue
        rows.append(sb.measure(args, regime, devices, envs, progress=log))
    dev = jax.devices()[0]
    return {"table": sb.format_table(rows) if rows else "", "skipped": list(skipped),
            **sb.as_json(rows, args, dev, jax.process_count(), jax.__version__)}


def compile_times(result: dict) -> dict:
    """Every compile time measured above: (section, config, row) -> cold / warm seconds."""
    rows = []
    sec = result["sections"]
    for r in (sec.get("trainer", {}).get("result") or {}).get("rows", []):
        rows.append({"section": "trainer", "config": r["config"], "row": r["row"],
                     "cold_s": r["compile_s"], "warm_s": r["warm_compile_s"]})
    for name, r in ((sec.get("token", {}).get("result") or {}).get("rows") or {}).items():
        rows.append({"section": "token", "config": sec["token"]["result"]["env"], "row": name,
                     "cold_s": r["compile_s"], "warm_s": None})
    for r in (sec.get("scale", {}).get("result") or {}).get("rows", []):
        rows.append({"section": "scale", "config": f"{r.get('regime')} {r.get('num_envs')} envs",
                     "row": f"{r.get('devices')} devices", "cold_s": r.get("compile_s"),
                     "warm_s": None})
    return {"rows": rows}


# ------------------------------------------------------------------------------ runner


def select(spec: Optional[str]) -> list[str]:
    """Section names of a comma-separated ``--sections`` value (None: all), in run order."""
    if spec is None:
        return list(SECTIONS)
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown or not wanted:
        raise ValueError(f"--sections: unknown {unknown or 'nothing'} (choose from "
                         f"{', '.join(SECTIONS)})")
    return [s for s in SECTIONS if s in wanted]


def write(out: Path, result: dict) -> None:
    """``device.json`` (atomically replaced) and ``device.md`` of what is measured so far."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "device.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=float))
    os.replace(tmp, out / "device.json")
    (out / "device.md").write_text(format_report(result) + "\n")


def run(out: str | Path, *, small: Optional[bool] = None, sections: Optional[list] = None,
        budget_s: float = BUDGET_S, log: Callable[[str], None] = lambda s: None) -> dict:
    """Run the sections (all by default) within ``budget_s`` seconds, writing ``out`` after
    each one; return the result dict. ``small``: None = automatic (small on CPU)."""
    out = Path(out)
    platform_ = jax.devices()[0].platform
    small = (platform_ == "cpu") if small is None else small
    cfg = SMALL if small else FULL
    names = list(SECTIONS) if sections is None else list(sections)
    total = Clock(budget_s)
    result = {"meta": {"small": small, "budget_s": budget_s, "platform": platform_,
                       "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": _load(),
                       "sections": names},
              "sections": {}}
    fns = {"host": host, "bandwidth": bandwidth, "vtrace": vtrace, "trainer": trainer,
           "token": token, "scale": scale}
    write(out, result)
    for i, name in enumerate(names):
        t0, load0 = time.perf_counter(), _load()
        rest = sum(SHARE[n] for n in names[i:]) or 1.0
        clock = Clock(min(total.left(), total.left() * SHARE[name] / rest) if SHARE[name]
                      else total.left())
        entry = {"status": "ok", "reason": "", "load_start": load0}
        log(f"[{name}] budget {clock.left():.0f}s")
        try:
            if total.left() <= 0 and name != "compile":  # (compile only reads the above)
                raise Skip(f"the run's time budget ({budget_s:.0f}s) is spent")
            if name == "compile":
                entry["result"] = compile_times(result)
            elif name == "vtrace":
                bw = (result["sections"].get("bandwidth", {}).get("result") or {})
                entry["result"] = vtrace(cfg, clock, log, bw.get("vtrace_ceiling_mts"))
            else:
                entry["result"] = fns[name](cfg, clock, log)
            if (entry["result"] or {}).get("skipped"):
                entry["status"] = "partial"
        except Skip as e:
            entry.update(status="skipped", reason=str(e))
        except Exception as e:  # noqa: BLE001  (record, go on with the next section)
            entry.update(status="skipped", reason=f"{type(e).__name__}: {e}"[:500],
                         traceback=traceback.format_exc()[-2000:])
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        entry["load_end"] = _load()
        result["sections"][name] = entry
        log(f"[{name}] {entry['status']} in {entry['seconds']:.1f}s"
            + (f": {entry['reason']}" if entry["reason"] else ""))
        write(out, result)
    result["meta"]["load_end"] = _load()
    write(out, result)
    return result


# ------------------------------------------------------------------------------ report


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def format_report(result: dict) -> str:
    """The markdown tables of a (possibly partial) result."""
    m, sec = result["meta"], result["sections"]
    lines = [f"# vccc bench device ({'small sizes: a smoke test' if m['small'] else 'full'}), "
             f"{m['platform']}, started {m['started']}, load {m['load_start']}"]
    for name in m["sections"]:
        e = sec.get(name)
        if e is None:
            lines += ["", f"## {name}: not run yet"]
            continue
        head = f"## {name}: {e['status']} ({e['seconds']:.1f}s, load {e['load_start']} -> " \
               f"{e['load_end']})"
        lines += ["", head]
        if e["reason"]:
            lines.append(f"skipped: {e['reason']}")
        r = e.get("result") or {}
        for s in r.get("skipped", []):
            lines.append(f"- skipped {s}")
        if name == "host" and r:
            lines.append(", ".join(f"{k} {v}" for k, v in r.items()))
        elif name == "bandwidth" and r:
            lines.append(f"{r['bytes_per_s'] / 1e9:.1f} GB/s ({r['buffer_mib']} MiB) = "
                         f"{r['vtrace_ceiling_mts']:.0f} M V-trace transitions/s at "
                         f"{r['bytes_per_transition']} B each")
        elif name == "vtrace" and r.get("rows"):
            cols = [c for c in r["variants"]]
            extra = [c for c in ("ours_vs_rlax_bm", "ours_vs_rlax_tm", "ours_of_ceiling",
                                 "inplace_of_ceiling") if c in r["rows"][0]]
            lines += ["| T | B | " + " | ".join(f"{c} M/s" for c in cols + []) +
                      "".join(f" | {c}" for c in extra) + " |",
                      "|---:" * (2 + len(cols) + len(extra)) + "|"]
            for row in r["rows"]:
                lines.append(f"| {row['T']} | {row['B']} | "
                             + " | ".join(f"{row[c]:.0f}" for c in cols)
                             + "".join(f" | {row[c]:.2f}" for c in extra) + " |")
            if r.get("note"):
                lines.append(r["note"])
            if r.get("crossover_table"):
                lines += ["", "loop vs associative scan (vtrace.ASSOCIATIVE_WINS):", "```",
                          r["crossover_table"], "```"]
        elif name == "trainer" and r.get("rows"):
            lines += ["| config | run | env steps/s | vs reference | compile s cold | "
                      "compile s warm | run s |", "|---|---|---:|---:|---:|---:|---:|"]
            for row in r["rows"]:
                lines.append(f"| {row['config']} | {row['row']} | {row['env_steps_per_s']:,.0f} "
                             f"| {_fmt(row['vs_reference'], '.2f')}x | {row['compile_s']:.1f} | "
                             f"{_fmt(row['warm_compile_s'], '.1f')} | {row['run_s']:.2f} |")
        elif name == "token" and r.get("rows"):
            lines += [f"{r['env']}, {r['num_envs']} envs x {r['num_steps']} steps, hidden "
                      f"{r['hidden']}", "| run | tokens/s | compile s | run s |",
                      "|---|---:|---:|---:|"]
            for k, row in r["rows"].items():
                lines.append(f"| {k} | {row['env_steps_per_s']:,.0f} | {row['compile_s']:.1f} "
                             f"| {row['run_s']:.2f} |")
        elif name == "scale" and r.get("table"):
            lines += ["```", r["table"], "```"]
        elif name == "compile" and r.get("rows"):
            lines += ["| section | config | row | cold s | warm s |", "|---|---|---|---:|---:|"]
            for row in r["rows"]:
                lines.append(f"| {row['section']} | {row['config']} | {row['row']} | "
                             f"{_fmt(row['cold_s'], '.1f')} | {_fmt(row['warm_s'], '.1f')} |")
    return "\n".join(lines)
