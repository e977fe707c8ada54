"""The trainer's actor weight from the actor-correction table (issue 21; ``estimators.actor_registry``).

``TrainConfig.actor`` names a row (``[centered-]<name>``; aliases is / tis / mis) and
``TrainConfig.actor_params`` its parameters (``"alpha=0.5,beta=5"``; a row's ``clip`` is
``TrainConfig.actor_clip``). The learner's actor loss stays ``estimators.actor.policy_loss``:

* the Eq 10 rows ratio / truncate / mask keep the library path (``kind`` / ``clip``, score
  centring, top-k centring): the same numbers as before this table existed;
* every other row gives a per-token weight w the loss multiplies by its PPO trust region on
  pi_theta / pi_old (``ppo_epsilon``) when the row has ``trust_region`` (TIS x PPO as verl
  ships it, IcePop, AReaL's decoupled PPO), or uses alone (CISPO, TOPR, GSPO, M2PO, ``ppo``:
  they replace the trust region). Token rows without data inputs are evaluated in each
  minibatch (:func:`minibatch_weights`; weights of rows without a trust region follow the
  current pi_theta, e.g. CISPO's sg(clip(pi_theta / mu))); sequence and batch rows, and
  AReaL (per-token lags), once per update on the [T, B] batch at pi_old
  (:func:`update_weights`: a sequence is an episode within a column, cut by the rollout
  window; M2PO's batch is the update's batch) and reused by every minibatch step.

Advantage signs: minibatch rows read the minibatch's (normalised) advantages; update rows
the update's advantages, normalised over the whole batch when ``normalize_advantages``.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from vccc_jax.estimators import actor_registry
from vccc_jax.estimators.actor_registry import ActorCorrection

Array = chex.Array
sg = jax.lax.stop_gradient

__all__ = ["parse_params", "resolve", "legacy", "per_update", "minibatch_weights",
           "update_weights", "sequence_starts"]


def parse_params(text: str) -> dict:
    """``"alpha=0.5,beta=5,max_staleness=4,cap=none"`` -> {name: float | int | None}."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"actor_params item {item!r} is not name=value")
        value = value.strip().lower()
        if value in ("none", ""):
            out[name.strip()] = None
            continue
        try:
            num = float(value)
        except ValueError:
            raise ValueError(f"actor_params {name.strip()}={value!r} is not a number or none") from None
        out[name.strip()] = int(num) if name.strip() == "max_staleness" else num
    return out


def resolve(actor_name: str, actor_params: str, actor_clip: float) -> tuple[ActorCorrection, dict]:
    """The row and its full parameter dict (defaults, ``actor_params``, ``clip`` =
    ``actor_clip`` for rows that take one); ValueError naming ``actor_params`` otherwise."""
    row = actor_registry.get_actor_correction(actor_name)
    given = parse_params(actor_params)
    if "clip" in given:
        raise ValueError("actor_params: give the clip as actor_clip, not inside actor_params")
    if "clip" in row.param_names:
        given["clip"] = actor_clip
    try:
        return row, row.resolve(given)
    except ValueError as err:
        raise ValueError(f"actor_params: {err}") from None


def legacy(row: ActorCorrection) -> bool:
    """The Eq 10 rows the learner runs through ``policy_loss(kind=...)`` (and score centring)."""
    return row.weight_kind in ("ratio", "truncate", "mask")


def per_update(row: ActorCorrection) -> bool:
    """Rows evaluated once per update on [T, B] (sequence / batch rows, rows with data)."""
    return not legacy(row) and (row.level != "token" or bool(row.data))


def minibatch_weights(row: ActorCorrection, params: dict, log_pi: Array, log_pi_old: Array,
                      log_mu: Array, advantages: Array, mask: Optional[Array]):
    """(w, log_pi_old for ``policy_loss``, whether the PPO trust region applies) of a token
    row in a minibatch. Rows with a trust region form w from pi_old / mu (pi_old: the
    learner at the update's start or the ``pi_old_route``); the others from the current
    pi_theta / mu, with the loss's reference sg(log pi_theta) (so the gradient is w A u)."""
    if row.trust_region:
        w = row(log_pi_old - log_mu, advantages, mask=mask, **params)
        return w, log_pi_old, True
    w = row(sg(log_pi) - log_mu, advantages, mask=mask, **params)
    return w, None, False


def sequence_starts(terminated: Array, truncated: Array) -> Array:
    """[T, B] bool: a new episode (sequence) begins at t = 0 and after every episode end."""
    done = (terminated | truncated).astype(bool)
    return jnp.concatenate([jnp.ones_like(done[:1]), done[:-1]], axis=0)


def update_weights(row: ActorCorrection, params: dict, log_pi_old: Array, log_mu: Array,
                   advantages: Array, mask: Optional[Array], *, starts: Array, lags: Array,
                   normalize: bool) -> Array:
    """w [T, B] of a per-update row (module docstring) at pi_old, a constant."""
    adv = advantages
    if normalize:
        m = jnp.ones_like(adv) if mask is None else mask.astype(adv.dtype)
        n = jnp.maximum(jnp.sum(m), 1.0)
        mean = jnp.sum(m * adv) / n
        adv = (adv - mean) / (jnp.sqrt(jnp.sum(m * jnp.square(adv - mean)) / n) + 1e-8)
    data = {}
    if "starts" in row.data:
        data["starts"] = starts
    if "lags" in row.data:
        data["lags"] = lags
    if "log_mu" in row.data:
        data["log_mu"] = log_mu
    return sg(row(log_pi_old - log_mu, adv, mask=mask, **params, **data))
