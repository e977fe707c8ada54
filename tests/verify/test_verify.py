"""`vccc verify`: the quick run passes every row (that the same machinery catches wrong
estimators is tests/verify/test_byo.py's gallery, run through ``vccc verify --target``).

Two row sections are left out of this file's quick run because another file already runs
each one exactly as ``run_verify(quick=True)`` does (same root key PRNGKey(0), same
fold_in), and asserts that every one of its rows passes at the exact tolerance:
``lqr_rows`` in tests/verify/test_lqr_rows.py (7 rows) and ``trainer_rows`` in
tests/verify/test_trainer_section.py (one row per ``trainer.ROWS``). Running them twice cost
~22 of this file's ~100 CPU-s (2026-12-02).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from vccc_jax import verify as V
from vccc_jax.commands import verify as cmd
from vccc_jax.verify import stats
from vccc_jax.verify.sections import SECTIONS, lqr_rows, trainer_rows

ROOT = Path(__file__).resolve().parents[2]
# section -> the test that runs it with run_verify's key and asserts every row passes
ELSEWHERE = {lqr_rows: "tests/verify/test_lqr_rows.py::test_rows_pass_and_state_their_effects",
             trainer_rows: "tests/verify/test_trainer_section.py::test_every_row_passes_on_the_trainer"}


@pytest.fixture(scope="module")
def quick_rows():
    return V.run_verify(quick=True, sections=[s for s in SECTIONS if s not in ELSEWHERE])


def test_sections_left_out_are_checked_elsewhere_with_the_same_key():
    assert set(ELSEWHERE) <= set(SECTIONS) and len(SECTIONS) - len(ELSEWHERE) >= 14
    for where in ELSEWHERE.values():
        path, name = where.split("::")
        text = (ROOT / path).read_text()
        assert f"def {name}(" in text and "CTX = Context(key=jax.random.PRNGKey(0), quick=True)" in text, where
    assert "KEY = jax.random.fold_in(CTX.key, 22)" in (ROOT / "tests/verify/test_trainer_section.py").read_text()


def test_quick_verify_every_row_passes(quick_rows):
    failed = [r for r in quick_rows if not r.passed]
    assert not failed, "\n" + V.format_table(failed)


def test_quick_verify_covers_every_identity(quick_rows):
    exact = [r for r in quick_rows if r.kind == "exact"]
    sampled = [r for r in quick_rows if r.kind == "sampled"]
    equations = {r.equation for r in exact}
    for eq in ("Eq 1", "Eq 2", "Eq 3", "Eq 5", "Eq 6", "Eq 4/8", "Eq 9", "Eq 10", "Eq 11", "Eq 12", "Eq 13",
               "Sec 4.1", "Sec 4.2"):
        assert eq in equations, eq
    names = " | ".join(r.name for r in quick_rows)
    for needle in ("bandit: b=0.1", "bandit: b=0.7", "bandit: b=b*", "bandit: b* of Eq 9", "library V-trace",
                   "GAE", "naive clipped", "Z-centred", "replay", "minimises", "expected_weight",
                   "pg_adv", "time-limit cut", "stop_gradient", "centering_term"):
        assert needle in names, needle
    # More than one V-trace setting with rho_bar != c_bar and n < T.
    assert sum("n=2" in r.name and "rho_bar=1 c_bar=1 " not in r.name + " " for r in exact) >= 2
    # The exact half is exact: every applicable error is at float64 round-off, except the
    # rows whose claim is a rate or a nonzero effect (their tolerance says so).
    loose = {r.name for r in exact if r.tolerance > 1e-10 and "mean != claim" not in r.name}
    assert loose == {"full IS return: log Var growth/step = log E_mu[rho^2]",
                     "BRACE n=2: no exponential variance growth",
                     "decoupled: clipped, naive route (pi_old = mu) biased vs exact route"}, loose
    for r in exact:
        if "mean != claim" not in r.name and r.name not in loose:
            assert r.error <= 1e-10, r
    # One section per new testbed / comparator (verify/sections).
    for eq, count in (("Sec 7", 2), ("BRACE", 5), ("decoupled", 5), ("RAC", 5), ("PS-PPO", 6)):
        assert sum(r.equation == eq for r in exact) == count, eq
    assert any(r.equation == "Eq 5" and "tool steps" in r.name for r in exact)
    assert not any(r.name.startswith(("lqr: ", "trainer ")) for r in quick_rows)  # see ELSEWHERE
    # Each comparator's library estimator is checked against its exact operator (issue 24).
    for needle in ("library BRACE E[vs_t]", "library BRACE E[pg_adv_t]", "library decoupled actor",
                   "library decoupled critic", "library PPO-EWMA", "library RAC: queued", "library RAC: delay 0",
                   "library PS-PPO: E_tau E_T", "library PS-PPO: sample_cutoffs"):
        assert needle in names, needle
    assert any("tool steps" in r.name and "library BRACE" in r.name for r in exact)
    # Every one-step target is also sampled, and the negative controls were rejected.
    assert {t.name for t in V.DEFAULT_TARGETS} == {r.name for r in sampled if not r.name.startswith("library ")}
    rejects = [r for r in sampled if "REJECTED" in r.detail]
    assert len(rejects) == 2 and all(r.passed and r.error > 0.1 for r in rejects)
    assert max(r.mdps for r in exact) >= 96


def test_statistics_helpers():
    rng = np.random.default_rng(0)
    z = rng.normal(size=3000)
    D, p = stats.ks_test(z)
    Fz = sps.norm.cdf(np.sort(z))
    i = np.arange(1, z.size + 1)
    assert D == pytest.approx(max(np.max(i / z.size - Fz), np.max(Fz - (i - 1) / z.size)))
    assert p > 0.01
    assert stats.ks_test(z + 0.15)[1] < 1e-6  # power against a small shift
    assert stats.ks_test(np.array([])) == (0.0, 1.0)
    np.testing.assert_allclose(stats.chi2_sf(np.array([1.0, 4.0]), np.array([2.0, 2.0])), np.exp([-0.5, -2.0]),
                               rtol=1e-12)
    assert float(stats.chi2_isf(1e-3, np.array([1.0]))[0]) == pytest.approx(10.828, abs=1e-3)
    # Binomial(1000, 0.001): P(X > 4) = 0.0037 > 0.001 >= P(X > 5) = 0.0006.
    assert stats.binomial_upper(1000, 1e-3) == 5
    assert stats.two_sided_tail(3.29) == pytest.approx(1e-3, abs=2e-5)


def test_main_exit_status_and_json(tmp_path, monkeypatch, capsys):
    rows = [V.Row("ok", "Eq 3", "exact", 4, 1e-15, 1e-10, True),
            V.Row("n/a", "Eq 10", "exact", 0, float("nan"), 1e-10, True, "not applicable")]
    monkeypatch.setattr(V, "run_verify", lambda **kw: list(rows))
    path = tmp_path / "v.json"
    assert cmd.main(["--quick", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["all_passed"] and data["rows"][1]["error"] is None and data["quick"]
    rows.append(V.Row("bad", "Eq 5", "exact", 4, 1.0, 1e-10, False))
    assert cmd.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "2/3 rows pass" in out


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "x"], "--seed"), (["--bogus"], "--bogus"), (["--num-mdps", "1"], "--num-mdps"),
    (["--samples", "0"], "--samples"), (["--json", "/nonexistent/dir/v.json"], "--json"),
])
def test_main_bad_input_is_one_line_status_2(argv, needle, capsys):
    assert cmd.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vccc verify: ") and needle in err[0]


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        cmd.main(["--help"])
    assert e.value.code == 0 and "--quick" in capsys.readouterr().out
