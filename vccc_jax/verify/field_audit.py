"""The field audit (issue 29): other libraries' estimators, unchanged, checked exactly at lags.

For every adapter of :mod:`vccc_jax.verify.adapters` (``library:function``) and every lag of
:data:`~vccc_jax.verify.lags.LAGS`, :func:`run` checks the function with
:func:`vccc_jax.verify.user.check_all` on the problems of ``vccc verify`` (same groups and
keys) re-set to that lag (:func:`vccc_jax.verify.lags.maker`): once under the claim the
library makes (``Adapter.claim``) and, when that claim is not ``vpi``, once against V^pi /
Eq 12, so the bias of the design is measured as well as the claim. :func:`verdict` says in
words whether a function is unbiased, biased by design or biased by staleness alone;
:func:`cross_rows` compares our actor-table rows with the libraries' losses on random
inputs (and on large log-ratios). ``commands/verify.py --field-audit`` writes the table
(:func:`markdown`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from vccc_jax.verify import lags as lagmod
from vccc_jax.verify.adapters import Adapter, registry
from vccc_jax.verify.user import Report, Target, check_all


@dataclasses.dataclass
class Audit:
    """One adapter's reports per lag: ``claim[lag]`` under its claim, ``vpi[lag]`` vs V^pi."""

    adapter: Adapter
    claim: dict
    vpi: dict


def targets_for(adapters: Sequence[Adapter]) -> list[Target]:
    out = []
    for a in adapters:
        out.append(Target(a.key, a.kind, a.claim))
        if a.claim != "vpi":
            out.append(Target(a.key, a.kind, "vpi"))
    return out


def checkable(adapters: Sequence[Adapter]) -> tuple[list[Adapter], list[tuple[Adapter, str]]]:
    """(adapters that pass the contract's preflight, [(adapter, the one-line reason) for the rest])
    -- e.g. a loss that couples tokens (a batch statistic) is not a per-token mean."""
    from vccc_jax.verify.contracts import TargetError, preflight

    ok, bad = [], []
    for a in adapters:
        try:
            preflight(Target(a.key, a.kind, a.claim).resolve()[3])
            ok.append(a)
        except (TargetError, ImportError) as e:
            bad.append((a, str(e)))
    return ok, bad


def run(adapters: Sequence[Adapter], lags: Sequence[int] = lagmod.LAGS, *, quick: bool = True, seed: int = 0,
        num_mdps: Optional[int] = None, num_samples: Optional[int] = None,
        log: Callable[[str], None] = lambda s: None) -> list[Audit]:
    """Check every adapter at every lag (one ``check_all`` per lag: targets of one kind share a graph)."""
    audits = [Audit(a, {}, {}) for a in adapters]
    targets = targets_for(adapters)
    for lag in lags:
        reports = check_all(targets, quick=quick, key=jax.random.PRNGKey(seed), num_mdps=num_mdps,
                            num_samples=num_samples, make=lagmod.maker(lag))
        it = iter(reports)
        for au in audits:
            r = next(it)
            au.claim[lag] = r
            au.vpi[lag] = r if au.adapter.claim == "vpi" else next(it)
        log(f"lag {lag}: {len(targets)} checks done")
    return audits


def exact_pass(r: Report) -> bool:
    """Every exact row about the mean passes (the sampled rows are reported but do not decide a
    verdict, and whether the output is a constant is :func:`carries_gradient`'s, not a bias)."""
    return all(row.passed for row in r.rows if row.kind == "exact" and "stop_gradient" not in row.name)


def carries_gradient(r: Report) -> str:
    """The inputs a critic target's output carries a gradient into ("" when it is a constant)."""
    for row in r.rows:  # the row passes with a warning unless loss_ready (diagnose.gradient_row)
        if "stop_gradient" in row.name and "gradient flows into " in row.detail:
            return row.detail.split("gradient flows into ", 1)[1].split(";", 1)[0]
    return ""


def bias(r: Report) -> str:
    """The bias against V^pi / Eq 12 in one cell: the fixed point's max |V* - V^pi| (critic
    targets) or the relative bias and min cosine of the expected update (actors)."""
    for row in r.rows:
        if "fixed point = V^pi" in row.name:
            return f"{row.error:.2g}"
    for row in r.rows:
        if "update = Eq 12, A = Q^pi - V^pi" in row.name:
            m = re.search(r"min cosine (-?[0-9.]+)", row.detail)
            return f"{row.error:.2g} (cos {float(m.group(1)):.3f})" if m else f"{row.error:.2g}"
    return "n/a"


def mean_error(r: Report) -> float:
    """The largest error of the exact mean / fixed-point / update rows (not Var, not stop_gradient)."""
    return max((row.error for row in r.rows if row.kind == "exact" and np.isfinite(row.error)
                and not row.name.endswith("finite") and "stop_gradient" not in row.name), default=0.0)


ON_POLICY_TOL = 1e-6  # lag 0 within this: exact on-policy up to an epsilon of the library's own


def verdict(au: Audit) -> str:
    """Unbiased / biased by design / biased by staleness alone, from the exact rows (lag 0 within
    :data:`ON_POLICY_TOL` counts as exact on-policy, with the error named)."""
    lags = sorted(au.vpi)
    vpi_ok = {lag: exact_pass(au.vpi[lag]) for lag in lags}
    note = ""
    if 0 in vpi_ok and not vpi_ok[0] and mean_error(au.vpi[0]) <= ON_POLICY_TOL:
        vpi_ok[0] = True
        note = f" (lag 0 exact up to {mean_error(au.vpi[0]):.0e}: above round-off, an epsilon or float32 inside)"
    claim_ok = all(exact_pass(au.claim[lag]) for lag in lags)
    if all(vpi_ok.values()):
        return "**unbiased** (V^pi / Eq 12 at every lag)" + note
    if au.adapter.claim != "vpi" and claim_ok:
        return f"**biased by design** (exactly its claim {au.adapter.claim} at every lag; not V^pi past lag 0)" + note
    if vpi_ok.get(0, False) and au.adapter.biased_by:
        return f"**biased by design** ({au.adapter.biased_by}): exact at lag 0, biased once the data is stale" + note
    if vpi_ok.get(0, False):
        return "**biased by staleness alone** (exact at lag 0, biased once the data is stale)" + note
    return "**biased even on-policy** (fails at lag 0)"


def command(au: Audit, lag: int, options: str) -> str:
    a = au.adapter
    return f"vccc verify --target {a.key} --claim {a.claim} --lag {lag}" + (f" {options}" if options else "")


# ------------------------------------------------------------------- cross-implementation


@dataclasses.dataclass
class CrossRow:
    ours: str
    theirs: str
    max_diff_random: float
    max_diff_edge: float
    note: str

    @property
    def agrees(self) -> bool:
        return self.max_diff_random <= 1e-9 and self.max_diff_edge <= 1e-9


# (our actor-table row, its parameters, the adapter it is compared with). The parameters are the
# library's as the adapter passes them (verl's config clip 0.2 / 0.2; AReaL's rejection cap 5).
CROSS = (
    ("ppo", {"epsilon": 0.2}, "rlax:clipped_surrogate_pg_loss"),
    ("none", {}, "rlax:policy_gradient_loss"),
    ("ppo", {"epsilon": 0.2}, "verl:vanilla"),      # verl adds a dual clip (c = 3) for A < 0
    ("gspo", {"eps_low": 0.2, "eps_high": 0.2}, "verl:gspo"),
    ("cispo", {"eps_low": 0.2, "eps_high": 0.2}, "verl:cispo"),
    ("none", {}, "verl:gpg"),
    ("areal", {"cap": 5.0}, "areal:ppo_actor_loss_fn"),
    ("none", {}, "areal:ppo_actor_loss_fn_no_rs"),
)
EDGE = ((np.array([30.0, -29.0, 0.0]), -1.0), (np.array([30.0, -29.5, 0.0]), -1.0),
        (np.array([25.0, 0.01, -0.02, 0.03]), 1.0), (np.array([0.3, -0.25, 0.1]), 1.0))


def loss_weights(loss, log_rhos: np.ndarray, advantages: np.ndarray) -> np.ndarray:
    """The per-token weight a loss applies to A grad log pi on ONE sequence (one batch):
    w_t = -n (d loss / d log pi_t) / A_t, by ``jax.grad`` (torch autograd through the bridge)."""
    import jax.numpy as jnp

    with jax.enable_x64(True):
        lr, adv = jnp.asarray(log_rhos, jnp.float64), jnp.asarray(advantages, jnp.float64)
        log_mu = -40.0 - jnp.zeros_like(lr)
        g = jax.grad(lambda lp: loss(lp, log_mu, adv))(log_mu + lr)
        return np.asarray(-lr.shape[0] * g / adv)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


def cross_rows(table: dict, rng_seed: int = 0, n_random: int = 64) -> list[CrossRow]:
    """Our actor row vs the library's loss, per :data:`CROSS` entry whose adapter builds:
    max relative difference of the per-token weight on random sequences (log rho ~ N(0, 0.3^2),
    lengths 1-8, A = +-1 per sequence, as GRPO) and on the large-log-ratio cases of
    :data:`EDGE` (issue 29 s3)."""
    from vccc_jax.estimators.actor_registry import get_actor_correction

    rng = np.random.default_rng(rng_seed)
    cases = [(rng.normal(0.0, 0.3, rng.integers(1, 9)), float(rng.choice([-1.0, 1.0]))) for _ in range(n_random)]
    out = []
    for name, params, key in CROSS:
        if key not in table:
            continue
        try:
            loss = table[key].build()
            loss = loss.one_sequence() if hasattr(loss, "one_sequence") else loss  # one response of n tokens
        except ImportError as e:
            out.append(CrossRow(name, key, float("nan"), float("nan"), f"not run: {e}"))
            continue
        row = jax.jit(functools.partial(get_actor_correction(name), **params))  # one compile per length

        def diff(cs):
            worst, at = 0.0, ""
            for lr, a in cs:
                adv = np.full(lr.shape, a)
                with jax.enable_x64(True):
                    ours = np.asarray(row(jax.numpy.asarray(lr), jax.numpy.asarray(adv)))
                theirs = loss_weights(loss, lr, adv)
                d = _rel(ours, theirs)
                if d > worst:
                    worst, at = d, f"log rho {np.round(lr, 3).tolist()}, A {a:g}: ours {ours.tolist()}, theirs {theirs.tolist()}"
            return worst, at

        d_r, _ = diff(cases)
        d_e, at = diff(EDGE)
        out.append(CrossRow(name, key, d_r, d_e, at if d_e > 1e-9 else ""))
    return out


def markdown(audits: Sequence[Audit], cross: Sequence[CrossRow], *, quick: bool, cmd: str, seconds: float,
             load: str, kl: dict, unchecked: Sequence[tuple[Adapter, str]] = (), options: str = "") -> str:
    """The table. ``cmd``: the command that wrote it; ``options``: the problem options a row's
    reproducing command repeats (``--quick --num-mdps 16 --samples 256``)."""
    lags = sorted(next(iter(audits)).claim) if audits else []
    lines = [
        "# Field audit: other libraries' estimators, unchanged, checked exactly under staleness",
        "",
        f"Generated by `{cmd}` in {seconds:.0f} s (compile included; load average before the run: {load}).",
        "Problems: the MDP groups and keys of `vccc verify" + (" --quick`" if quick else "`")
        + " re-set to a lag (`verify/lags.py`): learner pi_16 at the end of an exact NPG history "
        "pi_{k+1} ∝ pi_k exp(0.1 A^{pi_k}) from each problem's own policy, behaviour pi_{16 - lag}. "
        "Mean KL(pi || mu) per state: " + ", ".join(f"lag {lag}: {kl[lag]:.3g}" for lag in lags) + ".",
        "",
        "Verdict per lag = every exact row of `vccc verify --target` against the function's own claim "
        "(PASS / FAIL, with the largest exact error of the mean, fixed-point and update rows; whether the output is "
        "a constant is reported in the diagnosis, not as a bias). Bias vs V^pi / Eq 12: critic targets, max |V* - V^pi| of the "
        "fixed point; actor losses, the relative bias ||g - g*|| / ||g*|| of the exact expected update to Eq 12 "
        "(and its min cosine over MDPs). Diagnosis: what `vccc verify` matched the bias to (at the largest lag).",
        "",
        "| library | version | function | claims | " + " | ".join(f"lag {lag}" for lag in lags)
        + " | bias vs V^pi / Eq 12 (" + ", ".join(f"lag {lag}" for lag in lags) + ") | diagnosis | verdict | reproduce |",
        "|" + "---|" * (8 + len(lags)),
    ]
    for au in audits:
        a = au.adapter
        cells = []
        for lag in lags:
            r = au.claim[lag]
            err = mean_error(r)
            cells.append(f"{'PASS' if exact_pass(r) else 'FAIL'} ({err:.1e})")
        biases = " / ".join(bias(au.vpi[lag]) for lag in lags)
        diag = au.vpi[lags[-1]].diagnosis[0] if au.vpi[lags[-1]].diagnosis else ""
        grad = carries_gradient(au.claim[lags[-1]])
        if grad:
            diag += f". Not a constant: the output carries a gradient into {grad} (stop it in the loss)"
        diag = diag.replace("|", "\\|")
        lines.append(f"| {a.library} | {a.version()} | `{a.calls}` (`{a.key}`) | {a.claims} (`--claim {a.claim}`) | "
                     + " | ".join(cells) + f" | {biases} | {diag} | {verdict(au)} | `{command(au, lags[-1], options)}` |")
    for a, why in unchecked:
        lines.append(f"| {a.library} | {a.version()} | `{a.calls}` (`{a.key}`) | {a.claims} | " + " | ".join("n/a" for _ in lags)
                     + f" | n/a | not checkable under the contract: {why.replace('|', '/')} | **not checked** | "
                     f"`vccc verify --target {a.key}` |")
    if cross:
        lines += ["", "## Cross-implementation: our actor table vs theirs",
                  "", "Per-token weight on A grad log pi (theirs: -n d loss / d log pi / A by autograd), "
                  "max relative difference |ours - theirs| / max(1, |theirs|) on 64 random sequences and on the "
                  "large-log-ratio cases [30, -29, 0], [30, -29.5, 0] (A = -1), [25, 0.01, -0.02, 0.03], "
                  "[0.3, -0.25, 0.1] (A = 1).", "",
                  "| ours | theirs | random | large log-ratios | agrees | worst case |", "|---|---|---|---|---|---|"]
        for c in cross:
            lines.append(f"| `{c.ours}` | `{c.theirs}` | {c.max_diff_random:.1e} | {c.max_diff_edge:.1e} | "
                         f"{'yes' if c.agrees else '**no**'} | {c.note} |")
    return "\n".join(lines) + "\n"


def adapters_of(libraries: Sequence[str]) -> list[Adapter]:
    """The registered adapters of ``libraries`` (in registry order)."""
    return [a for a in registry().values() if a.library in libraries]


def lag_kl(lags: Sequence[int], quick: bool, seed: int = 0, num_mdps: Optional[int] = None) -> dict:
    """Mean KL(pi || mu) over states and problems of the verify groups at each lag."""
    from vccc_jax.verify.runner import group_keys
    from vccc_jax.verify.user import _groups

    with jax.enable_x64(True):
        groups = _groups(quick, num_mdps, None)
        keys = group_keys(jax.random.PRNGKey(seed), groups)
        out = {}
        for lag in lags:
            vals = [np.asarray(jax.vmap(lagmod.kl)(lagmod.maker(lag)(kp, g))) for g, (kp, _) in zip(groups, keys)]
            out[lag] = float(np.mean(np.concatenate(vals)))
        return out
