"""Tables of the actor-correction x critic-correction map (``runs.actor_map`` rows; issue 21).

Stored metric arrays are indexed [seed][sampler][lag][critic] (``metrics["critics"]`` names
the critics, ``cell["samplers"]`` / ``cell["lags"]`` the others); a row whose actor correction
has no closed form on its task holds ``{"na": reason}``.

* :func:`tolerance_lag`: the largest lag of the grid up to which the cosine stays >= a
  threshold (every grid lag <= it passes); None when the smallest lag already fails.
* :func:`exact_records` / :func:`tolerance_records`: seed means per (task, sampler, row,
  critic, lag) and the tolerance lags of the seed-mean cosine curves, for Eq 12 and for the
  true policy gradient.
* :func:`auc_records`: normalised return AUC per (task, sampler, row, critic, lag): IQM with a
  stratified-bootstrap CI over seeds (``analysis.seeds``); an instance whose initial policy is
  already optimal (J* = J(pi_0): AUC NaN) is left out and ``n`` counts the rest.
* :func:`paired_records`: per-seed paired differences of a critic's AUC against the
  uncorrected critic's (same seeds): mean with a bootstrap CI and the two-sided Wilcoxon
  signed-rank p-value (``analysis.seeds.paired_difference``).
* markdown tables (strings) of each.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from vccc_jax.analysis.seeds import CI_LEVEL, paired_difference, stratified_bootstrap_ci

THRESHOLDS = (0.9, 0.5)
PARTS = ("drift_part", "critic_part", "weight_part", "state_part")
REFERENCES = {"eq12": "Eq 12 (behaviour state weights)", "pg": "true policy gradient"}
SAMPLER_LABEL = {"temperature": "T", "top_p": "top-p"}
CRITIC_LABEL = {"uncorrected": "uncorrected (GAE)", "vccc": "VCCC", "truncated": "truncated c",
                "vtrace": "V-trace"}

__all__ = ["THRESHOLDS", "tolerance_lag", "format_lag", "exact_records", "tolerance_records",
           "auc_records", "paired_records", "tolerance_markdown", "at_lag_markdown",
           "auc_markdown", "paired_markdown", "decomposition_markdown", "actor_rows", "grid_lags"]


def tolerance_lag(lags: Sequence[int], cos: Sequence[float], threshold: float) -> Optional[int]:
    """Largest lag L of ``lags`` (increasing) with cos >= threshold at every lag <= L; None
    when cos < threshold at the smallest lag (NaN fails)."""
    best = None
    for lag, c in zip(lags, cos):
        if not (c is not None and np.isfinite(c) and c >= threshold):
            break
        best = int(lag)
    return best


def format_lag(lag: Optional[int], max_lag: int) -> str:
    """'-' (fails at the smallest lag), '>=L' (holds over the whole grid) or the lag."""
    if lag is None:
        return "-"
    return f"≥{lag}" if lag >= max_lag else str(lag)


def _by_study(rows, study):
    return [r for r in rows if r["cell"]["study"] == study]


def _key(r):
    c = r["cell"]
    return c["task"]["name"], c["row"]


def _mean(x) -> float:
    """Seed mean leaving out NaN (an instance whose reference gradient is 0; stored as None)."""
    x = np.asarray(x, np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def exact_records(rows: list[dict]) -> list[dict]:
    """One record per (task, sampler, row, critic, lag) of the exact study: seed means of
    every metric, NaN (degenerate instances with a zero reference gradient) left out
    (``na`` records for rows without a closed form)."""
    out = []
    for r in _by_study(rows, "exact"):
        c, m = r["cell"], r["metrics"]
        task, row = _key(r)
        if "na" in m:
            out.append(dict(task=task, row=row, na=m["na"]))
            continue
        metrics = [k for k, v in m.items() if isinstance(v, list) and k != "critics"]
        arrays = {k: np.asarray(m[k], np.float64) for k in metrics}  # None (NaN) -> nan
        for j, sampler in enumerate(c["samplers"]):
            for i, lag in enumerate(c["lags"]):
                ctx = {k: _mean(a[:, j, i]) for k, a in arrays.items() if a.ndim == 3}
                for k, critic in enumerate(m["critics"]):
                    rec = dict(task=task, sampler=sampler, row=row, critic=critic, lag=int(lag),
                               **ctx)
                    rec.update({n: _mean(a[:, j, i, k]) for n, a in arrays.items()
                                if a.ndim == 4})
                    out.append(rec)
    return out


def tolerance_records(rows: list[dict], thresholds: Sequence[float] = THRESHOLDS) -> list[dict]:
    """Per (task, sampler, row, critic): ``lag_<ref>_<thr>`` (:func:`tolerance_lag` of the
    seed-mean cosine to ``ref`` in eq12 / pg) and ``max_lag``; ``na`` rows per (task, row)."""
    out, curves = [], {}
    for rec in exact_records(rows):
        if "na" in rec:
            out.append(rec)
            continue
        key = (rec["task"], rec["sampler"], rec["row"], rec["critic"])
        curves.setdefault(key, []).append(rec)
    for (task, sampler, row, critic), recs in curves.items():
        recs = sorted(recs, key=lambda x: x["lag"])
        lags = [x["lag"] for x in recs]
        rec = dict(task=task, sampler=sampler, row=row, critic=critic, max_lag=max(lags))
        for ref in REFERENCES:
            for thr in thresholds:
                rec[f"lag_{ref}_{thr}"] = tolerance_lag(lags, [x[f"cos_{ref}"] for x in recs], thr)
        out.append(rec)
    return out


def auc_records(rows: list[dict], level: float = CI_LEVEL) -> list[dict]:
    """Per (task, sampler, row, critic, lag) of the train study: IQM of the normalised return
    AUC over seeds with its stratified-bootstrap ``level`` CI (``lo``, ``hi``), the mean
    final normalised return, the seeds ``n`` and the per-seed AUCs ``per_seed``."""
    out = []
    for r in _by_study(rows, "train"):
        c, m = r["cell"], r["metrics"]
        task, row = _key(r)
        if "na" in m:
            out.append(dict(task=task, row=row, na=m["na"]))
            continue
        auc, final = np.asarray(m["auc"], np.float64), np.asarray(m["final"], np.float64)
        for j, sampler in enumerate(c["samplers"]):
            for i, lag in enumerate(c["lags"]):
                for k, critic in enumerate(m["critics"]):
                    x = auc[:, j, i, k]
                    ok = np.isfinite(x)  # NaN: an instance with J* = J(pi_0) (no gap to close)
                    p, lo, hi = (stratified_bootstrap_ci(x[ok], level=level) if ok.any()
                                 else (np.nan,) * 3)
                    out.append(dict(task=task, sampler=sampler, row=row, critic=critic,
                                    lag=int(lag), iqm=p, lo=lo, hi=hi, n=int(ok.sum()),
                                    final=_mean(final[:, j, i, k]), per_seed=x.tolist()))
    return out


def paired_records(rows: list[dict], control: str = "uncorrected",
                   level: float = CI_LEVEL) -> list[dict]:
    """Per (task, sampler, row, lag, critic != ``control``): the per-seed paired difference
    of the AUC (critic - control, the same seeds): ``analysis.seeds.paired_difference``
    (mean, ``level`` bootstrap CI, share of seeds that improve, two-sided Wilcoxon
    signed-rank p-value), the control's mean AUC and the relative effect mean diff / mean
    control AUC."""
    recs = [r for r in auc_records(rows) if "na" not in r]
    index = {(r["task"], r["sampler"], r["row"], r["lag"], r["critic"]): r for r in recs}
    out = []
    for (task, sampler, row, lag, critic), r in index.items():
        ref = index.get((task, sampler, row, lag, control))
        if critic == control or ref is None:
            continue
        d = paired_difference(r["per_seed"], ref["per_seed"], level=level)
        base = _mean(ref["per_seed"])
        out.append(dict(task=task, sampler=sampler, row=row, lag=lag, critic=critic,
                        control_auc=base, treated_auc=float(np.mean(r["per_seed"])),
                        relative=d["point"] / base if base else float("nan"), **d))
    return out


# ------------------------------------------------------------------------- markdown


def _rows_in_order(records, key="row"):
    return list(dict.fromkeys(r[key] for r in records))


def actor_rows(rows: list[dict]) -> list[str]:
    """The actor rows of the stored cells, in grid order."""
    return list(dict.fromkeys(r["cell"]["row"] for r in rows))


def grid_lags(rows: list[dict]) -> list[int]:
    """Every lag of the stored cells, increasing."""
    return sorted({int(x) for r in rows for x in r["cell"]["lags"]})


def tolerance_markdown(rows: list[dict], task: str, reference: str = "eq12",
                       thresholds: Sequence[float] = THRESHOLDS) -> str:
    """Markdown map of one task: actor rows x (critic, sampler); each entry 'L_a / L_b', the
    tolerance lags (:func:`tolerance_lag`) at the two thresholds for ``reference``."""
    recs = [r for r in tolerance_records(rows, thresholds) if r["task"] == task]
    na = {r["row"]: r["na"] for r in recs if "na" in r}
    ok = [r for r in recs if "na" not in r]
    if not ok:
        return f"(no exact rows for task {task})"
    critics = _rows_in_order(ok, "critic")
    samplers = _rows_in_order(ok, "sampler")
    idx = {(r["row"], r["critic"], r["sampler"]): r for r in ok}
    cols = [(c, s) for c in critics for s in samplers]
    head = "| actor row | " + " | ".join(f"{CRITIC_LABEL.get(c, c)}, {SAMPLER_LABEL.get(s, s)}"
                                         for c, s in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for row in [x for x in actor_rows(rows) if x in na or any(r["row"] == x for r in ok)]:
        if row in na:
            lines.append(f"| {row} | " + " | ".join("n/a" for _ in cols) + " |")
            continue
        cells = []
        for c, s in cols:
            r = idx[(row, c, s)]
            cells.append(" / ".join(format_lag(r[f"lag_{reference}_{t}"], r["max_lag"])
                                    for t in thresholds))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def at_lag_markdown(rows: list[dict], task: str, sampler: str, lag: int) -> str:
    """Markdown table at one lag: per actor row and critic, 'cos / rel bias' to Eq 12 and
    to the policy gradient (seed means)."""
    recs = [r for r in exact_records(rows) if r["task"] == task and "na" not in r
            and r["sampler"] == sampler and r["lag"] == lag]
    critics = _rows_in_order(recs, "critic")
    idx = {(r["row"], r["critic"]): r for r in recs}
    head = ("| actor row | " + " | ".join(f"{CRITIC_LABEL.get(c, c)}: Eq 12 | "
                                         f"{CRITIC_LABEL.get(c, c)}: PG" for c in critics) + " |")
    lines = [head, "|---" * (2 * len(critics) + 1) + "|"]
    for row in [x for x in actor_rows(rows) if any(r["row"] == x for r in recs)]:
        cells = []
        for c in critics:
            r = idx[(row, c)]
            cells += [f"{r['cos_eq12']:.3f} / {r['rel_eq12']:.2g}",
                      f"{r['cos_pg']:.3f} / {r['rel_pg']:.2g}"]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def auc_markdown(rows: list[dict], task: str, sampler: str, lags: Sequence[int]) -> str:
    """Markdown table of return AUC IQM [CI] per actor row x (critic, lag)."""
    recs = [r for r in auc_records(rows) if r["task"] == task]
    ok = [r for r in recs if "na" not in r and r["sampler"] == sampler and r["lag"] in lags]
    critics = _rows_in_order(ok, "critic")
    idx = {(r["row"], r["critic"], r["lag"]): r for r in ok}
    cols = [(c, g) for g in lags for c in critics]
    head = "| actor row | " + " | ".join(f"{CRITIC_LABEL.get(c, c)}, lag {g}" for c, g in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for row in [x for x in actor_rows(rows) if any(r["row"] == x for r in recs)]:
        if (row, cols[0][0], cols[0][1]) not in idx:
            lines.append(f"| {row} | " + " | ".join("n/a" for _ in cols) + " |")
            continue
        cells = [f"{idx[(row, c, g)]['iqm']:.3f} [{idx[(row, c, g)]['lo']:.3f}, "
                 f"{idx[(row, c, g)]['hi']:.3f}]" for c, g in cols]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_markdown(rows: list[dict], control: str = "uncorrected") -> str:
    """Markdown table of :func:`paired_records`."""
    recs = sorted(paired_records(rows, control),
                  key=lambda r: (r["task"], r["sampler"], r["row"], r["lag"], r["critic"]))
    lines = [f"| task | sampler | actor row | lag | critic vs {control} | AUC {control} | "
             f"Δ AUC (mean) [{CI_LEVEL:.0%} CI] | relative | seeds better | Wilcoxon p |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        lines.append(f"| {r['task']} | {r['sampler']} | {r['row']} | {r['lag']} | "
                     f"{CRITIC_LABEL.get(r['critic'], r['critic'])} | {r['control_auc']:.4f} | "
                     f"{r['point']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] | "
                     f"{r['relative']:+.1%} | {r['frac_better']:.0%} of {r['n']} | "
                     f"{r['p_value']:.2g} |")
    return "\n".join(lines)


def decomposition_markdown(rows: list[dict], task: str, sampler: str) -> str:
    """Markdown table per (actor row, lag, critic): the exact bias parts |drift|, |critic|,
    |weight| over |Eq 12| and |state| over |PG| (seed means), the cosines, and the
    training-averaged parts when the train study stored them."""
    recs = [r for r in exact_records(rows) if r["task"] == task and "na" not in r
            and r["sampler"] == sampler]
    run = {}
    for r in _by_study(rows, "train"):
        c, m = r["cell"], r["metrics"]
        if c["task"]["name"] != task or "drift_part_run" not in m:
            continue
        j = c["samplers"].index(sampler)
        for i, lag in enumerate(c["lags"]):
            for k, critic in enumerate(m["critics"]):
                run[(c["row"], int(lag), critic)] = tuple(
                    float(np.nanmean(np.asarray(m[f"{p}_run"], np.float64)[:, j, i, k]))
                    for p in PARTS)
    lines = ["| actor row | lag | critic | drift | critic part | weight | state | "
             "cos Eq 12 | cos PG | along the run: drift / critic / weight / state |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (r["row"], r["lag"])):
        tr = run.get((r["row"], r["lag"], r["critic"]))
        trs = " / ".join(f"{x:.3g}" for x in tr) if tr else "-"
        lines.append(f"| {r['row']} | {r['lag']} | {CRITIC_LABEL.get(r['critic'], r['critic'])} | "
                     f"{r['drift_part']:.3g} | {r['critic_part']:.3g} | {r['weight_part']:.3g} | "
                     f"{r['state_part']:.3g} | {r['cos_eq12']:.4f} | {r['cos_pg']:.4f} | {trs} |")
    return "\n".join(lines)
