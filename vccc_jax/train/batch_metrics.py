"""Per-update metrics of the learner's batch: lags, importance-ratio diagnostics, KL(pi_k || mu),
the pi_k mass off a truncating sampler's support and value / target statistics
(:func:`data_metrics`), and KL(pi_k || pi_old) under a decoupled pi_old route
(:func:`pi_old_kl`). Plain functions of the static ``train.setup.Setup``, the grid values and
the update's arrays."""

from __future__ import annotations

import chex
import jax.numpy as jnp

from vccc_jax.estimators import importance
from vccc_jax.train import setup as setup_lib
from vccc_jax.train.losses import wmean
from vccc_jax.train.programs import GridValues
from vccc_jax.train.setup import Setup

Array = chex.Array

__all__ = ["data_metrics", "pi_old_kl"]


def data_metrics(setup: Setup, values: GridValues, ltraj, valid, prep) -> dict:
    """Lag, importance-ratio diagnostics (ESS, clip rate overall and by lag, log-ratio
    quantiles, guards), KL(pi_k || mu), value / target statistics of the batch, and
    with a truncating sampler (``sampler`` or ``top_k``) ``support_violation``: the
    pi_k mass on actions the sampler cannot emit (Sec 5.2), mean over policy steps.

    The diagnostics describe the data (true behaviour log-probs) even when
    ``correct=False``; replay: all columns, not-yet-filled slots count as log rho = 0."""
    cfg = setup.cfg
    K = setup.num_versions
    log_rho_data = prep.log_pi_old - ltraj.log_mu
    if valid is not None:
        log_rho_data = jnp.where(valid > 0, log_rho_data, 0.0)
    diag = importance.ratio_diagnostics(  # env-major [B, T]: flattens on a mesh
        log_rho_data.T, kind=cfg.clip_kind,
        clip=setup_lib.weight_clip(setup, values),
        versions=jnp.clip(ltraj.lag, 0, K + cfg.replay_updates - 1).T,
        num_versions=K + cfg.replay_updates)
    # KL(pi_k || mu) (categorical: actions mu cannot emit count with log-ratio MAX_LOG_RHO)
    kl = wmean(setup.head.kl(ltraj.log_pi_all, ltraj.log_mu_all), valid)
    targets = prep.targets
    out = {}
    if setup.sampler is not None or cfg.top_k > 0:
        pi_all = jnp.exp(ltraj.log_pi_all)
        # pi_k mass off the sampler's support (top-k / top-p: log mu = -inf), averaged
        # over the batch's policy steps (tool steps have mu := pi_k, so none there)
        off = jnp.sum(jnp.where(jnp.isneginf(ltraj.log_mu_all), pi_all, 0.0), axis=-1)
        w = jnp.ones(off.shape, jnp.float32) if valid is None else valid
        if ltraj.is_action is not None:
            w = w * ltraj.is_action.astype(jnp.float32)
        out["support_violation"] = wmean(off, w)
    return out | {
        "lag_mean": wmean(ltraj.lag.astype(jnp.float32), valid),
        "ess": diag.ess_fraction,
        "clip_frac": diag.clip_fraction,
        "clip_frac_by_lag": diag.clip_fraction_by_version,
        "count_by_lag": diag.count_by_version,
        "log_rho_q": diag.log_rho_quantiles,
        "guard_frac": diag.guard_fraction,
        "nonfinite": diag.num_nonfinite.astype(jnp.int32),
        "kl_pi_mu": kl,
        "value_mean": jnp.mean(prep.inputs.transitions.values),
        "target_mean": jnp.mean(targets),
        "target_std": jnp.std(targets),
    }


def pi_old_kl(setup: Setup, ltraj, valid, log_pi_old_all: Array) -> Array:
    """KL(pi_k || pi_old) over the batch (categorical: log-ratios floored at -MAX_LOG_RHO)."""
    return wmean(setup.head.kl(ltraj.log_pi_all, log_pi_old_all), valid)
