"""The library's BRACE estimator (``estimators.related.brace.brace``) checked exactly.

On small episodic MDPs (S = 3, A = 2, the last state terminal; gamma = 1 on half of them)
every length-3 trajectory is enumerated (:mod:`vccc_jax.verify.trajectories`) and the
library estimator is run on all of them; its expectation at every time t is compared with
the exact operator :func:`vccc_jax.tabular.brace.expected_segment_targets`:

- E_mu[vs_t | s_0] for every setting of ``SETTINGS``: rho-bar != c-bar (both orders) with
  clipping active, n < T (the tail is reached; later t have budgets longer than their
  segments), both tail anchors, episode ends, a nonzero bootstrap value; the "prefix" setting
  has a tool state (state 1: ``is_action`` False there, the logged log-ratios ignored, not
  counted toward n), the "constant" one calls the estimator without ``is_action``.
  This pins every term of the definition: the rho-bar residual weight, the c-bar trace, the
  tail weight W (the prefix trace, or 1), the ratio-free tail, the budget count and the
  bootstrap;
- E_mu[pg_advantages_t | s_0] against min(rhobar_pg, rho) (r + gamma v_{t+1} - Vbar(s_t))
  with v_{t+1} the operator over the remaining steps (pg bootstraps from the next target,
  not from the critic), every setting;
- a time-limit cut (``truncations``) gives the same vs and pg as the two pieces run as
  separate episodes (DESIGN.md §3), pathwise.

The estimator and the operator are looked up when the section runs and passed to the
compiled graph as static arguments (tests/verify/test_injected_bugs.py patches them).
"""

from __future__ import annotations

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.tabular import brace as tb
from vccc_jax.verify import trajectories as tr
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL, GroupSpec, Problem, make_problems, maxabs
from vccc_jax.verify.report import Row, exact_row

br = importlib.import_module("vccc_jax.estimators.related.brace")

Array = chex.Array

# (n, rho_bar, c_bar, pg_rho_bar, tail_anchor, tool state or None)
SETTINGS = (
    (1, 1.3, 0.7, 1.1, "prefix", 1),
    (2, 0.9, 1.3, None, "constant", None),
)
HORIZON = 3
NUM_MDPS = 16
GROUP = GroupSpec("episodic", 3, 2, NUM_MDPS)


def _clips(setting) -> dict:
    n, rbar, cbar, pgbar, anchor, _ = setting
    return dict(n=n, clip_rho_threshold=rbar, clip_c_threshold=cbar, clip_pg_rho_threshold=pgbar,
                tail_anchor=anchor)


def expected_outputs(p: Problem, estimator, settings=SETTINGS, horizon: int = HORIZON) -> Array:
    """E_mu[(vs_t, pg_advantages_t) | s_0] of the library estimator over every length-``horizon``
    trajectory of one problem: [len(settings), 2, T, S]."""
    mdp, pi, mu, vbar = p.mdp, p.pi, p.mus[-1], p.vbar
    seg = tr.enumerate_segments(mdp, pi, mu, vbar, horizon)
    out = []
    for setting in settings:
        act = None if setting[-1] is None else _is_action(setting, mdp.num_states)[seg.states]
        o = estimator(**seg.inputs, is_action=act, **_clips(setting))
        out.append(jnp.stack([tr.expect(seg, o.vs), tr.expect(seg, o.pg_advantages)]))
    return jnp.stack(out)


def exact_outputs(p: Problem, operator, settings=SETTINGS, horizon: int = HORIZON) -> Array:
    """The same from the exact operator: E[x_t | s_0] = (P_mu^t x_{T-t})(s_0). [len(settings), 2, T, S]"""
    mdp, pi, mu, vbar = p.mdp, p.pi, p.mus[-1], p.vbar
    out = []
    for setting in settings:
        by_length = operator(mdp, pi, mu, vbar, n_steps=horizon, is_action=_is_action(setting, mdp.num_states),
                             **_clips(setting))
        out.append(jnp.stack([tr.at_times(mdp, mu, x, horizon) for x in by_length]))
    return jnp.stack(out)


def _is_action(setting, num_states: int) -> Array:
    tool = setting[-1]
    return jnp.arange(num_states) != (-1 if tool is None else tool)


def cut_data(key: Array, length: int = 8, cut: int = 3, num_trajectories: int = 16) -> dict:
    """Random trajectories (episode ends, tool steps) with a time-limit cut after step ``cut``:
    numpy, seeded from ``key`` (no random-number graph to compile)."""
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)))
    shape = (length, num_trajectories)
    discounts = 0.95 * (rng.random(shape) > 0.15)
    discounts[cut] = 0.95  # the cut is a time limit, not a termination
    return dict(log_rhos=0.7 * rng.normal(size=shape), rewards=rng.normal(size=shape), discounts=discounts,
                values=rng.normal(size=shape), is_action=rng.random(shape) > 0.3,
                bootstrap_value=rng.normal(size=num_trajectories), truncation_values=rng.normal(size=shape),
                truncations=np.broadcast_to((np.arange(length) == cut)[:, None], shape))


def cut_error(data: dict, estimator, setting=SETTINGS[0], cut: int = 3) -> Array:
    """max |BRACE on trajectories cut by a time limit after step ``cut`` - the same steps run
    as two separate episodes| over vs and pg (:func:`cut_data`)."""
    steps = ("log_rhos", "rewards", "discounts", "values", "is_action")

    def piece(lo, hi, bootstrap, **kw):
        return estimator(**{k: data[k][lo:hi] for k in steps}, bootstrap_value=bootstrap, **kw, **_clips(setting))

    joint = piece(0, None, data["bootstrap_value"], truncations=data["truncations"],
                  truncation_values=data["truncation_values"])
    a, b = piece(0, cut + 1, data["truncation_values"][cut]), piece(cut + 1, None, data["bootstrap_value"])
    return jnp.maximum(maxabs(joint.vs - jnp.concatenate([a.vs, b.vs])),
                       maxabs(joint.pg_advantages - jnp.concatenate([a.pg_advantages, b.pg_advantages])))


# Two graphs (the library side and the exact side), so a patched estimator recompiles only its own.
_EXPECTED = fast_jit(jax.vmap(expected_outputs, in_axes=(0, None, None)), static_argnums=(1, 2))
_EXACT = fast_jit(jax.vmap(exact_outputs, in_axes=(0, None, None)), static_argnums=(1, 2))
_CUT = fast_jit(cut_error, static_argnums=(1,))
# The same compiled problem generator as the core V-trace rows (same spec: no extra compile).
_MAKE_PROBLEMS = fast_jit(make_problems, static_argnums=(1, 2))


def _label(setting) -> str:
    n, rbar, cbar, pgbar, anchor, tool = setting
    clip = "unclipped" if rbar is None else f"rho_bar={rbar:g} c_bar={cbar:g}"
    return f"n={n} {clip} {anchor}" + ("" if tool is None else " tool steps")


def enumeration_rows(ctx, settings=SETTINGS) -> tuple[list[Row], Row]:
    """(one E[vs_t] row per setting, the E[pg_adv_t] row over all settings)."""
    with jax.enable_x64(True):
        problems = _MAKE_PROBLEMS(jax.random.fold_in(ctx.key, 17), GROUP)
        settings = tuple(settings)
        diff = np.abs(np.asarray(_EXPECTED(problems, br.brace, settings))
                      - np.asarray(_EXACT(problems, tb.expected_segment_targets, settings)))
        err = np.max(diff, axis=(3, 4))  # [M, settings, (vs, pg)]
    trajs = f"all {(2 * 3) ** HORIZON} length-{HORIZON} trajectories per start state, every t"
    rows = [exact_row(f"library BRACE E[vs_t] = exact operator, {_label(s)}", "BRACE", err.shape[0],
                      float(np.max(err[:, j, 0])), EXACT_TOL, trajs) for j, s in enumerate(settings)]
    pg = exact_row("library BRACE E[pg_adv_t] = closed form (uses v_{t+1})", "BRACE", err.shape[0],
                   float(np.max(err[:, :, 1])), EXACT_TOL,
                   f"{len(settings)} settings incl. pg_rho_bar != rho_bar and tool steps")
    return rows, pg


def cut_row(ctx) -> Row:
    with jax.enable_x64(True):
        err = float(_CUT(cut_data(jax.random.fold_in(ctx.key, 18)), br.brace))
    return exact_row("library BRACE: time-limit cut = two separate episodes", "BRACE", 0, err, EXACT_TOL,
                     f"vs and pg, {_label(SETTINGS[0])}; 16 trajectories of 8 steps cut after step 3")


def brace_library_rows(ctx) -> list[Row]:
    """Rows checking the library BRACE estimator exactly (keys: fold_in(ctx.key, 17 and 18))."""
    vs_rows, pg = enumeration_rows(ctx)
    return vs_rows + [pg, cut_row(ctx)]
