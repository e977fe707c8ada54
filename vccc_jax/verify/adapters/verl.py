"""verl (volcengine/verl) ``trainer/ppo/core_algos.py``, unchanged, through the torch bridge.

verl cannot be imported without its heavy dependencies (ray, transformers, tensordict,
hydra ...; ``pip install verl==0.9.1`` resolves ~100 packages). So ``make audit`` downloads the
wheel (``pip download --no-deps verl==0.9.1``) and unpacks it in ``.audit/src``, and
:func:`core_algos` imports ``verl/trainer/ppo/core_algos.py`` by path with these stubs for its
imports (documented, minimal): ``verl.utils.torch_functional`` = the six functions
``clip_by_value, masked_sum, masked_mean, masked_var, masked_whiten, entropy_from_logits``
executed unchanged from verl's own ``utils/torch_functional.py``; ``verl.utils.as_torch_index``
/ ``group_mean_std`` from verl's ``utils/groupwise.py`` (same way); ``deprecated`` = a no-op
decorator; ``AlgoConfig`` / ``omegaconf.DictConfig`` = empty classes and ``ActorConfig`` =
:class:`Config` (type checks only: ``assert isinstance(config, ActorConfig)``). The actor config passed to the losses is :class:`Config`: verl 0.9.1's
``ActorConfig`` / ``PolicyLossConfig`` defaults (clip_ratio 0.2, clip_ratio_c 3.0, tau_pos 1.0,
tau_neg 1.05, clip_cov_ratio 2e-4, clip_cov_lb 1, clip_cov_ub 5, kl_cov_ratio 2e-4, ppo_kl_coef
0.1; dro_beta, which verl requires be set, 0.1; empty global_batch_info).

Conventions: verl's tensors are batch-major ``[bs, response_length]`` with a ``response_mask``
and a ``loss_agg_mode`` (default ``token-mean``). The actor contract's tokens are laid out as
``bs`` one-token responses (so a token's gradient is its own: the contract's per-token mean;
sequence-level losses such as GSPO see |y| = 1) -- :func:`policy_loss` with
``one_sequence=True`` lays them out as one response instead (the cross-implementation rows).
``old_log_prob`` = the behaviour's log-probability (verl's bypass mode: old = rollout).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Any, Optional

import numpy as np

from vccc_jax.verify.adapters import Adapter
from vccc_jax.verify.adapters import torch_bridge as tb

VERSION = "0.9.1"
POLICY_LOSSES = ("vanilla", "gspo", "sapo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "geo_mean", "gpg", "dro",
                 "cispo")


class Config(dict):
    """verl 0.9.1's actor-config defaults as an attribute dict with ``.get``."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


def default_config() -> Config:
    loss = Config(clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002, ppo_kl_coef=0.1,
                  dro_beta=0.1, loss_mode="vanilla")
    return Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, tau_pos=1.0,
                  tau_neg=1.05, loss_agg_mode="token-mean", global_batch_info={}, policy_loss=loss)


@functools.lru_cache(maxsize=None)
def core_algos():
    """verl's core_algos module, imported by path with the stubs of the module docstring."""
    import torch

    root = tb.package_dir("verl", VERSION, "verl")
    ns = {"torch": torch, "F": torch.nn.functional, "Optional": Optional, "Any": Any, "math": math, "np": np}
    tf = tb.functions_from(root / "utils" / "torch_functional.py",
                           ("clip_by_value", "masked_sum", "masked_mean", "masked_var", "masked_whiten",
                            "entropy_from_logits"), ns)
    gw = tb.functions_from(root / "utils" / "groupwise.py", ("as_torch_index", "group_mean_std"), dict(ns))
    tb.stub_module("verl.utils.torch_functional", **tf)
    tb.stub_module("verl.utils", **gw)
    tb.stub_module("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda f: f))
    tb.stub_module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (), {}))
    tb.stub_module("verl.workers.config", ActorConfig=Config)  # isinstance(config, ActorConfig) holds
    if importlib.util.find_spec("omegaconf") is None:  # verl only type-checks DictConfig here
        tb.stub_module("omegaconf", DictConfig=type("DictConfig", (), {}))
    return tb.load_file("verl.trainer.ppo.core_algos", root / "trainer" / "ppo" / "core_algos.py")


def policy_loss(name: str, one_sequence: bool = False):
    """verl's registered policy loss ``name`` as ``loss(log_pi, log_mu, advantages)`` (JAX)."""
    fn = core_algos().get_policy_loss_fn(name)
    cfg = default_config()
    cfg.policy_loss["loss_mode"] = name

    def loss_of(torch, lp, lm, a):
        shape = (1, -1) if one_sequence else (-1, 1)
        lp, lm, a = (x.reshape(shape) for x in (lp, lm, a))
        out = fn(old_log_prob=lm, log_prob=lp, advantages=a, response_mask=torch.ones_like(lp),
                 loss_agg_mode="token-mean", config=cfg)
        return out[0] if isinstance(out, tuple) else out

    loss = tb.host_loss(tb.torch_value_and_grad(loss_of))

    def target(log_pi, log_mu, advantages):
        return loss(log_pi, log_mu, advantages)

    target.one_sequence = lambda: policy_loss(name, True)
    return target


def _gae_returns(log_rhos, discounts, rewards, values, bootstrap_value, lam=1.0, value_loss=False):
    """verl's GAE returns on the contract's [T, B] trajectories (host, float64).

    verl takes ONE scalar gamma and ends every response with V = 0 (no bootstrap): gamma of a
    trajectory = its largest discount (the MDP's gamma; discounts are gamma, or 0 from an
    episode's end on), tokens after the first zero discount are masked (response_mask 0: the
    response ended), and the bootstrap gamma V(s_T) is added to the last reward (exact, since
    verl's next value after the last token is 0). Masked tokens keep their value (no target).
    ``value_loss``: the target read from ``compute_value_loss`` (cliprange 0.5) at vpreds =
    values: vs = values - n d loss / d vpreds by autograd."""
    import torch

    ca = core_algos()
    T = rewards.shape[0]
    d, r, v = (np.asarray(x, np.float64).reshape(T, -1).T for x in (discounts, rewards, values))
    boot = np.asarray(bootstrap_value, np.float64).reshape(-1)
    ended = np.cumsum(d == 0.0, axis=1)
    mask = np.concatenate([np.ones((d.shape[0], 1)), (ended[:, :-1] == 0)], axis=1)
    r = r.copy()
    r[:, -1] += d[:, -1] * boot
    gamma = torch.tensor(np.max(d, axis=1))
    t = functools.partial(torch.tensor, dtype=torch.float64)
    _, returns = ca.compute_gae_advantage_return(t(r), t(v), t(mask), gamma, t(lam))
    if value_loss:
        vp = t(v).requires_grad_(True)
        out = ca.compute_value_loss(vp, returns, t(v), t(mask), cliprange_value=0.5, loss_agg_mode="token-mean")
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        returns = vp.detach() - mask.sum() * vp.grad
    vs = np.where(mask > 0, returns.detach().numpy(), v)
    return vs.T.reshape(np.shape(rewards))


def gae_target():
    core_algos()

    def compute_gae_advantage_return(log_rhos, discounts, rewards, values, bootstrap_value):
        return tb.host_sequence(_gae_returns)(log_rhos, discounts, rewards, values, bootstrap_value)

    return compute_gae_advantage_return


def value_loss_target():
    core_algos()
    fn = functools.partial(_gae_returns, value_loss=True)

    def compute_value_loss(log_rhos, discounts, rewards, values, bootstrap_value):
        return tb.host_sequence(fn)(log_rhos, discounts, rewards, values, bootstrap_value)

    return compute_value_loss


# The group (critic-free) advantage estimators (``verify.group``'s contract): verl name, its
# keyword arguments, whether it reads a batch statistic (then one group per call: the contract's
# batch is one prompt's group).
GROUP_ESTIMATORS = {
    "grpo": ("grpo", {"norm_adv_by_std_in_grpo": True}, False),
    "dr_grpo": ("grpo", {"norm_adv_by_std_in_grpo": False}, False),
    "rloo": ("rloo", {}, False),
    "opo": ("opo", {}, False),
    "remax": ("remax", {}, False),
    "reinforce_plus_plus": ("reinforce_plus_plus", {}, True),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline", {}, True),
    "gpg": ("gpg", {}, True),
}


def group_advantage(name: str):
    """verl's registered advantage estimator as the group contract's ``fn(rewards [N, G],
    lengths [N, G], greedy [N]) -> advantages [N, G]``: each completion is a response of its
    length (``response_mask``), its outcome reward on its last token, the groups by ``index``,
    ReMax's ``reward_baselines`` = the greedy completion's reward, the algorithm config's gamma
    1 (verl's default); the advantage is read at the first token (every token carries the same
    one for outcome rewards at gamma 1)."""
    import torch

    verl_name, kw, batch_stat = GROUP_ESTIMATORS[name]
    fn = core_algos().get_adv_estimator_fn(verl_name)

    def call(r, lengths, greedy):
        n, g = r.shape
        L = int(np.max(lengths))
        ln = np.asarray(lengths, int).reshape(-1)
        mask = (np.arange(L)[None] < ln[:, None]).astype(np.float64)
        tok = np.zeros((n * g, L))
        tok[np.arange(n * g), ln - 1] = np.asarray(r, np.float64).reshape(-1)
        t = functools.partial(torch.tensor, dtype=torch.float64)
        args = dict(token_level_rewards=t(tok), response_mask=t(mask), config=Config(gamma=1.0), **kw)
        if verl_name == "remax":
            args["reward_baselines"] = t(np.repeat(np.asarray(greedy, np.float64), g))
        else:
            args["index"] = np.repeat(np.arange(n), g)
        adv = fn(**args)[0]
        return adv[:, 0].numpy().reshape(n, g)

    def advantages(rewards, lengths, greedy):
        rewards, lengths, greedy = np.asarray(rewards), np.asarray(lengths), np.asarray(greedy)
        if not batch_stat:
            return call(rewards, lengths, greedy)
        return np.concatenate([call(rewards[i:i + 1], lengths[i:i + 1], greedy[i:i + 1])
                               for i in range(len(rewards))])

    advantages.group_contract, advantages.__name__ = True, name
    return advantages


def _version() -> str:
    return VERSION


_CLAIMS = {
    "vanilla": "PPO clip (eps 0.2, dual clip c 3) vs old = rollout (bypass): the policy gradient in the trust region",
    "gspo": "GSPO sequence ratio clip (eps 3e-4/4e-4 in verl's recipe; here the config's 0.2)",
    "sapo": "SAPO soft sigmoid gates (tau_pos 1, tau_neg 1.05)",
    "dppo_tv": "DPPO total-variation trust region, truncation c = 3 (ActorConfig.clip_ratio_c; the function's "
               "fallback 20 is never reached)",
    "dppo_kl": "DPPO KL trust region, truncation c = 3 (ActorConfig.clip_ratio_c)",
    "clip_cov": "Clip-Cov: PPO with high-covariance tokens detached", "kl_cov": "KL-Cov: PPO with a KL penalty on high-covariance tokens",
    "geo_mean": "GMPO geometric-mean ratio clip", "gpg": "GPG: -A log pi, no ratio", "dro": "DRO: -A log pi with a quadratic log-ratio penalty (beta 0.1)",
    "cispo": "CISPO clipped IS weight, detached",
}


_DESIGN = {"vanilla": "PPO clip", "gspo": "the sequence-ratio clip", "sapo": "the soft sigmoid gates",
           "dppo_tv": "the TV trust region", "dppo_kl": "the KL trust region", "clip_cov": "the clip and covariance detach",
           "kl_cov": "the covariance KL penalty", "geo_mean": "the geometric-mean clip", "gpg": "",
           "dro": "the quadratic log-ratio penalty", "cispo": "the clipped IS weight"}


# Where an error above round-off on on-policy data (lag 0) comes from: a constant of verl's, not float32.
_EPSILON = {"sapo": "the 1e-8 in the denominator of verl's seq-mean-token-mean (|y| + 1e-8)",
            "geo_mean": "the 1e-8 in the denominator of the geometric mean's log-ratio average (|y| + 1e-8)"}
_DEFAULT = {"vanilla": "verl 0.9.1's default: actor.policy_loss.loss_mode = vanilla, clip_ratio 0.2, clip_ratio_c 3"}


def _policy_adapter(name: str) -> Adapter:
    return Adapter("verl", name, f"verl.trainer.ppo.core_algos.get_policy_loss_fn({name!r})", "actor", "vpi",
                   _CLAIMS[name], functools.partial(policy_loss, name), _version, biased_by=_DESIGN[name],
                   default=_DEFAULT.get(name, ""), epsilon=_EPSILON.get(name, ""))


_GROUP_CLAIMS = {
    "grpo": "GRPO: (r - mean_g r) / (std_g r + 1e-6), std with Bessel's correction (torch.std)",
    "dr_grpo": "Dr. GRPO: r - mean_g r (grpo with norm_adv_by_std_in_grpo = False)",
    "rloo": "RLOO: r_i - mean_{j != i} r_j (leave-one-out)",
    "opo": "OPO: r - sum_j l_j r_j / sum_j l_j (length-weighted group mean)",
    "remax": "ReMax: r - r(greedy completion)",
    "reinforce_plus_plus": "REINFORCE++: the return (gamma 1) whitened over the batch's tokens",
    "reinforce_plus_plus_baseline": "REINFORCE++-baseline: r - mean_g r, whitened over the batch's tokens",
    "gpg": "GPG: (bs / #nonzero r) (r - mean_g r)",
}
_GROUP_DEFAULT = {"grpo": "the GRPO recipes' algorithm.adv_estimator = grpo, norm_adv_by_std_in_grpo True"}


def _group_adapter(name: str) -> Adapter:
    return Adapter("verl", f"{name}_advantage",
                   f"verl.trainer.ppo.core_algos.get_adv_estimator_fn({GROUP_ESTIMATORS[name][0]!r})",
                   "group", "vpi", _GROUP_CLAIMS[name], functools.partial(group_advantage, name), _version,
                   default=_GROUP_DEFAULT.get(name, ""))


ADAPTERS = tuple(_policy_adapter(n) for n in POLICY_LOSSES) + tuple(_group_adapter(n) for n in GROUP_ESTIMATORS) + (
    Adapter("verl", "compute_gae_advantage_return", "verl.trainer.ppo.core_algos.compute_gae_advantage_return",
            "sequence", "vpi", "GAE returns (lam 1, the config default), no ratio: V of the data's policy", gae_target,
            _version, default="verl 0.9.1's default: algorithm.adv_estimator = gae, lam 1"),
    Adapter("verl", "compute_value_loss", "verl.trainer.ppo.core_algos.compute_value_loss", "sequence", "vpi",
            "clipped value loss on GAE returns (cliprange 0.5): its target at vpreds = values", value_loss_target,
            _version, default="verl 0.9.1's default critic loss: cliprange_value 0.5"),
)
