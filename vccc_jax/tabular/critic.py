"""Tabular critics on mixed-version replay: one sweep cell's metrics (:func:`evaluate`).

Setting (DESIGN.md §6; docs/method.md; write-up Sec 1.3, 3.3, 4.2, 4.4). One MDP, a target
policy pi = pi_K and behaviour versions mu_i = pi_i (i = 0..K) mixed in the replay with
weights w_i (a staleness law, ``tabular.history``). The parts, one idea per module:

* ``tabular.methods``: the sweep's methods, adapters of ``estimators.registry`` keyed by
  the same names (:data:`METHODS`, :func:`register_method`);
* ``tabular.vtrace_moments``: V-trace's exact moments and sampled trajectories (Eq 11);
* ``tabular.replay``: the exact replay mixture (:func:`make_replay`) and the mixture's
  b* of Eq 9;
* ``tabular.resolve``: binding a method's options (:func:`resolve`, :func:`resolve_bank`);
* ``tabular.fixed_point``: exact target moments, the exact fixed point of expected
  semi-gradient TD, weight diagnostics;
* ``tabular.critic_sgd``: the trained critic (stochastic semi-gradient TD on sampled
  replay, :class:`~vccc_jax.tabular.critic_sgd.CriticSGDConfig`).

Metrics against V^{pi_K} (:func:`evaluate`): max and d^{pi_K}-weighted RMS error of the
fixed point and of the trained critic, the exact target variance at the fixed point
(sum_s d_mix(s) Var_replay[Y | s]), and the population ESS and clip rate by version.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax.numpy as jnp

from vccc_jax.tabular.critic_sgd import CriticSGDConfig, train_critic
from vccc_jax.tabular.fixed_point import (  # noqa: F401  (re-exported for callers)
    FixedPoint,
    affine_map,
    expected_target,
    fixed_point,
    weight_diagnostics,
)
from vccc_jax.tabular.mdp import TabularMDP
from vccc_jax.tabular.methods import (  # noqa: F401  (re-exported for callers)
    BASELINES,
    METHODS,
    MethodSpec,
    general_baseline,
    register_method,
)
from vccc_jax.tabular.replay import Replay, make_replay, mixture_optimal_baseline  # noqa: F401
from vccc_jax.tabular.resolve import (  # noqa: F401  (re-exported for callers)
    Resolved,
    _as_resolved,
    resolve,
    resolve_bank,
    version_z,
)
from vccc_jax.tabular.vtrace_moments import Trajectory, vtrace_moments  # noqa: F401

Array = chex.Array



# XLA options for jitting the tabular evaluators: the arrays are tiny and compile time
# dominates. Backend optimisation level 1 (of 0-3) compiled a sweep group about 2.5x
# faster than the default on this 2-core CPU at equal run time; level 0 was 5x slower
# to run.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


class CellInputs(NamedTuple):
    """One (cell, MDP) element of a sweep group: arrays for :func:`evaluate`."""

    mdp: TabularMDP
    log_probs: Array  # [V, S, A] versions; [-1] is pi_K
    values: Array  # [V, S] V^{pi_i}
    visitation: Array  # [V, S]
    weights: Array  # [V]
    clip: Array  # []
    key: Array


def evaluate(method, options: Optional[dict], config: CriticSGDConfig, x: CellInputs) -> dict:
    """All metrics of one method on one MDP's replay mixture (single element; vmap/map it).

    ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved` (e.g. a
    bank from :func:`resolve_bank`). Returns a dict of arrays: fixed-point errors
    (``fp_err_max``, ``fp_err_rms``) and values (``fp_values``), the exact target variance
    at the fixed point (``target_var``), the unidentified-state count, weight diagnostics
    (``ess``, ``clip_rate``, ``ess_by_version``, ``clip_by_version``), and, when training
    is enabled, ``tc_err_rms``/``tc_err_max`` (end of training), ``tc_err_to_fp`` (RMS
    distance to the fixed point), ``tc_target_var`` (mean per-update target variance over
    the second half of training) and the curves ``tc_curve_rms``, ``tc_curve_var``.
    """
    r = _as_resolved(method, options)
    replay = make_replay(x.mdp, x.log_probs, x.visitation, x.weights)
    v_true = x.values[-1]
    d_eval = x.visitation[-1]  # d^{pi_K}
    baseline = r.baseline(x.values)
    fp = fixed_point(r, replay, x.clip, None, baseline)
    err = fp.values - v_true
    _, var = expected_target(r, replay, fp.values, x.clip, None, baseline)
    ess, clip_rate, ess_v, clip_v = weight_diagnostics(r, replay, x.clip)
    out = dict(
        fp_values=fp.values,
        fp_err_max=jnp.max(jnp.abs(err)),
        fp_err_rms=jnp.sqrt(jnp.sum(d_eval * err**2)),
        target_var=jnp.sum(replay.state_dist * var),
        unidentified=jnp.sum(~fp.identified),
        ess=ess, clip_rate=clip_rate, ess_by_version=ess_v, clip_by_version=clip_v,
    )
    if config.enabled:
        tr = train_critic(r, replay, x.clip, None, baseline, x.key, config,
                          v_true=v_true, eval_dist=d_eval, cond_mean=(fp.c, fp.M))
        idx = jnp.asarray(config.checkpoints() - 1)
        tail = config.num_updates // 2
        out.update(
            tc_err_rms=tr.err_rms[-1], tc_err_max=tr.err_max[-1],
            tc_err_to_fp=jnp.sqrt(jnp.sum(d_eval * (tr.values - fp.values) ** 2)),
            tc_target_var=jnp.mean(tr.target_var[tail:]),
            tc_curve_rms=tr.err_rms[idx], tc_curve_var=tr.target_var[idx],
        )
    return out


