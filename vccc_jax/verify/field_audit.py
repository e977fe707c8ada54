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
from vccc_jax.verify.report import worst
from vccc_jax.verify.user import Report, Target, check_all


@dataclasses.dataclass
class Audit:
    """One adapter's reports per lag: ``claim[lag]`` under its claim, ``vpi[lag]`` vs V^pi and
    ``f64[lag]`` its float64 re-run under its claim (``Adapter.float64``; empty without one)."""

    adapter: Adapter
    claim: dict
    vpi: dict
    f64: dict = dataclasses.field(default_factory=dict)


def targets_for(adapters: Sequence[Adapter]) -> list[Target]:
    """Per adapter: its claim, V^pi when it claims something else, its float64 re-run."""
    out = []
    for a in adapters:
        out.append(Target(a.key, a.kind, a.claim))
        if a.claim != "vpi":
            out.append(Target(a.key, a.kind, "vpi"))
        if a.float64 is not None:
            out.append(Target(a.float64(), a.kind, a.claim, name=f"{a.function} (float64 re-run)"))
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


def label(lag) -> str:
    """A column's name: ``lag L`` or ``law TEXT`` (a lag law, ``--lag-law``)."""
    return f"lag {lag}" if isinstance(lag, int) else f"law {lag}"


def run(adapters: Sequence[Adapter], lags: Sequence = lagmod.LAGS, *, quick: bool = True, seed: int = 0,
        num_mdps: Optional[int] = None, num_samples: Optional[int] = None,
        log: Callable[[str], None] = lambda s: None) -> list[Audit]:
    """Check every adapter at every lag or lag law (one ``check_all`` per lag: targets of one kind
    share a graph)."""
    audits = [Audit(a, {}, {}) for a in adapters]
    targets = targets_for(adapters)
    for lag in lags:
        reports = check_all(targets, quick=quick, key=jax.random.PRNGKey(seed), num_mdps=num_mdps,
                            num_samples=num_samples, make=lagmod.make_for(lag))
        it = iter(reports)
        for au in audits:
            r = next(it)
            au.claim[lag] = r
            au.vpi[lag] = r if au.adapter.claim == "vpi" else next(it)
            if au.adapter.float64 is not None:
                au.f64[lag] = next(it)
        log(f"{label(lag)}: {len(targets)} checks done")
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
    return worst([row.error for row in r.rows if row.kind == "exact"
                  and not row.name.endswith("finite") and "stop_gradient" not in row.name])


ON_POLICY_TOL = 1e-6  # lag 0 within this: exact on-policy up to an epsilon of the library's own
PRECISION_TOL = 1e-4   # a failing cell within this whose float64 re-run passes is float32 round-off


def precision(au: Audit, lag) -> bool:
    """The cell fails its claim only by float32 round-off: its error is at most
    :data:`PRECISION_TOL` and the float64 re-run of the same code passes."""
    r, f = au.claim[lag], au.f64.get(lag)
    return (f is not None and not exact_pass(r) and exact_pass(f) and mean_error(r) <= PRECISION_TOL)


def cell(au: Audit, lag) -> str:
    """PASS / FAIL / PRECISION (float32 round-off, with the float64 re-run's error) at one lag."""
    r = au.claim[lag]
    if precision(au, lag):
        return f"PRECISION ({mean_error(r):.1e}; float64 re-run {mean_error(au.f64[lag]):.1e})"
    return f"{'PASS' if exact_pass(r) else 'FAIL'} ({mean_error(r):.1e})"


_NO_RATIO = re.compile(r"no importance weight \(w = 1\): E_mu\[A u\], the behaviour's update"
                       r"(?: x (?P<alpha>-?[0-9.e+-]+) \(explains (?P<share>[0-9]+)%)?")


def missing_ratio(r: Report) -> Optional[tuple[float, int]]:
    """(alpha, % of |bias|^2) when the diagnosis puts the bias on the missing ratio -- the
    behaviour's update E_mu[A u] (w = 1) times alpha -- else None (alpha 1, 100%: exact)."""
    m = _NO_RATIO.search(r.diagnosis[0]) if r.diagnosis else None
    if m is None:
        return None
    return (float(m.group("alpha")), int(m.group("share"))) if m.group("alpha") else (1.0, 100)


def verdict(au: Audit) -> str:
    """Unbiased / biased by design / biased by staleness, from the exact rows. Lag 0 within
    :data:`ON_POLICY_TOL` counts as exact on-policy with the error and its source named (the
    adapter's ``epsilon``, or float32 when the float64 re-run passes); a float32 round-off
    cell (:func:`precision`) counts as a pass; a row whose diagnosis at the largest lag puts the
    bias on the missing ratio is biased by staleness, with the design term's share when it
    changes the bias (alpha != 1)."""
    a = au.adapter
    lags = list(au.vpi)  # in the order run (lag 0 first)
    prec = [lag for lag in lags if precision(au, lag)]
    vpi_ok = {lag: exact_pass(au.vpi[lag]) or (lag in prec and a.claim == "vpi") for lag in lags}
    notes = []
    if prec:
        worst32 = max(mean_error(au.claim[lag]) for lag in prec)
        worst64 = max(mean_error(au.f64[lag]) for lag in prec)
        notes.append(f"float32 round-off at lag {', '.join(str(x) for x in prec)}: error up to {worst32:.1e}, "
                     f"the same code in float64 {worst64:.1e}")
    if 0 in vpi_ok and not vpi_ok[0] and mean_error(au.vpi[0]) <= ON_POLICY_TOL:
        vpi_ok[0] = True
        where = a.epsilon + ", not float32" if a.epsilon else "an epsilon or float32 inside"
        notes.append(f"lag 0 exact up to {mean_error(au.vpi[0]):.0e}: {where}")
    note = f" ({'; '.join(notes)})" if notes else ""
    claim_ok = all(exact_pass(au.claim[lag]) or lag in prec for lag in lags)
    if all(vpi_ok.values()):
        return ("**exact up to float32**" if prec else "**unbiased**") + " (V^pi / Eq 12 at every lag)" + note
    if a.claim != "vpi" and claim_ok:
        return f"**biased by design** (exactly its claim {a.claim} at every lag; not V^pi past lag 0)" + note
    if not vpi_ok.get(0, False):
        return "**biased even on-policy** (fails at lag 0)" + note
    nr = missing_ratio(au.vpi[lags[-1]])
    if nr is not None:
        alpha, share = nr
        if abs(alpha - 1.0) < 5e-3:
            return "**biased by staleness** (no behaviour ratio: the bias is the behaviour's update E_mu[A u])" + note
        design = a.biased_by or "its design term"
        change = f"adds {alpha - 1:.0%}" if alpha > 1 else f"removes {1 - alpha:.0%}"
        return (f"**biased by staleness** (no behaviour ratio: {share}% of |bias|^2 is E_mu[A u] x {alpha:.3g}) "
                f"and by design ({design} {change} of it)" + note)
    if a.biased_by:
        return f"**biased by design** ({a.biased_by}): exact at lag 0, biased once the data is stale" + note
    return "**biased by staleness alone** (exact at lag 0, biased once the data is stale)" + note


def command(au: Audit, lag, options: str) -> str:
    a = au.adapter
    where = f"--lag {lag}" if isinstance(lag, int) else f"--lag-law {lag}"
    return f"vccc verify --target {a.key} --claim {a.claim} {where}" + (f" {options}" if options else "")


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
    ("ppo", {"epsilon": 0.2}, "tunix:grpo_loss_fn"),  # tunix: float32, log-ratio clipped to [-20, 20]
    ("gspo", {"eps_low": 0.2, "eps_high": 0.2}, "verl:gspo"),
    ("cispo", {"eps_low": 0.2, "eps_high": 0.2}, "verl:cispo"),
    ("none", {}, "verl:gpg"),
    ("geo_mean", {"eps_low": 0.2, "eps_high": 0.2}, "verl:geo_mean"),  # verl: no e^20 cap (docs/method.md A10)
    ("dppo_tv", {"eps_low": 0.2, "eps_high": 0.2, "clip": 3.0}, "verl:dppo_tv"),   # verl's effective c = 3
    ("dppo_tv", {"eps_low": 0.2, "eps_high": 0.2, "clip": 20.0}, "verl:dppo_tv"),  # our default c = 20
    ("dppo_kl", {"eps_low": 0.2, "eps_high": 0.2, "clip": 3.0}, "verl:dppo_kl"),
    ("areal", {"cap": 5.0}, "areal:ppo_actor_loss_fn"),
    ("none", {}, "areal:ppo_actor_loss_fn_no_rs"),
)
EDGE = ((np.array([30.0, -29.0, 0.0]), -1.0), (np.array([30.0, -29.5, 0.0]), -1.0),
        (np.array([25.0, 0.01, -0.02, 0.03]), 1.0), (np.array([0.3, -0.25, 0.1]), 1.0),
        (np.array([25.0, 24.0]), -1.0))
LOG_MU = -40.0  # log mu of every token in the cross rows (loss_weights; the DPPO rows read it)


def loss_weights(loss, log_rhos: np.ndarray, advantages: np.ndarray) -> np.ndarray:
    """The per-token weight a loss applies to A grad log pi on ONE sequence (one batch):
    w_t = -n (d loss / d log pi_t) / A_t, by ``jax.grad`` (torch autograd through the bridge)."""
    import jax.numpy as jnp

    with jax.enable_x64(True):
        lr, adv = jnp.asarray(log_rhos, jnp.float64), jnp.asarray(advantages, jnp.float64)
        log_mu = LOG_MU - jnp.zeros_like(lr)
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
        label = name + "".join(f" {k}={v:g}" for k, v in params.items() if k == "clip")
        if key not in table:
            continue
        try:
            loss = table[key].build()
            loss = loss.one_sequence() if hasattr(loss, "one_sequence") else loss  # one response of n tokens
        except ImportError as e:
            out.append(CrossRow(label, key, float("nan"), float("nan"), f"not run: {e}"))
            continue
        spec = get_actor_correction(name)
        row = jax.jit(functools.partial(spec, **params))  # one compile per length
        data = "log_mu" in spec.data

        def diff(cs):
            most, at = 0.0, ""
            for lr, a in cs:
                adv = np.full(lr.shape, a)
                with jax.enable_x64(True):
                    extra = {"log_mu": jax.numpy.full(lr.shape, LOG_MU)} if data else {}
                    ours = np.asarray(row(jax.numpy.asarray(lr), jax.numpy.asarray(adv), **extra))
                theirs = loss_weights(loss, lr, adv)
                d = _rel(ours, theirs)
                if not d <= most:  # a NaN difference is the worst case
                    most, at = d, f"log rho {np.round(lr, 3).tolist()}, A {a:g}: ours {ours.tolist()}, theirs {theirs.tolist()}"
            return most, at

        d_r, _ = diff(cases)
        d_e, at = diff(EDGE)
        out.append(CrossRow(label, key, d_r, d_e, at if not d_e <= 1e-9 else ""))
    return out


def markdown(audits: Sequence[Audit], cross: Sequence[CrossRow], *, quick: bool, cmd: str, seconds: float,
             load: str, kl: dict, unchecked: Sequence[tuple[Adapter, str]] = (), options: str = "",
             group_lines: Sequence[str] = (), law: Optional[lagmod.Law] = None) -> str:
    """The table. ``cmd``: the command that wrote it; ``options``: the problem options a row's
    reproducing command repeats (``--quick --num-mdps 16 --samples 256``); ``group_lines``: the
    group section (:mod:`.field_audit_group`), after the MDP table; ``law``: the lag law of a
    ``--lag-law`` run (its column beside lag 0)."""
    lags = list(next(iter(audits)).claim) if audits else []
    title = "checked exactly under staleness" if law is None else f"checked exactly under the lag law `{law.text}`"
    under = ("" if law is None else
             f" Under {law.describe()}: each sample's version is drawn from the law and carries its own behaviour "
             "log-prob, so each expectation is the P(L)-weighted sum of the per-version expectations (actors: the "
             "expected update; critic targets: E[vs_t | prefix] and the fixed point of the law's expected target; "
             "a clipped claim: the fixed point of the law's claimed operator, `verify/user_sequence_law.py`). "
             "With more than one version a clipped V-trace claim cannot hold after every prefix: the n-step "
             "V-trace operators of one version share the fixed point V^pitilde, their mixtures over versions do "
             "not, so the cell shows the gap between the law's T-step fixed point and its (T - t)-step targets. "
             "The law's KL is sum_L P(L) KL(pi || mu_L).")
    lines = [
        f"# Field audit: other libraries' estimators, unchanged, {title}",
        "",
        f"Generated by `{cmd}` in {seconds:.0f} s (compile included; load average before the run: {load}).",
        "Problems: the MDP groups and keys of `vccc verify" + (" --quick`" if quick else "`")
        + " re-set to a lag (`verify/lags.py`): learner pi_16 at the end of an exact NPG history "
        "pi_{k+1} ∝ pi_k exp(0.1 A^{pi_k}) from each problem's own policy, behaviour pi_{16 - lag}." + under
        + " Mean KL(pi || mu) per state: " + ", ".join(f"{label(lag)}: {kl[lag]:.3g}" for lag in lags) + ".",
        "",
        "Verdict per lag = every exact row of `vccc verify --target` against the function's own claim "
        "(PASS / FAIL, with the largest exact error of the mean, fixed-point and update rows; whether the output is "
        "a constant is reported in the diagnosis, not as a bias). Bias vs V^pi / Eq 12: critic targets, max |V* - V^pi| of the "
        "fixed point; actor losses, the relative bias ||g - g*|| / ||g*|| of the exact expected update to Eq 12 "
        "(and its min cosine over MDPs). Diagnosis: what `vccc verify` matched the bias to (at the largest lag).",
        "",
        "PRECISION: the cell fails only by float32 round-off -- an error at most 1e-4 from a library that computes "
        "in float32 on purpose, whose float64 re-run (the same code, its float32 casts made float64: "
        "`Adapter.float64`) passes; both errors are shown and the cell counts as a pass. **default**: the row is "
        "the library's default configuration (named; rlax and tunix functions have no configuration: the rows "
        "pass their signature defaults). Verdicts: *unbiased*; *exact up to float32*; *biased by design* (its "
        "claim, or a design term, exact at lag 0); *biased by staleness* (the diagnosis puts the bias on the "
        "missing behaviour ratio: the behaviour's update E_mu[A u], times alpha when a design term changes it); "
        "*biased by staleness alone* (the uncorrected target: fixed point V^mu); *biased even on-policy*.",
        "",
        "| library | version | function | claims | " + " | ".join(label(lag) for lag in lags)
        + " | bias vs V^pi / Eq 12 (" + ", ".join(label(lag) for lag in lags) + ") | diagnosis | verdict | reproduce |",
        "|" + "---|" * (8 + len(lags)),
    ]
    for au in audits:
        a = au.adapter
        cells = [cell(au, lag) for lag in lags]
        biases = " / ".join(bias(au.vpi[lag]) for lag in lags)
        diag = au.vpi[lags[-1]].diagnosis[0] if au.vpi[lags[-1]].diagnosis else ""
        grad = carries_gradient(au.claim[lags[-1]])
        if grad:
            diag += f". Not a constant: the output carries a gradient into {grad} (stop it in the loss)"
        diag = diag.replace("|", "\\|")
        claims = a.claims + (f"; **default** ({a.default})" if a.default else "")
        lines.append(f"| {a.library} | {a.version()} | `{a.calls}` (`{a.key}`) | {claims} (`--claim {a.claim}`) | "
                     + " | ".join(cells) + f" | {biases} | {diag} | {verdict(au)} | `{command(au, lags[-1], options)}` |")
    for a, why in unchecked:
        lines.append(f"| {a.library} | {a.version()} | `{a.calls}` (`{a.key}`) | {a.claims} | " + " | ".join("n/a" for _ in lags)
                     + f" | n/a | not checkable under the contract: {why.replace('|', '/')} | **not checked** | "
                     f"`vccc verify --target {a.key}` |")
    lines += list(group_lines)
    if cross:
        lines += ["", "## Cross-implementation: our actor table vs theirs",
                  "", "Per-token weight on A grad log pi (theirs: -n d loss / d log pi / A by autograd), "
                  "max relative difference |ours - theirs| / max(1, |theirs|) on 64 random sequences and on the "
                  "large-log-ratio cases [30, -29, 0], [30, -29.5, 0] (A = -1), [25, 0.01, -0.02, 0.03], "
                  "[0.3, -0.25, 0.1] (A = 1), [25, 24] (A = -1); log mu = -40 on every token. verl's DPPO losses "
                  "truncate at c = 3 (their `ActorConfig`'s clip_ratio_c; the function's fallback 20 is never "
                  "reached), ours default to c = 20: both rows are shown. verl's geo_mean does not cap the "
                  "geometric mean at e^20, ours does (docs/method.md A10).", "",
                  "| ours | theirs | random | large log-ratios | agrees | worst case |", "|---|---|---|---|---|---|"]
        for c in cross:
            lines.append(f"| `{c.ours}` | `{c.theirs}` | {c.max_diff_random:.1e} | {c.max_diff_edge:.1e} | "
                         f"{'yes' if c.agrees else '**no**'} | {c.note} |")
    return "\n".join(lines) + "\n"


LAW_SECTION = "## Under your lag law"


def merged(old: str, text: str, law: bool) -> str:
    """The ``--out`` file after a run: a ``--lag-law`` run's table (``law``) replaces the section
    :data:`LAW_SECTION` at the end of ``old`` (its headings one level down), a fixed-lag run's
    replaces everything before that section -- so ``make audit`` and a law run each rewrite only
    their own part of docs/field_audit.md."""
    head, sep, tail = old.partition(LAW_SECTION)
    if not law:
        return text + ("\n" + sep + tail if sep else "")
    body = text.replace("\n## ", "\n### ").replace("# Field audit: ", LAW_SECTION + " -- ", 1)
    return (head.rstrip("\n") + "\n\n" if head.strip() else "") + body


def adapters_of(libraries: Sequence[str]) -> list[Adapter]:
    """The registered adapters of ``libraries`` (in registry order)."""
    return [a for a in registry().values() if a.library in libraries]


def lag_kl(lags: Sequence, quick: bool, seed: int = 0, num_mdps: Optional[int] = None) -> dict:
    """Mean KL(pi || mu) over states and problems of the verify groups at each lag (a law: the
    P(L)-weighted KL over its versions)."""
    from vccc_jax.verify.runner import group_keys
    from vccc_jax.verify.user import _groups

    with jax.enable_x64(True):
        groups = _groups(quick, num_mdps, None)
        keys = group_keys(jax.random.PRNGKey(seed), groups)
        out = {}
        for lag in lags:
            vals = [np.asarray(jax.vmap(lagmod.kl)(lagmod.make_for(lag)(kp, g))) for g, (kp, _) in zip(groups, keys)]
            out[lag] = float(np.mean(np.concatenate(vals)))
        return out
