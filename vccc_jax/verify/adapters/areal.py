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
rows.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

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
def functional():
    """AReaL's functional module, imported by path with the stubs of the module docstring."""
    import torch  # noqa: F401  (fail early with ImportError when torch is missing)

    root = tb.package_dir("areal", VERSION, "areal")
    tb.stub_module("areal.api.cli_args", RejectionSamplingConfig=RejectionSamplingConfig)
    tb.stub_module("areal.utils.data", KLEstimator=type("KLEstimator", (), {}))
    return tb.load_file("areal.utils.functional.functional", root / "utils" / "functional" / "functional.py")


def ppo_actor_loss(rejection_sampling: bool = True, one_sequence: bool = False):
    """``ppo_actor_loss_fn`` (eps_clip 0.2, proximal = current policy, old = behaviour) as
    ``loss(log_pi, log_mu, advantages)``; ``rejection_sampling``: AReaL's default config (the
    behaviour weight pi_prox / mu, tokens above 5 masked) or None (no behaviour weight)."""
    fn = functional().ppo_actor_loss_fn
    rs = RejectionSamplingConfig() if rejection_sampling else None

    def loss_of(torch, lp, lm, a):
        out = fn(logprobs=lp, proximal_logprobs=lp.detach(), old_logprobs=lm, advantages=a, eps_clip=0.2,
                 loss_mask=torch.ones_like(lp, dtype=torch.bool), rejection_sampling=rs)
        return out[0]

    return tb.host_loss(tb.torch_value_and_grad(loss_of))


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
            "decoupled PPO, proximal = current policy, default rejection sampling (behaviour weight, mask > 5; "
            "AReaL forms that weight in float32: relative error ~1e-7)",
            functools.partial(ppo_actor_loss, True), _version, biased_by="the rejection mask (weight > 5 dropped)"),
    Adapter("areal", "ppo_actor_loss_fn_no_rs", "areal.utils.functional.ppo_actor_loss_fn", "actor", "vpi",
            "decoupled PPO, proximal = current policy, rejection_sampling=None (no behaviour weight)",
            functools.partial(ppo_actor_loss, False), _version),
    Adapter("areal", "sapo_loss_fn", "areal.utils.functional.sapo_loss_fn", "actor", "vpi",
            "SAPO soft gates vs the behaviour (tau 1.0 / 1.05)", sapo_loss, _version,
            biased_by="the soft sigmoid gates"),
)
