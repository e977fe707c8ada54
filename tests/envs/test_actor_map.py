"""Exact map of actor rows x critic corrections (``envs.actor_map``), float64.

* the bias decomposition drift + critic + weight + state sums to g - pg exactly, and its
  first three parts ARE the tabular async actor-critic table's (``tabular.async_actor.
  actor_diagnostics``) for a WEIGHT_KINDS row, every critic;
* "the critic" of each correction is the fixed point of its own registry target under the
  lagged replay: ``tabular.fixed_point.fixed_point`` (uncorrected, VCCC, truncated c, V-trace
  with its exact multi-step moments) on a tabular MDP, the token env's exact target means
  (``tabular.token.expected_targets``) on a token task;
* the sampler of the map is ``envs.samplers``'s (temperature, top-p).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import actor_map as am
from vccc_jax.envs import samplers
from vccc_jax.tabular import async_actor, critic
from vccc_jax.tabular import token as tk
from vccc_jax.tabular.mdp import random_mdp

S, A, CLIP, RHOBAR, T = 3, 3, 2.0, 1.0, 0.7


@pytest.fixture(scope="module", autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def tab():
    mdp = random_mdp(jax.random.PRNGKey(3), 1, S, A, gamma=0.9, dtype=jnp.float64)[0]
    k1, k2 = jax.random.split(jax.random.PRNGKey(4))
    pi_logits = jax.random.normal(k1, (S, A), jnp.float64)
    mu_logits = pi_logits + 1.5 * jax.random.normal(k2, (S, A), jnp.float64)
    return mdp, pi_logits, mu_logits


def _critics(kind, env, log_pi, log_mu):
    return jax.vmap(lambda lp: am.policy_values(kind, env, lp))(
        am.critic_policies(log_pi, log_mu, CLIP, RHOBAR))


@jax.jit
def _tabular_numbers(mdp, pi_logits, mu_logits):
    """One compiled graph: the map's lane (row truncate), the async table's diagnostics of
    every critic, and each critic's registry-target fixed point."""
    u = am.lane_update("tabular", mdp, "truncate", {"clip": CLIP}, pi_logits, mu_logits, T, 1.0,
                       0, clip=CLIP, rhobar=RHOBAR)
    log_pi = jax.nn.log_softmax(pi_logits, -1)
    log_mu = am.behaviour_log_probs(mu_logits, T, 1.0)
    d_mu = am.occupancy("tabular", mdp, log_mu)
    crit = _critics("tabular", mdp, log_pi, log_mu)
    kind = jnp.asarray(async_actor.ACTOR_KINDS.index("truncate"))
    diag = jax.vmap(lambda v: async_actor.actor_diagnostics(
        mdp, pi_logits, v, log_mu[None], d_mu, jnp.ones((1, S)), kind, jnp.asarray(CLIP),
        jnp.asarray(0), 0))(crit)
    versions = jnp.stack([log_mu, log_pi])  # one behaviour version; pi_K is the target
    visit = jax.vmap(lambda lp: am.occupancy("tabular", mdp, lp))(versions)
    replay = critic.make_replay(mdp, versions, visit, jnp.asarray([1.0, 0.0]))
    clips = {"uncorrected": CLIP, "vccc": CLIP, "truncated": CLIP, "vtrace": RHOBAR}
    opts = {"vtrace": {"lambda_": 1.0, "n_steps": 3}}
    fps = jnp.stack([critic.fixed_point(critic.METHODS[n], replay, clips[n], opts.get(n),
                                        jnp.zeros(S)).values for n in am.CRITICS])
    return u, diag, crit, fps


@pytest.fixture(scope="module")
def tab_numbers(tab):
    return _tabular_numbers(*tab)


def test_decomposition_is_exact_and_is_the_async_table(tab_numbers):
    u, diag, _, _ = tab_numbers
    total = u.drift + u.critic + u.weight + u.state
    scale = float(jnp.max(jnp.abs(u.g)))
    assert float(jnp.max(jnp.abs(total - (u.g - u.pg[None])))) <= 1e-15 * scale
    # every part is there (a dropped term could not hide), and the critics differ
    for part in (u.drift, u.critic[0], u.weight, u.state):
        assert float(jnp.max(jnp.abs(part))) > 1e-3 * scale
    for mine, theirs in ((u.g, diag.g_app), (u.drift, diag.drift), (u.critic, diag.critic),
                         (u.weight, diag.weight), (u.pg[None] + u.state, diag.g_ref)):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-13 * scale)


def test_critic_is_the_fixed_point_of_its_registry_target(tab_numbers):
    _, _, crit, fps = tab_numbers
    for k, name in enumerate(am.CRITICS):  # V-trace: its exact 3-step moments (Eq 11)
        np.testing.assert_allclose(fps[k], crit[k], rtol=0, atol=1e-11, err_msg=name)
    # the corrected fixed points are not the stale one
    assert float(jnp.max(jnp.abs(crit[1] - crit[0]))) > 1e-2


@jax.jit
def _token_numbers(task, log_pi, log_mu):
    """Each critic's table and the exact target means E_mu[Y | s] at it (uncorrected, VCCC,
    truncated c of ``tabular.token.expected_targets``)."""
    crit = _critics("token", task, log_pi, log_mu)
    e = jax.vmap(lambda v: tk.expected_targets(task, lambda t: log_pi[:, t],
                                               lambda t: log_mu[:, t], v, kind="truncate",
                                               clip=CLIP))(crit[:3])
    return crit, jnp.stack([e.uncorrected[0], e.vccc[1], e.truncated[2]])


def test_token_critic_is_the_fixed_point_of_the_token_targets():
    task = tk.make_task(jax.random.PRNGKey(5), num_tokens=5, horizon=4, num_states=3,
                        num_classes=3, num_prompts=2, tool_length=1, num_tool_states=1,
                        gamma=0.95, dtype=jnp.float64)
    k1, k2 = jax.random.split(jax.random.PRNGKey(6))
    pi_logits = jax.random.normal(k1, (2, 4, 3, 5), jnp.float64)
    mu_logits = pi_logits + jax.random.normal(k2, pi_logits.shape, jnp.float64)
    log_pi = jax.nn.log_softmax(pi_logits, -1)
    for t_, p_ in ((T, 1.0), (1.0, 0.8)):  # temperature; top-p (support violations)
        crit, means = _token_numbers(task, log_pi, am.behaviour_log_probs(mu_logits, t_, p_))
        np.testing.assert_allclose(means, crit[:3, :-1], rtol=0, atol=1e-12,
                                   err_msg=f"T={t_}, top-p={p_}")
        assert float(jnp.max(jnp.abs(crit[1] - crit[0]))) > 1e-3


SPECS = (samplers.SamplerSpec(temperature=0.7), samplers.SamplerSpec(top_p=0.8))


@jax.jit
def _sampler_pairs(logits):
    return [(am.behaviour_log_probs(logits, s.temperature, s.top_p),
             samplers.sampler_log_probs(logits, s)) for s in SPECS]


def test_sampler_is_envs_samplers():
    logits = jax.random.normal(jax.random.PRNGKey(7), (6, 9), jnp.float64)
    pairs = _sampler_pairs(logits)
    for mine, theirs in pairs:
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-14)
    assert np.isinf(np.asarray(pairs[1][0])).any()  # top-p cut something
