"""The critics real asynchronous pipelines train, checked exactly under lag (issue 48).

For each scheme of ``estimators.related.field_critics`` (Cleanba's mixed-version GAE,
NeMo-RL's recompute-with-the-current-critic without a ratio, verl / OpenRLHF's GAE on stale
data), on small episodic MDPs with a stale behaviour mu (the stalest version of the
problem), the learner's critic Vbar = V_k and an arbitrary actor copy V_{k-L} (the problem's
first baseline):

- E_mu[Y_0 | s_0 = s] of the library target over *all* length-3 trajectories (enumerated
  with their probabilities) equals its closed form: the rho = 1 lambda-return operator under
  mu of the values the scheme uses (``tabular.exact.expected_vtrace_operator`` with pi = mu),
  plus lambda^(n-1) M_mu^n (V_boot - V_in) where the bootstrap comes from another critic;
- its bias, E_mu[Y_0 | s] minus the learner's on-policy lambda-return of Vbar under pi
  (``tabular.exact.lambda_return_operator``; T_pi Vbar at lambda = 0), is reported and must be
  nonzero (>= ``MIN_BIAS``): none of the three targets the critic of pi_k under lag;
- at lag 0 (mu = pi, V_{k-L} = Vbar) every scheme's expected target IS that on-policy
  lambda-return (zero bias, exactly).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.related import field_critics as fc
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.mdp import next_state_discounts
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL, GroupSpec, make_problems, maxabs
from vccc_jax.verify.report import exact_row

HORIZON = 3
LAMBDAS = (0.0, 0.9, 1.0)
MIN_BIAS = 1e-3
NUM_MDPS = 8
KEY_FOLD = 30  # jax.random.fold_in(ctx.key, 30): this section's problems


def _uses(name: str):
    """(values, bootstrap) critics of a scheme: "actor" (V_{k-L}) or "learner" (Vbar)."""
    return {"cleanba_mixed": ("actor", "learner"), "recompute_no_ratio": ("learner", "learner"),
            "stale_gae": ("actor", "actor")}[name]


def closed_form(mdp, mu, v_in, v_boot, lam, horizon: int = HORIZON):
    """E_mu[lambda-return at t = 0 | s] of a length-``horizon`` rollout with values ``v_in``
    and final bootstrap ``v_boot``, no ratio. [S]"""
    base = ex.expected_vtrace_operator(mdp, mu, mu, v_in, n_steps=horizon, lambda_=lam)
    m = ex.discounted_transition_matrix(mdp, mu)
    reach = jnp.linalg.matrix_power(m, horizon) @ (v_boot - v_in)
    return base + lam ** (horizon - 1) * reach


def scheme_numbers(p, names: tuple, mu, v_actor, horizon: int = HORIZON):
    """[len(names), len(LAMBDAS)] (max |enumerated - closed form|, max |closed form - the
    on-policy lambda-return of Vbar|) of one problem."""
    mdp, vbar = p.mdp, p.vbar
    S, A = mdp.num_states, mdp.num_actions
    seqs = np.asarray(list(itertools.product(range(A * S), repeat=horizon)), np.int32)
    starts = np.repeat(np.arange(S, dtype=np.int32), len(seqs))
    cells = np.tile(seqs, (S, 1))
    actions, nxt = cells // S, cells % S
    states = np.concatenate([starts[:, None], nxt[:, :-1]], axis=1)
    prob = jnp.prod(mu[states, actions] * mdp.P[states, actions, nxt], axis=1)
    critic = {"actor": v_actor, "learner": vbar}
    rewards, discounts = mdp.R[states, actions, nxt].T, next_state_discounts(mdp)[nxt].T
    lams = jnp.asarray(LAMBDAS, vbar.dtype)
    errs, biases = [], []
    for name in names:
        vin, vboot = (critic[c] for c in _uses(name))

        def one(lam, name=name, vin=vin, vboot=vboot):
            y = fc.field_critic_target(name, rewards, discounts, v_actor[states].T,
                                       vbar[states].T, v_actor[nxt[:, -1]], vbar[nxt[:, -1]],
                                       lam)
            got = jnp.sum((prob * y[0]).reshape(S, -1), axis=-1)
            want = closed_form(mdp, mu, vin, vboot, lam, horizon)
            ref = ex.lambda_return_operator(mdp, p.pi, vbar, lam, horizon)
            return maxabs(got - want), maxabs(got - ref)

        e, b = jax.vmap(one)(lams)
        errs.append(e)
        biases.append(b)
    return jnp.stack(errs), jnp.stack(biases)


@functools.partial(fast_jit, static_argnums=(1,))
def _numbers(problems, names: tuple):
    def one(p):  # under lag (mu = the stalest version, actor copy = a baseline) and at lag 0
        mus, actor = jnp.stack([p.mus[-1], p.pi]), jnp.stack([p.baselines[0], p.vbar])
        err, bias = jax.vmap(lambda m, v: scheme_numbers(p, names, m, v))(mus, actor)
        return (err[0], bias[0]), bias[1]
    return jax.vmap(one)(problems)


_MAKE_PROBLEMS = fast_jit(make_problems, static_argnums=(1, 2))


def async_critic_rows(ctx, num_mdps: int = NUM_MDPS) -> list:
    """One row per field critic (exact under lag, and its bias), one row for lag 0."""
    names = fc.FIELD_CRITICS
    with jax.enable_x64(True):
        problems = _MAKE_PROBLEMS(jax.random.fold_in(ctx.key, KEY_FOLD),
                                  GroupSpec("episodic", 3, 2, num_mdps))
        (err, bias), bias0 = jax.tree_util.tree_map(np.asarray, _numbers(problems, names))
    rows = []
    labels = {"cleanba_mixed": "Cleanba mixed-version GAE (V from actor copy, bootstrap "
              "from learner)", "recompute_no_ratio": "recompute with current critic, no "
              "ratio (NeMo-RL)", "stale_gae": "GAE on stale data (verl / OpenRLHF default)"}
    for i, name in enumerate(names):
        e = float(err[:, i].max())
        b = bias[:, i].max(axis=0)  # per lambda, max over MDPs
        ok = e <= EXACT_TOL and float(b.min()) >= MIN_BIAS
        row = exact_row(f"field critic {name}: E_mu[Y_0] = closed form; biased under lag",
                        "issue 48", num_mdps, e, EXACT_TOL,
                        f"{labels[name]}; max |E[Y|s] - T^lambda_pi Vbar| = "
                        + ", ".join(f"{x:.3g} (lambda={lam:g})" for x, lam in zip(b, LAMBDAS))
                        + f"; all 216 length-{HORIZON} trajectories per start state")
        row.passed = bool(ok)
        rows.append(row)
    e0 = float(bias0.max())
    rows.append(exact_row("field critics at lag 0 = the on-policy lambda-return of Vbar",
                          "issue 48", num_mdps, e0, EXACT_TOL,
                          "mu = pi, actor copy = Vbar: the three schemes coincide, bias 0; "
                          f"lambda in {LAMBDAS}"))
    return rows
