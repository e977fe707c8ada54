"""The trainer's Gaussian head checked exactly on the LQR testbed (issue 44): rows of the
``trainer`` section.

A logged batch of one-step transitions is built on the quadrature grid of
``tabular.lqr_offpolicy.transition_grid`` (Gauss-Legendre in the action, split at the clip's
kinks; Gauss-Hermite in the dynamics noise; converged to ~1e-13): at fixed states s, for each
of two stale behaviour versions mu_i (mixed by q), the nodes (u, s') with their mu_i-law
weights. The behaviour's log-density is logged as a rollout logs it (the true N(u; mu_i)
density, written here in NumPy), the behaviour and target rows ([mean, log_std] of mu_i and
pi) as the Gaussian head's rows. The *trainer's own* ``learner.prepare`` (its head's
log-probs, log-ratios, critic target) then runs on the batch in float64 with the critic
swapped for a quadratic Vbar, and the rows compare the quadrature mean over the logged
versions with the closed forms of ``tabular.lqr``:

- VCCC b = Vbar (Eq 8) and b = 0 (Eq 4): sum_i q_i E_{mu_i}[Y | s] = T_pi Vbar(s);
- the uncorrected target: = sum_i q_i T_{mu_i} Vbar(s) (the stale mean);
- the trainer's log-ratios = log pi(u|s) - log mu_i(u|s) (NumPy densities);
- the head's closed-form Z(s) = E_mu[min(rho, c)] (normal CDFs) = its quadrature on the grid.

A Gaussian-head bug (variance for std, a dropped noise scale) moves the log-ratios and the
expected targets by far more than the tolerance.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import lqr as lq
from vccc_jax.tabular import lqr_offpolicy as lo
from vccc_jax.train import learner
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.programs import grid_values
from vccc_jax.train.setup import make_setup
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, pair_row
from vccc_jax.verify.sections.lqr import STATES, problems

ENV = "lqr:dim=2,act=1,gamma=0.9"   # the head and the discount; the problem is lqr.problems'
MIX, CLIP = (0.6, 0.4), 1.25
BASE = TrainConfig(env=ENV, gamma=0.9, num_envs=2, num_steps=2, num_minibatches=1, update_epochs=1,
                   total_timesteps=4, hidden=8, num_layers=1, lag="fixed:1", clip=CLIP)
TARGETS = (("vccc", "value"), ("vccc", "zero"), ("uncorrected", "value"))


class QuadraticCritic(nn.Module):
    """Vbar(s) = s'Ms + v's + c: the critic whose T_pi Vbar has a closed form."""

    n: int = 2

    @nn.compact
    def __call__(self, obs):
        m = self.param("mat", nn.initializers.zeros, (self.n, self.n))
        v = self.param("vec", nn.initializers.zeros, (self.n,))
        c = self.param("const", nn.initializers.zeros, ())
        return jnp.einsum("...i,ij,...j->...", obs, m, obs) + obs @ v + c


def _rows_of(pol: lq.GaussianPolicy, s):
    """The Gaussian head's rows [mean, log_std] of ``pol`` at states s [..., n]."""
    mean = s @ pol.gain.T
    mean = mean + jnp.broadcast_to(pol.offset, mean.shape)
    return jnp.concatenate([mean, jnp.broadcast_to(pol.log_std, mean.shape)], -1)


def _np_log_density(pol: lq.GaussianPolicy, s, u) -> np.ndarray:
    mean = np.asarray(s) @ np.asarray(pol.gain).T + np.asarray(pol.offset)
    std = np.exp(np.asarray(pol.log_std))
    return np.sum(-0.5 * ((np.asarray(u) - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi), -1)


def _batch(lqr, pi, mus, vbar):
    """The logged batch [1, M] over the grids of the versions (fields of a Trajectory) and
    each node's weight q_i x prob [M] and state index [M]."""
    parts = []
    for i, mu in enumerate(mus):
        g = lo.transition_grid(lqr, pi, mu, vbar, STATES, clips=(CLIP,))
        n, k = g.rewards.shape
        s = np.broadcast_to(STATES[:, None, :], (n, k, 2))
        parts.append(dict(obs=s, action=np.asarray(g.actions), reward=np.asarray(g.rewards),
                          final_obs=np.asarray(g.next_states),
                          log_mu=_np_log_density(mu, s, np.asarray(g.actions)),
                          log_mu_all=np.asarray(_rows_of(mu, jnp.asarray(s))),
                          log_pi_all=np.asarray(_rows_of(pi, jnp.asarray(s))),
                          weight=MIX[i] * np.asarray(g.prob), state=np.broadcast_to(np.arange(n)[:, None], (n, k)),
                          log_rho_np=_np_log_density(pi, s, np.asarray(g.actions))
                          - _np_log_density(mu, s, np.asarray(g.actions))))
    flat = {k: np.concatenate([p[k].reshape((-1,) + p[k].shape[2:]) for p in parts]) for k in parts[0]}
    return flat


def _trajectory(b: dict):
    from vccc_jax.envs.rollout import Trajectory

    one = lambda x: jnp.asarray(x)[None]  # noqa: E731   [1, M, ...]
    m = b["reward"].shape[0]
    zeros_b = jnp.zeros((1, m), bool)
    return Trajectory(obs=one(b["obs"]), action=one(b["action"]), reward=one(b["reward"]),
                      terminated=zeros_b, truncated=zeros_b, final_obs=one(b["final_obs"]),
                      log_mu=one(b["log_mu"]), log_mu_all=one(b["log_mu_all"]),
                      log_pi_all=one(b["log_pi_all"]), lag=jnp.ones((1, m), jnp.int32),
                      version=jnp.zeros((1, m), jnp.int32), episode_return=jnp.zeros((1, m)),
                      episode_length=jnp.zeros((1, m), jnp.int32), episode_done=zeros_b)


def gaussian_numbers(key) -> dict:
    """{key: (trainer value, reference)} from fresh setups (a patched trainer is checked)."""
    lqr, pi, mu, vbar = problems(key)[0]
    mus = (mu, mu._replace(gain=0.5 * (mu.gain + pi.gain), log_std=mu.log_std + 0.2))
    setups = {t: dataclasses.replace(make_setup(BASE.replace(critic=t[0], baseline=t[1])),
                                     critic_net=QuadraticCritic()) for t in TARGETS}
    b = _batch(lqr, pi, mus, vbar)
    states = jnp.asarray(STATES)

    def per_state(x):  # sum over each state's nodes of q_i prob x
        return jax.ops.segment_sum(jnp.asarray(b["weight"]) * x, jnp.asarray(b["state"]),
                                   num_segments=len(STATES))

    def run(traj, vparams):
        out = {}
        for (c, base), setup in setups.items():
            prep = learner.prepare(setup, grid_values(setup.cfg), traj, vparams)
            out[f"{c}_{base}"] = per_state(prep.targets[0])
            out["log_rhos"] = prep.inputs.transitions.log_rhos[0]
        head = setups[TARGETS[0]].head
        z = head.expected_weight(traj.log_pi_all[0], traj.log_mu_all[0], "truncate", CLIP)
        w = jnp.minimum(jnp.exp(out["log_rhos"]), CLIP)
        out["z"] = (per_state(z), per_state(w))   # sum_i q_i Z_i(s) vs its quadrature
        return out

    with jax.enable_x64(True):
        vparams = {"params": {"mat": vbar.mat, "vec": vbar.vec, "const": vbar.const}}
        got = jax.device_get(fast_jit(run)(_trajectory(b), vparams))
        t_pi = np.asarray(lq.bellman(lqr, pi, vbar)(states))
        t_mu = sum(q * np.asarray(lq.bellman(lqr, m, vbar)(states)) for q, m in zip(MIX, mus))
    return {"vccc_value": (got["vccc_value"], t_pi), "vccc_zero": (got["vccc_zero"], t_pi),
            "uncorrected": (got["uncorrected_value"], t_mu),
            "log_rhos": (got["log_rhos"], b["log_rho_np"]), "z": got["z"]}


ROWS = (  # (key, row name, equation, detail)
    ("vccc_value", "trainer Gaussian head (lqr) vccc b=Vbar: E[Y|s] = T_pi Vbar", "Eq 8",
     "two stale versions, quadrature"),
    ("vccc_zero", "trainer Gaussian head (lqr) vccc b=0: E[Y|s] = T_pi Vbar", "Eq 4", ""),
    ("uncorrected", "trainer Gaussian head (lqr) uncorrected: = sum q T_mu Vbar", "Eq 3",
     "the stale mean"),
    ("log_rhos", "trainer Gaussian head log-ratios = log pi - log mu", "Sec 1.4",
     "NumPy densities"),
    ("z", f"trainer Gaussian head Z(s) = E_mu[min(rho, {CLIP})]", "Sec 4.2",
     "normal CDFs vs quadrature"),
)


def gaussian_rows(ctx) -> list[Row]:
    """The Gaussian-head rows of the trainer section (keys: ``fold_in(ctx.key, 23)``: the
    LQR section's problems)."""
    with jax.enable_x64(True):
        numbers = gaussian_numbers(jax.random.fold_in(ctx.key, 23))
    return [pair_row(name, eq, 1, *(np.ravel(np.asarray(x, float)) for x in numbers[key]), EXACT_TOL,
                     detail or f"{np.size(numbers[key][1])} numbers")
            for key, name, eq, detail in ROWS]
