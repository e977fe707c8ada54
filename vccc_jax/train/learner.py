"""The trainer's learner (PureJaxRL-style): epochs x minibatches of actor and critic steps.

:class:`Batch` is one update's flattened learner batch ([T * B, ...] rows: observations,
actions, behaviour / proximal log-probs, advantages, critic targets, sample weights).
:class:`Learner` is a mixin of :class:`vccc_jax.train.trainer.Trainer` (it reads the
trainer's config, networks, optimisers and ``constrain`` hook) with the two protocols:

* :meth:`Learner.prepare`: Vbar on s_t / s_{t+1}, log-ratios, critic targets
  (``train.targets``) and actor advantages of one trajectory (:class:`Prepared`).
* :meth:`Learner._learn` (default): joint minibatch steps of the actor loss
  (``estimators.actor.policy_loss``: weight kind ratio / truncate / mask, PPO clip against
  pi_old, Eq 13 centring) + vf_coef x the critic loss 0.5 (V(s) - sg[y])^2 (Eq 7) - ent_coef
  x entropy; separate Adam optimisers.
* :meth:`Learner._learn_critic_first` (issue 11 §2): critic (and b_psi) epochs first, then the
  actor's advantages recomputed with the updated critic and actor-only epochs.

The learned baseline head b_psi (``baseline="learned"``) regresses toward Eq 9's b* in
:meth:`Learner._baseline_step`.

Top-k centring (``centering_topk = k > 0``, issue 12; §5.2, §7): the centred actor's
c(s) (hence Z(s) and m_w(s)) comes from the top-k summary of the logged behaviour row
(``lax.top_k(log_mu_all, k)``: what a real pipeline logs per token, k log-probs and ids)
plus the tail model of ``estimators.actor.centering_term_topk``, support-aware: the engine
also logs its sampler's support size n_s (one integer per token, known after its top-k / top-p
filter; here the count of finite entries of the logged row, ``actor.behaviour_support_size``),
and the unlogged mass lives on the n_s - k tokens pi_old ranks highest after the top-k
(:meth:`Learner._support_model`; a non-truncating sampler has n_s = V, where this is the
tail over all other tokens, unchanged). The batch still holds the full behaviour rows, but
otherwise only for the diagnostics :func:`topk_centering_errors` (``mw_topk_rel_err``,
``z_topk_abs_err``: the tail-model error against the exact values; ``mw_norm``: the size of
the exact m_w).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import importance
from vccc_jax.estimators.types import Transitions
from vccc_jax.train import actor_weights
from vccc_jax.train.targets import TargetInputs, gae_advantages

Array = chex.Array

__all__ = ["Batch", "Learner", "Prepared", "topk_centering_error_sums",
           "topk_centering_errors", "wmean"]


class Prepared(NamedTuple):
    """What the learner needs from one trajectory (all [T, B])."""

    inputs: TargetInputs
    targets: Array
    advantages: Array
    log_pi_old: Array  # log pi_k(a_t|s_t)
    log_mu: Array  # behaviour log-probs used by the actor (= log_pi_old if not correct)
    bstar_h: Optional[Array] = None  # r + gamma Vbar(s') (H of Eq 9), for the b_psi head


class Batch(NamedTuple):
    """One update's learner batch, rows [n = T * B, ...] (minibatches: [mb, ...])."""

    obs: Array
    action: Array
    log_mu: Array
    log_pi_old: Array
    log_mu_all: Array
    log_pi_old_all: Array
    advantages: Array
    targets: Array
    critic_w: Optional[Array] = None  # sample weights (replay validity); None: all 1
    actor_w: Optional[Array] = None  # critic_w x is_action (tool steps: no actor gradient)
    log_rho: Optional[Array] = None  # b_psi head (Eq 9): log rho and H per sample
    bstar_h: Optional[Array] = None
    actor_weight: Optional[Array] = None  # w of a per-update actor row (train.actor_weights)


def wmean(x: Array, w: Optional[Array]) -> Array:
    """mean(x), or the w-weighted mean when sample weights are given."""
    if w is None:
        return jnp.mean(x)
    return jnp.sum(w * x) / jnp.maximum(jnp.sum(w), 1.0)


def topk_centering_error_sums(
    log_pi_all: Array,
    log_mu_all: Array,
    k: int,
    *,
    kind: str,
    clip: Optional[float],
    weights: Optional[Array] = None,
    log_pi_old_all: Optional[Array] = None,
    support_size: Optional[Array] = None,
    max_support: Optional[int] = None,
) -> dict:
    """Sums over rows of the top-k centring error (pair with :func:`finish_topk_errors`).

    For a softmax policy c(s) = sum_a C(a) log pi_theta(a|s) has gradient wrt the logits
    m_w = C - (sum_a C(a)) pi_theta (§5.2, Eq 13; ``envs.samplers.m_w_topk``). Exact row:
    C = mu w (w from ``log_pi_old_all`` if given, else pi_theta; as ``actor.centering_term``),
    Z = sum_a C(a). Top-k + tail model: C_k from ``actor.centering_coefficients_topk`` of
    ``lax.top_k(log_mu_all, k)``, Z_k = sum_a C_k(a). Closed forms, O(V + k) per row.

    Args:
      log_pi_all, log_mu_all: [n, A] current-policy / behaviour log-probs (constants).
      k: the summary size (static, 1 <= k <= A).
      weights: [n] row weights (0: excluded, e.g. tool steps) or None (all 1).
      support_size, max_support: the support-aware tail (``actor.centering_coefficients_topk``):
        n_s [n] int (the sampler's support size) and a static bound on it, or None.

    Returns:
      {"mw_err_sq": sum_n w ||m_k - m||^2, "mw_sq": sum_n w ||m||^2,
       "z_abs_err": sum_n w |Z_k - Z|, "count": sum_n w}, scalars.
    """
    chex.assert_rank([log_pi_all, log_mu_all], 2)
    chex.assert_equal_shape([log_pi_all, log_mu_all])
    if not 1 <= k <= log_pi_all.shape[-1]:
        raise ValueError(f"k must be in [1, {log_pi_all.shape[-1]}], got {k}")
    sg = jax.lax.stop_gradient
    log_pi_all, log_mu_all = sg(log_pi_all), sg(log_mu_all)
    ref = log_pi_all if log_pi_old_all is None else sg(log_pi_old_all)
    chex.assert_equal_shape([ref, log_pi_all])
    c_exact = jnp.exp(log_mu_all) * importance.importance_weights(ref - log_mu_all, kind, clip)
    topk_log_mu, topk_ids = jax.lax.top_k(log_mu_all, k)
    top, tail = actor_lib.centering_coefficients_topk(
        ref, topk_log_mu, topk_ids, kind=kind, clip=clip, support_size=support_size,
        max_support=max_support)
    c_topk = jnp.put_along_axis(tail, topk_ids, top, axis=-1, inplace=False)  # tail is 0 there
    z, z_k = jnp.sum(c_exact, -1), jnp.sum(c_topk, -1)
    pi = jnp.exp(log_pi_all)
    m = c_exact - z[:, None] * pi
    m_k = c_topk - z_k[:, None] * pi
    w = jnp.ones(z.shape, z.dtype) if weights is None else weights.astype(z.dtype)
    chex.assert_equal_shape([w, z])
    return {"mw_err_sq": jnp.sum(w * jnp.sum(jnp.square(m_k - m), -1)),
            "mw_sq": jnp.sum(w * jnp.sum(jnp.square(m), -1)),
            "z_abs_err": jnp.sum(w * jnp.abs(z_k - z)),
            "count": jnp.sum(w)}


def finish_topk_errors(sums: dict) -> dict:
    """Sums of :func:`topk_centering_error_sums` (any leading axes: minibatches, epochs,
    summed over) -> {"mw_topk_rel_err": ||m_k - m||_2 / ||m||_2 over all rows (0 when both
    vanish, inf when only m does), "z_topk_abs_err": mean |Z_k - Z|, "mw_norm": the RMS
    ||m||_2 of the exact rows (read the relative error against it: when no weight is clipped
    m_w is 0 up to rounding, e.g. truncation at c >= max pi / mu, and so is its error)}."""
    err, sq = jnp.sum(sums["mw_err_sq"]), jnp.sum(sums["mw_sq"])
    count = jnp.maximum(jnp.sum(sums["count"]), 1e-30)
    rel = jnp.where(sq > 0, jnp.sqrt(err / jnp.where(sq > 0, sq, 1.0)),
                    jnp.where(err > 0, jnp.inf, 0.0))
    return {"mw_topk_rel_err": rel,
            "z_topk_abs_err": jnp.sum(sums["z_abs_err"]) / count,
            "mw_norm": jnp.sqrt(sq / count)}


def topk_centering_errors(log_pi_all, log_mu_all, k, kind, clip, weights=None,
                          log_pi_old_all=None, support_size=None, max_support=None) -> dict:
    """{"mw_topk_rel_err", "z_topk_abs_err", "mw_norm"} of the top-k + tail-model centring
    against the exact values over the rows of one batch (:func:`topk_centering_error_sums`)."""
    return finish_topk_errors(topk_centering_error_sums(
        log_pi_all, log_mu_all, k, kind=kind, clip=clip, weights=weights,
        log_pi_old_all=log_pi_old_all, support_size=support_size, max_support=max_support))




class Learner:
    """Mixin: the learner of :class:`~vccc_jax.train.trainer.Trainer` (see module docstring)."""

    # -- targets and advantages ----------------------------------------------------------
    def prepare(self, traj: rollout_lib.Trajectory, vbar_params, baseline_params=None) -> "Prepared":
        """Vbar on s_t / s_{t+1}, log-ratios, critic targets and actor advantages.

        next_values[t] = Vbar(final_obs[t]): the observation the step produced before any
        auto-reset, so a time-limit cut bootstraps from the state it actually reached;
        discounts are 0 only where the step terminated (or the env's own per-step
        discounts: token env tool steps). ``baseline_params``: the learned b_psi head
        (``baseline="learned"``), whose b(s_t) is the baseline of vccc / *_baseline targets.
        """
        cfg = self.config
        T = traj.reward.shape[0]
        both = self.critic_values(vbar_params, jnp.concatenate([traj.obs, traj.final_obs], 0))
        values, next_values = both[:T], both[T:]
        log_pi_old = jnp.take_along_axis(traj.log_pi_all, traj.action[..., None], -1)[..., 0]
        if cfg.correct:
            log_mu, log_mu_all = traj.log_mu, traj.log_mu_all
        else:  # pretend on-policy: the uncorrected learner
            log_mu, log_mu_all = log_pi_old, traj.log_pi_all
        inputs = TargetInputs(
            transitions=Transitions(
                rewards=traj.reward,
                discounts=traj.discounts(cfg.gamma),
                values=values,
                next_values=next_values,
                log_rhos=log_pi_old - log_mu,
            ),
            truncated=traj.truncated,
            log_mu_all=log_mu_all,
            log_pi_all=traj.log_pi_all,
            baseline=self._baseline(values, traj.obs, baseline_params),
            is_action=traj.is_action,
        )
        out = self.target_fn(inputs, cfg)
        if cfg.advantage == "target":
            advantages = out.advantages
        elif cfg.critic == "gae" and cfg.vtrace_n is None and cfg.critic_lambda is None:
            advantages = out.advantages
        else:
            advantages = gae_advantages(inputs, cfg.gae_lambda)
        bstar_h = None
        if self.baseline_net is not None:  # H = r + gamma Vbar(s') of Eq 9
            t = inputs.transitions
            bstar_h = jax.lax.stop_gradient(t.rewards + t.discounts * t.next_values)
        return Prepared(inputs, jax.lax.stop_gradient(out.targets),
                        jax.lax.stop_gradient(advantages), log_pi_old, log_mu, bstar_h)

    def _baseline(self, values, obs, baseline_params):
        cfg = self.config
        if cfg.baseline == "value":
            return values
        if cfg.baseline == "zero":
            return jnp.zeros_like(values)
        if baseline_params is None:
            raise ValueError("baseline='learned' needs the b_psi params (TrainState.baseline_params)")
        return jax.lax.stop_gradient(self.baseline_net.apply(baseline_params, obs))

    def _update_actor_weights(self, traj: rollout_lib.Trajectory, prep: "Prepared", log_pi_old,
                              actor_w) -> Optional[Array]:
        """w [T, B] of a sequence / batch actor row (or one with per-token lags) at pi_old,
        once per update (``train.actor_weights.update_weights``); None for other rows."""
        if not actor_weights.per_update(self.actor_row):
            return None
        return actor_weights.update_weights(
            self.actor_row, self.actor_row_params, log_pi_old, prep.log_mu, prep.advantages,
            actor_w, starts=actor_weights.sequence_starts(traj.terminated, traj.truncated),
            lags=traj.lag, normalize=self.config.normalize_advantages)

    # -- minibatch losses and steps --------------------------------------------------------

    def _centering_k(self) -> int:
        """``centering_topk`` checked against the action count (0: full rows)."""
        k = self.config.centering_topk
        if k and k >= self.num_actions:
            raise ValueError(f"centering_topk={k} must be < the number of actions "
                             f"{self.num_actions} (0 uses the full behaviour rows)")
        return k

    def _support_model(self) -> tuple[bool, Optional[int]]:
        """(support-aware?, max_support) of the top-k tail model, static, from the sampler.

        A sampler that cannot truncate (temperature / mismatch only, or the uncorrected
        learner, whose "behaviour" rows are pi_old) has n_s = V on every row, where the
        support-aware tail is every non-top-k token: (False, None), the first tail model,
        no ranking. Greedy: n_s = 1 (True, 1). Top-K (``top_k`` or the sampler's k): n_s <= K
        up to ties at the K-th logit, (True, K): one ``lax.top_k`` of size K - k; with an
        inference mismatch (bf16 / int8 rounding makes such ties likely) or top-p only,
        (True, None): the exact radix select of ``actor.tail_support_mask``."""
        cfg = self.config
        if not cfg.correct:
            return False, None
        spec = cfg.sampler_spec
        top_k, top_p, greedy, mismatch = ((cfg.top_k, 1.0, False, "none") if spec is None else
                                          (spec.top_k, spec.top_p, spec.greedy, spec.mismatch))
        if greedy:
            return True, 1
        top_k = top_k if 0 < top_k < self.num_actions else 0
        if top_k == 0 and top_p >= 1.0:
            return False, None
        return True, (top_k if top_k and mismatch == "none" else None)

    def _actor_loss(self, actor_params, mb_: Batch):
        """PPO-style actor loss (weights / clip / Eq 13 centring) on one minibatch; samples
        with ``actor_w`` = 0 (tool steps, empty replay slots) carry no gradient.

        Returns (pg_loss, entropy, approx_kl, ppo_clip, topk_sums): ``topk_sums`` is {} unless
        ``centering_topk`` > 0, then :func:`topk_centering_error_sums` of this minibatch at the
        current parameters (the error of the centring this very step used)."""
        cfg = self.config
        w = mb_.actor_w
        logits = self.actor_logits(actor_params, mb_.obs)
        log_pi_all = jax.nn.log_softmax(logits, axis=-1)
        log_pi = jnp.take_along_axis(log_pi_all, mb_.action[:, None], -1)[:, 0]
        adv = mb_.advantages
        if cfg.normalize_advantages:
            if w is None:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            else:
                mean = wmean(adv, w)
                adv = (adv - mean) / (jnp.sqrt(wmean(jnp.square(adv - mean), w)) + 1e-8)
        scale = 1.0
        if w is not None:  # policy_loss is a plain mean: zero the masked terms, renormalise
            adv = adv * w
            scale = w.shape[0] / jnp.maximum(jnp.sum(w), 1.0)
        centering, topk_sums = None, {}
        c_clip = None if self.actor_kind == "ratio" else cfg.actor_clip
        k = self._centering_k() if self.centered else 0
        if self.centered and k == 0:
            centering = actor_lib.centering_term(
                log_pi_all, mb_.log_mu_all, kind=self.actor_kind,
                clip=c_clip, log_pi_old_all=mb_.log_pi_old_all)
        elif self.centered:  # what a real pipeline logs: k log-probs + ids, and n_s
            topk_log_mu, topk_ids = jax.lax.top_k(mb_.log_mu_all, k)
            aware, max_support = self._support_model()
            n_s = actor_lib.behaviour_support_size(mb_.log_mu_all) if aware else None
            centering = actor_lib.centering_term_topk(
                log_pi_all, topk_log_mu, topk_ids, kind=self.actor_kind, clip=c_clip,
                log_pi_old_all=mb_.log_pi_old_all, support_size=n_s, max_support=max_support)
            topk_sums = topk_centering_error_sums(  # diagnostics only: full rows
                log_pi_all, mb_.log_mu_all, k, kind=self.actor_kind, clip=c_clip,
                weights=w, log_pi_old_all=mb_.log_pi_old_all, support_size=n_s,
                max_support=max_support)
        # the actor-correction row (issue 21): Eq 10 kinds by kind / clip, others by weights
        weights, ref, eps = None, mb_.log_pi_old, cfg.ppo_epsilon
        if mb_.actor_weight is not None:  # sequence / batch rows: w of the whole update
            weights = mb_.actor_weight
            if not self.actor_row.trust_region:
                ref, eps = None, None
        elif not actor_weights.legacy(self.actor_row):
            weights, ref, trust = actor_weights.minibatch_weights(
                self.actor_row, self.actor_row_params, log_pi, mb_.log_pi_old, mb_.log_mu, adv, w)
            eps = cfg.ppo_epsilon if trust else None
        kind = self.actor_kind if weights is None else "ratio"
        pg_loss = actor_lib.policy_loss(
            log_pi, mb_.log_mu, adv, kind=kind,
            clip=None if kind == "ratio" else cfg.actor_clip,
            ppo_epsilon=eps, log_pi_old=ref, centering=centering, weights=weights)
        if w is not None:
            pg_loss = pg_loss * scale
        if w is None:
            entropy = -jnp.mean(jnp.sum(jnp.exp(log_pi_all) * log_pi_all, axis=-1))
        else:
            entropy = wmean(-jnp.sum(jnp.exp(log_pi_all) * log_pi_all, axis=-1), w)
        log_r = log_pi - mb_.log_pi_old
        approx_kl = wmean(jnp.exp(log_r) - 1.0 - log_r, w)
        ppo_clip = (wmean((jnp.abs(jnp.exp(log_r) - 1.0) > cfg.ppo_epsilon)
                           .astype(jnp.float32), w) if cfg.ppo_epsilon is not None
                    else jnp.zeros((), jnp.float32))
        return pg_loss, entropy, approx_kl, ppo_clip, topk_sums

    def _critic_loss(self, critic_params, mb_: Batch):
        """0.5 (V(s) - sg[y])^2, Eq 7 (weighted by ``critic_w``)."""
        v = self.critic_values(critic_params, mb_.obs)
        return 0.5 * wmean(jnp.square(v - mb_.targets), mb_.critic_w)

    def _baseline_step(self, params, opt, mb_: Batch):
        """One step of the b_psi head toward the sample b* of Eq 9: b* minimises
        E_mu[((rho - 1) b - rho H)^2 | s] (its normal equation is Eq 9), so this regression,
        per sample, has b*(s) as its population minimiser."""
        rho = importance.safe_ratios(mb_.log_rho)

        def loss(p):
            b = self.baseline_net.apply(p, mb_.obs)
            return 0.5 * wmean(jnp.square((rho - 1.0) * b - rho * mb_.bstar_h), mb_.critic_w)

        value, g = jax.value_and_grad(loss)(params)
        upd, opt = self.baseline_tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, value

    def _epochs(self, step, carry, batch: Batch, key, epochs: int):
        """``epochs`` x ``num_minibatches`` of ``step`` over shuffled minibatches."""
        cfg = self.config
        n = batch.obs.shape[0]
        mb = n // cfg.num_minibatches

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, n)
            def split(x):
                return jnp.take(x, perm, axis=0).reshape((cfg.num_minibatches, mb) + x.shape[1:])

            shuffled = jax.tree_util.tree_map(split, batch)
            return jax.lax.scan(step, carry, shuffled)

        return jax.lax.scan(epoch, carry, jax.random.split(key, epochs))

    def _learn(self, learn, batch: Batch, key):
        """Joint actor + critic minibatch steps (the default protocol)."""
        cfg = self.config

        def loss_fn(params, mb_: Batch):
            actor_params, critic_params = params
            pg_loss, entropy, approx_kl, ppo_clip, topk = self._actor_loss(actor_params, mb_)
            v_loss = self._critic_loss(critic_params, mb_)
            total = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
            return total, (pg_loss, v_loss, entropy, approx_kl, ppo_clip, topk)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def minibatch_step(carry, mb_: Batch):
            mb_ = self.constrain("minibatch", mb_)
            actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt = carry
            (_, aux), (g_actor, g_critic) = grad_fn((actor_params, critic_params), mb_)
            upd, actor_opt = self.actor_tx.update(g_actor, actor_opt, actor_params)
            actor_params = optax.apply_updates(actor_params, upd)
            upd, critic_opt = self.critic_tx.update(g_critic, critic_opt, critic_params)
            critic_params = optax.apply_updates(critic_params, upd)
            b_loss = jnp.zeros((), jnp.float32)
            if self.baseline_net is not None:
                b_params, b_opt, b_loss = self._baseline_step(b_params, b_opt, mb_)
            return (actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt), \
                aux + (b_loss,)

        learn, aux = self._epochs(minibatch_step, learn, batch, key, cfg.update_epochs)
        pg, v, ent, kl, clip, topk, b = aux
        return learn, self._loss_stats((pg, v, ent, kl, clip, b),
                                       self.baseline_net is not None, topk)

    def _learn_critic_first(self, learn, batch: Batch, ltraj, key):
        """The write-up's protocol (issue 11 §2): ``critic_steps`` epochs of critic (and
        b_psi) minibatch steps toward the targets of the start-of-update Vbar; then the
        actor's advantages are recomputed with the UPDATED critic (and b_psi) and
        ``update_epochs`` epochs of actor-only steps follow."""
        cfg = self.config
        actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt = learn
        k_critic, k_actor = jax.random.split(key)
        critic_grad = jax.value_and_grad(self._critic_loss)

        def critic_step(carry, mb_: Batch):
            mb_ = self.constrain("minibatch", mb_)
            c_params, c_opt, bp, bo = carry
            v_loss, g = critic_grad(c_params, mb_)
            upd, c_opt = self.critic_tx.update(g, c_opt, c_params)
            c_params = optax.apply_updates(c_params, upd)
            b_loss = jnp.zeros((), jnp.float32)
            if self.baseline_net is not None:
                bp, bo, b_loss = self._baseline_step(bp, bo, mb_)
            return (c_params, c_opt, bp, bo), (v_loss, b_loss)

        (critic_params, critic_opt, b_params, b_opt), (v_losses, b_losses) = self._epochs(
            critic_step, (critic_params, critic_opt, b_params, b_opt), batch, key=k_critic,
            epochs=cfg.critic_steps)
        # actor advantages from the updated critic (Vbar := the new critic)
        prep = self.prepare(ltraj, critic_params, b_params)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = batch._replace(advantages=flat(prep.advantages))

        def actor_loss(p, mb_):
            pg_loss, entropy, approx_kl, ppo_clip, topk = self._actor_loss(p, mb_)
            return pg_loss - cfg.ent_coef * entropy, (pg_loss, entropy, approx_kl, ppo_clip, topk)

        actor_grad = jax.value_and_grad(actor_loss, has_aux=True)

        def actor_step(carry, mb_: Batch):
            mb_ = self.constrain("minibatch", mb_)
            a_params, a_opt = carry
            (_, aux), g = actor_grad(a_params, mb_)
            upd, a_opt = self.actor_tx.update(g, a_opt, a_params)
            return (optax.apply_updates(a_params, upd), a_opt), aux

        (actor_params, actor_opt), (pg, ent, kl, clip, topk) = self._epochs(
            actor_step, (actor_params, actor_opt), batch, k_actor, cfg.update_epochs)
        learn = (actor_params, critic_params, actor_opt, critic_opt, b_params, b_opt)
        return learn, self._loss_stats((pg, v_losses, ent, kl, clip, b_losses),
                                       self.baseline_net is not None, topk)

    @staticmethod
    def _loss_stats(aux, with_baseline: bool, topk_sums: Optional[dict] = None) -> dict:
        """Means over epochs x minibatches; ``topk_sums`` (stacked per-step sums of
        :func:`topk_centering_error_sums`) -> ``mw_topk_rel_err`` / ``z_topk_abs_err`` /
        ``mw_norm`` over all of the update's policy steps (rows of every epoch)."""
        pg_loss, v_loss, entropy, approx_kl, ppo_clip, b_loss = (jnp.mean(a) for a in aux)
        out = {"actor_loss": pg_loss, "critic_loss": v_loss, "entropy": entropy,
               "approx_kl": approx_kl, "ppo_clip_frac": ppo_clip}
        if with_baseline:
            out["baseline_loss"] = b_loss
        if topk_sums:
            out |= finish_topk_errors(topk_sums)
        return out
