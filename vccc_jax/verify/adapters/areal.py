"""AReaL (inclusionAI/AReaL) ``areal/utils/functional/functional.py``, unchanged, through the
torch bridge.

AReaL 1.0.4 is imported by path like verl (``make audit`` unpacks the wheel from
``pip download --no-deps areal==1.0.4`` into ``.audit/src``): ``functional.py`` imports only
torch, numpy and two AReaL names, stubbed: ``areal.api.cli_args.RejectionSamplingConfig`` =
:class:`RejectionSamplingConfig` (the same fields and defaults as AReaL's dataclass: level
token, action mask, metric ratio, agg mean, upper 5.0, lower None) and
``areal.utils.data.KLEstimator`` (used only by the kl_* metrics, not by these rows).

Conventions: AReaL's losses take flat or padded token tensors with a boolean ``loss_mask``;
the contract's tokens are passed flat (``[n]``, every token valid), so the loss is AReaL's
``sum / count`` token mean. Decoupled PPO (``ppo_actor_loss_fn``) has three policies: the
current one (``logprobs``), the proximal one (``proximal_logprobs``, the trainer's recomputed
log-probabilities: here the current policy's value, as at the first minibatch of an update)
and the behaviour (``old_logprobs`` = log mu). AReaL applies the behaviour weight pi_prox / mu
only through ``rejection_sampling`` (1.0.x replaced ``behave_imp_weight_cap``); both settings are
rows. AReaL 1.0.4's default is ``rejection_sampling=None`` (``PPOActorConfig``; with the decoupled
loss it warns that staleness filtering is then off), the ``_no_rs`` row; the rejection row is
the pre-1.0 default ``behave_imp_weight_cap=5`` in its 1.0 spelling.

Precision: AReaL forms the behaviour weight from ``.float()`` log-probabilities (float32, on
purpose: bf16 / fp16 inputs) and ``ppo_critic_loss_fn`` asserts float32 inputs. Each such row
has a float64 re-run of the same code (``Adapter.float64``): the actor's ``.float()`` casts made
float64 (:func:`~.torch_bridge.float32_casts`), the critic's module loaded a second time with
``torch.float32`` read as float64 (:class:`~.torch_bridge.Float64Torch`); the audit's
precision verdict compares the two.

``ppo_critic_loss_fn`` (value_eps_clip 0.5, AReaL's default) is a sequence critic target: its
target at value = old_value = the contract's values is read from autograd, vs = v - n d loss /
d value, with ``target_value`` the GAE returns AReaL's trainer forms with its defaults
(discount and gae_lambda 1.0; ``PPOActor.compute_advantages``' recursion delta_t + gamma lam
A_{t+1}, written out here: that method needs the trainer's imports), gamma the MDP's, every
response ending with V = 0 after its last token and the bootstrap added to the last reward (as
the verl GAE rows).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

from vccc_jax.verify.adapters import Adapter
from vccc_jax.verify.adapters import torch_bridge as tb

VERSION = "1.0.4"


@dataclasses.dataclass
class RejectionSamplingConfig:
    """AReaL 1.0.4's ``RejectionSamplingConfig`` fields and defaults."""

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    agg: str = "mean"
    upper: float = 5.0
    lower: Optional[float] = None


@functools.lru_cache(maxsize=None)
def functional(float64: bool = False):
    """AReaL's functional module, imported by path with the stubs of the module docstring
    (``float64``: a second copy whose ``torch.float32`` is float64, the precision re-run)."""
    import torch

    root = tb.package_dir("areal", VERSION, "areal")
    tb.stub_module("areal.api.cli_args", RejectionSamplingConfig=RejectionSamplingConfig)
    tb.stub_module("areal.utils.data", KLEstimator=type("KLEstimator", (), {}))
    path = root / "utils" / "functional" / "functional.py"
    if not float64:
        return tb.load_file("areal.utils.functional.functional", path)
    mod = tb.load_file("areal.utils.functional.functional_float64", path)
    mod.torch = tb.Float64Torch(torch)
    return mod


def ppo_actor_loss(rejection_sampling: bool = True, one_sequence: bool = False, float64: bool = False):
    """``ppo_actor_loss_fn`` (eps_clip 0.2, proximal = current policy, old = behaviour) as
    ``loss(log_pi, log_mu, advantages)``; ``rejection_sampling``: the behaviour weight pi_prox /
    mu with tokens above 5 masked, or None (AReaL's default: no behaviour weight); ``float64``:
    its ``.float()`` casts made float64 (the precision re-run)."""
    fn = functional().ppo_actor_loss_fn
    rs = RejectionSamplingConfig() if rejection_sampling else None

    def loss_of(torch, lp, lm, a):
        out = fn(logprobs=lp, proximal_logprobs=lp.detach(), old_logprobs=lm, advantages=a, eps_clip=0.2,
                 loss_mask=torch.ones_like(lp, dtype=torch.bool), rejection_sampling=rs)
        return out[0]

    return tb.host_loss(tb.torch_value_and_grad(tb.float32_casts(loss_of, float64)))


def _critic_target(log_rhos, discounts, rewards, values, bootstrap_value, float64=False):
    """``ppo_critic_loss_fn``'s target on [T, B] trajectories (host; see the module docstring)."""
    import torch

    fn = functional(float64).ppo_critic_loss_fn
    T = rewards.shape[0]
    d, r, v = (np.asarray(x, np.float64).reshape(T, -1).T for x in (discounts, rewards, values))
    boot = np.asarray(bootstrap_value, np.float64).reshape(-1)
    mask = np.concatenate([np.ones((d.shape[0], 1)), (np.cumsum(d == 0.0, axis=1)[:, :-1] == 0)], axis=1)
    r = r.copy()
    r[:, -1] += d[:, -1] * boot
    gamma, lam = np.max(d, axis=1), 1.0
    adv, last = np.zeros_like(r), np.zeros(r.shape[0])
    for t in reversed(range(T)):  # AReaL's recursion; V = 0 after a response's last token
        nxt = v[:, t + 1] * mask[:, t + 1] if t + 1 < T else np.zeros(r.shape[0])
        last = (r[:, t] + gamma * nxt - v[:, t] + gamma * lam * last * (mask[:, t + 1] if t + 1 < T else 0.0)) * mask[:, t]
        adv[:, t] = last
    # One call on the valid tokens, padded with zero tokens to a power-of-two count n: d loss /
    # d value = (value - target) / n is then exact in float32 too, so a token's target does not
    # depend on the rest of the batch (the contract's batch independence) beyond the per-token
    # float32 arithmetic AReaL does on purpose.
    dtype = torch.float64 if float64 else torch.float32
    keep = mask > 0
    vals, targets = v[keep], (adv + v)[keep]
    n = 1 << int(np.ceil(np.log2(max(len(vals), 1))))
    pad = np.zeros(n - len(vals))
    value = torch.tensor(np.concatenate([vals, pad]), dtype=dtype, requires_grad=True)
    loss, _ = fn(value=value, old_value=torch.tensor(np.concatenate([vals, pad]), dtype=dtype),
                 target_value=torch.tensor(np.concatenate([targets, pad]), dtype=dtype), value_eps_clip=0.5,
                 loss_mask=torch.ones(n, dtype=torch.bool))
    loss.backward()
    vs = v.copy()
    vs[keep] = vals - n * value.grad.double().numpy()[:len(vals)]
    return vs.T.reshape(np.shape(rewards))


def critic_loss_target(float64: bool = False):
    functional(float64)
    fn = functools.partial(_critic_target, float64=float64)

    def ppo_critic_loss_fn(log_rhos, discounts, rewards, values, bootstrap_value):
        return tb.host_sequence(fn)(log_rhos, discounts, rewards, values, bootstrap_value)

    return ppo_critic_loss_fn


def sapo_loss():
    """``sapo_loss_fn`` (tau_pos 1.0, tau_neg 1.05 as verl's defaults; old = behaviour)."""
    fn = functional().sapo_loss_fn

    def loss_of(torch, lp, lm, a):
        return fn(logprobs=lp, old_logprobs=lm, advantages=a, tau_pos=1.0, tau_neg=1.05,
                  loss_mask=torch.ones_like(lp, dtype=torch.bool))[0]

    return tb.host_loss(tb.torch_value_and_grad(loss_of))


def _version() -> str:
    return VERSION


ADAPTERS = (
    Adapter("areal", "ppo_actor_loss_fn", "areal.utils.functional.ppo_actor_loss_fn", "actor", "vpi",
            "decoupled PPO, proximal = current policy, rejection sampling level token, action mask, upper 5 "
            "(the pre-1.0 default behave_imp_weight_cap=5; not 1.0.4's default); the behaviour weight formed "
            "in float32", functools.partial(ppo_actor_loss, True), _version,
            biased_by="the rejection mask (weight > 5 dropped)",
            float64=functools.partial(ppo_actor_loss, True, float64=True)),
    Adapter("areal", "ppo_actor_loss_fn_no_rs", "areal.utils.functional.ppo_actor_loss_fn", "actor", "vpi",
            "decoupled PPO, proximal = current policy, rejection_sampling=None (no behaviour weight)",
            functools.partial(ppo_actor_loss, False), _version,
            default="AReaL 1.0.4's default: PPOActorConfig.rejection_sampling = None"),
    Adapter("areal", "ppo_critic_loss_fn", "areal.utils.functional.ppo_critic_loss_fn", "sequence", "vpi",
            "clipped value loss (value_eps_clip 0.5) on GAE returns (discount, gae_lambda 1.0): its target at "
            "value = old_value; float32 inputs (asserted)", critic_loss_target, _version,
            default="AReaL 1.0.4's defaults: value_eps_clip 0.5, discount 1, gae_lambda 1",
            float64=functools.partial(critic_loss_target, True)),
    Adapter("areal", "sapo_loss_fn", "areal.utils.functional.sapo_loss_fn", "actor", "vpi",
            "SAPO soft gates vs the behaviour (tau 1.0 / 1.05)", sapo_loss, _version,
            biased_by="the soft sigmoid gates"),
)
