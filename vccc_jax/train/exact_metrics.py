"""Exact ground truth of one trainer update on the tabular, token and LQR envs (issues 11 §1,
12, 44).

No Monte-Carlo noise: the actor / critic networks are evaluated on every state of the env
and the values come from closed-form solvers — ``envs.exact_truth`` (linear solves on a
``tabular_env``), ``tabular.token.policy_values`` (backward induction over (position,
prompt, automaton state, tool countdown)) and ``tabular.lqr`` (Lyapunov solves for the
linear-Gaussian actor of an ``lqr:`` env; :func:`lqr_metrics`: its D is the fresh rollout's
visited states, equally weighted, and the ``exact_grad_*`` metrics are NaN there).

Metric names (scalars unless noted; every ``*_err_*`` is an RMSE under the state weights D
of the update's fresh rollout — the states the learner actually trained on):

* ``exact_err_pi``: critic vs V^{pi_k}; ``exact_err_mix``: critic vs V^{mubar}, the value of
  the replay-mixture policy (the fixed point the uncorrected critic chases, Eq 6 / Sec 1.3);
  ``exact_gap``: V^{mubar} vs V^{pi_k} (how far apart the two fixed points are);
  ``exact_rel_err_pi`` / ``exact_rel_err_mix``: the errors over RMS_D(V^{pi_k}) / RMS_D(V^{mubar});
* ``exact_err_mu`` [num ring versions]: critic vs V^{mu_l} of the version l updates old;
* ``exact_v_pi``: mean_D V^{pi_k};
* ``exact_grad_bias`` / ``exact_grad_rel_bias`` / ``exact_grad_cos``: the exact expected
  update of the one-step TD actor (Sec 5.1; weight kind / clip / Eq 13 centring of the
  config) with the current critic, against Eq 12 under the same state weights
  (``exact_truth.gradient_bias``; any token / batch row of ``estimators.actor_registry``,
  NaN for sequence rows): tabular env ``exact_truth.actor_update_truth`` (weights
  d_mix); token env ``token_actor_truth.actor_update_truth`` (weights D at policy states,
  the version posterior below; tool-observation states carry no actor gradient).

Mixture weights: the version of every transition of the learner's batch is known, so the
replay mixture uses the batch's empirical version (lag) frequencies; on the tabular env the
mixture follows the exact_truth model (version i's states ~ d^{mu_i}), on the token env the
version posterior q_l(s) is the batch's empirical one at each visited policy state (the
lag frequencies elsewhere).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from vccc_jax.envs import exact_truth as et
from vccc_jax.envs import lag as lag_lib
from vccc_jax.envs import tabular_env
from vccc_jax.envs import token_actor_truth as tat
from vccc_jax.envs import token_env as token_env_lib
from vccc_jax.estimators import actor_registry
from vccc_jax.tabular import lqr as lq
from vccc_jax.tabular import token as token_task

Array = chex.Array
LogMuFn = Callable[[Array], Array]  # logits [..., A] -> behaviour log-probs [..., A]

SCALARS = ("exact_err_pi", "exact_err_mix", "exact_gap", "exact_rel_err_pi",
           "exact_rel_err_mix", "exact_v_pi", "exact_grad_bias", "exact_grad_rel_bias",
           "exact_grad_cos")


def nan_metrics(num_versions: int) -> dict:
    out = {k: jnp.full((), jnp.nan, jnp.float32) for k in SCALARS}
    out["exact_err_mu"] = jnp.full((num_versions,), jnp.nan, jnp.float32)
    return out


def _rms(x: Array, w: Array) -> Array:
    return jnp.sqrt(jnp.sum(w * jnp.square(x)))


def lag_weights(lags: Array, valid: Array, num_versions: int) -> Array:
    """Empirical frequency of each lag 0..K-1 in the batch (lags capped at K - 1). [K]"""
    lags = jnp.clip(lags.reshape(-1), 0, num_versions - 1)
    counts = jax.ops.segment_sum(valid.reshape(-1), lags, num_segments=num_versions)
    return counts / jnp.maximum(jnp.sum(counts), 1.0)


def ring_params(actor_params: Any, ring: Any, num_versions: int) -> Any:
    """Actor params of lags 0..K-1 stacked (leaves [K, ...]); synchronous: [1, ...]."""
    if ring is None:
        return jax.tree_util.tree_map(lambda x: x[None], actor_params)
    return lag_lib.gather(ring, jnp.arange(num_versions, dtype=jnp.int32))


def _per_state(kind: str) -> bool:
    """The actor row has a per-state expected update (token / batch rows; issue 21). A
    sequence-level row's needs the law of whole sequences (``tabular.actor_paths``, short
    horizons only): its ``exact_grad_*`` metrics are NaN here."""
    return actor_registry.get_actor_correction(kind).level != "sequence"


def _grad_metrics(grads) -> dict:
    bias = et.gradient_bias(grads.expected, grads.eq12)
    return dict(exact_grad_bias=bias.bias_norm, exact_grad_rel_bias=bias.relative,
                exact_grad_cos=bias.cosine)


def _nan_grad_metrics() -> dict:
    return {k: jnp.full((), jnp.nan, jnp.float32)
            for k in ("exact_grad_bias", "exact_grad_rel_bias", "exact_grad_cos")}


def _error_metrics(values, v_pi, v_mix, v_mus, w) -> dict:
    v_pi, v_mix, v_mus, values = (jnp.asarray(x, jnp.float32) for x in (v_pi, v_mix, v_mus, values))
    err_pi, err_mix = _rms(values - v_pi, w), _rms(values - v_mix, w)
    return {
        "exact_err_pi": err_pi,
        "exact_err_mix": err_mix,
        "exact_gap": _rms(v_mix - v_pi, w),
        "exact_rel_err_pi": err_pi / jnp.maximum(_rms(v_pi, w), 1e-8),
        "exact_rel_err_mix": err_mix / jnp.maximum(_rms(v_mix, w), 1e-8),
        "exact_v_pi": jnp.sum(w * v_pi),
        "exact_err_mu": jax.vmap(lambda v: _rms(values - v, w))(v_mus),
    }


# ------------------------------------------------------------------------- tabular env


def tabular_metrics(
    env_params: tabular_env.EnvParams, actor_apply, critic_apply, actor_params, critic_params,
    stacked_mu_params, log_mu_fn: LogMuFn, version_weights: Array, state_ids: Array,
    state_valid: Array, *, kind: str, clip, centred: bool, correction_params=None,
) -> dict:
    """All exact metrics of one update on a ``tabular_env`` (module docstring).

    stacked_mu_params: behaviour params of lags 0..K-1 (:func:`ring_params`);
    version_weights [K]: replay probability of each lag; state_ids / state_valid: effective
    states of the batch and their sample weights (D = their normalised histogram).
    """
    mdp, table = tabular_env.params_mdp(env_params), env_params.obs_table
    n = table.shape[0]
    log_pi = jax.nn.log_softmax(actor_apply(actor_params, table), axis=-1)
    log_mus = jax.vmap(lambda p: log_mu_fn(actor_apply(p, table)))(stacked_mu_params)
    truth = et.version_truth(mdp, log_pi, log_mus, version_weights)
    values = critic_apply(critic_params, table)
    counts = jax.ops.segment_sum(state_valid.reshape(-1), state_ids.reshape(-1), num_segments=n)
    w = counts / jnp.maximum(jnp.sum(counts), 1.0)
    out = _error_metrics(values, truth.v_pi, truth.v_mix, truth.v_mus, w)
    if _per_state(kind):
        grads = et.actor_update_truth(actor_apply, actor_params, table, mdp, truth, values,
                                      kind=kind, clip=clip, centred=centred,
                                      correction_params=correction_params)
        out.update(_grad_metrics(grads))
    else:
        out.update(_nan_grad_metrics())
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


# ------------------------------------------------------------------------- token env


def token_grid_obs(env: token_env_lib.TokenEnv) -> Array:
    """Observations of every state (t < H, p, q, k) with the last-token features at the
    start value (the value does not depend on them): [H, P, Q, K, F]."""
    t = env.task
    H, P, Q, K = t.horizon, t.num_prompts, t.num_states, t.num_counters
    ii = jnp.meshgrid(jnp.arange(H), jnp.arange(P), jnp.arange(Q), jnp.arange(K), indexing="ij")
    return token_env_lib.observation_features(
        t, ii[1], ii[0], ii[2], ii[3], jnp.full((H, P, Q, K), -1, jnp.int32),
        onehot_time=env.onehot_time, last_token_features=env.last_token_features)


class TokenWeights(NamedTuple):
    """Weights of a token-env update from its fresh rollout: ``posterior`` [L, H, P, Q] the
    empirical version posterior q_l(s) at visited policy states (the lag weights elsewhere),
    ``state_weights`` [H, P, Q, K] the normalised histogram D of all visited states."""

    posterior: Array
    state_weights: Array


def token_weights(task, version_weights: Array, env_state, lags: Array, valid: Array) -> TokenWeights:
    """:class:`TokenWeights` of states ``env_state`` with lags / sample weights ``valid`` [T, B]."""
    H, P, Q, K = task.horizon, task.num_prompts, task.num_states, task.num_counters
    nv = version_weights.shape[0]
    flat = lambda x: x.reshape(-1)  # noqa: E731
    st = env_state
    time = jnp.clip(flat(st.time), 0, H - 1)
    policy = flat(valid) * (flat(st.k) == 0)
    lag = jnp.clip(flat(lags), 0, nv - 1)
    idx = ((lag * H + time) * P + flat(st.prompt)) * Q + flat(st.q)
    counts = jax.ops.segment_sum(policy, idx, num_segments=nv * H * P * Q).reshape(nv, H, P, Q)
    total = jnp.sum(counts, axis=0, keepdims=True)
    post = jnp.where(total > 0, counts / jnp.maximum(total, 1.0),
                     version_weights[:, None, None, None])
    sidx = ((time * P + flat(st.prompt)) * Q + flat(st.q)) * K + flat(st.k)
    cnt = jax.ops.segment_sum(flat(valid), sidx, num_segments=H * P * Q * K)
    w = cnt / jnp.maximum(jnp.sum(cnt), 1.0)
    return TokenWeights(posterior=post, state_weights=w.reshape(H, P, Q, K))


def token_metrics(
    env: token_env_lib.TokenEnv, actor_apply, critic_apply, actor_params, critic_params,
    stacked_mu_params, log_mu_fn: LogMuFn, version_weights: Array, env_state, lags: Array,
    valid: Array, *, kind: str, clip, centred: bool, correction_params=None,
) -> dict:
    """Exact metrics of one update on the token env (module docstring).

    ``actor_apply`` must read ``obs[..., :env.num_exact_features]`` (the trainer's does);
    env_state / lags / valid: the fresh rollout's states at s_t, lags and sample weights [T, B];
    kind / clip / centred: the actor's weight and Eq 13 centring (for the gradient bias).
    """
    task = env.task
    H = task.horizon
    nv = version_weights.shape[0]
    obs_p = lambda time: token_env_lib.policy_observations(env, time)  # noqa: E731

    def pi_fn(time):
        return jax.nn.log_softmax(actor_apply(actor_params, obs_p(time)), axis=-1)

    def mus_at(time):  # [nv, P, Q, V]
        return jax.vmap(lambda p: log_mu_fn(actor_apply(p, obs_p(time))))(stacked_mu_params)

    pi_vals = token_task.policy_values(task, pi_fn)
    v_pi = pi_vals.v[:H]
    v_mus = jax.vmap(lambda l: token_task.policy_values(
        task, lambda time: mus_at(time)[l]).v[:H])(jnp.arange(nv))
    tw = token_weights(task, version_weights, env_state, lags, valid)
    post = tw.posterior

    def mix_fn(t):
        m = jnp.sum(post[:, t, :, :, None] * jnp.exp(mus_at(t)), axis=0)
        return jnp.log(m)

    v_mix = token_task.policy_values(task, mix_fn).v[:H]
    values = critic_apply(critic_params, token_grid_obs(env))  # [H, P, Q, K]
    out = _error_metrics(values.reshape(-1), v_pi.reshape(-1), v_mix.reshape(-1),
                         v_mus.reshape(nv, -1), tw.state_weights.reshape(-1))
    if _per_state(kind):
        grads = tat.actor_update_truth(
            actor_apply, actor_params, tat.policy_obs_grid(env), task, mus_at, post,
            tw.state_weights[..., 0], values, kind=kind, clip=clip, centred=centred,
            pi_values=pi_vals, correction_params=correction_params)
        out.update(_grad_metrics(grads))
    else:
        out.update(_nan_grad_metrics())
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


# ------------------------------------------------------------------------- LQR env


def linear_gaussian(params: Any, log_scale: float = 0.0) -> lq.GaussianPolicy:
    """The ``tabular.lqr`` policy of a linear ``networks.GaussianActor``'s params (the
    behaviour of noise scale exp(log_scale): log-std shifted by it)."""
    p = params["params"]
    return lq.GaussianPolicy(p["Dense_0"]["kernel"].T, p["Dense_0"]["bias"],
                             p["log_std"] + log_scale)


def lqr_metrics(prob: lq.LQR, critic_apply, actor_params, critic_params, stacked_mu_params,
                log_noise_scale: float, version_weights: Array, obs: Array,
                valid: Array) -> dict:
    """Exact metrics of one update on an ``lqr:`` env (module docstring): V^{pi_k}, V^{mu_l}
    (version l at the behaviour's noise scale) and the replay mixture's V^{mubar}
    (:func:`tabular.lqr.mixture_value`) in closed form at the fresh rollout's states ``obs``
    [T, B, n] with sample weights ``valid`` [T, B]."""
    states = obs.reshape((-1, obs.shape[-1]))
    w = valid.reshape(-1) / jnp.maximum(jnp.sum(valid), 1.0)
    v_pi = lq.value(prob, linear_gaussian(actor_params))(states)
    mus = jax.vmap(lambda p: linear_gaussian(p, log_noise_scale))(stacked_mu_params)
    v_mus = jax.vmap(lambda m: lq.value(prob, m)(states))(mus)
    v_mix = lq.mixture_value(prob, mus, version_weights)(states)
    out = _error_metrics(critic_apply(critic_params, states), v_pi, v_mix, v_mus, w)
    out.update(_nan_grad_metrics())
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}
