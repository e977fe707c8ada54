"""Figure of ``vccc bench scale`` results (issue 10): throughput and speed-up vs devices.

Bench JSON format (one file per bench run; :func:`read_bench` accepts it)::

    {"meta": {"device_kind", "platform", "jax", "processes", "env", "steps", ...},
     "rows": [{"regime": "weak"|"strong", "devices", "num_envs", "compile_s", "step_s",
               "updates_per_s", "env_steps_per_s", "collectives": {kind: count}}]}

(the fields of ``benchmarks.scale.Row``, written by ``vccc bench scale --json PATH``).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from vccc_jax.plotting.style import EXACT_COLOR, OKABE_ITO, figsize, styled

REQUIRED = ("regime", "devices", "num_envs", "updates_per_s", "env_steps_per_s")


def read_bench(path: str | Path) -> dict:
    """Load and check a bench JSON file (see the module docstring)."""
    doc = json.loads(Path(path).read_text())
    for i, r in enumerate(doc.get("rows", [])):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"{path}: row {i} lacks {missing}")
    if not doc.get("rows"):
        raise ValueError(f"{path}: no rows")
    return doc


def bench_table(doc: dict) -> str:
    lines = ["| regime | devices | envs | compile s | updates/s | env steps/s | speed-up |",
             "|---|---|---|---|---|---|---|"]
    for regime in ("weak", "strong"):
        rs = sorted((r for r in doc["rows"] if r["regime"] == regime), key=lambda r: r["devices"])
        for r in rs:
            base = rs[0]["env_steps_per_s"] if regime == "strong" else rs[0]["env_steps_per_s"] / rs[0]["devices"]
            sp = r["env_steps_per_s"] / base / (1 if regime == "strong" else r["devices"])
            lines.append(f"| {regime} | {r['devices']} | {r['num_envs']} | {r.get('compile_s', float('nan')):.1f} | "
                         f"{r['updates_per_s']:.1f} | {r['env_steps_per_s']:.0f} | {sp:.2f} |")
    return "\n".join(lines)


@styled
def fig_scaling(doc: dict):
    """Left: env steps/s vs devices (log-log; ideal linear scaling dashed). Right: scaling
    efficiency (weak: per-device throughput / 1-device; strong: speed-up / devices)."""
    meta = doc.get("meta", {})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=figsize("two", 2.6), layout="constrained")
    colors = {"weak": OKABE_ITO["blue"], "strong": OKABE_ITO["vermillion"]}
    for regime, marker in (("weak", "o"), ("strong", "s")):
        rs = sorted((r for r in doc["rows"] if r["regime"] == regime), key=lambda r: r["devices"])
        if not rs:
            continue
        d = np.array([r["devices"] for r in rs], float)
        y = np.array([r["env_steps_per_s"] for r in rs], float)
        ax.plot(d, y, marker=marker, color=colors[regime], label=f"{regime} scaling")
        ax.plot(d, y[0] * d / d[0], ls="--", lw=0.8, color=colors[regime], alpha=0.6)
        eff = (y / y[0]) / (d / d[0])
        bx.plot(d, eff, marker=marker, color=colors[regime], label=f"{regime} scaling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("env steps / s (log)")
    ax.set_title("throughput (dashed: linear from 1 device)")
    ax.legend()
    bx.axhline(1.0, color=EXACT_COLOR, lw=0.8, ls="--")
    bx.set_xscale("log", base=2)
    bx.set_ylim(bottom=0)
    bx.set_xlabel("devices")
    bx.set_ylabel("scaling efficiency")
    bx.set_title("efficiency (1 = linear)")
    for a in (ax, bx):
        devs = sorted({r["devices"] for r in doc["rows"]})
        a.set_xticks(devs, [str(x) for x in devs])
        a.minorticks_off()
    note = meta.get("note", "")
    fig.suptitle(f"vccc bench scale: {meta.get('device_kind', '?')} ({meta.get('platform', '?')}), "
                 f"{meta.get('env', '')}, jax {meta.get('jax', '?')}" + (f"\n{note}" if note else ""))
    return fig
