"""Exact checks of the token task solver (issue 12), float64, ~1e-10."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs.rollout import sampling_log_probs
from vccc_jax.tabular import token as tk

TOL = 1e-10


def _compute(task, logits, stale, vbar, baseline):
    """Every exact quantity the tests check, in ONE jitted program (compile once)."""
    pi = tk.table_policy(logits)
    mu = tk.table_policy(stale)
    topk = lambda t: sampling_log_probs(logits[:, t], 1.0, 4)  # noqa: E731
    hot = lambda t: sampling_log_probs(logits[:, t], 0.5, 0)  # noqa: E731
    values, mu_values = tk.policy_values(task, pi), tk.policy_values(task, mu)
    zero = jnp.zeros_like(vbar[:1])

    def iterate(_, xy):  # backward induction with the EXPECTED targets (mu-sampled)
        x, y = xy
        e = tk.expected_targets(task, pi, mu, x, kind="ratio", clip=None)
        u = tk.expected_targets(task, mu, mu, y, kind="ratio", clip=None)
        return jnp.concatenate([e.vccc, zero]), jnp.concatenate([u.uncorrected, zero])

    fixed_vccc, fixed_uncorrected = jax.lax.fori_loop(0, task.horizon, iterate, (vbar, vbar))
    pi_c = jax.vmap(lambda t: tk._class_sum(jnp.exp(pi(t)), task))(jnp.arange(task.horizon))
    return dict(
        values=values, mu_values=mu_values,
        q_average=jnp.sum(pi_c * values.q_class, -1),
        identity=tk.vccc_identity(task, pi, mu, vbar),
        identity_b=tk.vccc_identity(task, pi, mu, vbar, baseline=baseline),
        clipped=tk.expected_targets(task, pi, mu, vbar, kind="truncate", clip=1.0),
        backup_pi=tk.bellman_backup(task, pi, vbar), backup_mu=tk.bellman_backup(task, mu, vbar),
        fixed_vccc=fixed_vccc, fixed_uncorrected=fixed_uncorrected,
        sv_ratio=tk.support_violation_bias(task, pi, topk, vbar, kind="ratio", clip=None),
        sv_truncate=tk.support_violation_bias(task, pi, topk, vbar, kind="truncate", clip=1.5),
        sv_mass=tk.expected_targets(task, pi, topk, vbar).support_violation,
        raw_hot=tk.raw_logits_bias(task, pi, hot, pi, vbar),
        raw_topk=tk.raw_logits_bias(task, pi, topk, pi, vbar),
        hot_identity=tk.vccc_identity(task, pi, hot, vbar),
    )


@pytest.fixture(scope="module")
def setup():
    """A tiny task with tool steps, gamma < 1, format reward and length penalty; pi and a
    full-support stale mu, a top-k (k=4 of 12) and a temperature-0.5 sampler of pi, a
    random Vbar and a random baseline."""
    with jax.enable_x64(True):
        task = tk.make_task(
            jax.random.PRNGKey(0), num_tokens=12, horizon=5, num_states=4, num_classes=3,
            num_prompts=2, tool_length=2, num_tool_states=2, gamma=0.9, format_reward=0.1,
            length_penalty=0.05,
        )
        keys = jax.random.split(jax.random.PRNGKey(1), 4)
        logits = 2.0 * jax.random.normal(keys[0], (2, 5, 4, 12))
        stale = logits + 1.5 * jax.random.normal(keys[1], logits.shape)
        vbar = jax.random.normal(keys[2], (6, 2, 4, 3))
        baseline = jax.random.normal(keys[3], (6, 2, 4, 3))
        out = jax.jit(lambda *a: _compute(task, *a))(logits, stale, vbar, baseline)
        out = jax.tree_util.tree_map(np.asarray, out)
        out["task"] = task
        yield out


def test_task_has_tool_steps(setup):
    task = setup["task"]
    assert task.tool_length == 2 and bool(jnp.any(task.tool_state))
    assert float(jnp.exp(task.tool_log_probs).sum()) == pytest.approx(1.0)


def test_q_values_average_to_v(setup):
    np.testing.assert_allclose(setup["q_average"], setup["values"].v[:-1, :, :, 0], atol=TOL)


def test_vccc_mean_is_t_pi_with_tool_steps(setup):
    """Eq 5 at every (t, p, q, k), tool-observation states included, any baseline."""
    value, closed = setup["identity"]
    np.testing.assert_allclose(value, closed, atol=TOL)
    np.testing.assert_allclose(setup["identity_b"][0], closed, atol=TOL)
    e = setup["clipped"]
    assert np.max(np.abs(e.uncorrected - e.t_pi)) > 1e-2  # the stale target is off
    np.testing.assert_allclose(e.truncated, e.clipped_closed, atol=TOL)  # Sec 4.2 closed form
    # tool states: every target is the environment backup (no ratio), whatever the policy
    np.testing.assert_allclose(e.uncorrected[..., 1:], e.t_pi[..., 1:], atol=TOL)
    np.testing.assert_allclose(e.z[..., 1:], 1.0, atol=TOL)
    assert np.max(np.abs(e.z[..., 0] - 1.0)) > 1e-2


def test_tool_backup_is_policy_free(setup):
    a, b = setup["backup_pi"], setup["backup_mu"]
    np.testing.assert_allclose(a[..., 1:], b[..., 1:], atol=TOL)
    assert np.max(np.abs(a[..., 0] - b[..., 0])) > 1e-2


def test_expected_vccc_operator_reaches_v_pi_across_tool_steps(setup):
    """H rounds of backward induction with the expected VCCC target (tokens from mu) give
    V^pi at every state, tool states included; the uncorrected target gives V^mu."""
    np.testing.assert_allclose(setup["fixed_vccc"], setup["values"].v, atol=TOL)
    np.testing.assert_allclose(setup["fixed_uncorrected"], setup["mu_values"].v, atol=TOL)
    assert np.max(np.abs(setup["values"].v - setup["mu_values"].v)) > 1e-2


@pytest.mark.parametrize("name", ["sv_ratio", "sv_truncate"])
def test_support_violation_bias_closed_form(setup, name):
    """Top-k (k=4 of 12) behaviour: E_mu[Y] - T_pi Vbar equals the closed form of Sec 7
    (Eq 8, and Eq 10 with c = 1.5)."""
    value, closed = setup[name]
    np.testing.assert_allclose(value, closed, atol=TOL)
    assert np.max(np.abs(value)) > 1e-2
    assert np.max(setup["sv_mass"]) > 1e-3
    np.testing.assert_allclose(setup["sv_mass"][..., 1:], 0.0)


@pytest.mark.parametrize("name", ["raw_hot", "raw_topk"])
def test_raw_logits_control_bias(setup, name):
    """Sampling from temperature 0.5 (or top-k) but logging raw-logit log-probs: the Eq 8
    target is biased, by exactly the closed form; logging the sampler's log-probs is not."""
    value, closed = setup[name]
    np.testing.assert_allclose(value, closed, atol=TOL)
    assert np.max(np.abs(value)) > 1e-2
    good, target = setup["hot_identity"]
    np.testing.assert_allclose(good, target, atol=TOL)


def test_bad_shapes_raise(setup):
    pi = tk.table_policy(jnp.zeros((2, 5, 4, 12)))
    with pytest.raises(ValueError, match="vbar"):
        tk.bellman_backup(setup["task"], pi, jnp.zeros((3,)))
    with pytest.raises(ValueError, match="log_pi_fn"):
        tk.policy_values(setup["task"], lambda t: jnp.zeros((2, 4, 5)))
