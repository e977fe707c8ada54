"""Report table of the Sec 3.4 Monte-Carlo demonstration (``tabular.async_mc.mc_demo``)."""

from __future__ import annotations

import numpy as np


def format_report(rep: dict) -> str:
    g = rep["g0"]
    zc = rep["z_crit"]
    lines = [
        f"Sec 3.4 demo: {rep['num_rollouts']} rollouts of {rep['horizon']} steps, versions "
        f"{' -> '.join(rep['labels'])} from steps {rep['starts']}; two-sided {rep['confidence']:.1%} "
        f"tests (Bonferroni |z| > {zc:.2f})",
        f"  MC mean of G_0 = {g['mean']:.4f} +- {g['se']:.4f} (SE); exact switching expectation "
        f"{g['switching_value']:.4f} (z = {g['z_switching']:+.2f})",
    ]
    for k, v in g["stationary"].items():
        z = g["z_stationary"][k]
        lines.append(f"  vs V^{k}(s0) = {v:.4f}: z = {z:+8.2f}  {'MISMATCH' if abs(z) > zc else 'consistent'}")
    for name in ("vccc", "uncorrected"):
        o = rep["one_step"][name]
        lines.append(f"  one-step {name:<11} per-state mean vs T_pi Vbar: chi2 = {o['chi2']:.1f} "
                     f"(df {o['df']}), p = {o['p']:.3g}, max|z| = {np.nanmax(np.abs(o['z'])):.2f}")
    r = rep["returns"]
    for lab in ["pi_k"] + rep["labels"]:
        lines.append(f"  pooled returns-to-go vs V^{lab}(s): chi2 = {r[lab]['chi2']:.1f} (df {r[lab]['df']}), "
                     f"p = {r[lab]['p']:.3g}")
    return "\n".join(lines)
