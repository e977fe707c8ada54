"""Comparator registration (issue 13): BRACE through the registry equals the direct
estimator; the trainer's pi_old route functions (estimators.related.decoupled)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.estimators import registry
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.estimators.related.brace import brace

T, B, A = 5, 3, 4


@pytest.fixture(scope="module")
def seq():
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    return registry.SequenceInputs(
        log_rhos=0.8 * jax.random.normal(k[0], (T, B)),
        discounts=0.9 * (jax.random.uniform(k[1], (T, B)) > 0.15),
        rewards=jax.random.normal(k[2], (T, B)), values=jax.random.normal(k[3], (T, B)),
        bootstrap_value=jax.random.normal(k[4], (B,)),
        truncations=jax.random.uniform(k[5], (T, B)) > 0.8,
        truncation_values=jax.random.normal(k[5], (T, B)))


def test_brace_row_is_registered():
    row = registry.get_critic_target("brace")
    assert row.multi_step and row.uses_clip and row.sequence is not None
    assert row.weight_kind == "truncate"
    assert dict(row.option_defaults)["tail_anchor"] == "prefix"


@pytest.mark.parametrize("opts,clip,direct", [
    (dict(n=2), 1.5, dict(n=2, clip_rho_threshold=1.5, clip_c_threshold=1.5, clip_pg_rho_threshold=1.5)),
    (dict(n=1, tail_anchor="constant", rho_bar=2.0, c_bar=0.8), 9.0,
     dict(n=1, clip_rho_threshold=2.0, clip_c_threshold=0.8, clip_pg_rho_threshold=2.0, tail_anchor="constant")),
])
def test_brace_through_registry_equals_direct_call(seq, opts, clip, direct):
    out = registry.get_critic_target("brace").sequence(seq, clip, opts)
    ref = brace(seq.log_rhos, seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                truncations=seq.truncations, truncation_values=seq.truncation_values, **direct)
    np.testing.assert_allclose(out.vs, ref.vs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.pg_advantages, ref.pg_advantages, rtol=1e-6, atol=1e-6)
    assert float(jnp.max(jnp.abs(ref.vs - seq.values))) > 0.1


def test_brace_sequence_rejects_half_thresholds(seq):
    with pytest.raises(ValueError, match="rho_bar and c_bar"):
        registry.get_critic_target("brace").sequence(seq, 1.0, dict(rho_bar=1.0))


def test_route_log_pi_old():
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    lp, lm, lb = (jax.nn.log_softmax(jax.random.normal(x, (T, B, A))) for x in k[:3])
    ew = jax.random.normal(k[3], (T, B, A))
    act = jnp.zeros((T, B), jnp.int32).at[1].set(2)
    kw = dict(log_pi_all=lp, log_mu_all=lm, behaviour_log_pi_all=lb, ewma_logits=ew)
    want = {"": lp, "exact": lb, "ewma": jax.nn.log_softmax(ew), "behaviour": lm}
    for route, full in want.items():
        one, got = dec.route_log_pi_old(route, act, **kw)
        np.testing.assert_allclose(got, full, atol=1e-6)
        np.testing.assert_allclose(one, jnp.take_along_axis(full, act[..., None], -1)[..., 0], atol=1e-6)
    # behaviour route: the discrepancy factor pi_old / mu is exactly 1 (never truncated)
    one, _ = dec.route_log_pi_old("behaviour", act, **kw)
    r = dec.decoupled_ratios(one, one, jnp.take_along_axis(lm, act[..., None], -1)[..., 0], kind="mask", clip=1.1)
    assert not bool(jnp.any(r.discrepancy_fired))
    with pytest.raises(ValueError, match="behaviour_log_pi_all"):
        dec.route_log_pi_old("exact", act, log_pi_all=lp, log_mu_all=lm)
    with pytest.raises(ValueError, match="route"):
        dec.route_log_pi_old("snapshot", act, **kw)
    # the old logits carry no gradient
    g = jax.grad(lambda e: jnp.sum(dec.route_log_pi_old("ewma", act, log_pi_all=lp, log_mu_all=lm,
                                                          ewma_logits=e)[0]))(ew)
    assert float(jnp.max(jnp.abs(g))) == 0.0
    assert dec.trainer_ewma_decay(None, 3.0) == pytest.approx(0.75)
    assert dec.trainer_ewma_decay(0.5, 3.0) == 0.5
