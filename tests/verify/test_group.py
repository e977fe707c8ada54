"""The group (critic-free) contract (issue 47 item 1): the exact expected update against an
independent brute force over (version, completion) per slot, the closed forms it must give
(RLOO and ReMax = Eq 12, Dr. GRPO = (G - 1) / G x Eq 12 at every lag with the ratio; GRPO not a
multiple even on-policy), the audit's group verdicts and ``--target`` / ``--lag-law`` through the
CLI. NumPy only (no library needed); float64 throughout.
"""

import itertools

import numpy as np
import pytest

from vccc_jax.commands import verify as cmd
from vccc_jax.verify import adapters, group
from vccc_jax.verify import field_audit_group as fag

BANDIT, TREE = group.testbeds()


def _brute(p, fn, pmf, G):
    """E[(1/G) sum_i w_i A_i S(y_i)] over every (lag, completion) per slot, ratio and w = 1."""
    pols = [p.testbed.policy(t) for t in p.thetas]
    pi, S = pols[-1]
    lags = [L for L, w in enumerate(pmf) if w > 0]
    C = len(pi)
    greedy = p.rewards[p.testbed.greedy(p.thetas[-1])]
    rat, pla = np.zeros(S.shape[1]), np.zeros(S.shape[1])
    for slots in itertools.product(itertools.product(lags, range(C)), repeat=G):
        ls, ys = zip(*slots)
        mus = [pols[group.HORIZON - L][0][y] for L, y in slots]
        prob = np.prod([pmf[L] * m for L, m in zip(ls, mus)])
        A = fn(p.rewards[list(ys)][None], p.testbed.lengths[list(ys)][None], np.array([greedy]))[0]
        for i, y in enumerate(ys):
            rat += prob * pi[y] / mus[i] * A[i] * S[y] / G
            pla += prob * A[i] * S[y] / G
    return rat, pla


@pytest.mark.parametrize("name", ["grpo", "gpg", "opo"])
def test_enumeration_equals_a_brute_force_over_versions_and_completions(name):
    """G = 3 on the token tree under a two-lag law (trace 0, 4, 4): the factorised enumeration
    (versions summed out per slot) equals the sum over all (lag, completion)^G to 1e-13."""
    fn = group.REFERENCES[name]
    probs = group.problems(TREE, 2, seed=3)
    pmf = group.law_pmf("trace:0,4,4")
    ex = group.expected(probs, group.advantages_for(fn, probs, 3), pmf, 3)
    for k, p in enumerate(probs):
        rat, pla = _brute(p, fn, pmf, 3)
        np.testing.assert_allclose(ex.ratio[k], rat, atol=1e-13)
        np.testing.assert_allclose(ex.plain[k], pla, atol=1e-13)


def test_closed_forms_of_the_group_baselines():
    """With the ratio, at lags 0 and 16 and under geometric:4: a leave-one-out (RLOO) or
    sample-free (ReMax) baseline gives Eq 12; the group mean including the sample (Dr. GRPO)
    gives exactly (G - 1) / G Eq 12; GRPO's std makes it no multiple of Eq 12 even at lag 0.
    Without the ratio RLOO is Eq 12 at lag 0 only."""
    lags = (0, 16, "geometric:4")
    for name in ("rloo", "remax"):
        rep = group.check_group(group.REFERENCES[name], name, lags)
        assert all(f.exact for (_, _, k), f in rep.fits.items() if k == "ratio"), name
    dr = group.check_group(group.dr_grpo, "dr_grpo", lags)
    for (_, _, k), f in dr.fits.items():
        if k == "ratio":
            assert f.multiple and not f.exact
            np.testing.assert_allclose(f.alpha, (group.GROUP - 1) / group.GROUP, atol=1e-12)
    grpo = group.check_group(group.grpo, "grpo", (0,))
    assert all(not f.multiple and np.max(f.resid) > 1e-2 for f in grpo.fits.values())
    rloo = group.check_group(group.rloo, "rloo", (0, 16))
    assert all(f.exact for (_, lag, _), f in rloo.fits.items() if lag == 0)
    assert all(np.max(f.rel) > 0.1 for (_, lag, k), f in rloo.fits.items() if lag == 16 and k == "plain")


def test_group_verdicts():
    def audit(name, lags=(0, 1, 4, 16)):
        a = adapters.Adapter("ours", name, name, "group", "vpi", "", lambda: group.REFERENCES[name], lambda: "0")
        return fag.run([a], lags)[0]

    assert fag.verdict(audit("rloo")).startswith("**unbiased** with the ratio")
    v = fag.verdict(audit("dr_grpo"))
    assert v.startswith("**Eq 12 up to a scale** (x 0.75 with the ratio") and "biased by staleness" in v
    assert fag.verdict(audit("grpo")).startswith("**biased even on-policy**")
    assert fag.cell(audit("dr_grpo", (0,)), 0) == "SCALED (x 0.75)"
    assert fag.cell(audit("rloo", (0,)), 0).startswith("PASS")


def rloo_user(rewards, lengths, greedy):
    """A user's group estimator: RLOO written out."""
    G = rewards.shape[1]
    return rewards - (rewards.sum(1, keepdims=True) - rewards) / (G - 1)


def mean_user(rewards, lengths, greedy):
    """A user's group estimator: the group mean including the sample."""
    return rewards - rewards.mean(1, keepdims=True)


def test_target_group_estimator_under_a_lag_law_through_the_cli(capsys):
    """--target FILE:fn with a (rewards, lengths, greedy) signature is the group contract (kind
    inferred); --lag-law geometric:4 mixes the versions: RLOO passes (exit 0), the mean
    baseline fails its claim (exit 1, 0.75 x Eq 12 named); --lag-law on a one-step target and a bad
    law are one line, exit 2."""
    here = __file__
    assert cmd.main(["--target", f"{here}:rloo_user", "--lag-law", "geometric:4"]) == 0
    out = capsys.readouterr().out
    assert "(group, claim vpi): PASS" in out and "lag geometric:4, ratio pi/mu" in out
    assert cmd.main(["--target", f"{here}:mean_user", "--kind", "group", "--lag-law", "geometric:4"]) == 1
    assert "E[update] = 0.75 x Eq 12" in capsys.readouterr().out
    assert cmd.main(["--target", "vccc_jax.estimators:vccc_target", "--lag-law", "geometric:4"]) == 2
    err = capsys.readouterr().err
    assert "a one-step target takes one lag" in err and len(err.strip().splitlines()) == 1
    assert cmd.main(["--target", f"{here}:rloo_user", "--lag-law", "geometric:-1"]) == 2
    assert "--lag-law" in capsys.readouterr().err


# ------------------------------------------------------- the MDP table's verdicts (issue 47 item 3)

def _report(err, diagnosis=""):
    from vccc_jax.verify.report import Row
    from vccc_jax.verify.user import Report

    row = Row("t: update = Eq 12, A = Q^pi - V^pi", "Eq 12", "exact", 4, err, 1e-9, err <= 1e-9)
    return Report("t", "actor", "vpi", [row], [diagnosis] if diagnosis else [])


def _audit(errs, f64=None, diagnosis="", **kw):
    from vccc_jax.verify import field_audit as fa

    a = adapters.Adapter("lib", "f", "lib.f", "actor", "vpi", "", lambda: None, lambda: "0", **kw)
    reps = {lag: _report(e, diagnosis if lag == 16 else "") for lag, e in errs.items()}
    return fa.Audit(a, reps, reps, {lag: _report(e) for lag, e in (f64 or {}).items()})


def test_precision_cells_and_verdicts():
    """A cell failing by <= 1e-4 whose float64 re-run passes is PRECISION (counts as a pass);
    one whose re-run fails too, or that fails by more, stays FAIL."""
    from vccc_jax.verify import field_audit as fa

    au = _audit({0: 1e-15, 1: 1.1e-6, 4: 1.5e-6, 16: 1e-14}, {0: 1e-15, 1: 5e-15, 4: 2e-15, 16: 1e-15})
    assert fa.cell(au, 1) == "PRECISION (1.1e-06; float64 re-run 5.0e-15)"
    assert fa.verdict(au).startswith("**exact up to float32**") and "float32 round-off at lag 1, 4" in fa.verdict(au)
    au = _audit({0: 1e-15, 1: 1.1e-6, 4: 1.5e-6, 16: 1e-14}, {0: 1e-15, 1: 1e-6, 4: 2e-15, 16: 1e-15})
    assert fa.cell(au, 1).startswith("FAIL") and not fa.verdict(au).startswith("**exact")
    au = _audit({0: 1e-15, 1: 2e-3}, {0: 1e-15, 1: 1e-15})
    assert fa.cell(au, 1).startswith("FAIL")
    lag0 = _audit({0: 1e-8, 16: 1e-15}, epsilon="the 1e-8 in a denominator")
    assert "lag 0 exact up to 1e-08: the 1e-8 in a denominator, not float32" in fa.verdict(lag0)


def test_missing_ratio_verdicts():
    """A diagnosis that puts the bias on the missing ratio labels the row biased by staleness;
    a design term that scales it is named with its share (dro: x 1.01 adds 1%)."""
    from vccc_jax.verify import field_audit as fa

    exact = ("E_mu[update | s] - claim: the bias matches no importance weight (w = 1): E_mu[A u], the behaviour's "
             "update (least-squares residual 1.3e-16 of |bias| 68.3)")
    close = ("E_mu[update | s] - claim: no known closed form matches the bias exactly; closest: no importance weight "
             "(w = 1): E_mu[A u], the behaviour's update x 1.01 (explains 100% of |bias|^2 = 68.8^2)")
    v = fa.verdict(_audit({0: 1e-15, 16: 11.0}, diagnosis=exact))
    assert v.startswith("**biased by staleness** (no behaviour ratio: the bias is the behaviour's update")
    v = fa.verdict(_audit({0: 1e-15, 16: 11.0}, diagnosis=close, biased_by="the quadratic log-ratio penalty"))
    assert v.startswith("**biased by staleness** (no behaviour ratio: 100% of |bias|^2 is E_mu[A u] x 1.01)")
    assert "by design (the quadratic log-ratio penalty adds 1% of it)" in v
    v = fa.verdict(_audit({0: 1e-15, 16: 11.0}, diagnosis="something else", biased_by="PPO clip"))
    assert v.startswith("**biased by design** (PPO clip)")


def test_a_nan_error_fails_the_audit_cell_and_verdict():
    """Issue 47 item 4 in the field audit: a NaN error is FAIL (never PRECISION or PASS), the
    row's largest error is NaN (not the largest finite one) and lag 0 NaN is biased on-policy."""
    from vccc_jax.verify import field_audit as fa

    au = _audit({0: float("nan"), 16: 1e-15}, {0: 1e-15, 16: 1e-15})
    assert fa.cell(au, 0) == "FAIL (nan)" and np.isnan(fa.mean_error(au.claim[0]))
    assert fa.verdict(au).startswith("**biased even on-policy**")
    fit = group.fit(np.array([[1.0, np.nan]]), np.array([[1.0, 0.0]]))
    assert not fit.exact and not fit.multiple
