"""Decoupled correction routes and PPO-EWMA (vccc_jax.estimators.related.decoupled)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators.actor import policy_loss
from vccc_jax.estimators.related import decoupled as dc


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(0)
    lp = lambda x: jax.nn.log_softmax(jnp.asarray(x), axis=-1)[..., 0]  # noqa: E731
    base = rng.normal(size=(16, 4))
    return dict(log_pi=lp(base + 0.3 * rng.normal(size=base.shape)), log_old=lp(base),
                log_mu=lp(base + 0.5 * rng.normal(size=base.shape)),
                adv=jnp.asarray(rng.normal(size=16)))


def test_split_ratio_and_exact_route_is_policy_loss(tokens):
    t = tokens
    out = dc.decoupled_ratios(t["log_pi"], t["log_old"], t["log_mu"], kind="ratio", clip=None, ppo_epsilon=None)
    np.testing.assert_allclose(out.discrepancy * out.staleness, jnp.exp(t["log_pi"] - t["log_mu"]), rtol=1e-5)
    a = dc.decoupled_policy_loss(t["log_pi"], t["log_mu"], t["adv"], route="exact",
                                 exact_log_pi_old=t["log_old"], kind="mask", clip=2.0, ppo_epsilon=0.2)
    b = policy_loss(t["log_pi"], t["log_mu"], t["adv"], kind="mask", clip=2.0, ppo_epsilon=0.2,
                    log_pi_old=t["log_old"])
    np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(ValueError, match="exact_log_pi_old"):
        dc.decoupled_policy_loss(t["log_pi"], t["log_mu"], t["adv"], route="exact")


def test_behaviour_route_entangles_thresholds(tokens):
    """pi_old = mu: the discrepancy threshold never fires, the PPO clip sees pi/mu."""
    t = tokens
    ref = dc.old_log_probs("behaviour", t["log_mu"])
    out = dc.decoupled_ratios(t["log_pi"], ref, t["log_mu"], kind="mask", clip=1.2, ppo_epsilon=0.1)
    assert not bool(jnp.any(out.discrepancy_fired))
    np.testing.assert_allclose(out.discrepancy, 1.0)
    exact = dc.decoupled_ratios(t["log_pi"], t["log_old"], t["log_mu"], kind="mask", clip=1.2, ppo_epsilon=0.1)
    assert bool(jnp.any(exact.discrepancy_fired))
    w = dc.decoupled_weights(t["log_pi"], ref, t["log_mu"], kind="truncate", clip=2.0, ppo_epsilon=None)
    np.testing.assert_allclose(w, jnp.exp(t["log_pi"] - t["log_mu"]), rtol=1e-5)


def test_ewma_is_debiased_parameter_average():
    params = [{"w": jnp.full((2,), float(k))} for k in range(1, 6)]
    beta = dc.ewma_decay_for_lag(3.0)
    assert beta == pytest.approx(0.75)
    state = dc.ewma_init(params[0])
    step = jax.jit(dc.ewma_update)
    for p in params:
        state = step(state, p, beta)
    weights = (1 - beta) * beta ** np.arange(4, -1, -1)
    expected = np.dot(weights, np.arange(1, 6)) / weights.sum()
    np.testing.assert_allclose(dc.ewma_params(state, beta)["w"], expected, rtol=1e-6)
    assert int(state.count) == 5
    # decay 0 (lag 0): the EWMA is the current parameters.
    s0 = dc.ewma_update(dc.ewma_init(params[0]), params[2], 0.0)
    np.testing.assert_allclose(dc.ewma_params(s0, 0.0)["w"], 3.0)


def test_route_cost():
    snap = dc.route_cost("exact", num_params=10, max_lag=4)
    model = dc.route_cost("exact", num_params=10, max_lag=4, exact_strategy="old_logit_model")
    assert snap["extra_params"] == 50 and model["extra_params"] == 10
    assert dc.route_cost("behaviour", num_params=10, max_lag=4)["extra_forward_passes"] == 0
    with pytest.raises(ValueError, match="route"):
        dc.route_cost("magic", num_params=1, max_lag=0)
