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


# tunix's registered advantage estimators (``function_registry.register_advantage_estimator``):
# ``fn(rewards [N * G], num_generations) -> [N * G]``, outcome rewards, groups contiguous.
GROUP_ESTIMATORS = {"grpo": "compute_advantages", "rloo": "compute_rloo_advantages",
                    "drgrpo": "compute_drgrpo_advantages"}


def group_advantage(name: str):
    """tunix's advantage estimator ``name`` as the group contract's ``fn(rewards [N, G], lengths,
    greedy) -> [N, G]`` (lengths and greedy unused: tunix's take the rewards only)."""
    import numpy as np

    fn = getattr(algo_core(), GROUP_ESTIMATORS[name])

    def advantages(rewards, lengths=None, greedy=None):
        r = np.asarray(rewards, np.float64)
        return np.asarray(fn(jnp.asarray(r.reshape(-1)), r.shape[1]), np.float64).reshape(r.shape)

    advantages.group_contract, advantages.__name__ = True, f"{name}_advantages"
    return advantages


def _version() -> str:
    return VERSION


_GROUP_CLAIMS = {"grpo": "GRPO: (r - mean_g r) / (std_g r + 1e-6), std ddof 1",
                 "rloo": "RLOO: r_i - mean_{j != i} r_j", "drgrpo": "Dr. GRPO: r - mean_g r"}


ADAPTERS = tuple(
    Adapter("tunix", f"{n}_advantages", f"tunix.rl.algo_core.{f}", "group", "vpi", _GROUP_CLAIMS[n],
            functools.partial(group_advantage, n), _version,
            default="tunix's GRPO default: advantage_estimator = grpo" if n == "grpo" else "")
    for n, f in GROUP_ESTIMATORS.items()) + (
    Adapter("tunix", "compute_gae_advantages", "tunix.rl.algo_core.compute_gae_advantages", "sequence", "vpi",
            "GAE returns (lambda 1), no ratio: V of the data's policy", lambda: compute_gae_advantages, _version),
)
