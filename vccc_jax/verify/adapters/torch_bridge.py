"""The PyTorch bridge: a torch loss, unchanged, as a JAX function ``vccc verify`` can check.

A loss-shaped library function (verl's ``compute_policy_loss_*``, AReaL's
``ppo_actor_loss_fn``) enters the actor contract as ``loss(log_pi, log_mu, advantages)``:
the inputs come from JAX as float64 NumPy arrays (:func:`host_loss`, a
``jax.pure_callback``), a host function ``value_and_grad(log_pi, log_mu, advantages) ->
(loss, d loss / d log_pi)`` computes the loss and its gradient (:func:`torch_value_and_grad`:
torch float64 tensors, ``loss.backward()``), and a ``jax.custom_vjp`` hands that gradient
back, so the actor weight the verifier reads is exactly -d loss / d log_prob by autograd.
Only d / d log_pi is returned (log_mu and the advantages are data: their cotangents are 0).
Under ``jax.vmap`` the callback receives the batched arrays and loops over the batch on the
host in NumPy (``vmap_method="broadcast_all"``; JAX's "sequential" rule stacks the results
with jnp on the callback's thread, where a caller's ``jax.enable_x64`` does not hold).

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
import threading
import types
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def require_x64() -> None:
    """Turn JAX's float64 mode on for the whole process.

    A host callback runs on one of XLA's threads, where the caller's thread-local
    ``jax.enable_x64(True)`` does not hold: JAX would canonicalise the callback's float64
    inputs and outputs to float32 there (``jax._src.callback``). The bridged functions are
    checked in float64 only, so building one (``host_loss`` / ``host_sequence``) sets the flag
    globally for the process (a ``vccc verify`` run; tests restore it)."""
    jax.config.update("jax_enable_x64", True)


def host_loss(value_and_grad: Callable) -> Callable:
    """``loss(log_pi, log_mu, advantages) -> scalar`` (JAX) from a host ``value_and_grad``
    (sets float64 mode: :func:`require_x64`)."""
    require_x64()

    def call(lp, lm, a):
        out = (jax.ShapeDtypeStruct((), lp.dtype), jax.ShapeDtypeStruct(lp.shape, lp.dtype))
        dtype, nd = np.dtype(lp.dtype), lp.ndim

        def host(x, y, z):
            batch = np.shape(x)[:np.ndim(x) - nd]
            vals, grads = np.zeros(batch, dtype), np.zeros(np.shape(x), dtype)
            for i in np.ndindex(batch):
                v, g = value_and_grad(np.asarray(x[i], np.float64), np.asarray(y[i], np.float64),
                                      np.asarray(z[i], np.float64))
                vals[i], grads[i] = v, np.reshape(g, np.shape(x[i]))
            return vals, grads

        return jax.pure_callback(host, out, lp, lm, a, vmap_method="broadcast_all")

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
    from a NumPy ``fn`` of the same arguments (a constant: zero gradient; :func:`require_x64`)."""
    require_x64()

    def target(log_rhos, discounts, rewards, values, bootstrap_value):
        args = [jax.lax.stop_gradient(x) for x in (log_rhos, discounts, rewards, values, bootstrap_value)]

        dtype, nd = np.dtype(log_rhos.dtype), log_rhos.ndim

        def host(*xs):
            batch = np.shape(xs[0])[:np.ndim(xs[0]) - nd]
            out = np.zeros(np.shape(xs[0]), dtype)
            for i in np.ndindex(batch):
                out[i] = np.reshape(fn(*[np.asarray(x[i], np.float64) for x in xs]), np.shape(out[i]))
            return out

        return jax.pure_callback(host, jax.ShapeDtypeStruct(log_rhos.shape, log_rhos.dtype), *args,
                                 vmap_method="broadcast_all")

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


_CASTS = threading.Lock()


def float32_casts(loss_of: Callable, promote: bool) -> Callable:
    """``loss_of(torch, ...)`` run under one process-wide lock; with ``promote`` its torch
    ``Tensor.float()`` casts return float64 while it runs: the precision re-run of a library
    function that casts to float32 on purpose (the same code, the casts made float64; the lock
    keeps a concurrent host callback of the unpromoted function from seeing the patch)."""
    def run(torch, *args):
        with _CASTS:
            if not promote:
                return loss_of(torch, *args)
            cast = torch.Tensor.float
            torch.Tensor.float = lambda self, *a, **k: self.double()
            try:
                return loss_of(torch, *args)
            finally:
                torch.Tensor.float = cast

    return run


class Float64Torch:
    """``torch`` with ``float32`` read as ``float64`` (the module global of a second copy of a
    library file whose checks assert float32 inputs: its precision re-run)."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, k):
        return self._torch.float64 if k == "float32" else getattr(self._torch, k)


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
