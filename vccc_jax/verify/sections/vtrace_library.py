"""The library's V-trace (``estimators.vtrace``, Eq 11) checked exactly.

- E_mu[vs_0] over *all* length-3 trajectories (enumerated with their probabilities) equals
  :func:`tabular.exact.expected_vtrace_operator`, for every setting of ``VTRACE_SETTINGS``
  (including rho-bar != c-bar with n < T) and both ``vtrace`` and ``vtrace_associative``;
- E_mu[pg_advantages_0 | s] equals its closed form
  sum_a mu min(rhobar_pg, rho) (E[r + gamma(s') W(s') | s, a] - Vbar(s)), W = E[vs_1 | s_1]
  the expected operator over the remaining min(n, T - 1) steps (pg uses v_{t+1}, not v_t);
- with rho = 1 the targets equal the textbook GAE recursion pathwise;
- a trajectory cut by a time limit (``truncations``) gives the same vs and pg as running
  the two pieces as separate episodes (truncation is not termination, DESIGN.md §3).

The V-trace functions are passed as static arguments looked up from the library at call
time, so a patched library is what gets checked (tests/verify/test_injected_bugs.py).
"""

from __future__ import annotations

import functools
import importlib
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.mdp import next_state_discounts
from vccc_jax.tabular.policies import log_ratio_table
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL, GroupSpec, Problem, make_problems, maxabs
from vccc_jax.verify.report import Row

vt = importlib.import_module("vccc_jax.estimators.vtrace")  # the module (the package exports the function)

Array = chex.Array

# (lambda, rho_bar, c_bar, n_steps, pg_rho_bar); None = no truncation / full length.
# The first three are the historical rows (pg_rho_bar = the library default 1.0 unless all
# thresholds are None); the last two have rho_bar != c_bar and n < T = HORIZON.
VTRACE_SETTINGS = (
    (1.0, None, None, None, None),
    (0.7, 2.0, 1.5, None, 1.0),
    (0.9, 1.0, 1.0, 2, 1.0),
    (0.8, 1.5, 0.8, 2, 1.2),
    (0.5, 0.9, 1.3, 2, None),
)
HORIZON = 3


def library_vtrace_fns() -> tuple:
    """The library's V-trace implementations, looked up now (so a patch is seen)."""
    return (vt.vtrace, vt.vtrace_associative)


def _call(fn, args: dict, setting, **extra):
    lam, rbar, cbar, n, pgbar = setting
    return fn(**args, lambda_=lam, clip_rho_threshold=rbar, clip_c_threshold=cbar,
              clip_pg_rho_threshold=pgbar, n_steps=n, **extra)


def expected_pg_advantage(p: Problem, setting, horizon: int = HORIZON) -> Array:
    """Closed form of E_mu[pg_advantages_0 | s_0 = s] on a length-``horizon`` trajectory. [S]"""
    lam, rbar, cbar, n, pgbar = setting
    mdp, pi, mu, vbar = p.mdp, p.pi, p.mus[-1], p.vbar
    rest = horizon - 1 if n is None else min(n, horizon - 1)
    w_next = ex.expected_vtrace_operator(mdp, pi, mu, vbar, n_steps=rest, lambda_=lam,
                                         clip_rho_threshold=rbar, clip_c_threshold=cbar)
    rho = ex.ratio_table(pi, mu)
    w = rho if pgbar is None else jnp.minimum(rho, pgbar)
    w = jnp.where(mu > 0, w, 0.0)
    return jnp.sum(mu * w * (ex.q_values(mdp, v=w_next) - vbar[:, None]), axis=-1)


def vtrace_enumeration_errors(p: Problem, fns: tuple, settings=VTRACE_SETTINGS, horizon: int = HORIZON):
    """(vs errors, pg errors), each [len(fns), len(settings)]: E_mu[.] of the library outputs at
    t = 0 over all trajectories of length ``horizon`` against the closed forms."""
    mdp, pi, mu, vbar = p.mdp, p.pi, p.mus[-1], p.vbar
    S, A = mdp.num_states, mdp.num_actions
    C = A * S
    seqs = np.asarray(list(itertools.product(range(C), repeat=horizon)), np.int32)  # [C^T, T]
    starts = np.repeat(np.arange(S, dtype=np.int32), len(seqs))
    cells = np.tile(seqs, (S, 1))
    actions, nxt = cells // S, cells % S
    states = np.concatenate([starts[:, None], nxt[:, :-1]], axis=1)
    disc = next_state_discounts(mdp)
    prob = jnp.prod(mu[states, actions] * mdp.P[states, actions, nxt], axis=1)
    lrt = log_ratio_table(pi, mu)
    args = dict(
        log_rhos=lrt[states, actions].T, discounts=disc[nxt].T, rewards=mdp.R[states, actions, nxt].T,
        values=vbar[states].T, bootstrap_value=vbar[nxt[:, -1]],
    )

    def expect(x):
        return jnp.sum((prob * x).reshape(S, -1), axis=-1)

    # the closed forms, once per setting (they do not depend on the function checked)
    want_vs = [ex.expected_vtrace_operator(
        mdp, pi, mu, vbar, n_steps=horizon if n is None else n, lambda_=lam,
        clip_rho_threshold=rbar, clip_c_threshold=cbar) for lam, rbar, cbar, n, _ in settings]
    want_pg = [expected_pg_advantage(p, setting, horizon) for setting in settings]
    vs_err, pg_err = [], []
    for fn in fns:
        outs = [_call(fn, args, setting) for setting in settings]
        vs_err.append(jnp.stack([maxabs(expect(o.vs[0]) - w) for o, w in zip(outs, want_vs)]))
        pg_err.append(jnp.stack([maxabs(expect(o.pg_advantages[0]) - w)
                                 for o, w in zip(outs, want_pg)]))
    return jnp.stack(vs_err), jnp.stack(pg_err)


def gae_reference(rewards, discounts, values, bootstrap_value, lambda_):
    """GAE(gamma, lambda) value target by the textbook reverse recursion (time-major)."""
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = rewards + discounts * next_values - values

    def step(acc, x):
        delta, disc = x
        acc = delta + disc * lambda_ * acc
        return acc, acc

    _, adv = jax.lax.scan(step, jnp.zeros_like(bootstrap_value), (deltas, discounts), reverse=True)
    return values + adv


def vtrace_gae_errors(key: Array, fns: tuple, num_trajectories: int = 64, length: int = 12) -> Array:
    """Library V-trace with rho = 1 (log_rhos = 0) equals GAE pathwise, lambda in {0, .5, .9, 1}
    (random rewards, values and episode ends)."""
    kr, kd, kv, kb = jax.random.split(key, 4)
    shape = (length, num_trajectories)
    rewards = jax.random.normal(kr, shape)
    discounts = 0.95 * (jax.random.uniform(kd, shape) > 0.15)
    values = jax.random.normal(kv, shape)
    boot = jax.random.normal(kb, (num_trajectories,))

    def err(lam):
        ref = gae_reference(rewards, discounts, values, boot, lam)
        return jnp.max(jnp.stack([
            maxabs(fn(jnp.zeros(shape), discounts, rewards, values, boot, lambda_=lam).vs - ref) for fn in fns]))

    return jnp.max(jax.vmap(err)(jnp.asarray([0.0, 0.5, 0.9, 1.0], rewards.dtype)))


# (implementation index into ``fns``, setting): the three code paths of the library --
# vtrace's loop and vtrace_associative's scan at n = T, and the shared O(nT) Horner
# recursion at n < T -- each once (rho_bar != c_bar in both settings).
CUT_SETTINGS = ((0, VTRACE_SETTINGS[1]), (1, VTRACE_SETTINGS[1]), (0, VTRACE_SETTINGS[3]))


def vtrace_cut_errors(key: Array, fns: tuple, settings=CUT_SETTINGS, length: int = 8, cut: int = 3,
                      num_trajectories: int = 32) -> Array:
    """max |V-trace on a trajectory cut by a time limit after step ``cut`` - the same steps run
    as two separate episodes| over vs and pg, for each (``fns`` index, setting) of ``settings``."""
    kl, kr, kd, kv, kb, kt = jax.random.split(key, 6)
    shape = (length, num_trajectories)
    log_rhos = 0.7 * jax.random.normal(kl, shape)
    rewards = jax.random.normal(kr, shape)
    discounts = 0.95 * (jax.random.uniform(kd, shape) > 0.15)
    discounts = discounts.at[cut].set(0.95)  # the cut is a time limit, not a termination
    values = jax.random.normal(kv, shape)
    boot = jax.random.normal(kb, (num_trajectories,))
    trunc_values = jax.random.normal(kt, shape)
    truncations = jnp.broadcast_to((jnp.arange(length) == cut)[:, None], shape)

    def piece(lo, hi, bootstrap):
        return dict(log_rhos=log_rhos[lo:hi], discounts=discounts[lo:hi], rewards=rewards[lo:hi],
                    values=values[lo:hi], bootstrap_value=bootstrap)

    whole = piece(0, length, boot)
    first, second = piece(0, cut + 1, trunc_values[cut]), piece(cut + 1, length, boot)
    errs = []
    for i, setting in settings:
        fn = fns[i]
        joint = _call(fn, whole, setting, truncations=truncations, truncation_values=trunc_values)
        a, b = _call(fn, first, setting), _call(fn, second, setting)
        errs.append(maxabs(joint.vs - jnp.concatenate([a.vs, b.vs])))
        errs.append(maxabs(joint.pg_advantages - jnp.concatenate([a.pg_advantages, b.pg_advantages])))
    return jnp.max(jnp.stack(errs))


# One compiled graph per part, so that a test patching the library recompiles only the part
# it checks (and only for the settings it passes).
@functools.partial(fast_jit, static_argnums=(1, 2))
def _enumeration(p: Problem, fns: tuple, settings: tuple):
    return jax.vmap(lambda q: vtrace_enumeration_errors(q, fns, settings))(p)


_GAE = fast_jit(vtrace_gae_errors, static_argnums=(1,))
_CUT = fast_jit(vtrace_cut_errors, static_argnums=(1, 2))
_MAKE_PROBLEMS = fast_jit(make_problems, static_argnums=(1, 2))
NUM_MDPS = 16


def _keys(ctx):
    """(problem key, GAE key, cut key): the third key of ``split(ctx.key, 3)`` (as the
    historical runner did) split in two, and a fold-in of it for the cut check."""
    k_vt = jax.random.split(ctx.key, 3)[2]
    k_p, k_g = jax.random.split(k_vt)
    return k_p, k_g, jax.random.fold_in(k_vt, 1)


def _setting_label(setting) -> str:
    lam, rbar, cbar, n, _ = setting
    clip = "untruncated" if rbar is None else f"rho_bar={rbar:g} c_bar={cbar:g}"
    return f"lambda={lam:g} {clip}" + (f" n={n}" if n else "")


def enumeration_rows(ctx, settings=VTRACE_SETTINGS, num_mdps: int = NUM_MDPS) -> tuple[list[Row], Row]:
    """(one E[vs_0] row per setting, the E[pg_adv_0] row) on ``num_mdps`` small episodic MDPs."""
    with jax.enable_x64(True):
        small = _MAKE_PROBLEMS(_keys(ctx)[0], GroupSpec("episodic", 3, 2, num_mdps))
        enum, pg = jax.tree_util.tree_map(np.asarray, _enumeration(small, library_vtrace_fns(), tuple(settings)))
    rows = []
    for j, setting in enumerate(settings):
        err = float(np.max(enum[:, :, j]))
        rows.append(Row(f"library V-trace E[vs_0] = operator, {_setting_label(setting)}",
                        "Eq 11", "exact", enum.shape[0], err, EXACT_TOL, err <= EXACT_TOL,
                        "vtrace and vtrace_associative; all 216 length-3 trajectories per start state"))
    err = float(np.max(pg))
    pg_row = Row("library V-trace E[pg_adv_0] = closed form (uses v_{t+1})", "Eq 11", "exact", pg.shape[0],
                 err, EXACT_TOL, err <= EXACT_TOL,
                 f"{len(settings)} settings incl. pg_rho_bar != rho_bar; both implementations")
    return rows, pg_row


def gae_row(ctx) -> Row:
    """V-trace with rho = 1 equals the GAE recursion pathwise."""
    with jax.enable_x64(True):
        gae = float(_GAE(_keys(ctx)[1], library_vtrace_fns()))
    return Row("library V-trace with rho=1 = GAE recursion (pathwise)", "Eq 11", "exact", 0, gae,
               EXACT_TOL, gae <= EXACT_TOL, "64 random trajectories with episode ends, lambda in {0,.5,.9,1}")


def cut_row(ctx, settings=CUT_SETTINGS) -> Row:
    """A time-limit cut gives the same targets as two separate episodes (DESIGN.md §3)."""
    with jax.enable_x64(True):
        cut = float(_CUT(_keys(ctx)[2], library_vtrace_fns(), tuple(settings)))
    return Row("library V-trace: time-limit cut = two separate episodes", "Eq 11", "exact", 0, cut,
               EXACT_TOL, cut <= EXACT_TOL,
               "vs and pg; vtrace, vtrace_associative (n=T) and n<T; 32 trajectories of 8 steps cut after step 3")


def vtrace_rows(ctx, num_mdps: int = NUM_MDPS) -> list[Row]:
    """Rows checking the library V-trace exactly (Eq 11)."""
    vs_rows, pg = enumeration_rows(ctx, num_mdps=num_mdps)
    return vs_rows + [gae_row(ctx), pg, cut_row(ctx)]
