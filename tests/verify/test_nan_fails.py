"""A NaN or inf error fails its row, in every section of ``vccc verify`` (issue 47 item 4).

Each section's compiled graphs are replaced by their output shapes (``eval_shape``: nothing is
compiled or run) filled with zeros except a NaN (or inf) in the LAST entry of the first axis of
every float array (the last problem or MDP; a scalar is the NaN): a zero error passes, so a row that passes here dropped the NaN on its way to the
verdict (Python's ``max`` keeps a NaN only when it comes first, ``np.nanmax`` and ``e > tol``
skip it). Every row of every section must fail, and none may print "pass" with a NaN error.
"""

import importlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.verify import report, sections
from vccc_jax.verify.identities import EXACT_ROWS, identity_rows
from vccc_jax.verify.sections import Context
from vccc_jax.verify.sections import lqr as lqr_mod
from vccc_jax.verify.sections import trainer as trainer_mod
from vccc_jax.verify.sections import trainer_gaussian as gaussian_mod

CTX = Context(key=jax.random.PRNGKey(0), quick=True)
MODULES = ("actor_corrections", "actor_rows_field", "async_critics", "bandit", "brace_library",
           "comparators", "decoupled_library", "estimator_checks", "ps_ppo", "ps_ppo_library",
           "rac_library", "token", "vtrace_library")
# Rows computed from no compiled graph's numbers (the poison does not reach them)
NOT_FROM_NUMBERS = ("library PS-PPO: sample_cutoffs draws T ~ the law's pmf",)  # integer draws, chi-square


def _poison(x, bad):
    x = np.zeros(x.shape, x.dtype)
    if np.issubdtype(x.dtype, np.floating) and x.size:
        x[(-1,) if x.ndim else ()] = bad  # the last problem / MDP / setting of every number
    return jnp.asarray(x)


def _poisoned(fn, bad):
    def shaped(*args, **kwargs):
        with jax.enable_x64(True):
            shapes = fn.eval_shape(*args, **kwargs)
        return jax.tree_util.tree_map(lambda s: _poison(s, bad), shapes)
    return shaped


def _lqr_numbers(bad):
    def numbers(key):
        pair = [(np.zeros(3), np.zeros(3)), (np.array([0.0, 0.0, bad]), np.zeros(3))]
        return {"lyap": [0.0, bad], "mean": pair, "var": pair, "stale": pair, "stale_gap": [0.0, bad],
                "clip_mean": pair, "clip_fp": pair, "fp_bias": [0.0, bad], "actor": [0.0, bad], "grad": [0.0, bad]}
    return numbers


def _trainer_numbers(bad, rows=trainer_mod.ROWS):
    return lambda key: {k: (np.array([0.0, bad]), np.zeros(2)) for k, *_ in rows}


@pytest.fixture(params=[np.nan, np.inf], ids=["nan", "inf"])
def poisoned(request, monkeypatch):
    bad = request.param
    for name in MODULES:
        mod = importlib.import_module(f"vccc_jax.verify.sections.{name}")
        for attr, v in list(vars(mod).items()):
            if hasattr(v, "eval_shape") and hasattr(v, "lower"):  # a module-level compiled graph
                monkeypatch.setattr(mod, attr, _poisoned(v, bad))
    monkeypatch.setattr(lqr_mod, "lqr_numbers", _lqr_numbers(bad))
    monkeypatch.setattr(trainer_mod, "trainer_numbers", _trainer_numbers(bad))
    monkeypatch.setattr(gaussian_mod, "gaussian_numbers", _trainer_numbers(bad, gaussian_mod.ROWS))
    return bad


@pytest.mark.parametrize("section", sections.SECTIONS, ids=lambda s: s.__name__)
def test_every_row_of_a_section_fails_on_a_nan_or_inf(poisoned, section):
    with np.errstate(invalid="ignore"):  # NaN - NaN in the sections' NumPy is the point here
        rows = section(CTX)
    assert rows
    passing = [r.name for r in rows if r.passed and r.name not in NOT_FROM_NUMBERS]
    assert not passing, f"{section.__name__}: rows pass with a {poisoned} in their numbers: {passing}"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_identity_rows_fail_on_a_nan_or_inf_and_skip_only_not_applicable(bad):
    def group(last):
        errs = {s.key: np.array([0.0, 0.0, last]) for s in EXACT_ROWS}
        errs.update(naive_leak_size=np.ones(3), naive_clipping_active=np.ones(3))
        return errs

    rows = identity_rows([group(0.0), group(bad)])
    assert not [r.name for r in rows if r.passed]
    assert all(r.mdps == 6 for r in rows)
    # -inf marks a not-applicable MDP (every version masks a state's actions): skipped, not failed
    rows = identity_rows([group(0.0), group(-np.inf)])
    failing = [r.name for r in rows if not r.passed]
    assert not failing and all(r.mdps == 5 for r in rows)


def test_worst_and_failing_keep_nan_and_inf():
    assert np.isnan(report.worst([0.0, 1.0, np.nan]))       # max([0, 1, nan]) would be 1.0
    assert np.isnan(report.worst(0.0, np.array([[1.0, np.nan]])))
    assert report.worst([1.0, np.inf]) == np.inf
    assert report.worst() == 0.0
    np.testing.assert_array_equal(report.failing([0.0, 2.0, np.nan, np.inf, -np.inf], 1.0),
                                  [False, True, True, True, False])


def _law_actor(log_rhos, advantages):
    return jnp.exp(log_rhos)


def _law_sequence(seq, clip, options):
    return seq.values


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_lag_law_rows_fail_on_a_nan_or_inf(bad, monkeypatch):
    """``--lag-law`` (issue 47 item 2): the actor and sequence contracts' graphs poisoned on a
    law's problems (one "version", the law): every exact row of the --target report fails (the
    gradient row is a warning unless loss_ready), and the field audit's law cell is FAIL."""
    from vccc_jax.verify import field_audit, lags, user, user_actor, user_sequence_law
    from vccc_jax.verify.problems import GroupSpec

    monkeypatch.setattr(user_actor, "GRAPH", _poisoned(user_actor.GRAPH, bad))
    monkeypatch.setattr(user_sequence_law, "GRAPH", _poisoned(user_sequence_law.GRAPH, bad))
    law = "trace:1,4"
    targets = [user.Target(_law_actor, "actor", "vpi"), user.Target(_law_sequence, "sequence", "vpi")]
    with np.errstate(invalid="ignore"):
        reports = user.check_all(targets, groups=(GroupSpec("episodic", 4, 2, 3),), num_samples=64,
                                 make=lags.law_maker(law))
    for r in reports:
        exact = [row for row in r.rows if row.kind == "exact" and "stop_gradient" not in row.name]
        assert exact and not [row.name for row in exact if row.passed], r.format()
        adapter = types.SimpleNamespace(claim="vpi", epsilon="", biased_by="")
        au = field_audit.Audit(adapter, {0: r, law: r}, {0: r, law: r})
        assert field_audit.cell(au, law).startswith("FAIL (") and not field_audit.exact_pass(r)
        assert field_audit.verdict(au).startswith("**biased even on-policy**")
