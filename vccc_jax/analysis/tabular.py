"""The one-screen summary of a tabular staleness sweep (a string; ``vccc sweep`` prints it)."""

from __future__ import annotations

from typing import Optional

import numpy as np


def _fmt(x: Optional[float]) -> str:
    if x is None or not np.isfinite(x):
        return "     -"
    if x == 0:
        return "     0"
    if abs(x) < 1e-3 or abs(x) >= 1e4:
        return f"{x:6.0e}"
    return f"{x:6.3f}"


def summary_table(rows: list[dict], cfg: dict) -> str:
    """One screen: per family, fixed-point RMS error to V^{pi_K} by mean lag (one law, one
    clip for clipped methods), then the trained critic's error and the target variance at
    the largest lag."""
    grid = cfg["grid"]
    law = "geometric" if "geometric" in grid["laws"] else grid["laws"][0]
    clips = sorted(grid["clips"])
    clip = clips[len(clips) // 2] if clips else None
    lags = sorted(float(m) for m in grid["mean_lags"])
    top = lags[-1]
    idx = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        c = r["cell"]
        idx[(c["family"]["name"], c["method"], c["law"], c["mean_lag"], c["clip"])] = r["metrics"]
    lines = [
        f"sweep {cfg['name']}: RMS error |V - V^pi_K| (d^pi_K-weighted) of the exact fixed point",
        f"by mean lag; law={law}; clipped methods at c={clip:g}; mean over {cfg['num_mdps']} MDPs.",
        "trained = stochastically trained critic's error; targetVar = exact target variance.",
    ] if clip is not None else [
        f"sweep {cfg['name']}: RMS error |V - V^pi_K| (d^pi_K-weighted) of the exact fixed point",
        f"by mean lag; law={law}; mean over {cfg['num_mdps']} MDPs",
    ]
    uses_clip = {}  # a method is clipped iff its rows carry a clip threshold
    for r in rows:
        uses_clip[r["cell"]["method"]] = r["cell"]["clip"] is not None
    for fam in cfg["families"]:
        kl = next((r["metrics"].get("history_kl_by_step") for r in rows
                   if r["cell"]["family"]["name"] == fam["name"]), None)
        lines.append("")
        if kl:
            h = cfg["history"]
            lines += [f"{fam['name']}: pi_0..pi_{len(kl)} by {h['algorithm'].upper()} steps of "
                      f"{h['step_size']:g}; KL(pi_i || pi_i-1) per step: first {kl[0]:.3g}, "
                      f"mean {np.mean(kl):.3g}, last {kl[-1]:.3g}"]
        head = f"{fam['name']:<23}" + "".join(f" lag={m:<4g}" for m in lags)
        head += f" | trained@{top:g} targetVar@{top:g}"
        lines += [head, "-" * len(head)]
        for method in grid["methods"]:
            c = None
            if uses_clip.get(method, False):
                own = sorted(grid["method_clips"].get(method, clips))
                c = clip if clip in own else own[len(own) // 2]
            cells = [idx.get((fam["name"], method, law, m, c)) for m in lags]
            label = method if c is None else f"{method} c={c:g}"
            line = f"{label:<23}" + "".join(
                f" {_fmt(x['fp_err_rms']) if x else '     ?':>8}" for x in cells
            )
            last = cells[-1] or {}
            line += f" | {_fmt(last.get('tc_err_rms')):>10} {_fmt(last.get('target_var')):>10}"
            lines.append(line)
    return "\n".join(lines)
