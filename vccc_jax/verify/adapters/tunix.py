"""tunix (google/tunix, JAX LLM post-training) ``tunix/rl/algo_core.py``, unchanged.

``pip install google-tunix==0.1.7`` pulls transformers, datasets, tensorflow_datasets, grain,
kagglehub, numba, qwix ... (see docs/field_audit.md for the dry-run), so ``make audit``
unpacks the wheel (``pip download --no-deps``) into ``.audit/src`` and :func:`algo_core`
imports ``tunix/rl/algo_core.py`` by path: ``tunix.rl.function_registry`` is tunix's own file
(absl only), ``tunix.rl.common`` a stub holding tunix's own ``aggregate_loss`` (executed
unchanged from ``common.py``) and ``compute_per_token_logps`` of a tiny model (below).

``grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id)`` takes an ``nnx`` model and
recomputes the log-probabilities: the model here is :class:`TokenLogProbs`, an ``nnx.Module``
whose parameter IS the per-token log-probability of the sampled token (its forward returns that
parameter and the logits of a two-token vocabulary consistent with it), so d loss / d log pi is
tunix's own gradient. Each contract token is a one-token completion (``completion_mask`` 1,
``advantages`` [n], ``old_per_token_logps`` = log mu: the behaviour, no ``ref_per_token_logps``:
the KL-to-reference term, beta 0.04 by default, is a regulariser outside Eq 12), config tunix's
``GRPOConfig`` defaults (epsilon 0.2, loss_agg_mode sequence-mean-token-mean, loss_algo grpo,
no dual clip). tunix casts the log-probabilities and advantages to float32 on purpose; the
float64 re-run (``Adapter.float64``) loads a second copy of ``algo_core.py`` (and of
``aggregate_loss``) whose ``jnp.float32`` is float64.

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


class _Float64Jnp:
    """``jax.numpy`` with ``float32`` read as ``float64`` (the precision re-run's module global)."""

    def __getattr__(self, k):
        return jnp.float64 if k == "float32" else getattr(jnp, k)


def _per_token_logps(graphdef, state, **kw):
    """``common.compute_per_token_logps`` of :class:`TokenLogProbs`: (log pi, logits [.., 2])."""
    from flax import nnx

    lp = nnx.merge(graphdef, state).log_pi.value
    return lp, jnp.stack([lp, jnp.log(-jnp.expm1(jnp.minimum(lp, -1e-12)))], axis=-1)


@functools.lru_cache(maxsize=None)
def algo_core(float64: bool = False):
    import typing

    import jax

    root = tb.package_dir("google_tunix", VERSION, "tunix")
    ns = {"jnp": _Float64Jnp() if float64 else jnp, "jax": jax, "Any": typing.Any}
    agg = tb.functions_from(root / "rl" / "common.py", ("aggregate_loss", "_check_get_norm"), ns)
    tb.stub_module("tunix.rl.common")
    tb.load_file("tunix.rl.function_registry", root / "rl" / "function_registry.py")
    name = "tunix.rl.algo_core" + ("_float64" if float64 else "")
    mod = tb.load_file(name, root / "rl" / "algo_core.py")
    if float64:
        mod.jnp = _Float64Jnp()
    mod.common = type("common", (), {"aggregate_loss": staticmethod(agg["aggregate_loss"]),
                                     "compute_per_token_logps": staticmethod(_per_token_logps)})
    return mod


def grpo_loss(one_sequence: bool = False, float64: bool = False):
    """tunix's ``grpo_loss_fn`` as ``loss(log_pi, log_mu, advantages)`` (module docstring)."""
    import types

    import jax
    import numpy as np
    from flax import nnx

    core = algo_core(float64)

    class TokenLogProbs(nnx.Module):
        def __init__(self, log_pi):
            self.log_pi = nnx.Param(log_pi)

    cfg = types.SimpleNamespace(beta=0.04, epsilon=0.2, epsilon_high=0.2, epsilon_c=None, temperature=1.0,
                                loss_agg_mode="sequence-mean-token-mean", loss_algo="grpo")

    def call(lp, lm, adv):
        ex = types.SimpleNamespace(prompt_ids=None, completion_ids=jnp.zeros(lp.shape, jnp.int32),
                                   completion_mask=jnp.ones(lp.shape, lp.dtype), advantages=adv,
                                   old_per_token_logps=lm, ref_per_token_logps=None)
        return core.grpo_loss_fn(TokenLogProbs(lp), ex, cfg, pad_id=0, eos_id=1)[0].astype(lp.dtype)

    if one_sequence:  # one response of n tokens (the cross rows)
        def loss(log_pi, log_mu, advantages):
            return call(log_pi[None], log_mu[None], advantages[None])

        loss.one_sequence = lambda: grpo_loss(True, float64)
        return loss

    # n one-token completions, each through tunix's loss on its own by ONE compiled function of
    # CHUNK tokens on the host (the torch bridge's callback): a token's float32 arithmetic is then
    # the same whatever the batch (XLA fuses float32 ops differently per shape); their mean is
    # sequence-mean-token-mean over the batch, summed in float64.
    per_token = jax.jit(jax.vmap(jax.value_and_grad(lambda lp, lm, a: call(lp[None, None], lm[None, None], a[None]))))

    def value_and_grad(lp, lm, a):
        n = len(lp)
        m = -(-n // CHUNK) * CHUNK
        pad = [np.concatenate([x, np.full(m - n, v)]) for x, v in ((lp, -0.7), (lm, -0.7), (a, 0.0))]
        vals, grads = zip(*(per_token(*(x[i:i + CHUNK] for x in pad)) for i in range(0, m, CHUNK)))
        vals, grads = np.concatenate(vals)[:n], np.concatenate(grads)[:n]
        return float(np.mean(vals)), grads / n

    loss = tb.host_loss(value_and_grad)
    loss.one_sequence, loss.__name__ = (lambda: grpo_loss(True, float64)), "grpo_loss_fn"
    return loss


CHUNK = 256


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
    Adapter("tunix", "grpo_loss_fn", "tunix.rl.algo_core.grpo_loss_fn", "actor", "vpi",
            "GRPO loss: PPO clip (epsilon 0.2) vs old = behaviour, sequence-mean-token-mean, no reference KL; "
            "float32 inside", grpo_loss, _version, biased_by="PPO clip",
            default="tunix 0.1.7's GRPOConfig defaults (epsilon 0.2, sequence-mean-token-mean)",
            float64=functools.partial(grpo_loss, False, True)),
    Adapter("tunix", "compute_gae_advantages", "tunix.rl.algo_core.compute_gae_advantages", "sequence", "vpi",
            "GAE returns (lambda 1), no ratio: V of the data's policy", lambda: compute_gae_advantages, _version),
)
