"""Exact checks of the token task solver (issue 12), float64, ~1e-10."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs.rollout import sampling_log_probs
from vccc_jax.envs.token_env import TokenEnv, TokenEnvState
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
        out["task"], out["logits"] = task, np.asarray(logits)
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


# ------------------------------------------------------------- the task's semantics (spec)


def _reference_step(tables, p, t, q, k, token):
    """Reading ``token`` in state (prompt p, position t, automaton q, tool countdown k), written
    from the task's tables as the module docstring defines them (independent of step_class):
    the automaton moves on the token's class; the episode ends on an ``ends`` entry or after
    position H - 1; every step earns the format reward of the state entered, a POLICY step
    (k = 0) pays the length penalty and a tool step does not; the verifier's accept reward is
    paid only on the ending step; a policy step entering a tool state starts m tool tokens,
    a tool token counts down; discount gamma after a policy step, tool_discount after a tool
    step, 0 on the ending step. -> (q', k', reward, ended, discount)."""
    c = tables["token_class"][token]
    q2 = tables["transition"][q, c]
    policy = k == 0
    ended = bool(tables["ends"][q, c]) or t + 1 >= tables["H"]
    reward = tables["step_reward"][q2]
    if policy:
        reward -= tables["length_penalty"]
    if ended:
        reward += tables["accept_reward"][p, q2]
        return q2, 0, reward, True, 0.0
    if policy:
        return q2, (tables["m"] if tables["tool_state"][q2] else 0), reward, False, tables["gamma"]
    return q2, k - 1, reward, False, tables["tool_discount"]


def _tables(task):
    names = ("token_class", "transition", "ends", "accept_reward", "step_reward", "length_penalty", "tool_state",
             "tool_log_probs", "gamma", "tool_discount")
    out = {n: np.asarray(getattr(task, n)) for n in names}
    out.update(H=task.horizon, m=task.tool_length)
    return out


def test_solver_values_match_the_task_definition(setup):
    """V^pi by backward induction over (t, p, q, k) with the reference step (tokens from pi at
    policy states, from the tool distribution at tool states) = ``policy_values``."""
    task, tables = setup["task"], _tables(setup["task"])
    H, P, Q, K, V = task.horizon, task.num_prompts, task.num_states, task.num_counters, task.num_tokens
    logits = setup["logits"]
    pi = np.exp(logits - logits.max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    tool = np.exp(tables["tool_log_probs"])
    v = np.zeros((H + 1, P, Q, K))
    for t in reversed(range(H)):
        for p in range(P):
            for q in range(Q):
                for k in range(K):
                    probs = pi[p, t, q] if k == 0 else tool
                    for token in range(V):
                        q2, k2, r, _, d = _reference_step(tables, p, t, q, k, token)
                        v[t, p, q, k] += probs[token] * (r + d * v[t + 1, p, q2, k2])
    np.testing.assert_allclose(setup["values"].v, v, atol=TOL)
    assert tables["length_penalty"] > 0 and tables["gamma"] != tables["tool_discount"]  # every term matters


def test_env_steps_match_the_task_definition(setup):
    """``TokenEnv.step_env`` from every state (p, t, q, k), every action: reward, discount,
    termination, next automaton state and countdown = the reference step of the token it
    appended (the action on policy steps, the environment's draw on tool steps)."""
    task, tables = setup["task"], _tables(setup["task"])
    env = TokenEnv(task)
    H, P, Q, K, V = task.horizon, task.num_prompts, task.num_states, task.num_counters, task.num_tokens
    grid = np.stack(np.meshgrid(np.arange(P), np.arange(H), np.arange(Q), np.arange(K), np.arange(V),
                                indexing="ij"), -1).reshape(-1, 5)
    p, t, q, k, a = (jnp.asarray(grid[:, i], jnp.int32) for i in range(5))
    state = TokenEnvState(prompt=p, q=q, k=k, last_token=jnp.full_like(p, -1), ended=jnp.zeros(p.shape, bool), time=t)
    keys = jax.random.split(jax.random.PRNGKey(5), len(grid))
    with jax.enable_x64(True):
        step = jax.jit(jax.vmap(lambda key, s, act: env.step_env(key, s, act, env.default_params)))
        _, new, reward, done, info = jax.tree_util.tree_map(np.asarray, step(keys, state, a))
    tool_steps = 0
    for i, (pi_, ti, qi, ki, ai) in enumerate(grid):
        token = int(info["token"][i])
        if ki == 0:
            assert token == ai
        else:
            tool_steps += 1
            assert tables["tool_log_probs"][token] > -np.inf
        q2, k2, r, ended, d = _reference_step(tables, pi_, ti, qi, ki, token)
        assert (new.q[i], new.k[i], bool(done[i])) == (q2, k2, ended), (grid[i], token)
        assert reward[i] == pytest.approx(r, abs=1e-12) and info["discount"][i] == pytest.approx(d, abs=1e-12)
        assert bool(info["is_action"][i]) == (ki == 0)
    assert tool_steps > 0 and np.any(done) and not np.all(done)
