"""Trainer conformance (issue 27): every number the trainer prepares for an update equals the
library estimator applied here, independently, to the same logged arrays.

One logged batch per env: ``tabular:`` (random time-limit cuts) and ``token:`` (top-k
sampler, tool steps, env discounts), lag law uniform:3 over a ring of four distinct actor
versions, so the log-ratios are nonzero and some weights clip.

Trainer side (its own code path): ``learner.prepare`` (Vbar, log-ratios, critic targets with
Z(s), advantages), ``learner.pi_old`` + ``learner_batch`` (the pi_old route and a
per-update actor row's weights), ``learner.env_minibatches`` + ``effective_advantages`` +
``losses.actor_loss`` / ``critic_loss`` (the losses and, by jax.grad, their gradients).

Reference side, from the logged arrays only: log-ratios by take_along_axis, Vbar by applying
the critic network to obs / final_obs, discounts gamma (1 - terminated) (token env: its
logged discounts), Z(s) in NumPy, targets from ``estimators.critic_targets`` /
``estimators.vtrace``, GAE by a NumPy loop, normalised advantages in NumPy, actor weights
from the ``estimators.actor_registry`` row, the actor loss from ``estimators.actor.
policy_loss`` (+ ``centering_term``), the critic loss 0.5 (V - y)^2, gradients by jax.grad
of the reference losses (evaluated at perturbed parameters, so the PPO ratio is not 1).

Tolerance: float32, the same arithmetic in two XLA programs: rtol 1e-5 on values (1e-4 on
losses and 2e-4 on gradients, whose small components are sums of cancelling terms).
One-line bugs injected (then reverted) and the first test that fails (issue 27):
learner.py log_rhos = log mu - log pi_old and log_mu_all := log_pi_all (prepared batch:
uncorrected-value-gae); targets.py Z(s) with pi and mu swapped (centered_baseline-zero-target),
rho_bar / c_bar swapped in V-trace (vtrace-value-target), b = 0 ignored for vccc
(vccc-zero-gae); actor_weights.py trust-region w from pi_theta instead of pi_old
(icepop-exact), per-update advantages not normalised (topr-pik); losses.py centring without
pi_old (centered-truncate-behaviour).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.envs import lag as lag_lib
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import actor_registry
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.vtrace import vtrace
from vccc_jax.train import learner, losses
from vccc_jax.train import trainer as trainer_lib
from vccc_jax.train.config import TrainConfig, parse_actor
from vccc_jax.train.learner import effective_advantages, env_minibatches
from vccc_jax.train.trainer import Trainer

TAB = "tabular:family=garnet,S=5,A=3,gamma=0.9,seed=2"
TOKEN = "token:V=8,H=5,Q=3,C=3,P=2,m=1,tools=1,gamma=1,seed=1"
ENVS = {"tabular": dict(env=TAB, gamma=0.9),
        "token": dict(env=TOKEN, gamma=1.0, sampler="temp=0.8,k=4")}
BASE = dict(lag="uniform:3", num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1,
            hidden=8, num_layers=1, total_timesteps=32, clip=1.3, actor_clip=1.3, rho_bar=1.3,
            c_bar=1.1, gae_lambda=0.9, ppo_epsilon=0.1)
RTOL, ATOL = 1e-5, 1e-6


def _cfg(env: str, **changes) -> TrainConfig:
    return TrainConfig(**BASE, **ENVS[env]).replace(**changes)


@functools.lru_cache(maxsize=None)
def _trainer(cfg: TrainConfig) -> Trainer:
    return Trainer(cfg)


def _perturb(params, key, scale):
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


@functools.lru_cache(maxsize=None)
def logged(env: str):
    """(state, traj) of one seed: a ring of 4 distinct versions (the newest is the actor),
    a critic with clearly nonzero values, one rollout at lags drawn from uniform:3 (with the
    training-side behaviour log-probs recorded, for the exact pi_old route)."""
    tr = _trainer(_cfg(env, pi_old_route="exact"))
    one = jax.tree_util.tree_map(lambda x: x[0], tr.init())
    key = jax.random.PRNGKey(7)
    versions = one.versions
    for i in range(3):
        versions = lag_lib.push(versions, _perturb(one.actor_params, jax.random.fold_in(key, i), 1.0))
    versions = lag_lib.push(versions, one.actor_params)
    one = one.replace(versions=versions,
                      critic_params=jax.tree_util.tree_map(lambda x: 4.0 * x, one.critic_params))
    _, traj = jax.jit(lambda s, k: trainer_lib.rollout_step(
        tr.setup, tr.values, s.actor_params, s.versions, s.env, k, 3,
        jax.random.fold_in(k, 1)))(one, key)
    return one, traj


# -- the reference, from the logged arrays ------------------------------------------------


def _np(x):
    return np.asarray(x, np.float64)


def _take(table, action):
    return np.take_along_axis(_np(table), np.asarray(action)[..., None], -1)[..., 0]


def _actor_obs(tr, obs):
    return obs if tr.setup.actor_features is None else obs[..., :tr.setup.actor_features]


def reference_inputs(tr: Trainer, state, traj) -> dict:
    """Logged-array quantities, computed here (float64 NumPy where the math is ours)."""
    cfg = tr.config
    v = _np(tr.setup.critic_net.apply(state.critic_params, traj.obs))
    nv = _np(tr.setup.critic_net.apply(state.critic_params, traj.final_obs))
    log_pi_k = _take(traj.log_pi_all, traj.action)
    if traj.discount is not None:  # the token env's own discounts (tool steps)
        disc = _np(traj.discount)
    else:
        disc = cfg.gamma * (1.0 - _np(traj.terminated))
    return dict(rewards=_np(traj.reward), discounts=disc, values=v, next_values=nv,
                log_rhos=log_pi_k - _np(traj.log_mu), log_pi_k=log_pi_k,
                truncated=np.asarray(traj.truncated))


def numpy_z(log_pi_all, log_mu_all, clip) -> np.ndarray:
    """Z(s) = E_mu[min(pi / mu, c) | s] over the logged full rows (Sec 4.2)."""
    pi, mu = np.exp(_np(log_pi_all)), np.exp(_np(log_mu_all))
    w = np.minimum(pi / np.where(mu > 0, mu, 1.0), clip)
    return np.sum(np.where(mu > 0, mu * w, 0.0), -1) / np.sum(mu, -1)


def numpy_gae(x: dict, lam: float) -> np.ndarray:
    """GAE(gamma, lambda) on Vbar: A_t = delta_t + gamma_t lambda A_{t+1}, the trace cut at
    a time-limit truncation and at the window's end (bootstrapped from Vbar(final obs))."""
    T = x["rewards"].shape[0]
    delta = x["rewards"] + x["discounts"] * x["next_values"] - x["values"]
    adv = np.zeros_like(delta)
    nxt = np.zeros_like(delta[0])
    for t in reversed(range(T)):
        cont = 0.0 if t == T - 1 else x["discounts"][t] * lam * (1.0 - x["truncated"][t])
        nxt = delta[t] + cont * nxt
        adv[t] = nxt
    return adv


def reference_targets(cfg: TrainConfig, x: dict, traj) -> tuple[np.ndarray, np.ndarray]:
    """(critic targets, their own advantages) of ``cfg.critic`` by the library estimators."""
    with jax.enable_x64(True):
        f64 = {k: jnp.asarray(v) for k, v in x.items() if k != "truncated"}
        args = (f64["rewards"], f64["discounts"], f64["values"], f64["next_values"],
                f64["log_rhos"])
        zero = jnp.zeros_like(f64["values"])
        if cfg.critic == "uncorrected":
            y = ct.uncorrected_target(f64["rewards"], f64["discounts"], f64["next_values"])
        elif cfg.critic == "vccc":
            y = ct.vccc_target(*args, baseline=None if cfg.baseline == "value" else zero)
        elif cfg.critic == "truncated":
            y = ct.clipped_target(*args, clip=cfg.clip, kind="truncate")
        elif cfg.critic == "centered_baseline":
            base = f64["values"] if cfg.baseline == "value" else zero
            z = jnp.asarray(numpy_z(traj.log_pi_all, traj.log_mu_all, cfg.clip))
            y = ct.centered_clipped_target(*args, baseline=base, z=z, clip=cfg.clip,
                                           kind="truncate")
        elif cfg.critic == "vtrace":
            out = vtrace(f64["log_rhos"], f64["discounts"], f64["rewards"], f64["values"],
                         f64["next_values"][-1], lambda_=cfg.target_lambda,
                         clip_rho_threshold=cfg.rho_bar, clip_c_threshold=cfg.c_bar,
                         clip_pg_rho_threshold=cfg.rho_bar, truncations=jnp.asarray(x["truncated"]),
                         truncation_values=f64["next_values"])
            return _np(out.vs), _np(out.pg_advantages)
        else:
            raise ValueError(cfg.critic)
    return _np(y), _np(y) - x["values"]


# -- critic side: Vbar, log-ratios, Z, targets, advantages ------------------------------------

CRITICS = [("uncorrected", "value", "gae"), ("vccc", "value", "target"),
           ("vccc", "zero", "gae"), ("truncated", "value", "target"),
           ("centered_baseline", "zero", "target"), ("vtrace", "value", "target")]


@functools.lru_cache(maxsize=None)
def _prepare(cfg: TrainConfig):
    tr = _trainer(cfg)
    return jax.jit(functools.partial(learner.prepare, tr.setup, tr.values))


def test_the_logged_batch_is_off_policy():
    """The batch exercises what the conformance tests claim: lags > 0, log-ratios far from
    0, weights on both sides of the clip, time-limit cuts (tabular), tool steps (token)."""
    for env in ENVS:
        state, traj = logged(env)
        x = reference_inputs(_trainer(_cfg(env)), state, traj)
        rho = np.exp(x["log_rhos"])
        assert (np.asarray(traj.lag) > 0).any() and (np.asarray(traj.lag) == 0).any(), env
        assert np.max(np.abs(x["log_rhos"])) > 0.3, env
        assert (rho > BASE["clip"]).any() and (rho < BASE["clip"]).sum() > rho.size // 2, env
        assert np.std(x["values"]) > 0.05, env
    assert np.asarray(logged("tabular")[1].truncated).any()
    assert not np.asarray(logged("token")[1].is_action).all()


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("critic,baseline,advantage", CRITICS,
                         ids=["-".join(c) for c in CRITICS])
def test_prepared_batch_equals_the_library(env, critic, baseline, advantage):
    cfg = _cfg(env, critic=critic, baseline=baseline, advantage=advantage)
    state, traj = logged(env)
    tr = _trainer(cfg)
    prep = _prepare(cfg)(traj, state.critic_params)
    x = reference_inputs(tr, state, traj)
    t = prep.inputs.transitions
    close = functools.partial(np.testing.assert_allclose, rtol=RTOL, atol=ATOL * 10)
    close(t.values, x["values"], err_msg="Vbar(s_t)")
    close(t.next_values, x["next_values"], err_msg="Vbar(s_t+1)")
    close(t.discounts, x["discounts"], err_msg="discounts")
    close(t.rewards, x["rewards"], err_msg="rewards")
    close(t.log_rhos, x["log_rhos"], err_msg="log rho = log pi_k - log mu")
    close(prep.log_pi_old, x["log_pi_k"], err_msg="log pi_k(a|s)")
    close(prep.log_mu, traj.log_mu, err_msg="log mu(a|s)")
    close(prep.inputs.log_mu_all, traj.log_mu_all, err_msg="log mu(.|s)")
    y, own_adv = reference_targets(cfg, x, traj)
    close(prep.targets, y, err_msg=f"{critic} target")
    adv = own_adv if advantage == "target" else numpy_gae(x, cfg.gae_lambda)
    close(prep.advantages, adv, err_msg=f"{advantage} advantages")


# -- actor side: pi_old routes, actor weights, advantages, losses and gradients -------------

# (actor row, pi_old route): the Eq 10 rows (with and without Eq 13 centring), token rows
# with a trust region (IcePop) and without (CISPO), per-update rows (sequence TIS; TOPR, whose
# weight reads the sign of the batch-normalised advantage; AReaL with its per-token lags),
# over the routes "" (pi_k), "behaviour" (mu) and "exact"
ACTORS = [("truncate", ""), ("centered-truncate", "behaviour"), ("mask", "exact"),
          ("icepop", "exact"), ("cispo", ""), ("seq_tis", "behaviour"), ("topr", ""),
          ("areal", "exact")]


def _route(route: str, traj):
    """log pi_old(.|s) of the route, from the logged rows."""
    return {"": traj.log_pi_all, "behaviour": traj.log_mu_all, "exact": traj.log_b_all}[route]


@functools.lru_cache(maxsize=None)
def _actor_side(cfg: TrainConfig):
    tr = _trainer(cfg)

    def run(state, traj, key, theta, critic):
        prep = learner.prepare(tr.setup, tr.values, traj, state.critic_params)
        lp_old, lp_old_all = learner.pi_old(tr.setup, tr.values, state.ewma, traj, prep)
        batch = learner.learner_batch(tr.setup, tr.values, traj, prep, None, lp_old, lp_old_all)
        mbs = env_minibatches(key, batch, cfg.num_minibatches)
        adv = effective_advantages(mbs.advantages, mbs.actor_w, cfg.normalize_advantages)
        mb = jax.tree_util.tree_map(lambda a: a[0], mbs._replace(advantages=adv))
        pg, g = jax.value_and_grad(lambda p: losses.actor_loss(tr.setup, tr.values, p, mb)[0])(theta)
        vl, vg = jax.value_and_grad(functools.partial(losses.critic_loss, tr.setup))(critic, mb)
        return dict(lp_old=lp_old, lp_old_all=lp_old_all, actor_weight=batch.actor_weight,
                    adv=adv[0], pg=pg, g=g, vl=vl, vg=vg)

    return jax.jit(run)


def _normalise(adv, w):
    """(A - mean) / (std + 1e-8), w-weighted when sample weights are given."""
    m = np.ones_like(adv) if w is None else w
    mean = np.sum(m * adv) / max(np.sum(m), 1.0)
    std = np.sqrt(np.sum(m * (adv - mean) ** 2) / max(np.sum(m), 1.0))
    return (adv - mean) / (std + 1e-8)


def _starts(traj):
    done = np.asarray(traj.terminated) | np.asarray(traj.truncated)
    return np.concatenate([np.ones_like(done[:1]), done[:-1]], 0)


def _tree_close(a, b, rtol, atol, msg):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"{msg} {path}")


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("actor,route", ACTORS, ids=[f"{a}-{r or 'pik'}" for a, r in ACTORS])
def test_actor_weights_loss_and_gradient_equal_the_library(env, actor, route):
    cfg = _cfg(env, actor=actor, pi_old_route=route, critic="vccc")
    tr = _trainer(cfg)
    state, traj = logged(env)
    key = jax.random.PRNGKey(11)
    theta = _perturb(state.actor_params, jax.random.PRNGKey(12), 0.3)  # PPO ratio != 1
    critic = _perturb(state.critic_params, jax.random.PRNGKey(13), 0.3)
    out = _actor_side(cfg)(state, traj, key, theta, critic)

    # reference: the logged arrays, the route's pi_old, GAE advantages, sample weights
    x = reference_inputs(tr, state, traj)
    ref_old_all = _route(route, traj)
    ref_old = _take(ref_old_all, traj.action)
    np.testing.assert_allclose(out["lp_old"], ref_old, rtol=RTOL, err_msg="log pi_old(a|s)")
    np.testing.assert_allclose(out["lp_old_all"], ref_old_all, rtol=RTOL)
    adv = numpy_gae(x, cfg.gae_lambda)
    mask = None if traj.is_action is None else _np(traj.is_action)
    kind, centred = parse_actor(actor)
    row = actor_registry.get_actor_correction(kind)
    params = row.resolve({"clip": cfg.actor_clip} if "clip" in row.param_names else {})
    per_update = kind not in ("ratio", "truncate", "mask") and (row.level != "token" or row.data)
    with jax.enable_x64(True):
        if per_update:  # w of the whole update at pi_old, advantages normalised over the batch
            data = {k: v for k, v in (("starts", jnp.asarray(_starts(traj))),
                                      ("lags", jnp.asarray(traj.lag))) if k in row.data}
            w_update = _np(row(jnp.asarray(ref_old - _np(traj.log_mu)),
                               jnp.asarray(_normalise(adv, mask)),
                               mask=None if mask is None else jnp.asarray(mask), **params, **data))
            np.testing.assert_allclose(out["actor_weight"], w_update, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{actor} weights")
        else:
            assert out["actor_weight"] is None

    # the same rows as the trainer's first minibatch (env_minibatches is a permutation)
    logged_rows = dict(obs=traj.obs, action=traj.action, log_mu=traj.log_mu,
                       log_mu_all=traj.log_mu_all, old=jnp.asarray(ref_old, jnp.float32),
                       old_all=ref_old_all, adv=jnp.asarray(adv, jnp.float32),
                       w=jnp.ones(adv.shape) if mask is None else jnp.asarray(mask),
                       y=jnp.asarray(reference_targets(cfg, x, traj)[0], jnp.float32))
    if per_update:
        logged_rows["w_update"] = jnp.asarray(w_update, jnp.float32)
    mb = jax.tree_util.tree_map(lambda a: a[0], env_minibatches(key, logged_rows, cfg.num_minibatches))
    aw = None if mask is None else _np(mb["w"])
    eff = _normalise(_np(mb["adv"]), aw)
    if aw is not None:
        eff = eff * aw * aw.size / max(np.sum(aw), 1.0)
    np.testing.assert_allclose(out["adv"], eff, rtol=1e-4, atol=1e-5, err_msg="effective advantages")

    eps, c_clip = cfg.ppo_epsilon, (None if kind == "ratio" else cfg.actor_clip)
    adv_mb = jnp.asarray(eff, jnp.float32)
    amask = None if aw is None else mb["w"]

    def ref_loss(p):
        log_pi_all = jax.nn.log_softmax(tr.setup.actor_net.apply(p, _actor_obs(tr, mb["obs"])), -1)
        log_pi = jnp.take_along_axis(log_pi_all, mb["action"][:, None], -1)[:, 0]
        centering = (actor_lib.centering_term(log_pi_all, mb["log_mu_all"], kind=kind, clip=c_clip,
                                              log_pi_old_all=mb["old_all"]) if centred else None)
        if kind in ("ratio", "truncate", "mask"):  # Eq 10 kinds: the loss's own weights
            return actor_lib.policy_loss(log_pi, mb["log_mu"], adv_mb, kind=kind, clip=c_clip,
                                         ppo_epsilon=eps, log_pi_old=mb["old"], centering=centering)
        if per_update:
            w, ref, e = mb["w_update"], mb["old"], eps
            if not row.trust_region:
                ref, e = None, None
        elif row.trust_region:  # token row x PPO trust region on pi_theta / pi_old
            w = row(mb["old"] - mb["log_mu"], adv_mb, mask=amask, **params)
            ref, e = mb["old"], eps
        else:  # the row replaces the trust region: w from the current pi_theta
            w = row(jax.lax.stop_gradient(log_pi) - mb["log_mu"], adv_mb, mask=amask, **params)
            ref, e = None, None
        return actor_lib.policy_loss(log_pi, mb["log_mu"], adv_mb, kind="ratio", ppo_epsilon=e,
                                     log_pi_old=ref, weights=w)

    pg, g = jax.value_and_grad(ref_loss)(theta)
    np.testing.assert_allclose(out["pg"], pg, rtol=1e-4, atol=1e-6, err_msg="actor loss")
    scale = max(float(np.max(np.abs(leaf))) for leaf in jax.tree_util.tree_leaves(g))
    assert scale > 1e-3  # a gradient that could be wrong
    _tree_close(out["g"], g, 2e-4, 1e-5 * scale, "actor gradient")

    def ref_critic_loss(p):  # every sample has critic weight 1 here (no replay)
        return 0.5 * jnp.mean(jnp.square(tr.setup.critic_net.apply(p, mb["obs"]) - mb["y"]))

    vl, vg = jax.value_and_grad(ref_critic_loss)(critic)
    np.testing.assert_allclose(out["vl"], vl, rtol=1e-5, err_msg="critic loss")
    _tree_close(out["vg"], vg, 2e-4, 1e-6, "critic gradient")


def test_effective_advantages_equal_numpy():
    """The per-minibatch normalisation and sample weighting of the actor's advantages."""
    rng = np.random.default_rng(0)
    adv = rng.normal(size=(3, 10)).astype(np.float32)
    w = (rng.uniform(size=(3, 10)) > 0.3).astype(np.float32)
    for weights in (None, w):
        for normalize in (False, True):
            got = effective_advantages(jnp.asarray(adv), None if weights is None else jnp.asarray(weights),
                                       normalize)
            for m in range(3):
                ref = _np(adv[m])
                ww = None if weights is None else _np(weights[m])
                if normalize:
                    ref = _normalise(ref, ww)
                if ww is not None:
                    ref = ref * ww * ww.size / max(np.sum(ww), 1.0)
                np.testing.assert_allclose(got[m], ref, rtol=1e-5, atol=1e-6)
