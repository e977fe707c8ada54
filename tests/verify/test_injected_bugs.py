"""Verify rows fail when their bug is injected into the library (monkeypatched), and pass on
the real library: issue 9's "verify gaps" and the token testbed's Eq 5 row.

The sections look the library functions up when they run and hand them to the compiled
graph as static arguments, so a patch is seen without clearing jax's caches; each bug test
recompiles only the smallest graph that checks it (the clean rows come from the same
compiled functions as test_verify.py's quick run when run in one process). Fixed keys;
exact checks (float64), so pass/fail is deterministic.
"""


import importlib

import jax
import jax.numpy as jnp
import pytest

from vccc_jax.estimators import actor, importance
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.verify.sections import Context, estimator_rows, token_rows, vtrace_rows
from vccc_jax.verify.sections import vtrace_library as vl

vt = importlib.import_module("vccc_jax.estimators.vtrace")  # the module (the package exports the function)

CTX = Context(key=jax.random.PRNGKey(0), quick=True)


def _by_name(rows, needle):
    (row,) = [r for r in rows if needle in r.name]
    return row


@pytest.fixture(scope="module")
def clean_estimator_rows():
    return estimator_rows(CTX)


@pytest.fixture(scope="module")
def clean_vtrace_rows():
    return vtrace_rows(CTX)


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


def test_pg_advantage_with_v_t_is_caught(monkeypatch, clean_vtrace_rows):
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

    assert _by_name(clean_vtrace_rows, "pg_adv").passed
    _patch_vtrace(monkeypatch, make_bug)
    # The smallest piece: the enumeration graph for one setting (n < T, pg_rho_bar != rho_bar).
    _, row = vl.enumeration_rows(CTX, settings=vl.VTRACE_SETTINGS[3:4])
    assert not row.passed and row.error > 1e-3


def test_truncation_as_termination_is_caught(monkeypatch, clean_vtrace_rows):
    def make_bug(original):
        def terminates(log_rhos, discounts, rewards, values, bootstrap_value, *, truncations=None,
                       truncation_values=None, **kw):
            if truncations is not None:  # bug: the time-limit cut zeroes the discount
                discounts = jnp.where(truncations, 0.0, discounts)
            return original(log_rhos, discounts, rewards, values, bootstrap_value, **kw)
        return terminates

    assert _by_name(clean_vtrace_rows, "time-limit cut").passed
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
