"""verify.sections.async_critics (issue 48): the field's asynchronous critics. Its rows run in
tests/verify/test_verify.py (quick_rows, SECTIONS); here the negative controls: a scheme that
reads the wrong critic fails its closed form, and the bias rows measure something nonzero."""

import jax
import jax.numpy as jnp

from vccc_jax.estimators.related import field_critics as fc
from vccc_jax.verify.problems import GroupSpec, make_problems
from vccc_jax.verify.sections import SECTIONS
from vccc_jax.verify.sections import async_critics as ac


def _problem():
    with jax.enable_x64(True):
        p = make_problems(jax.random.PRNGKey(5), GroupSpec("episodic", 3, 2, 1))
        return jax.tree_util.tree_map(lambda x: x[0], p)


def test_a_scheme_reading_the_wrong_critic_fails_its_row(monkeypatch):
    assert ac.async_critic_rows in SECTIONS
    p = _problem()
    real = fc.field_critic_target

    def swapped(name, rewards, discounts, actor_values, learner_values, actor_boot,
                learner_boot, lambda_):  # the bug: Cleanba's values from the learner
        if name == "cleanba_mixed":
            name = "recompute_no_ratio"
        return real(name, rewards, discounts, actor_values, learner_values, actor_boot,
                    learner_boot, lambda_)

    with jax.enable_x64(True):
        err, bias = ac.scheme_numbers(p, fc.FIELD_CRITICS, p.mus[-1], p.baselines[0])
        assert float(err.max()) < 1e-10 and float(bias.min()) > ac.MIN_BIAS
        monkeypatch.setattr(fc, "field_critic_target", swapped)
        bad, _ = ac.scheme_numbers(p, ("cleanba_mixed",), p.mus[-1], p.baselines[0])
    assert float(jnp.max(bad)) > 1e-3


def test_schemes_differ_only_in_the_critic_they_read():
    """Cleanba's mixed target = the stale GAE with the learner's bootstrap: equal when the
    two critics agree, and pathwise the difference is (gamma lambda)^(T-1) gamma (V_k -
    V_{k-L})(s_T) at t = 0 on a trajectory without terminations."""
    T, lam, g = 4, 0.8, 0.9
    r = jnp.arange(T, dtype=jnp.float32)[:, None] * 0.1
    d = jnp.full((T, 1), g)
    va, vl = jnp.ones((T, 1)), 2 * jnp.ones((T, 1))
    ba, bl = jnp.asarray([0.5]), jnp.asarray([1.5])
    mixed = fc.field_critic_target("cleanba_mixed", r, d, va, vl, ba, bl, lam)
    stale = fc.field_critic_target("stale_gae", r, d, va, vl, ba, bl, lam)
    assert jnp.allclose(mixed[0] - stale[0], (g * lam) ** (T - 1) * g * (bl - ba), atol=1e-6)
