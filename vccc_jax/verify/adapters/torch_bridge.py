"""The PyTorch bridge: a torch loss, unchanged, as a JAX function ``vccc verify`` can check.

A loss-shaped library function (verl's ``compute_policy_loss_*``, AReaL's
``ppo_actor_loss_fn``) enters the actor contract as ``loss(log_pi, log_mu, advantages)``:
the inputs come from JAX as float64 NumPy arrays (:func:`host_loss`, a
``jax.pure_callback``), a host function ``value_and_grad(log_pi, log_mu, advantages) ->
(loss, d loss / d log_pi)`` computes the loss and its gradient (:func:`torch_value_and_grad`:
torch float64 tensors, ``loss.backward()``), and a ``jax.custom_vjp`` hands that gradient
back, so the actor weight the verifier reads is exactly -d loss / d log_prob by autograd.
Only d / d log_pi is returned (log_mu and the advantages are data: their cotangents are 0).
Under ``jax.vmap`` the callback runs once per batch element (``vmap_method="sequential"``).

A critic target enters the sequence contract the same way without a gradient
(:func:`host_sequence`): ``fn(log_rhos, discounts, rewards, values, bootstrap_value)`` in
NumPy, returning ``vs`` (the target is a constant: its gradient is 0, as the contract asks).

:mod:`vccc_jax.verify.adapters.verl` and :mod:`.areal` build their host functions on top;
``tests/verify/test_adapters.py`` checks this contract code on a NumPy stand-in with verl's
signature (no torch needed).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def host_loss(value_and_grad: Callable) -> Callable:
    """``loss(log_pi, log_mu, advantages) -> scalar`` (JAX) from a host ``value_and_grad``."""

    def call(lp, lm, a):
        out = (jax.ShapeDtypeStruct((), lp.dtype), jax.ShapeDtypeStruct(lp.shape, lp.dtype))

        def host(x, y, z):
            val, grad = value_and_grad(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                       np.asarray(z, np.float64))
            return np.asarray(val, x.dtype), np.asarray(grad, x.dtype).reshape(x.shape)

        return jax.pure_callback(host, out, lp, lm, a, vmap_method="sequential")

    @jax.custom_vjp
    def loss(log_pi, log_mu, advantages):
        return call(log_pi, log_mu, advantages)[0]

    def fwd(log_pi, log_mu, advantages):
        val, grad = call(log_pi, log_mu, advantages)
        return val, (grad, log_mu, advantages)

    def bwd(res, ct):
        grad, log_mu, advantages = res
        return ct * grad, jnp.zeros_like(log_mu), jnp.zeros_like(advantages)

    loss.defvjp(fwd, bwd)
    return loss


def host_sequence(fn: Callable) -> Callable:
    """A sequence target ``(log_rhos, discounts, rewards, values, bootstrap_value) -> vs`` (JAX)
    from a NumPy ``fn`` of the same arguments (a constant: zero gradient)."""

    def target(log_rhos, discounts, rewards, values, bootstrap_value):
        args = [jax.lax.stop_gradient(x) for x in (log_rhos, discounts, rewards, values, bootstrap_value)]

        def host(*xs):
            return np.asarray(fn(*[np.asarray(x, np.float64) for x in xs]), xs[0].dtype).reshape(xs[0].shape)

        return jax.pure_callback(host, jax.ShapeDtypeStruct(log_rhos.shape, log_rhos.dtype), *args,
                                 vmap_method="sequential")

    return target


def torch_value_and_grad(loss_of: Callable) -> Callable:
    """Host ``(log_pi, log_mu, adv) -> (loss, d loss / d log_pi)`` where ``loss_of(torch,
    log_pi, log_mu, adv)`` builds the library call on float64 tensors (log_pi requires grad)."""
    import torch

    def vg(lp, lm, a):
        x = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
        loss = loss_of(torch, x, torch.tensor(lm, dtype=torch.float64), torch.tensor(a, dtype=torch.float64))
        loss.backward()
        grad = x.grad if x.grad is not None else torch.zeros_like(x)
        return float(loss.detach()), grad.numpy()

    return vg


# ------------------------------------------------------------------ library source by path


def source_root() -> Path:
    """Where the audited libraries' wheels are unpacked (``make audit``): $VCCC_AUDIT_SRC or .audit/src."""
    return Path(os.environ.get("VCCC_AUDIT_SRC", ".audit/src"))


def package_dir(dist: str, version: str, package: str) -> Path:
    """The unpacked package folder of ``dist==version`` (ImportError naming ``make audit``)."""
    d = source_root() / f"{dist}-{version}" / package
    if not d.is_dir():
        raise ImportError(f"{dist} {version} source not found in {d.parent} (run: make audit)")
    return d


def stub_module(name: str, **attrs) -> types.ModuleType:
    """A module ``name`` in sys.modules with ``attrs`` (its parent packages created as needed),
    kept when a real one is already imported."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            mod = types.ModuleType(sub)
            mod.__path__ = []
            sys.modules[sub] = mod
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
    mod = sys.modules[name]
    for k, v in attrs.items():
        if not hasattr(mod, k):
            setattr(mod, k, v)
    return mod


def load_file(name: str, path: Path) -> types.ModuleType:
    """Import one source file by path as module ``name`` (its imports must resolve: stubs)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(stub_module(parent), child, mod)
    spec.loader.exec_module(mod)
    return mod


def functions_from(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """The named top-level functions of a source file, executed in ``namespace`` (for a module
    whose other imports are heavy: only these definitions are taken, unchanged)."""
    import ast

    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        raise ImportError(f"{path}: no function {sorted(missing)[0]}")
    for n in body:
        n.decorator_list = []
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec")
    exec(code, namespace)  # noqa: S102 -- the library's own definitions, unchanged
    return {k: namespace[k] for k in names}
