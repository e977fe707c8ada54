"""Verify rows fail when their bug is injected into the library (monkeypatched), and pass on
the real library: issue 9's "verify gaps", the token testbed's Eq 5 row and (issue 24)
realistic one-line bugs in the four comparator estimators (estimators/related/), each
caught by the rows that run the library estimator against its exact operator.

The sections look the library functions up when they run and hand them to the compiled
graph as static arguments, so a patch is seen without clearing jax's caches; each bug test
recompiles only the smallest graph that checks it, and shows that same piece passing on the
unpatched library (the full rows pass in test_verify.py's quick run). Fixed keys; exact
checks (float64), so pass/fail is deterministic.
"""


import importlib
import inspect

import jax
import jax.numpy as jnp
import pytest

from vccc_jax.estimators import actor, importance
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.verify.sections import Context, estimator_rows, token_rows
from vccc_jax.verify.sections import vtrace_library as vl

vt = importlib.import_module("vccc_jax.estimators.vtrace")  # the module (the package exports the function)

CTX = Context(key=jax.random.PRNGKey(0), quick=True)


def _by_name(rows, needle):
    (row,) = [r for r in rows if needle in r.name]
    return row


@pytest.fixture(scope="module")
def clean_estimator_rows():
    return estimator_rows(CTX)


def test_expected_weight_under_pi_is_caught(monkeypatch, clean_estimator_rows):
    def under_pi(log_pi_all, log_mu_all, *, kind, clip):  # bug: E_pi[w|s] instead of E_mu[w|s]
        w = importance.importance_weights(log_pi_all - log_mu_all, kind, clip)
        pi = jnp.exp(log_pi_all)
        return jnp.sum(pi * w, axis=-1) / jnp.sum(pi, axis=-1)

    assert _by_name(clean_estimator_rows, "expected_weight").passed
    monkeypatch.setattr(importance, "expected_weight", under_pi)
    row = _by_name(estimator_rows(CTX), "expected_weight")
    assert not row.passed and row.error > 1e-3


def test_dropped_stop_gradient_is_caught(monkeypatch, clean_estimator_rows):
    original = ct.vccc_target

    def no_stop(*args, **kwargs):  # bug: the target carries gradient into the critic
        return original(*args, **{**kwargs, "stop_target_gradients": False})

    assert _by_name(clean_estimator_rows, "stop_gradient").passed
    monkeypatch.setattr(ct, "vccc_target", no_stop)
    row = _by_name(estimator_rows(CTX), "stop_gradient")
    assert not row.passed and row.error > 1e-3


def test_centering_without_stop_gradient_is_caught(monkeypatch, clean_estimator_rows):
    def centering(log_pi_all, log_mu_all, *, kind="ratio", clip=None, log_pi_old_all=None):
        w = importance.importance_weights(log_pi_all - log_mu_all, kind, clip)  # bug: no sg on pi
        return jnp.sum(jnp.exp(log_mu_all) * w * log_pi_all, axis=-1)

    assert _by_name(clean_estimator_rows, "centering_term").passed
    assert _by_name(clean_estimator_rows, "policy_loss + centering").passed
    monkeypatch.setattr(actor, "centering_term", centering)
    rows = estimator_rows(CTX)
    assert not _by_name(rows, "centering_term").passed
    assert not _by_name(rows, "policy_loss + centering").passed


def _patch_vtrace(monkeypatch, make_bug):
    monkeypatch.setattr(vt, "vtrace", make_bug(vt.vtrace))
    monkeypatch.setattr(vt, "vtrace_associative", make_bug(vt.vtrace_associative))


def test_pg_advantage_with_v_t_is_caught(monkeypatch):
    def make_bug(original):
        def pg_uses_v_t(log_rhos, discounts, rewards, values, bootstrap_value, **kw):
            out = original(log_rhos, discounts, rewards, values, bootstrap_value, **kw)
            bar = kw.get("clip_pg_rho_threshold", 1.0)
            rho = importance.safe_ratios(log_rhos)
            w = rho if bar is None else jnp.minimum(rho, bar)
            next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
            delta = rewards + discounts * next_values - values
            return out._replace(pg_advantages=w * (delta + discounts * (out.vs - values)))  # y_t, not y_{t+1}
        return pg_uses_v_t

    # The smallest piece: the enumeration graph for one setting (n < T, pg_rho_bar != rho_bar),
    # passing on the library (the full rows are test_verify.py's) and failing on the bug.
    assert vl.enumeration_rows(CTX, settings=vl.VTRACE_SETTINGS[3:4])[1].passed
    _patch_vtrace(monkeypatch, make_bug)
    _, row = vl.enumeration_rows(CTX, settings=vl.VTRACE_SETTINGS[3:4])
    assert not row.passed and row.error > 1e-3


def test_truncation_as_termination_is_caught(monkeypatch):
    def make_bug(original):
        def terminates(log_rhos, discounts, rewards, values, bootstrap_value, *, truncations=None,
                       truncation_values=None, **kw):
            if truncations is not None:  # bug: the time-limit cut zeroes the discount
                discounts = jnp.where(truncations, 0.0, discounts)
            return original(log_rhos, discounts, rewards, values, bootstrap_value, **kw)
        return terminates

    assert vl.cut_row(CTX, settings=vl.CUT_SETTINGS[:1]).passed
    _patch_vtrace(monkeypatch, make_bug)
    row = vl.cut_row(CTX, settings=vl.CUT_SETTINGS[:1])  # the smallest piece: one setting, vtrace only
    assert not row.passed and row.error > 1e-3


def test_token_baseline_without_ratio_is_caught(monkeypatch):
    """Token testbed (Eq 5 with tool steps): a VCCC target that applies the ratio to the
    baseline only, Y = H - (rho - 1) b, has mean T_mu Vbar; the token row must fail."""
    clean = token_rows(CTX)
    assert all(r.passed for r in clean)

    def wrong(rewards, discounts, values, next_values, log_rhos, baseline=None, **kw):
        b = values if baseline is None else baseline
        return ct.bellman_sample(rewards, discounts, next_values) - (safe_ratios(log_rhos) - 1.0) * b

    monkeypatch.setattr(ct, "vccc_target", wrong)
    row = _by_name(token_rows(CTX), "E_mu[Y_VCCC]")
    assert not row.passed and row.error > 1e-3


# ------------------------------------------------------------------ comparator estimators
# Realistic one-line bugs, applied to the SOURCE of estimators/related/*.py (the line is
# replaced, the module re-executed, and the module's functions patched with the mutant's),
# each caught by the comparator rows of `vccc verify` that run the library estimator
# against its exact operator. Each bug runs only the smallest piece of the section that
# catches it (one setting where the rows allow it); the exact operators' graphs compile
# once per process and only the library side recompiles per bug. The same mutations, run
# against each module's own unit tests (tests/estimators/test_<module>.py), fail them too.

from vccc_jax.verify.sections import brace_library as bl  # noqa: E402
from vccc_jax.verify.sections import decoupled_library as dl  # noqa: E402
from vccc_jax.verify.sections import ps_ppo_library as pl  # noqa: E402
from vccc_jax.verify.sections import rac_library as rl  # noqa: E402

MODULES = {name: importlib.import_module(f"vccc_jax.estimators.related.{name}")
           for name in ("brace", "decoupled", "rac", "ps_ppo")}


def apply_mutation(monkeypatch, module_name: str, old: str, new: str) -> None:
    """Replace the one source line ``old`` of estimators.related.<module_name> by ``new``,
    execute the mutant and patch every function and class of the module with the mutant's."""
    module = MODULES[module_name]
    src = inspect.getsource(module)
    assert src.count(old) == 1, f"mutation site not found exactly once in {module.__name__}: {old!r}"
    ns = {"__name__": module.__name__, "__file__": module.__file__}
    exec(compile(src.replace(old, new), module.__file__, "exec"), ns)
    for name, value in vars(module).items():
        if (inspect.isfunction(value) or inspect.isclass(value) or hasattr(value, "lower")) \
                and getattr(value, "__module__", None) == module.__name__ and name in ns:
            monkeypatch.setattr(module, name, ns[name])


def _brace(settings):
    def piece():
        vs_rows, pg_row = bl.enumeration_rows(CTX, settings=settings)
        return vs_rows + [pg_row]
    return piece


# The smallest pieces of the comparator library sections (one setting where possible).
PIECES = {
    "brace-prefix": _brace(bl.SETTINGS[:1]),    # n=1, rho_bar=1.3 != c_bar=0.7, prefix anchor, tool steps
    "brace-constant": _brace(bl.SETTINGS[1:]),  # n=2, rho_bar=0.9 != c_bar=1.3, constant anchor
    "brace-cut": lambda: [bl.cut_row(CTX)],
    "decoupled": lambda: dl.decoupled_library_rows(CTX, settings=dl.DEC_SETTINGS[1:2]),  # truncate + PPO clip
    "rac-update": lambda: [rl.update_row(CTX)],
    "rac-identity": lambda: [rl.identity_row(CTX)],
    "ps-ppo-mixture": lambda: pl.ps_ppo_library_rows(CTX, laws=pl.LAWS[:1]),
    "ps-ppo-uniform": lambda: pl.ps_ppo_library_rows(CTX, laws=pl.LAWS[2:]),
}
BRACE_PREFIX = "library BRACE E[vs_t] = exact operator, n=1 rho_bar=1.3 c_bar=0.7 prefix tool steps"
BRACE_CONSTANT = "library BRACE E[vs_t] = exact operator, n=2 rho_bar=0.9 c_bar=1.3 constant"
BRACE_PG = "library BRACE E[pg_adv_t]"
DEC_ACTOR, DEC_CRITIC, DEC_EWMA = "library decoupled actor", "library decoupled critic", "library PPO-EWMA"
RAC_UPDATE, RAC_IDENTITY = "library RAC: queued", "library RAC: delay 0"
PS_MIX, PS_UNIFORM, PS_SAMPLER = "law mixture:0.2", "law uniform", "sample_cutoffs"


def _slow(*bug):
    return pytest.param(bug, marks=pytest.mark.slow, id=bug[0])


# (id, module, old line, new line, piece, rows that must fail); `make test` runs 14 of them
# (every piece, and the bugs the issue names), `pytest -m slow` the rest.
BUGS = [
    ("brace-tail-weight-rho-bar", "brace", 'w_tail = c if tail_anchor == "prefix"',
     'w_tail = rho_c if tail_anchor == "prefix"', "brace-prefix", [BRACE_PREFIX]),
    ("brace-pg-bootstraps-from-critic", "brace", "pg = rho_pg * (r + d * vs_next - v)",
     "pg = rho_pg * (r + d * next_v - v)", "brace-prefix", [BRACE_PG]),
    ("brace-swapped-thresholds", "brace",
     '("clip_rho_threshold", clip_rho_threshold), ("clip_c_threshold", clip_c_threshold),',
     '("clip_c_threshold", clip_c_threshold), ("clip_rho_threshold", clip_rho_threshold),',
     "brace-prefix", [BRACE_PREFIX]),
    ("brace-tool-steps-counted", "brace",
     "act = jnp.ones_like(v, dtype=bool) if is_action is None else flat(is_action, bool)",
     "act = jnp.ones_like(v, dtype=bool)", "brace-prefix", [BRACE_PREFIX]),
    ("brace-cut-keeps-trace", "brace", "g = jnp.where(trunc, jnp.zeros_like(d), d)", "g = d",
     "brace-cut", ["library BRACE: time-limit cut"]),
    _slow("brace-constant-anchor-weighted", "brace",
                 'w_tail = c if tail_anchor == "prefix" else jnp.ones_like(c)', "w_tail = c",
                 "brace-constant", [BRACE_CONSTANT]),
    _slow("brace-prefix-off-by-one", "brace", "n_eff = min(int(n), int(np.shape(values)[0]))",
                 "n_eff = min(int(n) + 1, int(np.shape(values)[0]))", "brace-prefix", [BRACE_PREFIX]),
    _slow("brace-tail-without-discount", "brace", "z0 = dk + gk * z_next[:1]", "z0 = dk + z_next[:1]",
                 "brace-prefix", [BRACE_PREFIX]),
    _slow("brace-end-bootstrap-from-last-value", "brace", "next_v = jnp.concatenate([v[1:], bv], axis=0)",
                 "next_v = jnp.concatenate([v[1:], v[-1:]], axis=0)", "brace-prefix", [BRACE_PREFIX]),
    ("decoupled-ewma-weights-swapped", "decoupled",
     "mean = optax.incremental_update(params, state.mean, 1.0 - jnp.asarray(decay))",
     "mean = optax.incremental_update(params, state.mean, jnp.asarray(decay))", "decoupled", [DEC_EWMA, DEC_ACTOR]),
    ("decoupled-behaviour-route-takes-learner", "decoupled", "            full = log_mu_all",
     "            full = log_pi_all", "decoupled", [DEC_ACTOR]),
    ("decoupled-critic-unclipped-staleness", "decoupled",
     "return jax.lax.stop_gradient(out.discrepancy * out.staleness_clipped)",
     "return jax.lax.stop_gradient(out.discrepancy * out.staleness)", "decoupled", [DEC_CRITIC]),
    _slow("decoupled-staleness-inverted", "decoupled", "r = safe_ratios(log_pi - log_pi_old)",
                 "r = safe_ratios(log_pi_old - log_pi)", "decoupled", [DEC_CRITIC]),
    _slow("decoupled-ewma-debias-off-by-one", "decoupled", "corr = 1.0 - jnp.asarray(decay) ** state.count",
                 "corr = 1.0 - jnp.asarray(decay) ** (state.count + 1)", "decoupled", [DEC_EWMA]),
    _slow("decoupled-ewma-decay-for-lag", "decoupled", "return float(mean_lag) / (1.0 + float(mean_lag))",
                 "return float(mean_lag) / (2.0 + float(mean_lag))", "decoupled", [DEC_EWMA]),
    ("rac-kernel-by-reversed-age", "rac", "w = jnp.asarray(k, queue.residuals.dtype)[:, None]",
     "w = jnp.asarray(k[::-1], queue.residuals.dtype)[:, None]", "rac-update", [RAC_UPDATE]),
    ("rac-delay-off-by-one", "rac", "if delay != 0:", "if delay > 1:", "rac-update", [RAC_UPDATE]),
    ("rac-residual-trace-uses-rho-bar", "rac",
     "clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_c_threshold,",
     "clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_rho_threshold,", "rac-identity", [RAC_IDENTITY]),
    _slow("rac-queue-pushes-at-wrong-end", "rac", "jnp.concatenate([new[None], buf[:-1]], axis=0)",
                 "jnp.concatenate([buf[1:], new[None]], axis=0)", "rac-update", [RAC_UPDATE]),
    _slow("rac-reinjection-ratio-inverted", "rac",
                 "out = inject(queue.residuals, log_pi_now - queue.log_mu, w,",
                 "out = inject(queue.residuals, queue.log_mu - log_pi_now, w,", "rac-update", [RAC_UPDATE],
                 ),
    ("ps-ppo-keep-rule-off-by-one", "ps_ppo", "keep = (t < cutoffs[None, :])", "keep = (t <= cutoffs[None, :])",
     "ps-ppo-mixture", [PS_MIX]),
    ("ps-ppo-policy-mask-dropped", "ps_ppo", "return w if alive is None else w * alive", "return w",
     "ps-ppo-mixture", [PS_MIX]),
    ("ps-ppo-sampler-off-by-one", "ps_ppo", "jnp.sum(survival > u[..., None], axis=-1)",
     "jnp.sum(survival[..., 1:] > u[..., None], axis=-1)", "ps-ppo-mixture", [PS_SAMPLER]),
    _slow("ps-ppo-weight-times-survival", "ps_ppo",
                 "w = jnp.where(keep, 1.0 / jnp.where(keep, survival, 1.0), 0.0)", "w = jnp.where(keep, survival, 0.0)",
                 "ps-ppo-mixture", [PS_MIX]),
    _slow("ps-ppo-loss-mean-over-time", "ps_ppo", "return -jnp.sum(weights * surr, axis=0)",
                 "return -jnp.mean(weights * surr, axis=0)", "ps-ppo-mixture", [PS_MIX]),
    _slow("ps-ppo-pmf-off-by-one", "ps_ppo",
                 "nxt = jnp.concatenate([s[..., 1:], jnp.zeros_like(s[..., :1])], axis=-1)",
                 "nxt = jnp.concatenate([s[..., 1:], s[..., -1:]], axis=-1)", "ps-ppo-mixture", [PS_MIX]),
    _slow("ps-ppo-uniform-survival-off-by-one", "ps_ppo", "uni = jnp.maximum(big_l - t, 0.0) / big_l",
                 "uni = jnp.maximum(big_l - t - 1.0, 0.0) / big_l", "ps-ppo-uniform", [PS_UNIFORM, PS_SAMPLER],
                 ),
]


@pytest.fixture(scope="module")
def clean_pieces():
    """Rows of each piece on the unpatched library (computed on first use, then shared)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = PIECES[name]()
        return cache[name]
    return get


@pytest.mark.parametrize("bug", [b if hasattr(b, "marks") else pytest.param(b, id=b[0]) for b in BUGS])
def test_comparator_bug_is_caught(monkeypatch, clean_pieces, bug):
    """The piece's rows pass on the library and fail (exact rows: by > 1e-3) on the mutant."""
    _, module, old, new, piece, needles = bug
    for needle in needles:
        assert _by_name(clean_pieces(piece), needle).passed
    apply_mutation(monkeypatch, module, old, new)
    rows = PIECES[piece]()
    for needle in needles:
        row = _by_name(rows, needle)
        assert not row.passed, row
        if row.kind == "exact":
            assert row.error > 1e-3, row
