"""Monte-Carlo demonstration of Sec 3.4: rollouts whose policy version switches mid-trajectory.

A worker receives new weights while it is rolling out, so one trajectory follows
mu_3 for its first steps, then mu_5, then mu_8 (vccc_blog_en.txt Sec 3.4). The write-up's
two claims, measured on a finite MDP where every expectation is known:

1. **The Monte-Carlo return is not the value of any single stationary policy involved.**
   E[G_0 | s_0] under the switching schedule is computed exactly by backward induction
   through the schedule (:func:`switching_values`); the sample mean of G_0 matches it, and
   differs -- by many standard errors -- from V^{mu_3}, V^{mu_5}, V^{mu_8} (and from V^{pi_k}
   of the trainer's current policy). Returns-to-go G_t pooled by state (what a critic
   regressed on these returns learns) likewise miss V^{pi_k}(s).
2. **The one-step VCCC target stays conditionally unbiased.** For every transition, whatever
   version produced it and whatever versions act later in the trajectory,
   Y = Vbar(s) + rho (r + gamma Vbar(s') - Vbar(s)) with rho = pi_k(a|s) / mu_{i_t}(a|s) has
   E[Y | s] = T_{pi_k} Vbar(s) (Eq 4, 5, 8); pooled per state it matches T_{pi_k} Vbar, while
   the uncorrected target H does not.

Standard errors are cluster-robust by rollout (transitions of one trajectory are dependent);
for the one-step target the centred terms are a martingale-difference sequence, so the
cluster SE is conservative there. Truncation: a rollout runs ``horizon`` steps and every
exact comparator of G_0 is the matching ``horizon``-step expectation (no truncation bias);
stationary values V^{mu} are the infinite-horizon ones, which differ from the truncated ones
by at most gamma^T max|r| / (1 - gamma) (reported).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.tabular import exact, history
from vccc_jax.tabular import mdp as mdp_mod
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts

Array = chex.Array

CONFIDENCE = 0.999  # two-sided level of every reported test


def schedule(starts: Sequence[int], horizon: int) -> np.ndarray:
    """Index j of the policy acting at step t = 0..horizon-1: policy j acts for
    starts[j] <= t < starts[j + 1], the last one from starts[-1] on. [horizon] int."""
    starts = list(starts)
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"starts must be strictly increasing and begin at 0, got {starts}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    t = np.arange(horizon)
    return (np.searchsorted(np.asarray(starts), t, side="right") - 1).astype(np.int32)


def switching_values(mdp: TabularMDP, mus: Array, starts: Sequence[int], horizon: int) -> Array:
    """Exact E[sum_{t<T} (prod gamma) r_t | s_0 = s] of a rollout that follows mus[j] on
    schedule(starts, T): backward induction V_t = r_{mu(t)} + P_{mu(t)} diag(gamma(s')) V_{t+1},
    V_T = 0. [S]"""
    sched = schedule(starts, horizon)
    r = jax.vmap(lambda mu: exact.expected_reward(mdp, mu))(mus)  # [J, S]
    M = jax.vmap(lambda mu: exact.discounted_transition_matrix(mdp, mu))(mus)  # [J, S, S]

    def step(v, j):
        return r[j] + M[j] @ v, None

    v, _ = jax.lax.scan(step, jnp.zeros((mdp.num_states,), mus.dtype), jnp.asarray(sched[::-1]))
    return v


class Rollouts(NamedTuple):
    """Time-major [T, N] transitions of N switching rollouts; ``version`` [T] is the schedule
    index acting at step t; ``returns_to_go`` [T, N]: discounted reward-to-go to the horizon."""

    states: Array
    actions: Array
    rewards: Array
    next_states: Array
    discounts: Array
    version: Array
    returns_to_go: Array


def simulate(key: Array, mdp: TabularMDP, mus: Array, starts: Sequence[int], num_rollouts: int,
             horizon: int) -> Rollouts:
    """N independent rollouts from s_0 ~ init under the switching schedule (single MDP).

    A terminal next state (discount 0) ends the episode: the rollout then stays absorbed
    (the generators make terminal states absorbing with zero reward)."""
    sched = jnp.asarray(schedule(starts, horizon))
    log_mus = jnp.log(mus)
    gam = next_state_discounts(mdp)
    k0, k_run = jax.random.split(key)
    s0 = jax.random.categorical(k0, jnp.log(mdp.init), shape=(num_rollouts,))

    def step(s, xs):
        j, k = xs
        k_a, k_p = jax.random.split(k)
        a = jax.random.categorical(k_a, log_mus[j][s])
        s2 = jax.random.categorical(k_p, jnp.log(mdp.P[s, a]))
        return s2, (s, a, mdp.R[s, a, s2], s2, gam[s2])

    _, (s, a, r, s2, disc) = jax.lax.scan(step, s0, (sched, jax.random.split(k_run, horizon)))

    def back(g_next, xs):
        r_t, d_t = xs
        g = r_t + d_t * g_next
        return g, g

    _, rtg = jax.lax.scan(back, jnp.zeros((num_rollouts,), r.dtype), (r, disc), reverse=True)
    return Rollouts(states=s, actions=a, rewards=r, next_states=s2, discounts=disc,
                    version=sched, returns_to_go=rtg)


def per_state_means(states: Array, y: Array, num_states: int, mask: Optional[Array] = None):
    """Per-state mean of y [T, N] over the transitions at each state, with a standard error
    clustered by rollout (axis 1). ``mask`` [T] selects time steps. Returns numpy
    (mean [S], se [S], count [S])."""
    states, y = np.asarray(states), np.asarray(y, np.float64)
    m = np.ones(states.shape[0], bool) if mask is None else np.asarray(mask, bool)
    states, y = states[m], y[m]
    N = states.shape[1]
    onehot = states[..., None] == np.arange(num_states)  # [T, N, S]
    sums = np.einsum("tns,tn->ns", onehot, y)  # per rollout
    counts = onehot.sum(0).astype(np.float64)  # [N, S]
    tot = counts.sum(0)
    mean = np.where(tot > 0, sums.sum(0) / np.maximum(tot, 1), np.nan)
    resid = sums - mean[None] * counts
    se = np.sqrt(N / max(N - 1, 1) * np.sum(resid**2, axis=0)) / np.maximum(tot, 1)
    return mean, np.where(tot > 0, se, np.nan), tot


def _z_crit(level: float = CONFIDENCE, m: int = 1) -> float:
    from scipy import stats

    return float(stats.norm.ppf(1 - (1 - level) / (2 * m)))


def _chi2(z: np.ndarray) -> tuple[float, int, float]:
    from scipy import stats

    z = z[np.isfinite(z)]
    stat = float(np.sum(z**2))
    return stat, int(z.size), float(stats.chi2.sf(stat, z.size))


def mc_demo(key: Array, mdp: TabularMDP, mus: Array, pi: Array, vbar: Array, starts: Sequence[int],
            *, num_rollouts: int = 4000, horizon: int = 200, return_steps: Optional[int] = None,
            labels: Optional[Sequence[str]] = None) -> dict:
    """Run the Sec 3.4 demonstration (single MDP; see the module docstring).

    Args:
      mus: [J, S, A] the versions the rollout switches through (in order); pi: [S, A] the
        trainer's current policy pi_k; vbar: [S] any frozen bootstrap table.
      starts: step at which each version takes over (starts[0] = 0).
      return_steps: returns-to-go pooled per state use t < return_steps (default starts[-1]:
        the steps whose future spans a version switch).
      labels: names of the versions (default mu_0, mu_1, ...).

    Returns a dict of numpy results: ``g0`` (mean, se, the exact switching expectation, the
    stationary values init.V^{mu_j}, init.V^{pi} and their z-scores), ``one_step`` (per-state
    means, ses and z-scores of the VCCC and uncorrected targets against T_pi Vbar, with
    chi-square statistics), ``returns`` (per-state pooled returns-to-go against V^pi and each
    V^{mu_j}), and the critical |z| at ``CONFIDENCE`` with Bonferroni over the comparisons.
    """
    J = mus.shape[0]
    labels = list(labels) if labels is not None else [f"mu_{j}" for j in range(J)]
    S = mdp.num_states
    return_steps = starts[-1] if return_steps is None else return_steps
    if not 0 < return_steps <= horizon // 2:
        raise ValueError(f"return_steps must lie in [1, horizon // 2], got {return_steps}")
    ro = jax.jit(simulate, static_argnums=(3, 4, 5))(key, mdp, mus, tuple(starts), num_rollouts, horizon)
    g0 = np.asarray(ro.returns_to_go[0], np.float64)
    g_mean, g_se = float(g0.mean()), float(g0.std(ddof=1) / np.sqrt(num_rollouts))
    init = np.asarray(mdp.init)
    v_switch = float(init @ np.asarray(switching_values(mdp, mus, starts, horizon)))
    v_stat = {lab: float(init @ np.asarray(exact.policy_value(mdp, mus[j]))) for j, lab in enumerate(labels)}
    v_pi = np.asarray(exact.policy_value(mdp, pi))
    v_stat["pi_k"] = float(init @ v_pi)
    gmax = float(jnp.max(mdp.gamma))
    trunc = gmax**horizon * float(jnp.max(jnp.abs(mdp.R))) / max(1 - gmax, 1e-12)

    # one-step targets of every transition, with the log-ratio against the version that acted
    log_pi = jnp.log(pi)
    log_mu_t = jnp.log(mus)[ro.version]  # [T, S, A]
    t_idx = jnp.arange(horizon)[:, None]
    log_rhos = log_pi[ro.states, ro.actions] - log_mu_t[t_idx, ro.states, ro.actions]
    y_vccc = ct.vccc_target(ro.rewards, ro.discounts, vbar[ro.states], vbar[ro.next_states], log_rhos)
    y_unc = ct.uncorrected_target(ro.rewards, ro.discounts, vbar[ro.next_states])
    t_pi = np.asarray(exact.bellman_operator(mdp, pi, vbar))
    one_step = {}
    for name, y in (("vccc", y_vccc), ("uncorrected", y_unc)):
        mean, se, cnt = per_state_means(ro.states, y, S)
        z = (mean - t_pi) / se
        stat, df, p = _chi2(z)
        one_step[name] = {"mean": mean, "se": se, "count": cnt, "z": z, "chi2": stat, "df": df, "p": p}
    one_step["target"] = t_pi

    mask = np.arange(horizon) < return_steps
    mean, se, cnt = per_state_means(ro.states, ro.returns_to_go, S, mask)
    returns = {"mean": mean, "se": se, "count": cnt}
    for lab, v in [("pi_k", v_pi)] + [(lab, np.asarray(exact.policy_value(mdp, mus[j])))
                                      for j, lab in enumerate(labels)]:
        z = (mean - v) / se
        stat, df, p = _chi2(z)
        returns[lab] = {"value": v, "z": z, "chi2": stat, "df": df, "p": p}

    return {
        "g0": {"mean": g_mean, "se": g_se, "switching_value": v_switch,
               "z_switching": (g_mean - v_switch) / g_se,
               "stationary": v_stat,
               "z_stationary": {k: (g_mean - v) / g_se for k, v in v_stat.items()},
               "truncation_bound": trunc},
        "one_step": one_step,
        "returns": returns,
        "z_crit": _z_crit(CONFIDENCE, len(v_stat)),
        "confidence": CONFIDENCE,
        "labels": labels,
        "starts": list(starts),
        "num_rollouts": num_rollouts,
        "horizon": horizon,
    }


def default_problem(seed: int = 1, num_states: int = 6, num_actions: int = 3, gamma: float = 0.9,
                    versions: Sequence[int] = (3, 5, 8), current: int = 10, step_size: float = 1.0,
                    dtype=None):
    """A random MDP with a fixed start state and an NPG version history pi_0..pi_current.

    Returns (mdp, mus [len(versions), S, A], pi_k [S, A], vbar = V^{pi_0} (a stale critic as
    the frozen bootstrap), labels)."""
    k_mdp, k_th = jax.random.split(jax.random.PRNGKey(seed))
    mdp = mdp_mod.random_mdp(k_mdp, 1, num_states, num_actions, gamma=gamma, dtype=dtype)[0]
    mdp = mdp.replace(init=jnp.zeros_like(mdp.init).at[0].set(1.0))
    th0 = history.initial_logits(k_th, 1, num_states, num_actions, 1.0, dtype=dtype)[0]
    cfg = history.HistoryConfig(algorithm="npg", step_size=step_size, num_versions=current + 1)
    hist = history.policy_history(mdp, th0, cfg)
    mus = hist.probs[jnp.asarray(versions)]
    return mdp, mus, hist.probs[current], hist.values[0], [f"mu_{v}" for v in versions]
