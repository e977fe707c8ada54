"""The trainer's learner (PureJaxRL-style): prepare one batch, then epochs x minibatches.

Plain functions of the static :class:`~vccc_jax.train.setup.Setup`, the grid values
(``train.programs.GridValues``) and arrays:

* :func:`prepare`: Vbar on s_t / s_{t+1}, log-ratios, critic targets (``train.targets``) and
  actor advantages of one trajectory (:class:`Prepared`);
* :func:`pi_old`: the actor's proximal policy (pi_k, or a decoupled route of issue 13);
* :func:`learner_batch`: the update's :class:`~vccc_jax.train.losses.Batch` (sample weights,
  pi_old, a per-update actor row's weights);
* :func:`learn` (default protocol): joint minibatch steps of the actor loss
  (``train.losses.actor_loss``) + vf_coef x the critic loss (Eq 7) - ent_coef x entropy;
  separate Adam optimisers;
* :func:`learn_critic_first` (issue 11 §2): critic (and b_psi) epochs first, then the
  actor's advantages recomputed with the updated critic and actor-only epochs.

The learned baseline head b_psi (``baseline="learned"``) regresses toward Eq 9's b* in
:func:`baseline_step`. Minibatches (:func:`env_minibatches`) shuffle each env's steps and
keep every env's rows together, so on a mesh that splits envs over devices no row moves;
advantages are normalised per minibatch before the minibatch loop
(:func:`effective_advantages`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators import importance
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.estimators.types import Transitions
from vccc_jax.train import actor_weights
from vccc_jax.train import setup as setup_lib
from vccc_jax.train.losses import (  # noqa: F401  (re-exported: the learner's batch API)
    Batch,
    actor_loss,
    critic_loss,
    finish_topk_errors,
    topk_centering_error_sums,
    topk_centering_errors,
    wmean,
)
from vccc_jax.train.programs import GridValues
from vccc_jax.train.setup import Setup
from vccc_jax.train.targets import TargetInputs, gae_advantages

Array = chex.Array

__all__ = ["Batch", "Learnable", "Prepared", "effective_advantages", "env_minibatches",
           "flat_rows", "learn", "learn_critic_first", "learner_batch", "pi_old", "prepare",
           "topk_centering_error_sums", "topk_centering_errors", "wmean"]


class Prepared(NamedTuple):
    """What the learner needs from one trajectory (all [T, B])."""

    inputs: TargetInputs
    targets: Array
    advantages: Array
    log_pi_old: Array  # log pi_k(a_t|s_t)
    log_mu: Array  # behaviour log-probs used by the actor (= log_pi_old if not correct)
    bstar_h: Optional[Array] = None  # r + gamma Vbar(s') (H of Eq 9), for the b_psi head


class Learnable(NamedTuple):
    """What the learner changes: the three heads' params and optimiser states."""

    actor_params: Any
    critic_params: Any
    actor_opt: Any
    critic_opt: Any
    baseline_params: Any = None
    baseline_opt: Any = None


# -- targets, advantages, pi_old ---------------------------------------------------------


def prepare(setup: Setup, values: GridValues, traj: rollout_lib.Trajectory, vbar_params,
            baseline_params=None) -> Prepared:
    """Vbar on s_t / s_{t+1}, log-ratios, critic targets and actor advantages.

    next_values[t] = Vbar(final_obs[t]): the observation the step produced before any
    auto-reset, so a time-limit cut bootstraps from the state it actually reached;
    discounts are 0 only where the step terminated (or the env's own per-step
    discounts: token env tool steps). ``baseline_params``: the learned b_psi head
    (``baseline="learned"``), whose b(s_t) is the baseline of vccc / *_baseline targets.
    """
    cfg = setup.cfg
    T = traj.reward.shape[0]
    both = setup.critic_values(vbar_params, jnp.concatenate([traj.obs, traj.final_obs], 0))
    values_, next_values = both[:T], both[T:]
    log_pi_old = setup.head.log_prob_as(traj.log_pi_all, traj.action, traj.log_mu_all, traj.log_mu)
    if cfg.correct:
        log_mu, log_mu_all = traj.log_mu, traj.log_mu_all
    else:  # pretend on-policy: the uncorrected learner
        log_mu, log_mu_all = log_pi_old, traj.log_pi_all
    inputs = TargetInputs(
        transitions=Transitions(
            rewards=traj.reward,
            discounts=traj.discounts(cfg.gamma),
            values=values_,
            next_values=next_values,
            log_rhos=log_pi_old - log_mu,
        ),
        truncated=traj.truncated,
        log_mu_all=log_mu_all,
        log_pi_all=traj.log_pi_all,
        baseline=_baseline(setup, values_, traj.obs, baseline_params),
        is_action=traj.is_action,
        head=setup.head,
        **_behaviour_values(cfg, traj, values_, next_values),
    )
    out = setup.target_fn(inputs, cfg, setup_lib.weight_clip(setup, values))
    if cfg.advantage == "target":
        advantages = out.advantages
    elif (cfg.critic in ("gae", "recompute_no_ratio") and cfg.vtrace_n is None
          and cfg.critic_lambda is None):
        advantages = out.advantages
    else:
        advantages = gae_advantages(inputs, cfg.gae_lambda)
    bstar_h = None
    if setup.baseline_net is not None:  # H = r + gamma Vbar(s') of Eq 9
        t = inputs.transitions
        bstar_h = jax.lax.stop_gradient(t.rewards + t.discounts * t.next_values)
    return Prepared(inputs, jax.lax.stop_gradient(out.targets),
                    jax.lax.stop_gradient(advantages), log_pi_old, log_mu, bstar_h)


def _behaviour_values(cfg, traj, values_, next_values) -> dict:
    """The actor's critic copy V_{k-L} at s_t and s_{t+1} (``TargetInputs`` fields) when the
    rollout logged it; lag-0 steps take the learner's Vbar (the same version's critic, so the
    same numbers; not with a Polyak Vbar, which no actor holds)."""
    if traj.behaviour_values is None:
        return {}
    v, nv = traj.behaviour_values[..., 0], traj.behaviour_values[..., 1]
    if cfg.polyak is None:
        lag0 = traj.lag == 0
        v, nv = jnp.where(lag0, values_, v), jnp.where(lag0, next_values, nv)
    return dict(behaviour_values=jax.lax.stop_gradient(v),
                behaviour_next_values=jax.lax.stop_gradient(nv))


def _baseline(setup: Setup, values_, obs, baseline_params):
    cfg = setup.cfg
    if cfg.baseline == "value":
        return values_
    if cfg.baseline == "zero":
        return jnp.zeros_like(values_)
    if baseline_params is None:
        raise ValueError("baseline='learned' needs the b_psi params (TrainState.baseline_params)")
    return jax.lax.stop_gradient(setup.baseline_net.apply(baseline_params, obs))


def pi_old(setup: Setup, values: GridValues, ewma, ltraj, prep: Prepared) -> tuple[Array, Array]:
    """The actor's proximal policy (log pi_old(a_t|s_t), log pi_old(.|s_t)), [T, B(, A)].

    Default (``pi_old_route=""``): pi_k, the learner at the start of the update. The
    decoupled routes of issue 13 (``estimators.related.decoupled.route_log_pi_old``):
    "exact" (training-side log-probs of each token's behaviour version, recorded by the
    rollout), "ewma" (PPO-EWMA: the actor at the debiased EMA ``ewma`` of its parameters),
    "behaviour" (the sampler's mu), "interpolated" (AReaL's A-3PO: log-probs interpolated
    between mu and pi_k by each token's lag, no forward pass). The actor loss is then
    w(pi_old / mu) x PPO-clip(pi_theta / pi_old) (``actor.policy_loss`` with
    ``log_pi_old``)."""
    route = setup.cfg.pi_old_route
    if not route:
        return prep.log_pi_old, prep.inputs.log_pi_all
    ewma_logits = (setup.actor_logits(dec.ewma_params(ewma, values.ewma_decay), ltraj.obs)
                   if route == "ewma" else None)
    return dec.route_log_pi_old(
        route, ltraj.action, log_pi_all=ltraj.log_pi_all, log_mu_all=prep.inputs.log_mu_all,
        behaviour_log_pi_all=ltraj.log_b_all, ewma_logits=ewma_logits, lags=ltraj.lag,
        head=setup.head)


def learner_batch(setup: Setup, values: GridValues, ltraj, prep: Prepared, valid,
                  log_pi_old, log_pi_old_all) -> Batch:
    """The update's learner :class:`Batch` [T, B, ...]: sample weights (replay validity,
    tool steps), pi_old (:func:`pi_old`) and a per-update actor row's weights."""
    actor_w = critic_w = None
    if setup.masked:
        critic_w = jnp.ones(ltraj.reward.shape, jnp.float32) if valid is None else valid
        actor_w = critic_w
        if ltraj.is_action is not None:
            actor_w = critic_w * ltraj.is_action.astype(jnp.float32)
    with_b = setup.baseline_net is not None
    return Batch(
        obs=ltraj.obs, action=ltraj.action, log_mu=prep.log_mu, log_pi_old=log_pi_old,
        log_mu_all=prep.inputs.log_mu_all, log_pi_old_all=log_pi_old_all,
        advantages=prep.advantages, targets=prep.targets, critic_w=critic_w,
        actor_w=actor_w,
        log_rho=prep.inputs.transitions.log_rhos if with_b else None,
        bstar_h=prep.bstar_h if with_b else None,
        actor_weight=_update_actor_weights(setup, values, ltraj, prep, log_pi_old, actor_w),
    )


def _update_actor_weights(setup: Setup, values: GridValues, traj, prep: Prepared, log_pi_old,
                          actor_w) -> Optional[Array]:
    """w [T, B] of a sequence / batch actor row (or one with per-token lags) at pi_old,
    once per update (``train.actor_weights.update_weights``); None for other rows."""
    if not actor_weights.per_update(setup.actor_row):
        return None
    return actor_weights.update_weights(
        setup.actor_row, setup_lib.actor_row_params(setup, values), log_pi_old, prep.log_mu,
        prep.advantages, actor_w,
        starts=actor_weights.sequence_starts(traj.terminated, traj.truncated),
        lags=traj.lag, normalize=setup.cfg.normalize_advantages)


# -- minibatches, steps and epochs ------------------------------------------------------


def env_minibatches(key: Array, batch: Any, num_minibatches: int) -> Any:
    """Time-major rows [T, B, ...] -> minibatches [M, T B / M, ...] that keep envs together.

    Each env's T steps are shuffled by a permutation of its own (random bits drawn for the
    whole [B, T] grid from ``key``, so the split does not depend on how the envs are placed
    on devices); the rows are then laid out env-major, r = b T + j, and minibatch m takes the
    rows with r = m (mod M). When M divides T every minibatch holds T / M random steps of
    every env (stratified by env, like the rollout). A mesh that splits the envs over
    "data" (D devices) keeps every row on its device as long as M divides T B / D: the
    shuffle is local, as in Anakin / PureJaxRL-on-pmap, yet the same on any device count.
    """
    leaves = [x for x in jax.tree_util.tree_leaves(batch) if x is not None]
    T, n = leaves[0].shape[:2]
    if (T * n) % num_minibatches:
        raise ValueError(f"num_minibatches={num_minibatches} must divide T * B = {T * n}")
    perm = jnp.argsort(jax.random.bits(key, (n, T)), axis=1)  # [B, T]

    def split(x):
        x = jax.vmap(lambda xb, pb: xb[pb])(jnp.swapaxes(x, 0, 1), perm)  # [B, T, ...]
        x = x.reshape((T * n // num_minibatches, num_minibatches) + x.shape[2:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree_util.tree_map(split, batch)


def effective_advantages(adv: Array, w: Optional[Array], normalize: bool) -> Array:
    """The advantages the actor loss takes, per minibatch: [M, mb] (minibatch rows on axis 1).

    ``normalize``: (A - mean) / (std + 1e-8) over each minibatch (w-weighted with sample
    weights ``w``). With ``w``: A w mb / sum(w), so the loss's plain mean over the minibatch
    is the w-weighted mean (masked samples carry no gradient)."""
    chex.assert_rank(adv, 2)
    if normalize:
        if w is None:
            mean = jnp.mean(adv, axis=1, keepdims=True)
            adv = (adv - mean) / (jnp.std(adv, axis=1, keepdims=True) + 1e-8)
        else:
            total = jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1.0)
            mean = jnp.sum(w * adv, axis=1, keepdims=True) / total
            var = jnp.sum(w * jnp.square(adv - mean), axis=1, keepdims=True) / total
            adv = (adv - mean) / (jnp.sqrt(var) + 1e-8)
    if w is not None:
        adv = adv * w * (w.shape[1] / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1.0))
    return adv


def flat_rows(batch: Any) -> Any:
    """[T, B, ...] -> [T B, ...] in time-major order (None fields stay None)."""
    return jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)


def baseline_step(setup: Setup, values: GridValues, params, opt, mb_: Batch):
    """One step of the b_psi head toward the sample b* of Eq 9: b* minimises
    E_mu[((rho - 1) b - rho H)^2 | s] (its normal equation is Eq 9), so this regression,
    per sample, has b*(s) as its population minimiser."""
    rho = importance.safe_ratios(mb_.log_rho)

    def loss(p):
        b = setup.baseline_net.apply(p, mb_.obs)
        return 0.5 * wmean(jnp.square((rho - 1.0) * b - rho * mb_.bstar_h), mb_.critic_w)

    value, g = jax.value_and_grad(loss)(params)
    upd, opt = setup_lib.baseline_tx(setup, values).update(g, opt, params)
    return optax.apply_updates(params, upd), opt, value


def epochs(setup: Setup, step, carry, batch: Batch, key, num_epochs: int):
    """``num_epochs`` x ``num_minibatches`` of ``step`` over ``losses.env_minibatches`` of the
    [T, B, ...] ``batch`` (reshuffled every epoch), advantages per minibatch as
    ``losses.effective_advantages`` (computed for the whole epoch before its minibatch loop,
    so under a mesh the loop's only collective is the gradient all-reduce)."""
    cfg = setup.cfg

    def epoch(carry, epoch_key):
        mbs = env_minibatches(epoch_key, batch, cfg.num_minibatches)
        mbs = mbs._replace(advantages=effective_advantages(
            mbs.advantages, mbs.actor_w, cfg.normalize_advantages))
        return jax.lax.scan(step, carry, mbs)

    return jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs))


def learn(setup: Setup, values: GridValues, params: Learnable, batch: Batch, key
          ) -> tuple[Learnable, dict]:
    """Joint actor + critic minibatch steps (the default protocol)."""
    cfg = setup.cfg
    actor_tx = setup_lib.actor_tx(setup, values)
    critic_tx = setup_lib.critic_tx(setup, values)

    def loss_fn(params, mb_: Batch):
        actor_params, critic_params = params
        pg_loss, entropy, approx_kl, ppo_clip, topk = actor_loss(setup, values, actor_params, mb_)
        v_loss = critic_loss(setup, critic_params, mb_)
        total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        return total, (pg_loss, v_loss, entropy, approx_kl, ppo_clip, topk)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def minibatch_step(carry: Learnable, mb_: Batch):
        mb_ = setup.constrain("minibatch", mb_)
        actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt = carry
        (_, aux), (g_actor, g_critic) = grad_fn((actor_params, critic_params), mb_)
        upd, actor_opt = actor_tx.update(g_actor, actor_opt, actor_params)
        actor_params = optax.apply_updates(actor_params, upd)
        upd, critic_opt = critic_tx.update(g_critic, critic_opt, critic_params)
        critic_params = optax.apply_updates(critic_params, upd)
        b_loss = jnp.zeros((), jnp.float32)
        if setup.baseline_net is not None:
            b_params, b_opt, b_loss = baseline_step(setup, values, b_params, b_opt, mb_)
        return Learnable(actor_params, critic_params, actor_opt, critic_opt, b_params,
                         b_opt), aux + (b_loss,)

    params, aux = epochs(setup, minibatch_step, params, batch, key, cfg.update_epochs)
    pg, v, ent, kl, clip, topk, b = aux
    return params, loss_stats((pg, v, ent, kl, clip, b), setup.baseline_net is not None, topk)


def learn_critic_first(setup: Setup, values: GridValues, params: Learnable, batch: Batch,
                       ltraj, key) -> tuple[Learnable, dict]:
    """The write-up's protocol (issue 11 §2): ``critic_steps`` epochs of critic (and
    b_psi) minibatch steps toward the targets of the start-of-update Vbar; then the
    actor's advantages are recomputed with the UPDATED critic (and b_psi) and
    ``update_epochs`` epochs of actor-only steps follow."""
    cfg = setup.cfg
    actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt = params
    actor_tx = setup_lib.actor_tx(setup, values)
    critic_tx = setup_lib.critic_tx(setup, values)
    k_critic, k_actor = jax.random.split(key)
    critic_grad = jax.value_and_grad(lambda p, mb_: critic_loss(setup, p, mb_))

    def critic_step(carry, mb_: Batch):
        mb_ = setup.constrain("minibatch", mb_)
        c_params, c_opt, bp, bo = carry
        v_loss, g = critic_grad(c_params, mb_)
        upd, c_opt = critic_tx.update(g, c_opt, c_params)
        c_params = optax.apply_updates(c_params, upd)
        b_loss = jnp.zeros((), jnp.float32)
        if setup.baseline_net is not None:
            bp, bo, b_loss = baseline_step(setup, values, bp, bo, mb_)
        return (c_params, c_opt, bp, bo), (v_loss, b_loss)

    (critic_params, critic_opt, b_params, b_opt), (v_losses, b_losses) = epochs(
        setup, critic_step, (critic_params, critic_opt, b_params, b_opt), batch, k_critic,
        cfg.critic_steps)
    # actor advantages from the updated critic (Vbar := the new critic)
    prep = prepare(setup, values, ltraj, critic_params, b_params)
    batch = batch._replace(advantages=prep.advantages)

    def actor_only(p, mb_):
        pg_loss, entropy, approx_kl, ppo_clip, topk = actor_loss(setup, values, p, mb_)
        return pg_loss - cfg.ent_coef * entropy, (pg_loss, entropy, approx_kl, ppo_clip, topk)

    actor_grad = jax.value_and_grad(actor_only, has_aux=True)

    def actor_step(carry, mb_: Batch):
        mb_ = setup.constrain("minibatch", mb_)
        a_params, a_opt = carry
        (_, aux), g = actor_grad(a_params, mb_)
        upd, a_opt = actor_tx.update(g, a_opt, a_params)
        return (optax.apply_updates(a_params, upd), a_opt), aux

    (actor_params, actor_opt), (pg, ent, kl, clip, topk) = epochs(
        setup, actor_step, (actor_params, actor_opt), batch, k_actor, cfg.update_epochs)
    params = Learnable(actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt)
    return params, loss_stats((pg, v_losses, ent, kl, clip, b_losses),
                              setup.baseline_net is not None, topk)


def loss_stats(aux, with_baseline: bool, topk_sums: Optional[dict] = None) -> dict:
    """Means over epochs x minibatches; ``topk_sums`` (stacked per-step sums of
    ``losses.topk_centering_error_sums``) -> ``mw_topk_rel_err`` / ``z_topk_abs_err`` /
    ``mw_norm`` over all of the update's policy steps (rows of every epoch)."""
    pg_loss, v_loss, entropy, approx_kl, ppo_clip, b_loss = (jnp.mean(a) for a in aux)
    out = {"actor_loss": pg_loss, "critic_loss": v_loss, "entropy": entropy,
           "approx_kl": approx_kl, "ppo_clip_frac": ppo_clip}
    if with_baseline:
        out["baseline_loss"] = b_loss
    if topk_sums:
        out |= finish_topk_errors(topk_sums)
    return out
