"""The trainer checked the way the estimators are (issue 27): section "trainer".

On an exact ``tabular:`` env every path of T = 2 steps is enumerated: (s0, behaviour version
i, a0, s1, a1, s2), with probability d0(s0) q_i mu_i(a0|s0) P(s1|s0, a0) mu_i(a1|s1)
P(s2|s1, a1) (d0 uniform, q the version mix, mu_i = the trainer's sampler on a perturbed
actor, pi = the newest actor). The paths are one logged batch [T, N]; the *trainer's own*
code path (``learner.prepare``, ``pi_old``, ``learner_batch``, ``losses.actor_loss``, in
float64) turns it into log-ratios, Vbar, critic targets, advantages, actor weights, losses
and gradients, and the rows compare them with:

- exact (the conditional mean over the enumerated paths, per s0, against the closed form
  of ``tabular.exact``): VCCC with b = Vbar (Eq 8) and b = 0 (Eq 4) -> T_pi Vbar; the
  uncorrected target -> sum_i q_i T_mu_i Vbar (the stale mean it is known to have); Eq 10
  truncation and the Z-centred target with b = 0 (Sec 4.2) -> Z (T_pitilde Vbar - Vbar) +
  Vbar; V-trace (Eq 11, lambda, rhobar, cbar) -> the expected V-trace operator over 2
  steps; the actor's GAE advantages -> the lambda-return under mu minus Vbar; the actor
  gradient (truncate row, VCCC advantages, at theta = pi_k) -> the closed form
  -sum d0 q mu min(rho, c) rho (Q - Vbar) grad log pi;
- equal to the library (the same batch through ``estimators`` directly, inputs built here
  from the tables): log-ratios, Vbar, every critic target above (Z(s) from
  ``tabular.exact.z_and_clipped_policy``), a per-update actor row's weights (TOPR, on
  batch-normalised advantages), the actor loss and gradient of a trust-region token row
  (IcePop x PPO) and of Eq 13 centred truncation x PPO, pi_old = pi_k, at perturbed
  parameters.

Layering: this module imports ``train`` (rank 3); ``verify`` ranks above it (4), so the
checker sits above what it checks (tests/test_layering.py). Every call builds fresh
Trainers and compiles one graph (``fast_jit``), so a patched trainer is what gets checked.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import rollout as rollout_lib
from vccc_jax.envs import tabular_env
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import actor_registry
from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.vtrace import vtrace
from vccc_jax.tabular import exact
from vccc_jax.train import learner, losses
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.learner import effective_advantages
from vccc_jax.train.trainer import Trainer
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, pair_row

# a chain of 3 states + a terminal one (discount 0; a new sequence after it); chain, not
# garnet, because building it costs 0.4 s of CPU instead of 1.9 s
SPEC = "tabular:family=chain,S=3,A=3,gamma=0.9"
T, MIX = 2, (0.6, 0.4)       # path length; mix q over two stale behaviour versions
CLIP, RHO_BAR, C_BAR, LAMBDA, EPS = 1.25, 1.25, 1.125, 0.8, 0.2  # exact in float32
BASE = TrainConfig(env=SPEC, gamma=0.9, num_envs=2, num_steps=T, num_minibatches=1,
                   update_epochs=1, total_timesteps=4, hidden=8, num_layers=1, lag="fixed:1",
                   clip=CLIP, actor_clip=CLIP, rho_bar=RHO_BAR, c_bar=C_BAR, gae_lambda=LAMBDA,
                   ppo_epsilon=EPS, normalize_advantages=False, critic="vccc")
# (critic, baseline): the one-step rows and V-trace, each under its exact claim
CRITICS = (("vccc", "value"), ("vccc", "zero"), ("uncorrected", "value"), ("truncated", "value"),
           ("centered_baseline", "zero"), ("vtrace", "value"))
ACTORS = (("truncate", ""), ("icepop", ""), ("centered-truncate", ""), ("topr", ""))


def _f64(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), tree)


def _perturb(params, key, scale):
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _paths(S: int, A: int, K: int) -> dict:
    """Index arrays [N] of every (s0, i, a0, s1, a1, s2)."""
    grid = np.array(list(itertools.product(range(S), range(K), range(A), range(S), range(A),
                                           range(S))), np.int32)
    return dict(zip(("s0", "i", "a0", "s1", "a1", "s2"), grid.T))


def _batch(mdp, obs, log_pi, log_mus, log_bs, ix):
    """The enumerated paths as a rollout Trajectory [T, N] and their probabilities [N]."""
    s = jnp.stack([ix["s0"], ix["s1"]])
    a = jnp.stack([ix["a0"], ix["a1"]])
    s_next = jnp.stack([ix["s1"], ix["s2"]])
    i = jnp.broadcast_to(ix["i"], s.shape)
    log_mu_all = log_mus[i, s]
    mu = jnp.exp(jnp.take_along_axis(log_mu_all, a[..., None], -1)[..., 0])
    prob = (jnp.asarray(MIX)[ix["i"]] / mdp.num_states * mu[0] * mdp.P[s[0], a[0], s_next[0]]
            * mu[1] * mdp.P[s[1], a[1], s_next[1]])
    zeros = jnp.zeros(s.shape, jnp.float64)
    traj = rollout_lib.Trajectory(
        obs=obs[s], action=a, reward=mdp.R[s, a, s_next], terminated=mdp.terminal[s_next] > 0,
        truncated=jnp.zeros(s.shape, bool), final_obs=obs[s_next],
        log_mu=jnp.take_along_axis(log_mu_all, a[..., None], -1)[..., 0], log_mu_all=log_mu_all,
        log_pi_all=log_pi[s], lag=i + 1, version=-1 - i, episode_return=zeros,
        episode_length=jnp.zeros(s.shape, jnp.int32), episode_done=jnp.zeros(s.shape, bool),
        log_b_all=log_bs[i, s])
    return traj, prob


def _state_mean(x, prob, s0, S):
    """E[x | s0] over the enumerated paths. [S]"""
    onehot = jax.nn.one_hot(s0, S, dtype=prob.dtype)
    return (prob * x) @ onehot / (prob @ onehot)


def _library_targets(cfg, x: dict, z, baseline):
    """The critic target of ``cfg.critic`` by ``estimators`` on the table-built inputs."""
    args = (x["rewards"], x["discounts"], x["values"], x["next_values"], x["log_rhos"])
    if cfg.critic == "uncorrected":
        return ct.uncorrected_target(x["rewards"], x["discounts"], x["next_values"])
    if cfg.critic == "vccc":
        return ct.vccc_target(*args, baseline=None if cfg.baseline == "value" else baseline)
    if cfg.critic == "truncated":
        return ct.clipped_target(*args, clip=CLIP, kind="truncate")
    if cfg.critic == "centered_baseline":
        return ct.centered_clipped_target(*args, baseline=baseline, z=z, clip=CLIP, kind="truncate")
    return _library_vtrace(cfg, x).vs


def _library_vtrace(cfg, x: dict):
    """``estimators.vtrace`` on the table-built inputs (rhobar = RHO_BAR != cbar = C_BAR, so
    a policy-gradient clip at cbar shows)."""
    return vtrace(x["log_rhos"], x["discounts"], x["rewards"], x["values"], x["next_values"][-1],
                  lambda_=cfg.target_lambda, clip_rho_threshold=RHO_BAR, clip_c_threshold=C_BAR,
                  clip_pg_rho_threshold=RHO_BAR)


def _numbers(key, trainers: dict, actors: dict) -> dict:
    """Every (trainer value, reference) pair of the section, float64, one graph."""
    tr = trainers[CRITICS[0]]
    mdp = _f64(tabular_env.params_mdp(tr.setup.env_params))  # exact in float64: P rows sum to 1
    mdp = mdp.replace(P=mdp.P / jnp.sum(mdp.P, -1, keepdims=True), gamma=jnp.float64(BASE.gamma))
    S, A = mdp.num_states, tr.setup.num_actions
    obs = _f64(tr.setup.env_params.obs_table)
    k_a, k_c, k_v, k_t = jax.random.split(key, 4)
    dummy = jnp.zeros((1,) + tr.setup.obs_shape)
    actor = _f64(tr.setup.actor_net.init(k_a, dummy))
    critic = _f64(jax.tree_util.tree_map(lambda w: 4.0 * w, tr.setup.critic_net.init(k_c, dummy)))
    stale = [_perturb(actor, jax.random.fold_in(k_v, i), 1.0) for i in range(len(MIX))]
    logits = tr.setup.actor_logits(actor, obs)
    log_pi = jax.nn.log_softmax(logits, -1)
    log_mus = jnp.stack([tr.setup.log_mu_fn(tr.setup.actor_logits(p, obs)) for p in stale])
    log_bs = jnp.stack([jax.nn.log_softmax(tr.setup.actor_logits(p, obs), -1) for p in stale])
    ix = _paths(S, A, len(MIX))
    traj, prob = _batch(mdp, obs, log_pi, log_mus, log_bs, ix)
    pi, mus, vbar = jnp.exp(log_pi), jnp.exp(log_mus), tr.setup.critic_values(critic, obs)
    q = jnp.asarray(MIX)

    def mix(f):  # sum_i q_i f(mu_i): the per-s0 mean over the version mix
        return sum(q[i] * f(mus[i]) for i in range(len(MIX)))

    # the library's inputs, built here from the tables
    s, a = jnp.stack([ix["s0"], ix["s1"]]), traj.action
    s_next, i = jnp.stack([ix["s1"], ix["s2"]]), jnp.broadcast_to(ix["i"], traj.action.shape)
    x = dict(rewards=mdp.R[s, a, s_next], discounts=exact.next_state_discounts(mdp)[s_next],
             values=vbar[s], next_values=vbar[s_next], log_rhos=log_pi[s, a] - log_mus[i, s, a])
    z_tab = jnp.stack([exact.z_and_clipped_policy(pi, m, CLIP)[0] for m in mus])
    mean0 = lambda y: _state_mean(y[0], prob, ix["s0"], S)  # noqa: E731

    def truncated_mean(m):
        z, pit = exact.z_and_clipped_policy(pi, m, CLIP)
        return z * (exact.bellman_operator(mdp, pit, vbar) - vbar) + vbar

    exact_means = {
        ("vccc", "value"): exact.bellman_operator(mdp, pi, vbar),
        ("vccc", "zero"): exact.bellman_operator(mdp, pi, vbar),
        ("uncorrected", "value"): mix(lambda m: exact.bellman_operator(mdp, m, vbar)),
        ("truncated", "value"): mix(truncated_mean),
        ("centered_baseline", "zero"): mix(truncated_mean),
        ("vtrace", "value"): mix(lambda m: exact.expected_vtrace_operator(
            mdp, pi, m, vbar, n_steps=T, lambda_=LAMBDA, clip_rho_threshold=RHO_BAR,
            clip_c_threshold=C_BAR)),
    }
    out, preps = {}, {}
    for name, t in trainers.items():
        prep = preps[name] = learner.prepare(t.setup, t.values, traj, critic)
        tx = prep.inputs.transitions
        y_lib = _library_targets(t.config, x, z_tab[i, s], jnp.zeros_like(x["values"]))
        out[f"target {name}"] = (mean0(prep.targets), exact_means[name])
        out[f"library target {name}"] = (prep.targets, y_lib)
        if name == ("vtrace", "value"):  # its actor advantages: V-trace's pg ones (rhobar)
            out["library vtrace advantages"] = (prep.advantages,
                                                _library_vtrace(t.config, x).pg_advantages)
        if name == CRITICS[0]:
            out["log_rhos"] = (tx.log_rhos, x["log_rhos"])
            out["vbar"] = (jnp.stack([tx.values, tx.next_values]),
                           jnp.stack([x["values"], x["next_values"]]))
        if t.config.advantage == "gae":  # the actor's default advantages: GAE(gamma, lambda)
            out["gae"] = (mean0(prep.advantages), mix(
                lambda m: exact.lambda_return_operator(mdp, m, vbar, LAMBDA, T)) - vbar)

    theta = _perturb(actor, k_t, 0.3)
    for name, t in actors.items():
        prep = preps[CRITICS[0]]  # the actors' critic config (vccc, b = Vbar, its advantages)
        lp_old, lp_old_all = learner.pi_old(t.setup, t.values, None, traj, prep)
        batch = learner.learner_batch(t.setup, t.values, traj, prep, None, lp_old, lp_old_all)
        # the t = 0 rows, sample weights = path probabilities (carried by the advantages)
        mb = jax.tree_util.tree_map(lambda v: v[0], batch)
        mb = mb._replace(advantages=effective_advantages(
            mb.advantages[None], (prob / jnp.sum(prob))[None], False)[0])
        grad = jax.grad(lambda p: losses.actor_loss(t.setup, t.values, p, mb)[0])
        if name == ("truncate", ""):  # E[grad] at theta = pi_k: closed form (Eq 10 weights)
            qv = exact.q_values(mdp, v=vbar)
            coeff = mix(lambda m: m * jnp.minimum(pi / m, CLIP) * (pi / m) * (qv - vbar[:, None]))
            closed = jax.grad(lambda p: -jnp.sum(jax.lax.stop_gradient(coeff / S) * jax.nn.log_softmax(
                t.setup.actor_logits(p, obs), -1)))(actor)
            out["actor gradient"] = (grad(actor), closed)
        elif name == ("topr", ""):  # sequence weights of the whole update, at pi_old = pi_k,
            # reading the sign of the batch-normalised advantages
            starts = jnp.stack([jnp.ones_like(traj.terminated[0]), mdp.terminal[ix["s1"]] > 0])
            adv = ct.vccc_target(x["rewards"], x["discounts"], x["values"], x["next_values"],
                                 x["log_rhos"]) - x["values"]
            adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-8)
            w = actor_registry.get_actor_correction("topr")(x["log_rhos"], adv, starts=starts)
            out["actor weights topr"] = (batch.actor_weight, w)
        else:  # IcePop x PPO / Eq 13 centred truncation x PPO (pi_old = pi_k), theta != pi_k
            log_mu0 = log_mus[ix["i"], ix["s0"], ix["a0"]]
            log_old0 = log_pi[ix["s0"], ix["a0"]]

            def ref_loss(p, kind=name[0]):
                log_pi_th = jax.nn.log_softmax(t.setup.actor_logits(p, obs[ix["s0"]]), -1)
                lp = jnp.take_along_axis(log_pi_th, ix["a0"][:, None], -1)[:, 0]
                adv = mb.advantages
                if kind == "icepop":
                    w = actor_registry.get_actor_correction("icepop")(log_old0 - log_mu0, adv)
                    return actor_lib.policy_loss(lp, log_mu0, adv, kind="ratio", ppo_epsilon=EPS,
                                                 log_pi_old=log_old0, weights=w)
                c = actor_lib.centering_term(log_pi_th, log_mus[ix["i"], ix["s0"]], kind="truncate",
                                             clip=CLIP, log_pi_old_all=log_pi[ix["s0"]])
                return actor_lib.policy_loss(lp, log_mu0, adv, kind="truncate", clip=CLIP,
                                             ppo_epsilon=EPS, log_pi_old=log_old0, centering=c)

            out[f"actor loss {name[0]}"] = (jnp.stack([losses.actor_loss(t.setup, t.values, theta, mb)[0]]),
                                            jnp.stack([ref_loss(theta)]))
            out[f"actor gradient {name[0]}"] = (grad(theta), jax.grad(ref_loss)(theta))
    return out


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(v, float)) for v in jax.tree_util.tree_leaves(tree)])


ROWS = (  # (key, row name, equation, detail)
    ("target ('vccc', 'value')", "trainer vccc b=Vbar: E[Y|s] = T_pi Vbar", "Eq 8", ""),
    ("target ('vccc', 'zero')", "trainer vccc b=0: E[Y|s] = T_pi Vbar", "Eq 4", ""),
    ("target ('uncorrected', 'value')", "trainer uncorrected: E[Y|s] = sum q T_mu Vbar", "Eq 3", ""),
    ("target ('truncated', 'value')", "trainer truncated: Z (T_pit Vbar - Vbar) + Vbar", "Eq 10", ""),
    ("target ('centered_baseline', 'zero')", "trainer Z-centred b=0: = truncated mean",
     "Sec 4.2", ""),
    ("target ('vtrace', 'value')", "trainer vtrace T=2: E = V-trace operator", "Eq 11", ""),
    ("gae", "trainer GAE advantages: E = lambda-return(mu) - Vbar", "Eq 11", "rho := 1"),
    ("actor gradient", "trainer actor grad (truncate): closed form", "Eq 10,12", "theta = pi_k"),
    ("log_rhos", "trainer log-ratios = log pi - log mu", "Sec 1.4", ""),
    ("vbar", "trainer Vbar(s), Vbar(s') = critic table", "Sec 1.4", ""),
    ("library target ('vccc', 'value')", "trainer targets = library: vccc b=Vbar", "Eq 8", ""),
    ("library target ('vccc', 'zero')", "trainer targets = library: vccc b=0", "Eq 4", ""),
    ("library target ('uncorrected', 'value')", "trainer targets = library: uncorrected", "Eq 3", ""),
    ("library target ('truncated', 'value')", "trainer targets = library: truncated", "Eq 10", ""),
    ("library target ('centered_baseline', 'zero')", "trainer targets = library: Z-centred",
     "Sec 4.2", "Z(s) from tabular.exact"),
    ("library target ('vtrace', 'value')", "trainer targets = library: vtrace", "Eq 11", ""),
    ("library vtrace advantages", "trainer vtrace advantages = library pg (rhobar)", "Eq 11",
     "rhobar != cbar"),
    ("actor weights topr", "trainer actor weights = library: topr", "A5", "per update"),
    ("actor loss icepop", "trainer actor loss = library: icepop x PPO", "A2", "theta != pi_k"),
    ("actor gradient icepop", "trainer actor grad = library: icepop x PPO", "A2", "theta != pi_k"),
    ("actor loss centered-truncate", "trainer actor loss = library: centred TIS x PPO", "Eq 13",
     "theta != pi_k"),
    ("actor gradient centered-truncate", "trainer actor grad = library: centred TIS x PPO",
     "Eq 13", "theta != pi_k"),
)


def trainer_numbers(key) -> dict:
    """{key: (trainer value, reference)} as NumPy, from fresh Trainers (a patched trainer
    module is what gets checked)."""
    trainers = {(c, b): Trainer(BASE.replace(critic=c, baseline=b, advantage="target"
                                             if c in ("vccc", "vtrace") else "gae"))
                for c, b in CRITICS}
    actors = {(a, r): Trainer(BASE.replace(actor=a, pi_old_route=r, advantage="target",
                                           normalize_advantages=a == "topr"))
              for a, r in ACTORS}
    with jax.enable_x64(True):
        out = fast_jit(lambda k: _numbers(k, trainers, actors))(key)
        return {k: (_flat(v), _flat(ref)) for k, (v, ref) in jax.device_get(out).items()}


def rows_from_numbers(numbers: dict) -> list[Row]:
    """One exact row per (trainer value, reference) pair, tolerance ``EXACT_TOL``."""
    return [pair_row(name, eq, 1, *numbers[key], EXACT_TOL,
                     detail or f"{numbers[key][1].size} numbers")
            for key, name, eq, detail in ROWS]


def trainer_rows(ctx) -> list[Row]:
    """Rows of the trainer section (keys: ``fold_in(ctx.key, 22)``), then its Gaussian-head
    rows on the LQR testbed (``sections.trainer_gaussian``)."""
    from vccc_jax.verify.sections.trainer_gaussian import gaussian_rows

    return rows_from_numbers(trainer_numbers(jax.random.fold_in(ctx.key, 22))) + gaussian_rows(ctx)
