"""The function contracts under which ``vccc verify`` checks an estimator, library or user.

A user estimator is checked by the same machinery as a library row, so it enters through
the contracts the library already has (no new signatures):

- one-step critic target: the registry's ``one_step(t: Transitions, extras: TargetExtras,
  clip) -> Y`` (``estimators.registry``), or the plain library style ``fn(rewards,
  discounts, values, next_values, log_rhos, baseline=..., z=..., b_star=..., clip=...,
  **kw)`` of ``estimators.critic_targets`` (arguments are passed by name; any subset);
- multi-step critic target: the registry's ``sequence(seq: SequenceInputs, clip, options)
  -> vs | (vs, pg_advantages)``, or the library style ``fn(log_rhos, discounts, rewards,
  values, bootstrap_value, **kw)`` of ``estimators.vtrace`` (an output with ``.vs`` /
  ``.pg_advantages`` is read by name);
- actor: a weight ``w(log_rhos, advantages, ..., **params) -> w`` (the coefficient of
  A grad log pi: update = E_mu[w A grad log pi]), or a loss with the signature of
  ``estimators.actor.policy_loss(log_pi, log_mu, advantages, *, clip, centering, ...)``.

:class:`OneStepTarget`, :class:`SequenceTarget` and :class:`ActorTarget` wrap a function
under its contract (frozen dataclasses: equal wrappers hash equal, so a compiled graph that
takes them as static arguments is reused). :func:`preflight` runs a wrapped target on a
small probe eagerly and under ``jit`` and raises :class:`TargetError` (one line) when it
does not run, returns the wrong shape or dtype, is not pure, or is not elementwise /
batch-independent. :func:`load_target`, :func:`infer_kind` and :func:`parse_claim` turn the
command line into these objects.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.registry import CriticTarget, SequenceInputs, TargetExtras
from vccc_jax.estimators.types import Transitions

Array = chex.Array
sg = jax.lax.stop_gradient

KINDS = ("one-step", "sequence", "actor")
INF = math.inf


class TargetError(ValueError):
    """A target that cannot be checked (spec, signature, jit error, shape, impurity).

    The message is one line naming the problem (the command prints it and exits 2).
    """


def in_graph(what: str, graph, *args):
    """``graph(*args)`` (a verify graph that traces the targets ``what``); an exception raised
    while tracing, compiling or running it -- a target that passed :func:`preflight` but fails
    on the verify problems' shapes -- becomes one :class:`TargetError` line."""
    try:
        return graph(*args)
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- the targets' error, as one line
        raise TargetError(f"{what} failed inside the verify graph: {_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# ------------------------------------------------------------------------------ claims


@dataclasses.dataclass(frozen=True)
class Claim:
    """What the estimator claims (``--claim``).

    ``vpi``: E[Y | s] = T_pi Vbar and fixed point V^pi (actor: Eq 12). ``clipped:c`` /
    ``masked:c``: the clipped target of Eq 10 with w = min(rho, c) / rho 1[1/c <= rho <= c],
    E[Y | s] = Vbar + Z (T_pitilde Vbar - Vbar), fixed point V^pitilde (actor: the centred
    update of Eq 13 with that w). ``any``: no claim; the estimator passes when its exact
    mean matches one of the closed forms the verifier knows (the diagnosis says which).
    The clip passed to the function is c for clipped / masked claims, +inf otherwise.
    """

    name: str = "vpi"
    c: float = INF

    @property
    def weight_kind(self) -> str:
        return {"clipped": "truncate", "masked": "mask"}.get(self.name, "ratio")

    @property
    def clip(self) -> float:
        return self.c if self.name in ("clipped", "masked") else INF

    @property
    def label(self) -> str:
        if self.name in ("clipped", "masked"):
            return f"{self.name}:{self.c:g}"
        return self.name

    @property
    def value_short(self) -> str:
        return "V^pit" if self.name in ("clipped", "masked") else "V^pi"

    @property
    def value_label(self) -> str:
        if self.name in ("clipped", "masked"):
            return f"V^pitilde ({self.weight_kind} c={self.c:g})"
        return "V^pi"


def parse_claim(text: str) -> Claim:
    """``vpi`` | ``clipped:c`` | ``masked:c`` | ``any`` -> :class:`Claim` (ValueError names --claim)."""
    name, _, arg = str(text).partition(":")
    if name in ("vpi", "any") and not arg:
        return Claim(name)
    if name in ("clipped", "masked") and arg:
        try:
            c = float(arg)
        except ValueError:
            c = float("nan")
        if not (c > 0 and math.isfinite(c)) or (name == "masked" and c < 1):
            raise ValueError(f"--claim {text!r}: c must be a finite number > 0 (>= 1 for masked)")
        return Claim(name, c)
    raise ValueError(f"--claim must be vpi, clipped:c, masked:c or any, got {text!r}")


# --------------------------------------------------------------------- loading, kind


def load_target(spec: str) -> Any:
    """The object named by ``module:attr[.attr...]`` or ``path/to/file.py:attr``.

    Attribute paths may index mappings (``vccc_jax.estimators:CRITIC_TARGETS.vccc``).
    Raises :class:`TargetError` with one line naming what could not be found.
    """
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise TargetError(f"--target must be module:function or file.py:function, got {spec!r}")
    adapted = _adapted(spec)
    if adapted is not None:
        return adapted
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise TargetError(f"--target {spec!r}: no file {mod_name}")
            name = f"_vccc_user_{abs(hash(str(path.resolve())))}"
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            loader.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # like `python -m`: the current folder
            module = importlib.import_module(mod_name)
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- any import error is the user's: one line
        raise TargetError(f"--target {spec!r}: cannot import {mod_name} ({_one_line(e)})") from None
    obj = module
    for part in attr.split("."):
        if isinstance(obj, Mapping) and part in obj:
            obj = obj[part]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            raise TargetError(f"--target {spec!r}: {mod_name} has no {attr}")
    if not callable(obj) and not isinstance(obj, CriticTarget):
        raise TargetError(f"--target {spec!r} is not a function")
    return obj


def _adapted(spec: str):
    """The contract-style function of a library adapter (``rlax:vtrace``, ``verl:vanilla``,
    ...; :mod:`vccc_jax.verify.adapters`), or None when ``spec`` names no adapted library."""
    from vccc_jax.verify import adapters

    try:
        adapter = adapters.lookup(spec)
        return None if adapter is None else adapter.build()
    except KeyError as e:
        raise TargetError(f"--target {e.args[0]}") from None
    except ImportError as e:
        raise TargetError(f"--target {spec!r}: the library is not installed ({_one_line(e)}; "
                          "pip install -e '.[audit]')") from None


def _params(fn) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        raise TargetError(f"cannot read the signature of {_name(fn)}") from None


def _name(fn) -> str:
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))


def _annotation(p: inspect.Parameter) -> str:
    a = p.annotation
    return a if isinstance(a, str) else getattr(a, "__name__", "")


def infer_kind(obj) -> str:
    """``one-step`` | ``sequence`` | ``actor`` from a registry row or a signature."""
    if isinstance(obj, CriticTarget):
        return "sequence" if obj.multi_step else "one-step"
    params = _params(obj)
    names = list(params)
    first = params[names[0]] if names else None
    if first is not None and (_annotation(first).endswith("Transitions") or first.name in ("t", "transitions")):
        return "one-step"
    if first is not None and (_annotation(first).endswith("SequenceInputs") or first.name in ("seq", "sequence")):
        return "sequence"
    if "next_values" in params:
        return "one-step"
    if "bootstrap_value" in params:
        return "sequence"
    if "log_rhos" in params or ("log_pi" in params and "log_mu" in params):
        return "actor"
    raise TargetError(f"cannot infer --kind from the signature of {_name(obj)}{inspect.signature(obj)}; "
                      "give --kind one-step|sequence|actor")


def _library_kwargs(fn, available: dict, kwargs: tuple, what: str) -> dict:
    """Keyword arguments for a library-style call: every parameter whose name is in
    ``available`` (or given in ``kwargs``); TargetError for a required one we cannot supply."""
    params = _params(fn)
    extra = dict(kwargs)
    out = {}
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in extra:
            out[name] = extra.pop(name)
        elif name in available and available[name] is not None:
            out[name] = available[name]
        elif p.default is p.empty:
            raise TargetError(f"{what} {_name(fn)}: cannot supply required argument {name!r} "
                              f"(known: {', '.join(available)}; pass others with --kw {name}=VALUE)")
    if extra:
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            out.update(extra)
        else:
            raise TargetError(f"{what} {_name(fn)} has no argument {sorted(extra)[0]!r} (--kw)")
    return out


def _style(fn, registry_first: tuple[str, ...]) -> str:
    """"registry" when the first parameter is the contract's record, else "library"."""
    if isinstance(fn, CriticTarget):
        return "registry"
    params = list(_params(fn).values())
    if params and (params[0].name in registry_first or _annotation(params[0]) in ("Transitions", "SequenceInputs")):
        return "registry"
    return "library"


# ------------------------------------------------------------------------ one-step


@dataclasses.dataclass(frozen=True)
class OneStepTarget:
    """A one-step critic target under the registry contract, evaluated on verify cells.

    ``baseline`` / ``z``: the :class:`~vccc_jax.verify.cells.Cells` fields passed as the
    extras' baseline (None: not passed, b = Vbar) and Z(s). ``kwargs``: extra keyword
    arguments of a library-style function (pairs).
    """

    fn: Callable
    clip: float = INF
    kwargs: tuple = ()
    baseline: Optional[str] = "baseline"
    z: str = "z_truncate"

    @property
    def style(self) -> str:
        return _style(self.fn, ("t", "transitions"))

    def call(self, t: Transitions, e: TargetExtras) -> Array:
        fn = self.fn
        if isinstance(fn, CriticTarget):
            return fn.one_step(t, e, jnp.asarray(self.clip, t.rewards.dtype))
        if self.style == "registry":
            return fn(t, e, self.clip)
        available = dict(t._asdict(), baseline=e.baseline, z=e.z, b_star=e.b_star, clip=self.clip)
        return fn(**_library_kwargs(fn, available, self.kwargs, "one-step target"))

    def __call__(self, cells) -> Array:
        t = Transitions(cells.rewards, cells.discounts, cells.values, cells.next_values, cells.log_rhos)
        e = TargetExtras(baseline=None if self.baseline is None else getattr(cells, self.baseline),
                         z=getattr(cells, self.z), b_star=cells.baseline_star)
        return self.call(t, e)


# ------------------------------------------------------------------------ sequence


@dataclasses.dataclass(frozen=True)
class SequenceTarget:
    """A multi-step critic target: ``seq -> (vs [T, ...], pg_advantages or None)``."""

    fn: Callable
    clip: float = INF
    kwargs: tuple = ()

    @property
    def style(self) -> str:
        return _style(self.fn, ("seq", "sequence"))

    def __call__(self, seq: SequenceInputs):
        fn = self.fn
        if isinstance(fn, CriticTarget):
            if fn.sequence is None:
                raise TargetError(f"registry row {fn.name!r} has no shared sequence function "
                                  "(check its estimator, e.g. vccc_jax.estimators:vtrace)")
            out = fn.sequence(seq, jnp.asarray(self.clip, seq.rewards.dtype), dict(self.kwargs))
        elif self.style == "registry":
            out = fn(seq, self.clip, dict(self.kwargs))
        else:
            out = fn(**_library_kwargs(fn, dict(seq._asdict(), clip=self.clip), self.kwargs, "sequence target"))
        if hasattr(out, "vs"):
            return out.vs, getattr(out, "pg_advantages", None)
        if isinstance(out, tuple) and len(out) == 2:
            return out
        return out, None


# --------------------------------------------------------------------------- actor


@dataclasses.dataclass(frozen=True)
class ActorTarget:
    """An actor weight or loss, as a per-token loss whose gradient is the update.

    Weight style: loss = -mean(sg(w) r A) with r = exp(log_pi - sg(log_pi)) and
    w = fn(log_rhos, advantages, clip=..., **kw) (arguments by name), so grad = -E[w A u].
    Loss style: ``fn(log_pi, log_mu, advantages, clip=..., centering=..., **kw)`` as is.
    ``centering`` (per token, with gradient) is passed when the loss takes it.
    """

    fn: Callable
    clip: float = INF
    kwargs: tuple = ()

    @property
    def style(self) -> str:
        params = _params(self.fn)
        return "loss" if "log_pi" in params and "log_mu" in params else "weight"

    @property
    def takes_centering(self) -> bool:
        return self.style == "loss" and "centering" in _params(self.fn)

    def __call__(self, log_pi: Array, log_mu: Array, advantages: Array, centering: Optional[Array] = None):
        if self.style == "loss":
            available = dict(log_pi=log_pi, log_mu=log_mu, advantages=advantages, clip=self.clip,
                             centering=centering)
            return self.fn(**_library_kwargs(self.fn, available, self.kwargs, "actor loss"))
        available = dict(log_rhos=sg(log_pi) - log_mu, advantages=sg(advantages), clip=self.clip)
        kw = _library_kwargs(self.fn, available, self.kwargs, "actor weight")
        if "clip" in getattr(self.fn, "param_names", ()) and "clip" not in kw:
            kw["clip"] = self.clip  # a row of the actor table (``weight(..., **params)``) with a clip
        w = self.fn(**kw)
        w = jnp.broadcast_to(jnp.asarray(w), log_pi.shape) if jnp.ndim(w) == 0 else w
        if jnp.shape(w) != jnp.shape(log_pi):
            raise TargetError(f"actor weight {_name(self.fn)} returned shape {jnp.shape(w)} for log_rhos of "
                              f"shape {jnp.shape(log_pi)} (a weight is elementwise)")
        return -jnp.mean(sg(w) * jnp.exp(log_pi - sg(log_pi)) * sg(advantages))


def wrap(obj, kind: str, claim: Claim, kwargs: tuple = ()):
    """The contract wrapper of ``obj`` for ``kind`` (clip from the claim)."""
    if kind not in KINDS:
        raise TargetError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if isinstance(obj, CriticTarget) and kind != infer_kind(obj):
        raise TargetError(f"registry row {obj.name!r} is a {infer_kind(obj)} target, not {kind}")
    if kind == "one-step":
        return OneStepTarget(obj, claim.clip, kwargs, z="z_mask" if claim.weight_kind == "mask" else "z_truncate")
    if kind == "sequence":
        return SequenceTarget(obj, claim.clip, kwargs)
    return ActorTarget(obj, claim.clip, kwargs)


# ------------------------------------------------------------------------- preflight


def _probe(shape, key: int = 0):
    """Random float64 inputs of ``shape``: (rewards, discounts, values, next_values, log_rhos,
    baseline, z, b_star)."""
    rng = np.random.default_rng(key)
    x = [rng.normal(size=shape), rng.uniform(0.5, 1.0, shape), 3 * rng.normal(size=shape),
         3 * rng.normal(size=shape), rng.uniform(-1.0, 1.0, shape), 5 * rng.normal(size=shape),
         rng.uniform(0.5, 1.0, shape), rng.normal(size=shape)]
    return [jnp.asarray(v, jnp.float64) for v in x]


def _run(what: str, f, *args):
    try:
        return f(*args)
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's error, as one line
        raise TargetError(f"{what} raised {_one_line(e)}") from None


def _leaves(out) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]


def _compare(what: str, a, b, problem: str) -> None:
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb) or any(x.shape != y.shape for x, y in zip(la, lb)):
        raise TargetError(f"{what} {problem}: the outputs differ in structure")
    for x, y in zip(la, lb):
        if not np.allclose(x, y, rtol=1e-9, atol=1e-12, equal_nan=True):
            diff = float(np.nanmax(np.abs(x - y)))
            raise TargetError(f"{what} {problem} (max difference {diff:.3g})")


def _check_outputs(what: str, out, shape) -> None:
    for x in _leaves(out):
        if x.shape != tuple(shape):
            raise TargetError(f"{what} returned shape {x.shape} for inputs of shape {tuple(shape)}")
        if not np.issubdtype(x.dtype, np.floating):
            raise TargetError(f"{what} returned dtype {x.dtype}, not a float")
        if x.dtype != np.float64:
            raise TargetError(f"{what} returned {x.dtype} for float64 inputs (the exact checks need float64: "
                              "do not hard-code a dtype)")
        if not np.all(np.isfinite(x)):
            raise TargetError(f"{what} returned non-finite values on finite inputs")


def _traced(what: str, f, args, sliced: Callable, slice_out: Callable, slice_problem: str):
    """Three traces of ``f`` in one jitted call: on the inputs twice (a Python side effect or
    a random number drawn while tracing makes the two differ: not pure) and on a slice of the
    batch (the contract's locality). Returns (the first output, the comparison to run once
    the caller has checked that output's shape)."""
    out, again, part = _run(f"{what} under jax.jit", jax.jit(lambda *a: (f(*a), f(*a), f(*sliced(a)))), *args)
    return out, lambda: (_compare(what, out, again, "is not pure: two traces with the same inputs differ"),
                         _compare(what, slice_out(out), part, slice_problem))


def preflight(target) -> None:
    """Run ``target`` (a contract wrapper) on a small float64 probe; :class:`TargetError` when it
    cannot be checked. Checks: it runs eagerly and under jit, returns float64 arrays of the
    contract's shape, is pure (two calls, jit vs eager) and elementwise (one-step, actor
    weight) or batch-independent (sequence: trajectories do not mix)."""
    with jax.enable_x64(True):
        if isinstance(target, OneStepTarget):
            _preflight_one_step(target)
        elif isinstance(target, SequenceTarget):
            _preflight_sequence(target)
        elif isinstance(target, ActorTarget):
            _preflight_actor(target)
        else:
            raise TargetError(f"not a contract wrapper: {target!r}")


def _preflight_one_step(target: OneStepTarget) -> None:
    what = f"one-step target {_name(target.fn)}"
    shape = (6, 3)
    r, d, v, nv, lr, b, z, bs = _probe(shape)

    def f(r, d, v, nv, lr, b, z, bs):
        return target.call(Transitions(r, d, v, nv, lr),
                           TargetExtras(baseline=b if target.baseline else None, z=z, b_star=bs))

    args = (r, d, v, nv, lr, b, z, bs)
    out, compare = _traced(what, f, args, lambda a: [x[1:4, :2] for x in a], lambda y: y[1:4, :2],
                           "is not elementwise: Y at a transition depends on other transitions (one-step contract)")
    _check_outputs(what, out, shape)
    compare()


def _preflight_sequence(target: SequenceTarget) -> None:
    what = f"sequence target {_name(target.fn)}"
    T, B = 4, 3
    r, d, v, _, lr, boot, *_ = _probe((T, B), key=1)

    def f(lr, d, r, v, boot):
        vs, pg = target(SequenceInputs(log_rhos=lr, discounts=d, rewards=r, values=v, bootstrap_value=boot))
        return vs if pg is None else (vs, pg)

    args = (lr, d, r, v, boot[0])
    out, compare = _traced(what, f, args, lambda a: [x[..., :2] for x in a],
                           lambda y: jax.tree_util.tree_map(lambda x: x[:, :2], y),
                           "mixes trajectories: the targets of one trajectory depend on another (batch axis)")
    _check_outputs(what, out, (T, B))
    compare()


def _preflight_actor(target: ActorTarget) -> None:
    what = f"actor {target.style} {_name(target.fn)}"
    n = 8
    _, _, adv, _, lr, *_ = _probe((n,), key=2)
    log_mu = jnp.log(jnp.linspace(0.1, 0.9, n))
    log_pi = jnp.minimum(log_mu + lr, -1e-3)
    cen = jnp.zeros((n,)) if target.takes_centering else None

    def per_token_grads(lp, lm, a, c):
        """d loss / d log_pi, times the token count (the per-token coefficient)."""
        return lp.shape[0] * jax.grad(lambda x: target(x, lm, a, c))(lp)

    loss = jax.eval_shape(lambda *a: _run(what, target, *a), log_pi, log_mu, adv, cen)
    if loss.shape != () or not np.issubdtype(loss.dtype, np.floating):
        raise TargetError(f"{what} returned shape {loss.shape}: an actor loss is a scalar (the mean over tokens)")
    args = (log_pi, log_mu, adv, cen)
    out, compare = _traced(f"jax.grad of {what}", per_token_grads, args,
                           lambda a: [None if x is None else x[:3] for x in a], lambda y: y[:3],
                           "is not a per-token mean: a token's gradient depends on the other tokens")
    _check_outputs(what, out, (n,))
    compare()
