"""`vccc verify` section "trainer", its Gaussian-head rows on the LQR testbed (issue 44): they
pass on the trainer, the claims are not vacuous (two stale versions far enough from pi that the
stale mean and Z differ from their on-policy values), and Gaussian-head bugs patched into the
head the trainer uses fail them: the variance in place of the std in the log-density, and Z
with pi and mu swapped. Exact float64 with a fixed key: deterministic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import policy_heads
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.sections import Context
from vccc_jax.verify.sections import trainer_gaussian as sec

CTX = Context(key=jax.random.PRNGKey(0), quick=True)


@pytest.fixture(scope="module")
def rows():
    return sec.gaussian_rows(CTX)


def test_every_gaussian_row_passes_and_is_not_vacuous(rows):
    assert len(rows) == len(sec.ROWS) and all(r.passed for r in rows), rows
    assert all(r.kind == "exact" and r.tolerance == EXACT_TOL for r in rows)
    with jax.enable_x64(True):
        n = sec.gaussian_numbers(jax.random.fold_in(CTX.key, 23))
    assert np.max(np.abs(n["vccc_value"][1] - n["uncorrected"][1])) > 1e-2   # the stale mean is off
    assert np.max(np.abs(n["log_rhos"][1])) > 0.5
    assert np.min(n["z"][1]) < 0.99 * 1.0                                    # clipping binds


def test_variance_for_std_in_the_head_fails_the_rows(monkeypatch):
    def log_prob(self, rows, action):
        mean, log_std = self.split(rows)
        z = (action - mean) * jnp.exp(-2 * log_std)
        return jnp.sum(-0.5 * jnp.square(z) - log_std, axis=-1) - 0.5 * self.action_dim * np.log(2 * np.pi)

    monkeypatch.setattr(policy_heads.GaussianHead, "log_prob", log_prob)
    failed = {r.name for r in sec.gaussian_rows(CTX) if not r.passed}
    assert {sec.ROWS[i][1] for i in (0, 1, 3)} <= failed
    assert sec.ROWS[2][1] not in failed   # the uncorrected target reads no ratio


def test_z_with_pi_and_mu_swapped_fails_the_z_row(monkeypatch):
    clean = policy_heads.gaussian_z
    monkeypatch.setattr(policy_heads, "gaussian_z",
                        lambda mp, lp, mm, lm, kind, clip: clean(mm, lm, mp, lp, kind, clip))
    failed = {r.name for r in sec.gaussian_rows(CTX) if not r.passed}
    assert failed == {sec.ROWS[4][1]}
