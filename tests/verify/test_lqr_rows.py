"""The LQR rows of ``vccc verify`` (verify/sections/lqr.py): pass on the library, and fail when
a realistic bug is injected into the library function a row runs (monkeypatched; the section
looks the functions up when it runs). Exact float64 checks: pass/fail is deterministic."""

import jax
import jax.numpy as jnp
import pytest

from vccc_jax.estimators import actor
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import safe_ratios
from vccc_jax.estimators.registry import get_critic_target
from vccc_jax.verify.contracts import Claim, OneStepTarget
from vccc_jax.verify.sections import Context, lqr_rows
from vccc_jax.verify.sections.lqr import lqr_user_rows

CTX = Context(key=jax.random.PRNGKey(0), quick=True)


def _row(rows, needle):
    (row,) = [r for r in rows if needle in r.name]
    return row


def test_rows_pass_and_state_their_effects():
    rows = lqr_rows(CTX)
    assert len(rows) == 7 and all(r.passed for r in rows), [(r.name, r.error) for r in rows if not r.passed]
    assert all(r.kind == "exact" and r.error <= 1e-10 for r in rows)


def test_vccc_with_ratio_on_the_baseline_only_is_caught(monkeypatch):
    def wrong(rewards, discounts, values, next_values, log_rhos, baseline=None, **kw):
        b = values if baseline is None else baseline   # bug: Y = H - (rho - 1) b, mean T_mu Vbar
        return ct.bellman_sample(rewards, discounts, next_values) - (safe_ratios(log_rhos) - 1.0) * b

    monkeypatch.setattr(ct, "vccc_target", wrong)
    rows = lqr_rows(CTX)
    assert not _row(rows, "E_mu[Y_VCCC").passed and _row(rows, "E_mu[Y_VCCC").error > 1e-3
    assert _row(rows, "clipped fixed point").passed


@pytest.mark.parametrize("bug", ["no_weight", "clip_ignored"])
def test_actor_and_clip_bugs_are_caught(monkeypatch, bug):
    if bug == "no_weight":     # the IS weight dropped from the actor loss: E_mu[A u], not E_pi
        original = actor.policy_loss

        def wrong(log_pi, log_mu, advantages, **kw):
            return original(log_pi, log_pi, advantages, **kw)
        monkeypatch.setattr(actor, "policy_loss", wrong)
        needle = "actor update"
    else:                      # the clip ignored: the clipped target is the VCCC one
        def wrong(rewards, discounts, values, next_values, log_rhos, *, clip, kind="truncate", **kw):
            return ct.vccc_target(rewards, discounts, values, next_values, log_rhos)
        monkeypatch.setattr(ct, "clipped_target", wrong)
        needle = "clipped fixed point"
    row = _row(lqr_rows(CTX), needle)
    assert not row.passed and row.error > 1e-3
    assert jnp.isfinite(row.error)


@pytest.mark.parametrize("row_name, claim, ok", [("vccc", Claim("vpi"), True),
                                                 ("truncated", Claim("clipped", 1.3), True),
                                                 ("uncorrected", Claim("vpi"), False)])
def test_user_target_rows_on_lqr(row_name, claim, ok):
    target = OneStepTarget(fn=get_critic_target(row_name), clip=claim.clip)
    (row,) = lqr_user_rows(row_name, target, claim)
    assert row.passed == ok
    assert row.error <= 1e-10 if ok else row.error > 1e-2
