"""`vccc verify` section "trainer" (issue 27): its rows pass on the trainer, each row fails when
its trainer quantity is wrong, and a realistic trainer bug (Z(s) with pi and mu swapped,
patched into what ``train.targets`` calls) fails exactly the Z-centred rows.

Exact float64 checks with a fixed key, so pass / fail is deterministic. Each
``trainer_numbers`` call builds fresh Trainers and compiles one graph (the clean run is
shared by the module; the patched run compiles once more).
"""

import jax
import numpy as np
import pytest

from vccc_jax.estimators import importance
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.sections import SECTIONS, Context
from vccc_jax.verify.sections import trainer as sec

CTX = Context(key=jax.random.PRNGKey(0), quick=True)
KEY = jax.random.fold_in(CTX.key, 22)  # the key trainer_rows uses


@pytest.fixture(scope="module")
def numbers():
    return sec.trainer_numbers(KEY)


def test_every_row_passes_on_the_trainer(numbers):
    rows = sec.rows_from_numbers(numbers)
    assert sec.trainer_rows in SECTIONS
    assert len(rows) == len(sec.ROWS) == len({r.name for r in rows})
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    assert all(r.kind == "exact" and r.tolerance == EXACT_TOL for r in rows)


def test_the_claims_are_not_vacuous(numbers):
    """The batch is off-policy enough that every claim separates right from wrong: the stale
    mean differs from T_pi Vbar, clipping binds, the trace and the actor gradient are nonzero."""
    t_pi = numbers["target ('vccc', 'value')"][1]
    stale = numbers["target ('uncorrected', 'value')"][1]
    clipped = numbers["target ('truncated', 'value')"][1]
    assert np.max(np.abs(t_pi - stale)) > 1e-2
    assert np.max(np.abs(t_pi - clipped)) > 1e-2 and np.max(np.abs(clipped - stale)) > 1e-2
    assert np.max(np.abs(numbers["gae"][1])) > 1e-2
    assert np.max(np.abs(numbers["actor gradient"][1])) > 1e-3
    assert np.max(np.abs(numbers["actor gradient icepop"][1])) > 1e-3
    assert np.max(np.abs(numbers["actor gradient centered-truncate"][1])) > 1e-3
    w = numbers["actor weights topr"][1]
    assert (w == 1.0).any() and (w < 0.5).any()  # TOPR: 1 on A >= 0, min(R, 1) on A < 0
    assert np.max(np.abs(numbers["log_rhos"][1])) > 1.0


@pytest.mark.parametrize("key", [k for k, *_ in sec.ROWS])
def test_each_row_fails_when_its_trainer_value_is_wrong(numbers, key):
    value, ref = numbers[key]
    bad = dict(numbers)
    wrong = value.copy()
    wrong[np.argmax(np.abs(ref))] += 1e-6 * (1.0 + np.max(np.abs(ref)))
    bad[key] = (wrong, ref)
    failed = [r.name for r in sec.rows_from_numbers(bad) if not r.passed]
    assert failed == [name for k, name, *_ in sec.ROWS if k == key]


def test_z_with_pi_and_mu_swapped_fails_the_z_centred_rows(monkeypatch):
    """The issue's bug: train/targets.py forming Z(s) = E_pi[min(mu / pi, c)] (arguments
    swapped). Patched into ``importance.expected_weight`` as the trainer's adapter calls it
    (the section's own Z comes from ``tabular.exact``)."""
    clean = importance.expected_weight

    def swapped(log_pi_all, log_mu_all, *, kind, clip):
        return clean(log_mu_all, log_pi_all, kind=kind, clip=clip)

    monkeypatch.setattr(importance, "expected_weight", swapped)
    failed = {r.name for r in sec.rows_from_numbers(sec.trainer_numbers(KEY)) if not r.passed}
    assert failed == {"trainer Z-centred b=0: = truncated mean", "trainer targets = library: Z-centred"}


def test_a_trainer_log_ratio_bug_fails_the_log_ratio_row(monkeypatch):
    """The row compares the trainer's log-ratios with ones built from the tables (not with
    themselves): log pi_k shifted by 0.01 in the head the trainer uses fails it."""
    from vccc_jax.envs import policy_heads

    clean = policy_heads.CategoricalHead.log_prob_as
    monkeypatch.setattr(policy_heads.CategoricalHead, "log_prob_as",
                        lambda self, *a: clean(self, *a) + 0.01)
    failed = {r.name for r in sec.rows_from_numbers(sec.trainer_numbers(KEY)) if not r.passed}
    assert "trainer log-ratios = log pi - log mu" in failed


def test_the_actor_rows_see_the_ppo_clip(monkeypatch):
    """The actor rows are evaluated at theta != pi_k, where the PPO clip binds: a trainer whose
    actor loss drops the clip fails the PPO rows (at theta = pi_k every ratio is 1 and no clip
    would ever fire)."""
    import types

    from vccc_jax.estimators import actor as actor_lib
    from vccc_jax.train import losses

    def no_clip(*args, **kw):
        return actor_lib.policy_loss(*args, **dict(kw, ppo_epsilon=None))

    fake = types.SimpleNamespace(**{k: getattr(actor_lib, k) for k in dir(actor_lib)
                                    if not k.startswith("__")})
    fake.policy_loss = no_clip
    monkeypatch.setattr(losses, "actor_lib", fake)
    failed = {r.name for r in sec.rows_from_numbers(sec.trainer_numbers(KEY)) if not r.passed}
    assert {"trainer actor loss = library: icepop x PPO",
            "trainer actor grad = library: icepop x PPO"} <= failed
