"""``--lag-law``: the actor and sequence contracts under a lag law's mixture of versions (issue 47 item 2).

A law's problem (``verify.lags.law_maker``) holds one version per lag of its support, built as
the fixed lags are, and the contracts check the P(L)-weighted sum of the per-version
expectations. Pinned, float64, on 4 episodic MDPs: ``fixed:4`` reproduces lag 4's exact rows to
1e-12; under ``trace:1,4`` the per-state signed bias of the expected update (actor) and of
E[vs_0 | s_0] (sequence) is the average of lag 1's and lag 4's to 1e-12 (linearity); a law that
needs a lag beyond 16 is refused in one line (exit 2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.commands import verify as cmd
from vccc_jax.estimators import vtrace
from vccc_jax.verify import lags, user, user_actor, user_sequence, user_sequence_law
from vccc_jax.verify.contracts import parse_claim, wrap
from vccc_jax.verify.problems import GroupSpec

GROUP = GroupSpec("episodic", 4, 2, 4)
KEY = jax.random.PRNGKey(0)
SAMPLES = 256


def reinforce(log_rhos, advantages):
    """w = 1: the behaviour's update (biased by staleness)."""
    return jnp.ones_like(log_rhos)


def truncated(log_rhos, advantages, clip):
    """min(rho, c), uncentred (biased against its clipped claim once the data is stale)."""
    return jnp.minimum(jnp.exp(log_rhos), clip)


def clipped_vtrace(seq, clip, options):
    return vtrace(seq.log_rhos, seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                  clip_rho_threshold=clip, clip_c_threshold=clip, clip_pg_rho_threshold=clip)


def stale_gae(seq, clip, options):
    """GAE(0.9) with no ratio: V of the data's policy."""
    return vtrace(jnp.zeros_like(seq.log_rhos), seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                  lambda_=0.9, clip_rho_threshold=None, clip_c_threshold=None, clip_pg_rho_threshold=None).vs


TARGETS = (user.Target(reinforce, "actor", "vpi"), user.Target(truncated, "actor", "clipped:2"),
           user.Target(clipped_vtrace, "sequence", "clipped:1"), user.Target(stale_gae, "sequence", "vpi"))


def _check(make):
    return user.check_all(TARGETS, key=KEY, groups=(GROUP,), num_samples=SAMPLES, make=make)


def _exact(report) -> dict:
    return {r.name: r.error for r in report.rows if r.kind == "exact"}


def test_fixed_law_reproduces_the_fixed_lag_exact_rows():
    fixed, law = _check(lags.maker(4)), _check(lags.law_maker("fixed:4"))
    for a, b in zip(fixed, law):
        ea, eb = _exact(a), _exact(b)
        assert ea.keys() == eb.keys()
        for name in ea:
            assert abs(ea[name] - eb[name]) <= 1e-12 * max(1.0, abs(ea[name])), (name, ea[name], eb[name])
        assert a.passed == b.passed
    # the rows are informative: the biased targets fail at lag 4, V-trace passes its clipped claim
    assert [fixed[i].passed for i in (0, 2, 3)] == [False, True, False]
    assert min(_exact(fixed[0]).values()) > 0.1


def _outputs(graph, users, make, *extra):
    kp, ks = jax.random.split(KEY)
    with jax.enable_x64(True):
        p = make(kp, GROUP)
        return jax.tree_util.tree_map(np.asarray, graph(jax.random.split(ks, GROUP.num_mdps), p, users, *extra))


def _users(cls, kind, targets):
    return tuple(cls(t.fn.__name__, wrap(t.fn, kind, parse_claim(t.claim)), parse_claim(t.claim)) for t in targets)


def test_two_point_law_is_the_average_of_its_lags():
    """trace:1,4: P(1) = P(4) = 1/2, so the law's per-state signed biases are the mean of lag 1's
    and lag 4's -- the actor's g - Eq 12 for both advantage settings and its diagnosis atoms, and
    E[vs_0 | s_0] at V^pi and at the arbitrary Vbar for the no-ratio GAE target."""
    actors = _users(user_actor.UserActor, "actor", TARGETS[:1])
    seqs = _users(user_sequence.UserSequence, "sequence", TARGETS[3:])
    T = user_sequence.horizon(GROUP)
    out = {lag: (_outputs(user_actor.GRAPH, actors, lags.make_for(lag), SAMPLES)[0],
                 _outputs(user_sequence_law.GRAPH if isinstance(lag, str) else user_sequence.GRAPH, seqs,
                          lags.make_for(lag), T, SAMPLES)[0])
           for lag in (1, 4, "trace:1,4")}
    (a1, s1), (a4, s4), (al, sl) = out[1], out[4], out["trace:1,4"]
    assert al.bias.shape[2] == 1 and sl.means0.shape[2] == 1  # one "version": the law
    for field, scale in (("bias", 1.0), ("atoms", 1.0)):
        avg = 0.5 * (getattr(a1, field)[:, :, -1] + getattr(a4, field)[:, :, -1])
        np.testing.assert_allclose(getattr(al, field)[:, :, 0], avg, rtol=0, atol=1e-12 * scale)
    assert np.max(np.abs(al.bias)) > 0.01  # a real bias, not two zeros
    np.testing.assert_allclose(sl.means0[:, :, 0], 0.5 * (s1.means0[:, :, -1] + s4.means0[:, :, -1]), rtol=0,
                               atol=1e-12)
    assert np.max(np.abs(sl.means0[:, 1, 0] - s1.means0[:, 1, -1])) > 0.01


@pytest.mark.parametrize("argv", [["--field-audit", "--lag-law", "fixed:20"],
                                  ["--target", "vccc_jax.estimators:vtrace", "--lag-law", "trace:1,40"],
                                  ["--field-audit", "--lag-law", "geometric:-1"]])
def test_a_law_that_cannot_be_built_is_refused_in_one_line(argv, capsys):
    assert cmd.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--lag-law" in err, err
    if "40" in argv[-1] or "20" in argv[-1]:
        assert "lags 0..16" in err, err


def test_law_header_names_mean_support_and_truncation():
    g = lags.parse_law("geometric:4")
    assert g.lags == tuple(range(17)) and abs(sum(g.probs) - 1) < 1e-15
    q = 0.8  # geometric:4: P(L) ∝ (4/5)^L, truncated at 17 versions (the trainer keeps 31)
    np.testing.assert_allclose(g.mean, sum(L * q**L for L in range(17)) / sum(q**L for L in range(17)), rtol=1e-14)
    assert g.trainer_k == 31 and abs(g.cut - (q**17 - q**31) / (1 - q**31)) < 1e-14
    assert "mean lag 3.61, support 0..16 (17 lags); truncated at K = 17" in g.describe()
    t = lags.parse_law("trace:1,4,4")
    assert t.lags == (1, 4) and t.probs == (1 / 3, 2 / 3) and "no truncation" in t.describe()


def test_a_law_run_rewrites_only_the_law_section_of_the_out_file():
    from vccc_jax.verify.field_audit import LAW_SECTION, merged

    fixed = "# Field audit: fixed\n\n| row |\n\n## Group\n\n| g |\n"
    law = "# Field audit: under geometric:4\n\n| law row |\n\n## Group\n\n| law g |\n"
    both = merged(fixed, law, True)
    assert both == fixed.rstrip("\n") + f"\n\n{LAW_SECTION} -- under geometric:4\n\n| law row |\n\n### Group\n\n| law g |\n"
    assert merged(both, fixed.replace("row", "new row"), False) == both.replace("| row |", "| new row |")
    assert merged(both, law.replace("law row", "trace row"), True) == both.replace("law row", "trace row")
    assert merged("", law, True).startswith(LAW_SECTION)
