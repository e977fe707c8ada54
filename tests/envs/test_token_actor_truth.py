"""Exact actor-gradient truth on the token env (issue 12; Sec 5.1 / Eq 12 / Eq 13):
the ratio identity, centring, a brute-force check of the truncated update with a top-k
stale behaviour, tool states carrying no actor gradient, and the wiring into
``train.exact_metrics.token_metrics``. All float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import samplers as sm
from vccc_jax.envs import token_actor_truth as tat
from vccc_jax.envs import token_env as te
from vccc_jax.tabular import token as tk
from vccc_jax.train import exact_metrics as em

H, P, Q, C, V, M = 4, 2, 3, 3, 8, 2  # tool_length M = 2 -> countdown K = 3
HIDDEN = 6
CLIP = 1.2


def apply(params, obs):
    """Tiny MLP actor on the exact features: obs [..., F] -> logits [..., V]."""
    x = obs.astype(params["w1"].dtype)
    b1 = params["b1"].reshape((1,) * (x.ndim - 1) + (-1,))
    return jnp.tanh(x @ params["w1"] + b1) @ params["w2"]


def _init(rng, f):
    return {"w1": rng.normal(size=(f, HIDDEN)), "b1": 0.3 * rng.normal(size=(HIDDEN,)),
            "w2": 1.5 * rng.normal(size=(HIDDEN, V))}


def _flat(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


def _make_task():
    task = jax.jit(lambda k: tk.make_task(
        k, num_tokens=V, horizon=H, num_states=Q, num_classes=C, num_prompts=P, tool_length=M,
        num_tool_states=1, dtype=jnp.float64))(jax.random.PRNGKey(0))
    # the tool state is entered by some policy token (so tool values enter the actor update)
    assert bool(jnp.any(task.tool_state[task.transition] & ~task.ends))
    return task


def _setup(task):
    """Actor params, a stale actor, behaviour versions [L=2, H, P, Q, V] (full support at
    temperature 1.3; top-5 of 8), a random posterior, a sparse random D, V^pi, a noisy critic
    (numpy randomness: no RNG kernels to compile)."""
    rng = np.random.default_rng(7)
    grid = tat.policy_obs_grid(te.TokenEnv(task))
    params = _init(rng, grid.shape[-1])
    stale = jax.tree_util.tree_map(lambda x, e: x + 0.8 * e, params, _init(rng, grid.shape[-1]))
    post = rng.uniform(0.05, 1.0, (2, H, P, Q))
    d = rng.uniform(size=(H, P, Q)) * (rng.uniform(size=(H, P, Q)) > 0.2)
    noise = 0.3 * rng.normal(size=(H + 1, P, Q, M + 1))

    @jax.jit
    def derived(params, stale):
        log_mus = jnp.stack([jax.nn.log_softmax(apply(stale, grid) / 1.3, axis=-1),
                             sm.sampler_log_probs(apply(stale, grid), sm.SamplerSpec(top_k=5))])
        v_pi = tk.policy_values(task, lambda t: jax.nn.log_softmax(apply(params, grid[t]), -1)).v
        return log_mus, v_pi

    log_mus, v_pi = derived(params, stale)
    return dict(grid=grid, params=jax.tree_util.tree_map(jnp.asarray, params), log_mus=log_mus,
                stale=jax.tree_util.tree_map(jnp.asarray, stale),
                post=jnp.asarray(post / post.sum(0, keepdims=True)), d=jnp.asarray(d / d.sum()),
                v_pi=v_pi, critic=v_pi + noise)


def _all_truths(task, c):
    """Every exact quantity the tests compare (one compile; settings that differ only in the
    critic share one vmapped body)."""

    pi_fn = lambda t: jax.nn.log_softmax(apply(c["params"], c["grid"][t]), -1)  # noqa: E731
    pi_vals = tk.policy_values(task, pi_fn)

    def truths(log_mus, critics, **kw):
        return jax.vmap(lambda cr: tat.actor_update_truth(
            apply, c["params"], c["grid"], task, lambda t: log_mus[:, t], c["post"], c["d"], cr,
            pi_values=pi_vals, **kw))(critics)

    def coeffs(critics):
        return jax.vmap(lambda cr: tat.update_coefficients(
            task, pi_fn, lambda t: c["log_mus"][:, t], c["post"], c["d"], cr, kind="truncate",
            clip=CLIP, centred=True))(critics)

    def pick(tree, i):
        return jax.tree_util.tree_map(lambda x: x[i], tree)

    full = jnp.stack([c["log_mus"][0],  # two full-support versions
                      jax.nn.log_softmax(0.5 * apply(c["params"], c["grid"]), axis=-1)])
    trunc = dict(kind="truncate", clip=CLIP)
    both = jnp.stack([c["v_pi"], c["critic"]])
    ratio = truths(full, both, kind="ratio")
    tr, tr_c = truths(c["log_mus"], both, **trunc), truths(c["log_mus"], both, **trunc, centred=True)
    co = coeffs(jnp.stack([c["critic"], c["critic"].at[:, :, :, 1].add(5.0),
                           c["critic"].at[:, :, :, M].add(5.0)]))
    return dict(
        ratio=pick(ratio, 0),
        ratio_centred=pick(truths(full, c["v_pi"][None], kind="ratio", centred=True), 0),
        ratio_noisy=pick(ratio, 1),
        trunc=pick(tr, 1),
        trunc_centred=pick(tr_c, 1),
        trunc_vpi=pick(tr, 0),
        trunc_vpi_centred=pick(tr_c, 0),
        coeff=pick(co, 0),
        coeff_k1=pick(co, 1),
        coeff_km=pick(co, 2),
    )


@pytest.fixture(scope="module")
def case():
    with jax.enable_x64(True):
        task = _make_task()
        c = _setup(task)
        c.update(task=task, env=te.TokenEnv(task), out=jax.jit(_all_truths)(task, c))
    return c


def test_ratio_with_exact_critic_equals_eq12(case):
    """Sec 5.1 / Eq 12: kind='ratio', V_phi = V^pi, full-support versions -> expected == eq12
    for any posterior and D, with and without Eq 13 centring (m_w = E_pi[u] = 0)."""
    with jax.enable_x64(True):
        for name in ("ratio", "ratio_centred"):
            g = case["out"][name]
            e, r = _flat(g.expected), _flat(g.eq12)
            assert np.linalg.norm(r) > 1e-3
            np.testing.assert_allclose(e, r, rtol=0, atol=1e-10 * max(1.0, np.abs(r).max()))
        # the critic is what matters: a wrong critic breaks the identity
        g = case["out"]["ratio_noisy"]
        assert et.gradient_bias(g.expected, g.eq12).relative > 1e-3


def _brute_force(c, kind, clip, centred):
    """Per policy state: explicit loop over tokens with step_class, the score of each token by
    jax.jacrev of log pi at that single state, weights from probabilities (numpy)."""
    task, params, env = c["task"], c["params"], c["env"]
    crit = np.asarray(c["critic"])
    post, d = np.asarray(c["post"]), np.asarray(c["d"])
    mus_all = np.exp(np.asarray(c["log_mus"]))

    @jax.jit
    def at_state(t, p, q):
        obs = te.policy_observations(env, t)[p, q]
        logp = lambda prm: jax.nn.log_softmax(apply(prm, obs))  # noqa: E731
        jac = jax.jacrev(logp)(params)
        u = jnp.concatenate([x.reshape(V, -1) for x in jax.tree_util.tree_leaves(jac)], axis=1)
        step = tk.step_class(task, p, t, q, 0, task.token_class)
        return jnp.exp(logp(params)), u, step.q, step.k, step.reward, step.discount

    total = 0.0
    for t in range(H):
        for p in range(P):
            for q in range(Q):
                if d[t, p, q] == 0:
                    continue
                pi, u, q2, k2, r, disc = (np.asarray(x) for x in at_state(t, p, q))
                nxt = crit[t + 1, p, q2, k2]
                adv = r + disc * nxt - crit[t, p, q, 0]  # [V]
                for lag in range(mus_all.shape[0]):
                    mu = mus_all[lag, t, p, q]
                    on = mu > 0
                    rho = np.where(on, pi / np.where(on, mu, 1.0), 0.0)
                    w = {"ratio": rho, "truncate": np.minimum(rho, clip)}[kind] * on
                    m_w = (mu * w) @ u
                    score = w[:, None] * u - (m_w[None] if centred else 0.0)
                    total = total + d[t, p, q] * post[lag, t, p, q] * ((mu * adv) @ score)
    return total


@pytest.mark.parametrize("centred", [False, True])
def test_truncated_stale_topk_matches_brute_force(case, centred):
    """Eq 10 / Eq 13 actor with a stale top-5 behaviour: nonzero bias vs Eq 12, and the
    exact expected update equals an explicit per-state sum over tokens (1e-10)."""
    suffix = "_centred" if centred else ""
    with jax.enable_x64(True):
        brute = _brute_force(case, "truncate", CLIP, centred)
        np.testing.assert_allclose(_flat(case["out"]["trunc" + suffix].expected), brute, rtol=0,
                                   atol=1e-10 * max(1.0, np.abs(brute).max()))
        # exact critic, truncated stale weights and top-k support: still biased vs Eq 12
        g = case["out"]["trunc_vpi" + suffix]
        assert et.gradient_bias(g.expected, g.eq12).relative > 1e-2


def test_tool_states_carry_no_actor_coefficient(case):
    """Critic values at countdown k = 1 (reached only from tool states, M = 2) never enter the
    actor update; those at k = M (entered by a policy token) do; the coefficient tables have
    no tool-state axis and D at tool states is not an input."""
    out = case["out"]
    base = out["coeff"]
    assert base.expected.shape == (H, P, Q, V) and base.eq12.shape == (H, P, Q, V)
    np.testing.assert_array_equal(np.asarray(out["coeff_k1"].expected), np.asarray(base.expected))
    assert np.abs(np.asarray(out["coeff_km"].expected - base.expected)).max() > 1e-3
    with jax.enable_x64(True):
        mus_fn = lambda t: case["log_mus"][:, t]  # noqa: E731
        pi_fn = lambda t: jnp.zeros((P, Q, V))  # noqa: E731
        with pytest.raises(ValueError, match="state_weights"):
            tat.update_coefficients(case["task"], pi_fn, mus_fn, case["post"],
                                    jnp.ones((H, P, Q, M + 1)), case["critic"])
        with pytest.raises(ValueError, match="critic_values"):
            tat.update_coefficients(case["task"], pi_fn, mus_fn, case["post"], case["d"],
                                    case["critic"][..., 0])


def test_token_metrics_wiring(case):
    """``train.exact_metrics.token_metrics`` on a fake batch (two versions, lags 0 / 1, tool
    states included): exact critic + ratio weights -> no bias (Eq 12); truncated -> biased."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        T, B = 12, 4
        ints = lambda hi: jnp.asarray(rng.integers(0, hi, (T, B)), jnp.int32)  # noqa: E731
        st = te.TokenEnvState(prompt=ints(P), q=ints(Q), k=ints(M + 1), last_token=ints(V),
                              ended=jnp.zeros((T, B), bool), time=ints(H))
        stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), case["params"],
                                         case["stale"])

        @jax.jit
        def both(critic):
            def run(kind, clip):
                return em.token_metrics(
                    case["env"], apply, lambda p, obs: p, case["params"], critic, stacked,
                    lambda z: jax.nn.log_softmax(z / 1.3, axis=-1), jnp.array([0.5, 0.5]), st,
                    ints(2), jnp.ones((T, B)), kind=kind, clip=clip, centred=False)
            return run("ratio", None), run("truncate", CLIP)

        ratio, trunc = both(case["v_pi"][:H])
    assert float(ratio["exact_err_pi"]) < 1e-6
    assert float(ratio["exact_grad_rel_bias"]) < 1e-6  # float32 outputs
    assert float(trunc["exact_grad_rel_bias"]) > 1e-2
