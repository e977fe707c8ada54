"""The rows of ``vccc verify`` and their table (a string; printing is the command's job)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class Row:
    """One line of the verify table."""

    name: str
    equation: str
    kind: str              # "exact" | "sampled"
    mdps: int
    error: float           # exact: max abs error; sampled: fraction |z| > 3.29
    tolerance: float       # exact: tolerance; sampled: pass bound on the fraction
    passed: bool
    detail: str = ""
    info: bool = False     # information only (``--claim any``): printed "info", never decides a verdict

    @property
    def result(self) -> str:
        return "info" if self.info else ("pass" if self.passed else "FAIL")

    def as_dict(self) -> dict:
        """JSON-safe dict (NaN -> None)."""
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def worst(*errors) -> float:
    """The largest of ``errors`` (scalars, sequences or arrays): NaN when any is NaN, inf when
    any is inf. Python's ``max`` drops a NaN that is not first and ``np.nanmax`` drops them all;
    every verify row reduces its errors here, so a NaN or inf error fails the row."""
    flat = [np.ravel(np.asarray(e, float)) for e in errors]
    flat = np.concatenate(flat) if flat else np.zeros(0)
    return float(np.max(flat)) if flat.size else 0.0


def failing(errors, tol: float) -> np.ndarray:
    """Which errors fail ``tol``: ``not (e <= tol)``, so NaN and inf fail (``e > tol`` would not
    count a NaN)."""
    return ~(np.asarray(errors, float) <= tol)


def exact_row(name: str, equation: str, mdps: int, error: float, tolerance: float, detail: str = "") -> Row:
    """An exact row that passes when ``error <= tolerance`` (NaN fails)."""
    error = float(error)
    return Row(name, equation, "exact", int(mdps), error, tolerance, bool(error <= tolerance), detail)


def pair_row(name: str, equation: str, mdps: int, value, closed, tolerance: float, detail: str = "",
             *, min_size: float = 0.0) -> Row:
    """An exact row for a (value, closed form) pair: error = max |value - closed|; with
    ``min_size`` > 0 it also requires max |closed| >= min_size (a claimed nonzero effect,
    e.g. a bias, must be there). The size is appended to the detail."""
    value, closed = np.asarray(value, float), np.asarray(closed, float)
    row = exact_row(name, equation, mdps, float(np.max(np.abs(value - closed))), tolerance, detail)
    if min_size > 0:
        size = float(np.max(np.abs(closed)))
        row.passed = bool(row.passed and size >= min_size)
        row.detail = f"{detail}; max |closed form| = {size:.3g} (must be >= {min_size:g})".lstrip("; ")
    return row


def format_table(rows: Sequence[Row]) -> str:
    """The exact and sampled rows as two aligned tables plus a pass count."""
    lines = []
    exact = [r for r in rows if r.kind == "exact"]
    sampled = [r for r in rows if r.kind == "sampled"]
    w = max(len(r.name) for r in rows) + 2
    lines.append(f"{'EXACT (float64)':<{w}} {'eq':<9} {'MDPs':>5} {'max abs err':>12} {'tol':>8}  result")
    for r in exact:
        lines.append(
            f"{r.name:<{w}} {r.equation:<9} {r.mdps:>5} {r.error:>12.2e} {r.tolerance:>8.0e}  "
            f"{r.result}" + (f"  ({r.detail})" if r.detail and not r.name.startswith("bandit") else "")
        )
        if r.name.startswith("bandit"):
            lines[-1] += f"  {r.detail}"
    if sampled:
        lines.append("")
        lines.append(f"{'SAMPLED (z-scores)':<{w}} {'eq':<9} {'MDPs':>5} {'|z|>3.29':>12} {'bound':>8}  result")
    for r in sampled:
        lines.append(
            f"{r.name:<{w}} {r.equation:<9} {r.mdps:>5} {r.error:>12.4f} {r.tolerance:>8.4f}  "
            f"{r.result}  ({r.detail})"
        )
    n_fail = sum(not r.passed for r in rows)
    n_info = sum(r.info for r in rows)
    lines.append("")
    lines.append(f"{len(rows) - n_fail - n_info}/{len(rows) - n_info} rows pass" + ("" if n_fail == 0 else f"; {n_fail} FAIL")
                 + (f"; {n_info} informational (no claim)" if n_info else ""))
    return "\n".join(lines)


def json_report(rows: Sequence[Row], *, seconds: float, quick: bool, seed: int) -> dict:
    """The JSON document of ``vccc verify --json`` (NaN errors as null)."""
    return {"rows": [r.as_dict() for r in rows], "seconds": seconds, "quick": quick, "seed": seed,
            "all_passed": all(r.passed for r in rows)}
