"""The field audit's group (critic-free) section: every group adapter under :mod:`.group`'s
contract at each lag (or a lag law), its verdict, and cross rows against our reference
estimators and ``train/critic_free.py``'s group baseline on the same groups.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from vccc_jax.verify import group
from vccc_jax.verify.adapters import Adapter
from vccc_jax.verify.report import worst


@dataclasses.dataclass
class GroupAudit:
    adapter: Adapter
    report: group.GroupReport
    lags: tuple


def run(adapters: Sequence[Adapter], lags: Sequence) -> list[GroupAudit]:
    return [GroupAudit(a, group.check_group(a.build(), a.key, tuple(lags)), tuple(lags)) for a in adapters]


def _fits(au: GroupAudit, lag, kind: str) -> list[group.Fit]:
    return [f for (tb, lg, k), f in au.report.fits.items() if lg == lag and k == kind]


def cell(au: GroupAudit, lag) -> str:
    """PASS (Eq 12) / SCALED (a multiple alpha of Eq 12) / FAIL, the ratio rows of both testbeds."""
    fs = _fits(au, lag, "ratio")
    rel = worst(*(f.rel for f in fs))
    if all(f.exact for f in fs):
        return f"PASS ({rel:.1e})"
    if all(f.multiple for f in fs):
        a = np.concatenate([f.alpha for f in fs])
        return f"SCALED (x {_range(a)})"
    return f"FAIL ({rel:.2g}, cos {min(float(np.min(f.cos)) for f in fs):.3f})"


def _range(a: np.ndarray) -> str:
    lo, hi = float(np.min(a)), float(np.max(a))
    return f"{lo:.4g}" if hi - lo <= 1e-9 * max(1.0, abs(hi)) else f"{lo:.3g}..{hi:.3g}"


def verdict(au: GroupAudit) -> str:
    """From the ratio rows at every lag (the estimator's own bias) and the rows without the
    ratio at the largest lag (what staleness adds when the update is not corrected)."""
    last = au.lags[-1]
    plain = worst(*(f.rel for f in _fits(au, last, "plain")))
    stale = f"; without the ratio biased by staleness: {plain:.2g} at {_lag(last)}"
    ratio = [f for lag in au.lags for f in _fits(au, lag, "ratio")]
    if all(f.exact for f in ratio):
        return ("**unbiased** with the ratio pi/mu (Eq 12 at every lag: the baseline does not depend on the "
                "completion it scores)" + stale)
    if all(f.multiple for f in ratio):
        a = np.concatenate([f.alpha for f in ratio])
        return (f"**Eq 12 up to a scale** (x {_range(a)} with the ratio: the baseline includes the completion "
                "it scores; the direction is unbiased at every lag)" + stale)
    first = au.lags[0]
    on = [f for f in _fits(au, first, "ratio")]
    if first == 0 and not all(f.multiple for f in on):
        cos = min(float(np.min(f.cos)) for f in on)
        return (f"**biased even on-policy** (lag 0: not a multiple of Eq 12, min cosine {cos:.3f}: a baseline or "
                "normalisation that depends on the completion it scores)" + stale)
    return "**biased** with the ratio (not a multiple of Eq 12 at some lag)" + stale


def _lag(lag) -> str:
    return f"lag {lag}" if isinstance(lag, int) else f"lag law {lag}"


def markdown(audits: Sequence[GroupAudit], cross: Sequence[dict], kls: dict, options: str = "") -> list[str]:
    if not audits:
        return []
    lags = audits[0].lags
    lines = [
        "", "## Group (critic-free) estimators", "",
        "Contract (`verify/group.py`): per prompt G = 4 completions, each slot's behaviour version drawn from the lag "
        "(law), outcome rewards in {0, 0.5, 1}; the update (1/G) sum_i w_i A_i grad log pi(y_i) with w_i = pi / mu "
        "(the ratio rows: the claim) or w_i = 1; its expectation enumerated exactly over all C^G ordered groups "
        "(the baseline's dependence on the completion it scores is inside the expectation) against Eq 12, on a "
        "4-armed bandit and a token tree (completions EOS, aa, ab, ba, bb: lengths 1 and 2), 8 problems each; "
        "learner = the end of a 16-step exact gradient-ascent history, behaviour at lag L its step 16 - L. "
        "Mean KL(pi || mu): " + ", ".join(f"{_lag(k)}: {v:.3g}" for k, v in kls.items()) + ". Cells: PASS = "
        "Eq 12 (max relative error), SCALED = exactly alpha x Eq 12 (alpha over problems), FAIL = relative bias "
        "and min cosine. Aggregation: tokens summed, the group averaged (verl's token-mean adds a length "
        "weighting not covered here); an estimator with a batch statistic (REINFORCE++'s whitening, GPG's "
        "alpha) sees one group as its batch.", "",
        "| library | version | function | claims | " + " | ".join(_lag(x) for x in lags)
        + " | E[update] with the ratio, largest lag | verdict | reproduce |",
        "|" + "---|" * (7 + len(lags)),
    ]
    for au in audits:
        a = au.adapter
        claims = a.claims + (f"; **default** ({a.default})" if a.default else "")
        diag = " / ".join(f"{tb}: {f.sentence()}" for (tb, lg, k), f in au.report.fits.items()
                          if lg == lags[-1] and k == "ratio")
        lag_opt = f"--lag {lags[-1]}" if isinstance(lags[-1], int) else f"--lag-law {lags[-1]}"
        lines.append(f"| {a.library} | {a.version()} | `{a.calls}` (`{a.key}`) | {claims} | "
                     + " | ".join(cell(au, lag) for lag in lags) + f" | {diag} | {verdict(au)} | "
                     f"`vccc verify --target {a.key} {lag_opt}` |")
    if cross:
        lines += ["", "Cross rows: the library's advantages vs ours (`verify.group.REFERENCES`, written from the "
                  "papers) and vs `train/critic_free.py`'s group baseline (`estimators.related.ps_ppo."
                  "group_advantages`) on the same 256 random groups (G = 4, rewards in {0, 0.5, 1}, lengths 1-3): "
                  "max |difference|.", "",
                  "| theirs | ours | max diff | critic_free | max diff | note |", "|---|---|---|---|---|---|"]
        for c in cross:
            lines.append(f"| `{c['theirs']}` | `{c['ours']}` | {c['diff']:.1e} | {c['cf'] or 'n/a'} | "
                         + (f"{c['cf_diff']:.1e}" if c["cf"] else "n/a") + f" | {c['note']} |")
    return lines


# Which train/critic_free baseline corresponds to a library estimator (ps_ppo.group_advantages).
CRITIC_FREE = {"grpo": True, "dr_grpo": False, "drgrpo": False}
NOTES = {
    "grpo": "critic_free normalises by jnp.std (ddof 0), the libraries by the Bessel-corrected std (ddof 1)",
    "gpg": "verl forms alpha = bs / #nonzero as a float32 tensor division (round-off 3e-8)",
}


def cross_rows(adapters: Sequence[Adapter], seed: int = 0, n: int = 256) -> list[dict]:
    """Each group adapter vs our reference and, where one corresponds, critic_free's baseline."""
    import jax
    import jax.numpy as jnp

    from vccc_jax.estimators.related import ps_ppo

    rng = np.random.default_rng(seed)
    r = rng.choice([0.0, 0.5, 1.0], size=(n, group.GROUP))
    lengths = rng.integers(1, 4, size=(n, group.GROUP)).astype(float)
    greedy = rng.choice([0.0, 0.5, 1.0], size=n)
    out = []
    for a in adapters:
        base = a.function.removesuffix("_advantages").removesuffix("_advantage")
        ours = group.REFERENCES["dr_grpo" if base == "drgrpo" else base]
        theirs = np.asarray(a.build()(r, lengths, greedy), float)
        row = {"theirs": a.key, "ours": ours.__name__, "diff": worst(np.abs(theirs - ours(r, lengths, greedy))),
               "cf": "", "cf_diff": float("nan"), "note": NOTES.get(base, "")}
        if base in CRITIC_FREE:
            with jax.enable_x64(True):
                cf = np.asarray(ps_ppo.group_advantages(jnp.asarray(r), normalize=CRITIC_FREE[base]))
            row.update(cf=f"group_advantages(normalize={CRITIC_FREE[base]})", cf_diff=worst(np.abs(theirs - cf)))
        out.append(row)
    return out


def kls(lags: Sequence) -> dict:
    return {lag: group.kl(lag) for lag in lags}


def adapters_of(table: Sequence[Adapter]) -> tuple[list[Adapter], list[Adapter]]:
    """(group adapters, the rest)."""
    return [a for a in table if a.kind == "group"], [a for a in table if a.kind != "group"]


__all__ = ["GroupAudit", "adapters_of", "cell", "cross_rows", "kls", "markdown", "run", "verdict"]
