"""Adapters: another library's estimator, unchanged, under a ``vccc verify`` contract.

``vccc verify --target rlax:vtrace`` resolves ``rlax:vtrace`` here before it tries a Python
module (:func:`lookup`, called by :func:`~vccc_jax.verify.contracts.load_target`). Each
:class:`Adapter` names the library function it calls, the contract it is checked under
(``sequence`` critic target or ``actor`` loss), the claim the library makes for it at the
arguments the adapter passes (its defaults, stated in ``claims``), and a ``build`` that
returns a function in a contract's library style (``contracts.SequenceTarget`` /
``contracts.ActorTarget``), which converts the conventions (time-major, batch-free per
trajectory: ``jax.vmap`` over the batch; ``discount_t``, ``rho_tm1 = exp(log_rhos)``,
``v_tm1`` / ``v_t`` from ``values`` and ``bootstrap_value``; TD errors back to targets
``vs = v_tm1 + errors``; a loss's reduction kept as the library writes it). The library is
imported when ``build`` runs (extras: rlax in ``dev``; torch, verl and AReaL in ``audit``).

Libraries: :mod:`.rlax` (JAX), :mod:`.tunix` (JAX), :mod:`.verl` and :mod:`.areal` (PyTorch,
through :mod:`.torch_bridge`: inputs from JAX, the loss and -d loss / d log_prob computed
by torch autograd in a host callback).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

LIBRARIES = ("rlax", "tunix", "verl", "areal")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One library function under a verify contract.

    ``library``/``function``: the registry key ``library:function``; ``calls``: the library
    object called (dotted path); ``kind``: ``sequence`` | ``actor``; ``claim``: what the
    library claims at the adapter's arguments, as a ``--claim`` (``vpi``, ``clipped:c``);
    ``claims``: the same in words; ``build()``: the contract-style function (imports the
    library); ``version()``: the library's version; ``biased_by``: the design choice that
    makes it differ from V^pi / Eq 12 off-policy ("" when the design claims V^pi / Eq 12);
    ``default``: when the row is the library's default configuration, which default (the audit
    marks that row); ``float64``: a build of the same library code with its float32 casts made
    float64 (for a function that computes in float32 on purpose: the precision verdict compares
    the two); ``epsilon``: where an error above round-off on on-policy data comes from (a
    constant inside the library, not float32).
    """

    library: str
    function: str
    calls: str
    kind: str
    claim: str
    claims: str
    build: Callable[[], Callable]
    version: Callable[[], str]
    biased_by: str = ""
    default: str = ""
    float64: Optional[Callable[[], Callable]] = None
    epsilon: str = ""

    @property
    def key(self) -> str:
        return f"{self.library}:{self.function}"


def registry() -> dict[str, Adapter]:
    """Every adapter, keyed ``library:function`` (imports no library)."""
    from vccc_jax.verify.adapters import areal, rlax, tunix, verl

    out: dict[str, Adapter] = {}
    for mod in (rlax, tunix, verl, areal):
        for a in mod.ADAPTERS:
            if a.key in out:  # e.g. verl's gpg is a policy loss and an advantage estimator
                raise ValueError(f"two adapters named {a.key}")
            out[a.key] = a
    return out


def lookup(spec: str) -> Optional[Adapter]:
    """The adapter named by ``library:function`` (None when ``spec`` names no library of
    :data:`LIBRARIES`); KeyError with the known names when the library is ours but the
    function is not adapted."""
    lib, sep, fn = spec.partition(":")
    if not sep or lib not in LIBRARIES:
        return None
    table = registry()
    if spec not in table:
        known = ", ".join(k.split(":", 1)[1] for k in table if k.startswith(lib + ":"))
        raise KeyError(f"no adapter for {spec!r}; {lib} adapters: {known}")
    return table[spec]


__all__ = ["Adapter", "LIBRARIES", "lookup", "registry"]
