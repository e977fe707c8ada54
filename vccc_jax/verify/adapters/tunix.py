"""tunix (google/tunix, JAX LLM post-training) ``tunix/rl/algo_core.py``, unchanged.

``pip install google-tunix==0.1.7`` pulls transformers, datasets, tensorflow_datasets, grain,
kagglehub, numba, qwix ... (see docs/field_audit.md for the dry-run), so ``make audit``
unpacks the wheel (``pip download --no-deps``) into ``.audit/src`` and :func:`algo_core`
imports ``tunix/rl/algo_core.py`` by path: ``tunix.rl.function_registry`` is tunix's own file
(absl only), ``tunix.rl.common`` an empty stub (algo_core reads it only inside the policy
losses, which are not adapted: they take an ``nnx`` model and token ids and recompute the
log-probabilities, and ``grpo_loss_fn`` casts advantages and old log-probabilities to float32,
so no float64 contract can hold them).

Adapted: ``compute_gae_advantages(rewards, values, completion_mask, gamma, gae_lambda)``
(batch-major ``[bs, L]``, one gamma, next value 0 after the last token): the returns
``advantages + values`` as a sequence target, with the mapping of verl's GAE
(``adapters.verl._gae_returns``): gamma per trajectory (an array: tunix's jitted scan
broadcasts it over the batch), tokens after an episode's end masked, the bootstrap folded
into the last reward, masked tokens keep their value; lambda 1.0 (--kw gae_lambda=...).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from vccc_jax.verify.adapters import Adapter
from vccc_jax.verify.adapters import torch_bridge as tb

VERSION = "0.1.7"


@functools.lru_cache(maxsize=None)
def algo_core():
    root = tb.package_dir("google_tunix", VERSION, "tunix")
    tb.stub_module("tunix.rl.common")
    tb.load_file("tunix.rl.function_registry", root / "rl" / "function_registry.py")
    return tb.load_file("tunix.rl.algo_core", root / "rl" / "algo_core.py")


def compute_gae_advantages(log_rhos, discounts, rewards, values, bootstrap_value, gae_lambda=1.0):
    """tunix's GAE returns on the contract's time-major trajectories (see the module docstring)."""
    fn = algo_core().compute_gae_advantages
    T = rewards.shape[0]
    d, r, v = (x.reshape(T, -1).T for x in (discounts, rewards, values))
    ended = jnp.cumsum(d == 0.0, axis=1)
    mask = jnp.concatenate([jnp.ones_like(d[:, :1]), (ended[:, :-1] == 0).astype(d.dtype)], axis=1)
    r = r.at[:, -1].add(d[:, -1] * jnp.reshape(bootstrap_value, (-1,)))
    _, returns = fn(r, v, mask, jnp.max(d, axis=1), float(gae_lambda))
    return jnp.where(mask > 0, returns, v).T.reshape(rewards.shape)


def _version() -> str:
    return VERSION


ADAPTERS = (
    Adapter("tunix", "compute_gae_advantages", "tunix.rl.algo_core.compute_gae_advantages", "sequence", "vpi",
            "GAE returns (lambda 1), no ratio: V of the data's policy", lambda: compute_gae_advantages, _version),
)
