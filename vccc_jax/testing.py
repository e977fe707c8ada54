"""pytest helpers: the exact checks of ``vccc verify --target`` inside your own test suite.

    from vccc_jax.testing import assert_unbiased_target, assert_unbiased_actor

    def test_my_target_is_unbiased():
        assert_unbiased_target(my_target)                     # E[Y|s] = T_pi Vbar, V* = V^pi

    def test_my_clipped_vtrace():
        assert_unbiased_target(my_vtrace, claim="clipped:2")  # V^pitilde, rho_bar = 2

    def test_my_ppo_loss():
        assert_unbiased_actor(my_loss, claim="clipped:2", kwargs={"kind": "truncate"})

Each runs :func:`vccc_jax.verify.check` (float64, the verify problems; ``quick`` groups
by default) and raises ``AssertionError`` with the full report -- the failing rows, the
MDPs where they fail and the diagnosis -- when a row fails; it returns the report otherwise.
A target that cannot be checked (import, jit, shape, impurity) raises
:class:`vccc_jax.verify.TargetError`.
"""

from __future__ import annotations

from typing import Optional

from vccc_jax.verify import Report, check
from vccc_jax.verify.contracts import infer_kind, load_target


def _assert(report: Report) -> Report:
    if not report.passed:
        raise AssertionError("\n" + report.format())
    return report


def assert_unbiased_target(fn, *, claim: str = "vpi", kind: Optional[str] = None, kwargs=(), quick: bool = True,
                           **check_kw) -> Report:
    """Assert that a critic target (one-step or sequence) meets its claim exactly.

    Args:
      fn: the target (``one_step(t, extras, clip)``, library style, or a ``sequence`` row),
        or a ``"module:function"`` string.
      claim: ``vpi`` | ``clipped:c`` | ``masked:c`` | ``any``.
      kind: ``one-step`` | ``sequence`` (None: inferred; an actor is refused).
      kwargs, quick, **check_kw: passed to :func:`vccc_jax.verify.check`.
    """
    obj = load_target(fn) if isinstance(fn, str) else fn
    kind = kind or infer_kind(obj)
    if kind == "actor":
        raise TypeError("assert_unbiased_target checks critic targets; use assert_unbiased_actor")
    return _assert(check(obj, kind=kind, claim=claim, kwargs=kwargs, quick=quick, **check_kw))


def assert_unbiased_actor(fn, *, claim: str = "vpi", kwargs=(), quick: bool = True, **check_kw) -> Report:
    """Assert that an actor weight ``w(log_rhos, advantages, ...)`` or a ``policy_loss``-style
    loss has the claimed expected update exactly: Eq 12 (``vpi``) or the score-centred Eq 13
    (``clipped:c`` / ``masked:c``), for a target-policy critic and for any state baseline."""
    return _assert(check(fn, kind="actor", claim=claim, kwargs=kwargs, quick=quick, **check_kw))


__all__ = ["assert_unbiased_actor", "assert_unbiased_target"]
