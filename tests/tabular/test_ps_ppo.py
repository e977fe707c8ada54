"""Exact PS-PPO claims on enumerable token tasks (float64; every sequence and every cutoff)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import ps_ppo as T

LAWS = ["uniform", "mixture:0.2", "geometric:0.6"]


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "tools"])
def problem(request):
    with jax.enable_x64(True):
        task = T.tiny_task(tools=request.param)
        logits = 0.7 * jax.random.normal(jax.random.PRNGKey(1), (2, 4, 3, 3), jnp.float64)
        return task, logits


def test_enumeration_gives_the_policy_gradient(problem):
    with jax.enable_x64(True):
        got, want = T.claim_full_is_policy_gradient(*problem)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert float(jnp.max(jnp.abs(want))) > 1e-2
        e = T.enumerate_task(*problem)
        assert abs(float(e.prob.sum()) - 1.0) < 1e-12


@pytest.mark.parametrize("law", LAWS)
def test_cutoff_expectation_is_full_gradient_and_variance_closed_form(problem, law):
    with jax.enable_x64(True):
        got, want = T.claim_cutoff_unbiased(*problem, law)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        v_enum, v_closed = T.claim_variance_closed_form(*problem, law, lengths=jnp.array([2.0, 3.0]))
        assert abs(float(v_enum - v_closed)) < 1e-12


def test_variance_cost_and_short_uniform_bias(problem):
    with jax.enable_x64(True):
        rows = {r["law"]: r for r in T.variance_cost(problem[0], problem[1], ["full"] + LAWS)}
        assert rows["full"]["var_ratio"] == pytest.approx(1.0) and rows["full"]["kept_fraction"] == 1.0
        for law in LAWS:  # prefix sampling: fewer steps, more variance, no bias
            assert rows[law]["kept_fraction"] < 1.0 < rows[law]["var_ratio"]
            assert rows[law]["relative_bias"] < 1e-10
        # uniform cut at a length scale below the real length never keeps late steps: biased
        short = T.variance_cost(*problem, ["uniform", "mixture:0.2"], lengths=jnp.array([2.0, 2.0]))
        assert short[0]["relative_bias"] > 1e-3 and short[1]["relative_bias"] < 1e-10
