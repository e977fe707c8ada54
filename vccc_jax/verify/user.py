"""Bring your own estimator: :func:`check` verifies a user's critic target or actor exactly.

    from vccc_jax.verify import check
    print(check(my_target))                       # kind inferred from the signature
    print(check(my_vtrace, claim="clipped:1"))    # a multi-step target, V^pitilde claimed

A user function is checked by the machinery that checks the library: the same random MDP
groups and keys as ``vccc verify`` (:func:`runner.group_keys`), the same function contracts
(:mod:`.contracts`: the registries' one-step and sequence signatures, an actor weight or a
``policy_loss``-style loss) and the same rows (:mod:`.targets` for one-step targets). Per
kind:

- ``one-step`` (:mod:`.user_one_step`): E[Y | s] on every version's enumerated (s, a, s')
  cells and on the replay mixture vs the claim, the fixed point vs V^pi / V^pitilde,
  Var(Y | s), stop-gradient (a warning unless ``loss_ready``), sampled z-scores and KS;
- ``sequence`` (:mod:`.user_sequence`): all short trajectories enumerated: E[vs_t | prefix]
  at Vbar = the claimed value, Markov in the prefix, the fixed point, variance,
  stop-gradient, pg advantages, sampled z-scores;
- ``actor`` (:mod:`.user_actor`): the expected update in parameter space vs Eq 12 (vpi) or
  the centred Eq 13 at c, for a target-policy critic and for an arbitrary baseline (Eq 2),
  cosine and relative bias per MDP, sampled z-scores.

When a row fails, :mod:`.diagnose` matches the exact bias against the closed forms of the
known biases by least squares and names the one it is. A :class:`Report` is the rows, the
diagnosis and ``passed``; ``str(report)`` is the table. Bad targets (import, signature, jit
errors, shapes, impurity) raise :class:`~vccc_jax.verify.contracts.TargetError` (one line)
before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional, Sequence, Union

import jax
import numpy as np

from vccc_jax.verify import contracts, group, user_one_step
from vccc_jax.verify.contracts import (
    Claim,
    TargetError,
    infer_kind,
    load_target,
    parse_claim,
    preflight,
    wrap,
)
from vccc_jax.verify.problems import default_groups
from vccc_jax.verify.report import Row, format_table
from vccc_jax.verify.runner import group_keys, make_problems_jit


@dataclasses.dataclass
class Report:
    """The result of :func:`check`: rows, diagnosis lines and whether every row passed."""

    target: str
    kind: str
    claim: str
    rows: list[Row]
    diagnosis: list[str]
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def warnings(self) -> list[str]:
        """Diagnosis lines that warn without failing (gradient through a target)."""
        return [d for d in self.diagnosis if d.startswith("warning:")]

    def format(self) -> str:
        head = f"{self.target} ({self.kind}, claim {self.claim}): {'PASS' if self.passed else 'FAIL'}"
        lines = [head, "", format_table(self.rows)]
        if self.diagnosis:
            lines += ["", "DIAGNOSIS"] + [f"  {d}" for d in self.diagnosis]
        return "\n".join(lines)

    __str__ = format

    def as_dict(self) -> dict:
        """JSON-safe dict (NaN -> None, an infinite tolerance -> "inf")."""
        rows = [{k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in r.as_dict().items()}
                for r in self.rows]
        return {"target": self.target, "kind": self.kind, "claim": self.claim, "passed": self.passed,
                "rows": rows, "diagnosis": list(self.diagnosis), "warnings": self.warnings, "seconds": self.seconds}


@dataclasses.dataclass(frozen=True)
class Target:
    """One estimator to check: a function (or ``module:function`` string), its kind (None:
    inferred), its claim and extra keyword arguments (pairs or a dict)."""

    fn: Any
    kind: Optional[str] = None
    claim: Union[str, Claim] = "vpi"
    kwargs: Any = ()
    name: Optional[str] = None

    def resolve(self) -> tuple[str, str, Claim, Any]:
        """(name, kind, claim, contract wrapper); TargetError / ValueError on bad input."""
        fn = load_target(self.fn) if isinstance(self.fn, str) else self.fn
        kind = self.kind or ("group" if group.is_group(fn) else infer_kind(fn))
        claim = self.claim if isinstance(self.claim, Claim) else parse_claim(self.claim)
        kwargs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in dict(self.kwargs).items()))
        name = self.name or getattr(fn, "__name__", None) or getattr(fn, "name", "target")
        if kind == "group":  # no JAX contract wrapper: verify.group calls it on NumPy groups
            return name, kind, claim, (lambda *a: fn(*a, **dict(kwargs))) if kwargs else fn
        return name, kind, claim, wrap(fn, kind, claim, kwargs)


def _groups(quick: bool, num_mdps: Optional[int], groups):
    if groups is not None:
        return tuple(groups)
    return default_groups((96 if quick else 256) if num_mdps is None else num_mdps, quick)


def check_all(targets: Sequence[Union[Target, Any]], *, quick: bool = False, key=None,
              num_mdps: Optional[int] = None, num_samples: Optional[int] = None, groups=None,
              loss_ready: bool = False, make=None) -> list[Report]:
    """:func:`check` for several targets; targets of one kind share one compiled graph per group.

    Args:
      targets: :class:`Target` s or plain functions (claim ``vpi``, kind inferred).
      quick, key, num_mdps, num_samples: as ``run_verify`` (the same problems for the same key).
      groups: the problem groups (default: ``problems.default_groups``, as ``vccc verify``).
      loss_ready: a critic target must also be a constant (stop-gradient-ed) that a loss can
        regress on as is; gradient into its values, ratios or baselines then fails, otherwise it
        is a warning (it does not change the mean the other rows check).
      make: ``make(key, group) -> Problem`` batch (default ``runner.make_problems_jit``; the
        field audit re-sets the behaviour to a lag, :mod:`.lags`).
    """
    targets = [t if isinstance(t, Target) else Target(t) for t in targets]
    resolved = [t.resolve() for t in targets]
    for _, kind, _, wrapped in resolved:
        if kind != "group":
            preflight(wrapped)
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(0) if key is None else key
        num_samples = (2048 if quick else 4096) if num_samples is None else num_samples
        groups = _groups(quick, num_mdps, groups)
        keys = group_keys(key, groups)
        reports: list[Optional[Report]] = [None] * len(resolved)
        by_kind: dict[str, list[int]] = {}
        for i, (_, kind, _, _) in enumerate(resolved):
            by_kind.setdefault(kind, []).append(i)
        for kind, idx in by_kind.items():
            t0 = time.perf_counter()
            results = _run_kind(kind, [resolved[i] for i in idx], groups, keys, num_samples, loss_ready,
                                make or make_problems_jit)
            seconds = (time.perf_counter() - t0) / len(idx)
            for i, (rows, diagnosis) in zip(idx, results):
                name, kind_, claim, _ = resolved[i]
                label = targets[i].fn if isinstance(targets[i].fn, str) else name
                reports[i] = Report(label, kind_, claim.label, rows, diagnosis, seconds)
    return reports


def _run_kind(kind: str, items: list, groups, keys, num_samples: int, loss_ready: bool, make):
    if kind == "group":  # the lag (or law) of ``make`` (verify.lags.maker), else on-policy
        return [group.report(fn, name, getattr(make, "lag", 0)) for name, _, _, fn in items]
    if kind == "one-step":
        if getattr(make, "law", None) is not None:
            raise TargetError("--lag-law applies to actor, sequence and group targets; a one-step target takes "
                              "one lag: --lag L")
        users = tuple(user_one_step.UserOneStep(name, wrapped, claim) for name, _, claim, wrapped in items)
        outs = []
        for g, (kp, ks) in zip(groups, keys):
            p = make(kp, g)
            out = contracts.in_graph(", ".join(u.name for u in users), user_one_step.GRAPH,
                                     jax.random.split(ks, g.num_mdps), p, users, num_samples)
            outs.append(jax.tree_util.tree_map(np.asarray, out))
        return user_one_step.user_reports(users, outs, groups, num_samples, loss_ready)
    if kind == "sequence":
        from vccc_jax.verify import user_sequence, user_sequence_law
        graph = user_sequence_law.GRAPH if getattr(make, "law", None) is not None else None
        return user_sequence.run(items, groups, keys, num_samples, loss_ready, make, graph)
    from vccc_jax.verify import user_actor
    return user_actor.run(items, groups, keys, num_samples, make)


def check(target, *, kind: Optional[str] = None, claim: Union[str, Claim] = "vpi", kwargs=(),
          quick: bool = False, key=None, num_mdps: Optional[int] = None, num_samples: Optional[int] = None,
          groups=None, loss_ready: bool = False, make=None) -> Report:
    """Verify one estimator exactly (see the module docstring); returns a :class:`Report`.

    Args:
      target: a function, a registry row, or a ``"module:function"`` / ``"file.py:function"`` string.
      kind: ``one-step`` | ``sequence`` | ``actor`` (None: inferred from the signature).
      claim: ``vpi`` | ``clipped:c`` | ``masked:c`` | ``any`` (what the estimator claims).
      kwargs: extra keyword arguments for the function (options of a registry sequence).
      quick, key, num_mdps, num_samples, groups, loss_ready, make: as :func:`check_all`.

    Raises:
      TargetError: the target cannot be checked (one line naming the problem).
      ValueError: a bad claim or kind.
    """
    return check_all([Target(target, kind, claim, kwargs)], quick=quick, key=key, num_mdps=num_mdps,
                     num_samples=num_samples, groups=groups, loss_ready=loss_ready, make=make)[0]


__all__ = ["Report", "Target", "TargetError", "check", "check_all"]
