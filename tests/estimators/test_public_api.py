"""The curated estimator API (issue 9): every name of ``__all__`` imports, and the README
snippet "Use the estimators in your own trainer" runs as written."""

import pathlib
import re

import jax.numpy as jnp

import vccc_jax.estimators as E

HEADING = "## Use the estimators in your own trainer"
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

# Keep identical to the first python block under HEADING in README.md (the test checks it).
SNIPPET = '''
import jax
import jax.numpy as jnp

from vccc_jax.estimators import (
    Transitions, centered_clipped_target, clipped_target, expected_weight, policy_loss,
    ratio_diagnostics, vccc_target, vtrace,
)

T, B, A = 8, 4, 3
k = jax.random.split(jax.random.PRNGKey(0), 6)
log_pi_all = jax.nn.log_softmax(jax.random.normal(k[0], (T, B, A)))  # learner pi_k
log_mu_all = jax.nn.log_softmax(jax.random.normal(k[1], (T, B, A)))  # stale behaviour mu
actions = jax.random.categorical(k[2], log_mu_all)
take = lambda lp: jnp.take_along_axis(lp, actions[..., None], -1)[..., 0]  # noqa: E731
log_pi, log_mu = take(log_pi_all), take(log_mu_all)
batch = Transitions(
    rewards=jax.random.normal(k[3], (T, B)),
    discounts=jnp.full((T, B), 0.99),              # gamma * (1 - terminal_{t+1})
    values=jax.random.normal(k[4], (T, B)),        # Vbar(s_t)
    next_values=jax.random.normal(k[5], (T, B)),   # Vbar(s_{t+1})
    log_rhos=log_pi - log_mu,                      # log pi_k(a|s) - log mu(a|s)
)

# one-step critic targets (stop-gradient): regress V(s_t) on them, loss 0.5 (V - y)^2
y_vccc = vccc_target(*batch)                                  # Eq 8: unbiased for V^{pi_k}
y_clip = clipped_target(*batch, clip=2.0, kind="truncate")    # Eq 10: bounded variance
z = expected_weight(log_pi_all, log_mu_all, kind="truncate", clip=2.0)   # Z(s), Sec 4.2
y_cent = centered_clipped_target(*batch, baseline=jnp.zeros((T, B)), z=z, clip=2.0)

# multi-step: V-trace (Eq 11) over the time axis
out = vtrace(batch.log_rhos, batch.discounts, batch.rewards, batch.values,
             batch.next_values[-1], lambda_=0.95)

# actor: truncated-IS policy loss on the V-trace advantages, and what to log
loss = policy_loss(log_pi, log_mu, out.pg_advantages, kind="truncate", clip=2.0)
diag = ratio_diagnostics(batch.log_rhos, kind="truncate", clip=2.0)
assert y_vccc.shape == y_clip.shape == y_cent.shape == out.vs.shape == (T, B)
assert jnp.isfinite(loss) and 0.0 < diag.ess_fraction <= 1.0
'''


def _readme_snippet():
    """The first ```python block under HEADING in README.md, or None without the heading."""
    if not README.exists():
        return None
    text = README.read_text()
    if HEADING not in text:
        return None
    section = text.split(HEADING, 1)[1]
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, f"README section {HEADING!r} has no python block"
    return m.group(1)


def test_every_name_in_all_imports():
    assert len(set(E.__all__)) == len(E.__all__)
    for name in E.__all__:
        assert getattr(E, name) is not None, name
    ns = {}
    exec(f"from vccc_jax.estimators import {', '.join(E.__all__)}", ns)
    assert set(E.__all__) <= set(ns)
    # the names the issue asks for
    for name in ("vtrace", "vccc_target", "clipped_target", "centered_clipped_target",
                 "ratio_diagnostics", "policy_loss", "importance_weights", "expected_weight",
                 "optimal_baseline", "Transitions"):
        assert name in E.__all__, name
    assert callable(E.vtrace) and E.WEIGHT_KINDS == ("none", "ratio", "truncate", "mask")


def test_readme_snippet_runs():
    code = _readme_snippet()
    if code is not None:  # the README block and the fallback must not drift apart
        assert code.strip() == SNIPPET.strip()
    ns = {}
    exec(compile(SNIPPET if code is None else code, "README snippet", "exec"), ns)
    # the snippet's VCCC target is Eq 8: Vbar + rho delta
    b = ns["batch"]
    rho = jnp.exp(b.log_rhos)
    expected = b.values + rho * (b.rewards + b.discounts * b.next_values - b.values)
    assert jnp.allclose(ns["y_vccc"], expected, rtol=1e-5, atol=1e-5)


def test_registry_rows_match_the_plan():
    names = set(E.CRITIC_TARGETS)
    assert {"uncorrected", "vccc", "vccc_bstar", "truncated", "masked", "naive_baseline",
            "centered_baseline", "vtrace"} <= names
    assert E.get_critic_target("vtrace").multi_step
    for row in E.CRITIC_TARGETS.values():
        assert row.weight_kind in E.WEIGHT_KINDS
