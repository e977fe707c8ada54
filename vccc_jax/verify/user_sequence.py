"""``vccc verify --target`` for a multi-step critic target (the registry's ``sequence`` contract).

Every trajectory of length T from every start state is enumerated with its probability
under a behaviour version (as the library V-trace rows do, ``sections.vtrace_library``);
the user's ``vs`` [T, N] on that batch gives exact conditional means given any prefix.
T per group is the largest of 3, 2, 1 with at most :data:`MAX_TRAJECTORIES` trajectories
per MDP, and at most :data:`MAX_MDPS` MDPs per group are used. Rows, per target:

- ``E[vs_t | prefix; Vbar = V_claim] = V_claim(s_t)``: at the claimed fixed point (V^pi,
  or V^pitilde of each version for a clipped claim) the target is unbiased at every step
  and after every prefix, under every behaviour version;
- Markov: at an arbitrary Vbar, E[vs_t | prefix] depends on the prefix only through s_t
  (V-trace, n-step and lambda-returns are; a sequence-level ratio applied per token is not);
- the fixed point of E[vs_0 | s_0; Vbar] (affine map in Vbar, solved) vs V_claim;
- Var(vs_0 | s_0) finite; gradient through vs (and pg) exactly 0;
- if pg advantages are returned: mu(a|s) E[pg_0 | s, a; V_claim] = m(s, a) (Q_claim - V_claim)
  with m = pi (vpi) or min(c mu, pi) (clipped), the IMPALA policy-gradient claim;
- sampled: N trajectories per start state, z-scores of the mean of vs_0 at Vbar = V_claim
  against V_claim (``targets.sampled_rows``, as for the one-step targets).

Diagnosis: E[vs_0 | s_0] at Vbar = V_claim and at the arbitrary Vbar against the closed-form
V-trace operator (``tabular.exact.expected_vtrace_operator``) on a grid of (lambda, rhobar,
cbar) and the uncorrected lambda-return; a failing Markov row against the prefix-ratio
closed form Vbar + (prod_{j<t} rho_j)(T_pi Vbar - Vbar); the fixed point against V^mu and
V^pitilde at each c of the grid.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators.registry import SequenceInputs
from vccc_jax.tabular import exact as ex
from vccc_jax.tabular.mdp import next_state_discounts
from vccc_jax.tabular.policies import log_ratio_table
from vccc_jax.verify import diagnose
from vccc_jax.verify.cells import draw
from vccc_jax.verify.claimed import behaviour_mass, claimed_value, normalised
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.contracts import Claim, SequenceTarget, in_graph
from vccc_jax.verify.problems import EXACT_TOL, NUM_VERSIONS, GroupSpec, Problem, maxabs
from vccc_jax.verify.report import Row
from vccc_jax.verify.targets import TargetSpec, sampled_rows
from vccc_jax.verify.user_one_step import FIXED_TOL, GRID, _basis, solve_affine

Array = chex.Array

MAX_TRAJECTORIES = 10_000
MAX_MDPS = 32
LAMBDAS = (1.0, 0.95, 0.9, 0.8, 0.5, 0.0)
THRESHOLDS = (np.inf, 1.0, 1.5, 2.0, 3.0)
SEQ_FIELDS = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")


def horizon(g: GroupSpec) -> int:
    """The longest T in (3, 2, 1) with S (A S)^T <= MAX_TRAJECTORIES."""
    C = g.num_actions * g.num_states
    return next(T for T in (3, 2, 1) if T == 1 or g.num_states * C**T <= MAX_TRAJECTORIES)


def sequence_groups(groups) -> tuple[GroupSpec, ...]:
    return tuple(dataclasses.replace(g, num_mdps=min(g.num_mdps, MAX_MDPS)) for g in groups)


@functools.lru_cache(maxsize=None)
def _layout(S: int, A: int, T: int):
    """(states, actions, next states), each [N, T], N = S (A S)^T, ordered (s_0, c_0, ..., c_{T-1})."""
    C = A * S
    seqs = np.asarray(list(itertools.product(range(C), repeat=T)), np.int32).reshape(-1, T)
    cells = np.tile(seqs, (S, 1))
    starts = np.repeat(np.arange(S, dtype=np.int32), len(seqs))
    actions, nxt = cells // S, cells % S
    states = np.concatenate([starts[:, None], nxt[:, :-1]], axis=1)
    return states, actions, nxt


def enumerate_trajectories(p: Problem, mu: Array, vbar: Array, T: int) -> tuple[SequenceInputs, Array]:
    """All length-T trajectories from every start state: (inputs [T, N], prob [N] given s_0)."""
    mdp = p.mdp
    states, actions, nxt = _layout(mdp.num_states, mdp.num_actions, T)
    prob = jnp.prod(mu[states, actions] * mdp.P[states, actions, nxt], axis=1)
    R = mdp.R if mdp.R.ndim == 3 else jnp.broadcast_to(mdp.R[:, :, None], mdp.P.shape)
    seq = SequenceInputs(log_rhos=log_ratio_table(p.pi, mu)[states, actions].T,
                         discounts=next_state_discounts(mdp)[nxt].T, rewards=R[states, actions, nxt].T,
                         values=vbar[states].T, bootstrap_value=vbar[nxt[:, -1]])
    return seq, prob


def prefix_means(x: Array, prob: Array, S: int, C: int, t: int) -> tuple[Array, Array]:
    """(E[x | prefix up to s_t] [S C^t], P(prefix | s_0) [S C^t]) for x [N]."""
    x, w = x.reshape(S * C**t, -1), prob.reshape(S * C**t, -1)
    pw = jnp.sum(w, axis=-1)
    return jnp.sum(w * x, axis=-1) / jnp.where(pw > 0, pw, 1.0), pw


def _prefix_states(S: int, A: int, T: int, t: int) -> np.ndarray:
    states, _, _ = _layout(S, A, T)
    return states[:, t].reshape(S * (A * S) ** t, -1)[:, 0]


def _prefix_ratio(seq: SequenceInputs, S: int, C: int, t: int) -> Array:
    """prod_{j<t} rho_j along each prefix [S C^t]."""
    r = jnp.exp(jnp.sum(seq.log_rhos[:t], axis=0)) if t else jnp.ones(seq.log_rhos.shape[1:], seq.log_rhos.dtype)
    return r.reshape(S * C**t, -1)[:, 0]


@dataclasses.dataclass(frozen=True)
class UserSequence:
    name: str
    target: SequenceTarget
    claim: Claim


class SeqOut(NamedTuple):
    claim_err: Array    # [K] max |E[vs_t | prefix; V_claim] - V_claim(s_t)|
    markov: Array       # [] max spread of E[vs_t | prefix] over prefixes with the same s_t
    fixed_err: Array    # [] max |V* - V_claim| (stalest version)
    var0: Array         # [S] Var(vs_0 | s_0)
    grads: Array        # [5]
    pg_err: Array       # [K] (NaN without pg)
    z: Array            # [1, S]
    valid: Array        # [1, S]
    gap: Array          # [1, S]
    ncp: Array          # [1, S]
    means0: Array       # [2, K, S] E[vs_0 | s_0] at (V_claim, arbitrary Vbar)
    atoms0: Array       # [2, K, n_atoms, S]
    ref0: Array         # [2, K, S] the claim's operator (V-trace, lambda = 1, rho_bar = c_bar = c)
    dev: Array          # [P] E[vs_t | prefix] - E[vs_t | s_t] at the arbitrary Vbar, stalest, t >= 1
    dev_atom: Array     # [P] the same for the prefix-ratio closed form
    fixed: Array        # [S] V* - V_claim
    fp_atoms: Array     # [n_fp, S] V_h - V_claim


def atom_labels() -> list[str]:
    labels = []
    for lam, rb, cb in itertools.product(LAMBDAS, THRESHOLDS, THRESHOLDS):
        labels.append(f"V-trace with lambda={lam:g}, rho_bar={rb:g}, c_bar={cb:g} (Eq 11)")
    labels += [f"the uncorrected lambda-return / GAE (rho = 1), lambda={lam:g}: fixed point V^mu" for lam in LAMBDAS]
    return labels


def fp_labels() -> list[str]:
    return (["V^mu, the behaviour's value (uncorrected)"]
            + [f"V^pitilde, pitilde ∝ min(c mu, pi) at c={c:g} (Eq 10: the rho_bar of V-trace sets it)" for c in GRID])


def _atoms(p: Problem, mu: Array, vbar: Array, T: int) -> Array:
    """E[vs_0 | s_0] of the V-trace grid and the uncorrected lambda-returns, in closed form. [n, S]"""
    grid = jnp.asarray(list(itertools.product(LAMBDAS, THRESHOLDS, THRESHOLDS)), vbar.dtype)

    def op(g, target):
        return ex.expected_vtrace_operator(p.mdp, target, mu, vbar, n_steps=T, lambda_=g[0],
                                           clip_rho_threshold=g[1], clip_c_threshold=g[2])

    vt = jax.vmap(lambda g: op(g, p.pi))(grid)
    lam = jnp.asarray(LAMBDAS, vbar.dtype)
    unc = jax.vmap(lambda g: op(jnp.stack([g, jnp.inf, jnp.inf]).astype(vbar.dtype), mu))(lam)
    return jnp.concatenate([vt, unc])


class _Enumerated(NamedTuple):
    """Trajectory batches shared by every target with one claim (inputs [T, N], prob [N])."""

    at_claim: tuple      # every version at Vbar = V_claim: ([K, T, N] inputs, [K, N] prob)
    sample: tuple        # sampled from the stalest version at V_claim: inputs [T, S n]
    v_claim: Array       # [K, S]
    atoms: Array         # [K, n_atoms, S] closed forms at V_claim
    ref: Array           # [2, K, S] the claim's own operator
    fp_atoms: Array      # [n_fp, S] V_h - V_claim (stalest)
    sample_idx: Array    # [S, n]


def _claim_batches(key: Array, p: Problem, claim: Claim, T: int, n: int) -> _Enumerated:
    S = p.mdp.num_states
    mixes = jnp.broadcast_to(jnp.eye(NUM_VERSIONS, dtype=p.vbar.dtype)[:, :, None], (NUM_VERSIONS,) + p.mix.shape)
    v_claim = jax.vmap(lambda q: claimed_value(p, q, claim))(mixes)
    at_claim = jax.vmap(lambda mu, v: enumerate_trajectories(p, mu, v, T))(p.mus, v_claim)
    seq, prob = jax.tree_util.tree_map(lambda x: x[-1], at_claim)
    idx = draw(key, prob.reshape(S, -1), n) + (jnp.arange(S) * (prob.size // S))[:, None]  # [S, n]
    sample = jax.tree_util.tree_map(lambda x: x[..., idx.ravel()] if x.ndim == 2 else x[idx.ravel()], seq)
    atoms = jax.vmap(lambda mu, v: _atoms(p, mu, v, T))(p.mus, v_claim)
    c = jnp.asarray(claim.clip, p.vbar.dtype)
    ref = jnp.stack([jax.vmap(lambda mu, v: _claim_operator(p, mu, v, c, T))(p.mus, v_claim),
                     jax.vmap(lambda mu: _claim_operator(p, mu, p.vbar, c, T))(p.mus)])
    fp = [ex.policy_value(p.mdp, normalised(behaviour_mass(p, mixes[-1], "none", None))[1])[None]]
    fp.append(jax.vmap(lambda c: ex.policy_value(p.mdp, normalised(behaviour_mass(p, mixes[-1], "truncate", c))[1]))(
        jnp.asarray(GRID, p.vbar.dtype)))
    return _Enumerated(at_claim, sample, v_claim, atoms, ref, jnp.concatenate(fp) - v_claim[-1][None], idx)


def seq_checks(key: Array, p: Problem, users: tuple, T: int, num_samples: int) -> tuple:
    """Everything for one problem and every user sequence target (one graph). The trajectory
    batches are enumerated once (per claim where they depend on it); each target adds only
    its own evaluations. A lag law's problem: :data:`.user_sequence_law.GRAPH`."""
    if p.law:
        raise ValueError("a lag law's problem is checked by verify.user_sequence_law (run(graph=...))")
    S, A = p.mdp.num_states, p.mdp.num_actions
    C = A * S
    prefix_states = [_prefix_states(S, A, T, t) for t in range(T)]
    onehots = [jax.nn.one_hot(ps, S, dtype=p.vbar.dtype) for ps in prefix_states]
    t_pi = jnp.sum(p.pi * ex.q_values(p.mdp, v=p.vbar), -1)
    mixes = jnp.broadcast_to(jnp.eye(NUM_VERSIONS, dtype=p.vbar.dtype)[:, :, None], (NUM_VERSIONS,) + p.mix.shape)
    arbitrary = jax.vmap(lambda mu: enumerate_trajectories(p, mu, p.vbar, T))(p.mus)        # every version
    fp_batches = jax.vmap(lambda v: enumerate_trajectories(p, p.mus[-1], v, T)[0])(_basis(p))  # stalest
    seq, prob = jax.tree_util.tree_map(lambda x: x[-1], arbitrary)
    # the prefix-ratio closed form (a sequence-level ratio per token), arbitrary Vbar, stalest version
    ratios = [_prefix_ratio(seq, S, C, t) for t in range(T)]
    atoms_arbitrary = jax.vmap(lambda mu: _atoms(p, mu, p.vbar, T))(p.mus)                  # [K, n, S]
    claims: dict = {}
    outs = []
    for u in users:
        if u.claim not in claims:
            claims[u.claim] = _claim_batches(key, p, u.claim, T, num_samples)
        e = claims[u.claim]

        # ONE evaluation of the target (with its gradient) on every batch it meets, joined
        # along the trajectory axis (the contract's batch independence, checked in preflight).
        pieces = [e.at_claim[0], arbitrary[0], fp_batches, jax.tree_util.tree_map(lambda x: x[None], e.sample)]
        (vs_k, pg_k), grads = _evaluate(u, pieces)
        vs_claim, vs_all, vs_fp, vs_s = vs_k
        pg_claim = None if pg_k is None else pg_k[0]

        def at_claim(vs, pg, prob_k, v, mix):
            errs = [maxabs(jnp.where(prefix_means(vs[t], prob_k, S, C, t)[1] > 0,
                                     prefix_means(vs[t], prob_k, S, C, t)[0] - v[prefix_states[t]], 0.0))
                    for t in range(T)]
            if pg is None:
                pg_err = jnp.asarray(jnp.nan, v.dtype)
            else:
                m = behaviour_mass(p, mix, u.claim.weight_kind, u.claim.c)
                claimed = m * (ex.q_values(p.mdp, v=v) - v[:, None])
                pg_err = maxabs(jnp.sum((prob_k * pg[0]).reshape(S, A, -1), -1) - claimed)
            return jnp.max(jnp.stack(errs)), pg_err, _moments0(vs[0], prob_k, S)

        claim_err, pg_err, (mean_claim, var_claim) = jax.vmap(at_claim, in_axes=(0, None if pg_claim is None else 0,
                                                                                0, 0, 0))(
            vs_claim, pg_claim, e.at_claim[1], e.v_claim, mixes)
        vs = vs_all[-1]
        devs, dev_atoms = [], []
        spread = [jnp.zeros((), p.vbar.dtype)]
        for t in range(1, T):
            m, pw = prefix_means(vs[t], prob, S, C, t)
            oh = onehots[t] * (pw > 0)[:, None]                         # [P, S]
            hi = jnp.max(jnp.where(oh > 0, m[:, None], -jnp.inf), axis=0)
            lo = jnp.min(jnp.where(oh > 0, m[:, None], jnp.inf), axis=0)
            reached = jnp.any(oh > 0, axis=0)                           # a NaN mean keeps its NaN spread
            spread.append(jnp.max(jnp.where(reached, hi - lo, 0.0)))
            wsum = jnp.sum(oh * pw[:, None], axis=0)
            mbar = jnp.sum(oh * (pw * m)[:, None], axis=0) / jnp.where(wsum > 0, wsum, 1.0)
            rbar = jnp.sum(oh * (pw * ratios[t])[:, None], axis=0) / jnp.where(wsum > 0, wsum, 1.0)
            ps = prefix_states[t]
            devs.append(jnp.where(pw > 0, m - mbar[ps], 0.0))
            dev_atoms.append(jnp.where(pw > 0, (ratios[t] - rbar[ps]) * (t_pi - p.vbar)[ps], 0.0))
        mean_arb = jax.vmap(lambda v, q: _moments0(v[0], q, S)[0])(vs_all, arbitrary[1])
        var0 = _moments0(vs[0], prob, S)[1]
        fixed, _ = solve_affine(jax.vmap(lambda x: _moments0(x[0], prob, S)[0])(vs_fp))
        z, valid, gap, ncp = _z_scores(jnp.mean(vs_s[0, 0].reshape(S, -1), axis=-1), mean_claim[-1], var_claim[-1],
                                       e.v_claim[-1], num_samples)
        zero = jnp.zeros((1,), p.vbar.dtype)
        outs.append(SeqOut(
            claim_err=claim_err, markov=jnp.max(jnp.stack(spread)), fixed_err=maxabs(fixed - e.v_claim[-1]),
            var0=var0, grads=grads, pg_err=pg_err, z=z[None], valid=valid[None], gap=gap[None],
            ncp=ncp[None], means0=jnp.stack([mean_claim, mean_arb]), atoms0=jnp.stack([e.atoms, atoms_arbitrary]),
            ref0=e.ref,
            dev=jnp.concatenate(devs) if devs else zero, dev_atom=jnp.concatenate(dev_atoms) if dev_atoms else zero,
            fixed=fixed - e.v_claim[-1], fp_atoms=e.fp_atoms))
    return tuple(outs)


def _z_scores(sample_mean: Array, mean: Array, var: Array, claimed: Array, n: int):
    """(z, valid, gap, ncp) [S] of a sample mean against the claim, with the exact variance."""
    ok = ~(var <= 1e-20 * (1.0 + jnp.square(mean)))  # NaN: a NaN z-score, which fails
    safe = jnp.where(ok, var, 1.0)
    z = jnp.where(ok, (sample_mean - claimed) / jnp.sqrt(safe / n), 0.0)
    return z, ok, mean - claimed, jnp.where(ok, n * jnp.square(mean - claimed) / safe, 0.0)


def _claim_operator(p: Problem, mu: Array, vbar: Array, c, T: int) -> Array:
    return ex.expected_vtrace_operator(p.mdp, p.pi, mu, vbar, n_steps=T, lambda_=1.0, clip_rho_threshold=c,
                                       clip_c_threshold=c)


def _moments0(x: Array, prob: Array, S: int) -> tuple[Array, Array]:
    x, w = x.reshape(S, -1), prob.reshape(S, -1)
    mean = jnp.sum(w * x, -1)
    return mean, jnp.sum(w * jnp.square(x - mean[:, None]), -1)


def _evaluate(u: UserSequence, pieces: list) -> tuple:
    """The target on several batches of inputs [B_i, T, N_i] with one call, on their columns
    joined into one [T, sum_i B_i N_i] batch; with the gradient of sum cos(vs) + sum sin(pg)
    with respect to every input field. Returns ((vs pieces, pg pieces or None), max |grad|
    per field of SEQ_FIELDS)."""
    shapes = [x.log_rhos.shape for x in pieces]                                  # [B_i, T, N_i]

    def join(xs):
        return jnp.concatenate([jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1) if x.ndim == 3
                                else x.reshape(-1) for x in xs], axis=-1)

    fields = {f: join([getattr(x, f) for x in pieces]) for f in SEQ_FIELDS}

    def loss(x):
        vs, pg = u.target(SequenceInputs(**x))
        return jnp.sum(jnp.cos(vs)) + (0.0 if pg is None else jnp.sum(jnp.sin(pg))), (vs, pg)

    (_, (vs, pg)), g = jax.value_and_grad(loss, has_aux=True)(fields)

    def split(y):
        out, start = [], 0
        for B, T, N in shapes:
            out.append(jnp.moveaxis(y[:, start:start + B * N].reshape(T, B, N), 1, 0))
            start += B * N
        return out

    return (split(vs), None if pg is None else split(pg)), jnp.stack([maxabs(g[f]) for f in SEQ_FIELDS])


GRAPH = fast_jit(jax.vmap(seq_checks, in_axes=(0, 0, None, None, None)), static_argnums=(2, 3, 4))


# ------------------------------------------------------------------------------ rows


def run(items: list, groups, keys, num_samples: int, loss_ready: bool = False,
        make=None, graph=None) -> list[tuple[list[Row], list[str]]]:
    """(rows, diagnosis) per (name, kind, claim, wrapper) item, one graph per group
    (``loss_ready``: as :func:`diagnose.gradient_row`; ``make``: as :func:`user.check_all`;
    ``graph``: :data:`GRAPH` or, for a lag law's problems, ``user_sequence_law.GRAPH``)."""
    from vccc_jax.verify.runner import make_problems_jit

    users = tuple(UserSequence(name, wrapped, claim) for name, _, claim, wrapped in items)
    groups_s = sequence_groups(groups)
    outs = []
    for g, gs, (kp, ks) in zip(groups, groups_s, keys):
        p = (make or make_problems_jit)(kp, g)
        p = jax.tree_util.tree_map(lambda x: x[:gs.num_mdps], p)
        k = jax.random.split(jax.random.fold_in(ks, 1), gs.num_mdps)
        out = in_graph(", ".join(u.name for u in users), graph or GRAPH, k, p, users, horizon(g), num_samples)
        outs.append(jax.tree_util.tree_map(np.asarray, out))
    names = diagnose.mdp_names(groups_s)
    horizons = ", ".join(f"T={horizon(g)} on {g.kind}{g.num_states}x{g.num_actions}" for g in groups)
    return [_report(u, [o[j] for o in outs], names, horizons, num_samples, loss_ready) for j, u in enumerate(users)]


def _cat(outs, field) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(o, field)) for o in outs])


def _report(u: UserSequence, outs: list[SeqOut], names, horizons: str, num_samples: int, loss_ready: bool):
    vl = u.claim.value_short
    rows = []
    ce = np.max(_cat(outs, "claim_err"), axis=-1)
    rows.append(Row(f"{u.name}: E[vs_t | prefix; Vbar = {vl}] = {vl}", "Eq 11", "exact", len(ce), float(np.max(ce)),
                    EXACT_TOL, bool(np.all(ce <= EXACT_TOL)),
                    diagnose.failing_mdps(ce, EXACT_TOL, names) or f"{u.claim.value_label}; every step, prefix, version; {horizons}"))
    mk = _cat(outs, "markov")
    rows.append(Row(f"{u.name}: Markov (E[vs_t | prefix] depends on s_t only)", "Eq 11", "exact", len(mk),
                    float(np.max(mk)), EXACT_TOL, bool(np.all(mk <= EXACT_TOL)),
                    diagnose.failing_mdps(mk, EXACT_TOL, names) or "arbitrary Vbar, stalest version"))
    fe = _cat(outs, "fixed_err")
    rows.append(Row(f"{u.name}: fixed point = {vl}", "Eq 11", "exact", len(fe), float(np.max(fe)), FIXED_TOL,
                    bool(np.all(fe <= FIXED_TOL)),
                    diagnose.failing_mdps(fe, FIXED_TOL, names) or "of V -> E[vs_0 | s_0; Vbar = V], stalest version"))
    pg = np.max(_cat(outs, "pg_err"), axis=-1)
    if not np.all(np.isnan(pg)):
        kind = "pi" if u.claim.weight_kind == "ratio" else f"min(c mu, pi), c={u.claim.c:g}"
        rows.append(Row(f"{u.name}: mu E[pg_0 | s, a; {vl}] = m (Q - V)", "Eq 11", "exact", len(pg),
                        float(np.max(pg)), EXACT_TOL, bool(np.all(pg <= EXACT_TOL)),
                        diagnose.failing_mdps(pg, EXACT_TOL, names) or f"m = {kind}; every version"))
    var = np.concatenate([np.max(np.asarray(o.var0), axis=-1) for o in outs])
    rows.append(Row(f"{u.name}: Var(vs_0|s_0) finite", "user", "exact", len(var), float(np.max(var)), np.inf,
                    bool(np.all(np.isfinite(var))), f"median {np.median(var):.3g}"))
    row, warnings = diagnose.gradient_row(f"{u.name}: stop_gradient (grad through vs, pg = 0)", len(var),
                                          np.max(_cat(outs, "grads"), axis=0), SEQ_FIELDS, loss_ready)
    rows.append(row)
    spec = (TargetSpec(f"{u.name}: vs_0 at Vbar = {vl}", "Eq 11", None, None),)
    pad = [_pad(np.asarray(getattr(o, f))) for o in outs for f in ("z", "valid", "gap", "ncp")]
    z, valid, gap, ncp = (np.concatenate(pad[i::4]) for i in range(4))
    rows += sampled_rows(spec, z, valid, gap, ncp, num_samples)
    diagnosis = _diagnosis(u, outs, rows) + warnings
    if u.claim.name == "any":
        for r in rows:
            if "fixed point" in r.name or "Vbar =" in r.name or r.kind == "sampled" or "pg_0" in r.name:
                diagnose.as_info(r)
        explained = " matches " in diagnosis[0] and "no known" not in diagnosis[0] or "no bias" in diagnosis[0]
        rows.append(Row(f"{u.name}: E[vs_0|s_0] is a known closed form", "user", "exact", len(var),
                        0.0 if explained else 1.0, 0.0, explained, diagnosis[0]))
    return rows, diagnosis


def _pad(x: np.ndarray) -> np.ndarray:
    from vccc_jax.verify.targets import MAX_STATES_PADDED

    return np.pad(x, ((0, 0), (0, 0), (0, MAX_STATES_PADDED - x.shape[-1])), constant_values=np.zeros((), x.dtype))


def _diagnosis(u: UserSequence, outs: list[SeqOut], rows: list[Row]) -> list[str]:
    lines = []
    labels = atom_labels()
    means = np.concatenate([np.asarray(o.means0).ravel() for o in outs])
    ref = np.concatenate([np.asarray(o.ref0).ravel() for o in outs])
    atoms = np.concatenate([np.moveaxis(np.asarray(o.atoms0), 3, 0).reshape(len(labels), -1) for o in outs], axis=1)
    exact_ok = all(r.passed for r in rows if r.kind == "exact" and ("Vbar =" in r.name or "fixed point" in r.name))
    markov_ok = next(r for r in rows if "Markov" in r.name).passed
    if not markov_ok:
        dev = np.concatenate([np.asarray(o.dev).ravel() for o in outs])
        dev_atom = np.concatenate([np.asarray(o.dev_atom).ravel() for o in outs])
        m = diagnose.match(dev, dev_atom[None], ["a sequence-level ratio applied per token: E[vs_t | prefix] = "
                                                 "Vbar + (prod_{j<t} rho_j)(T_pi Vbar - Vbar)(s_t)"])
        lines.append("the target depends on earlier steps of the trajectory: " + m.sentence("E[vs_t | prefix] - E[vs_t | s_t]"))
    if exact_ok and u.claim.name != "any":
        lines.insert(0, f"unbiased for {u.claim.value_label} at every step; fixed point {u.claim.value_label}")
    else:
        m = diagnose.match(means - ref, atoms - ref[None], labels, float(np.max(np.abs(means))))
        lines.insert(0, "E[vs_0 | s_0] (at V_claim and at an arbitrary Vbar): "
                     + m.sentence("it", candidate=u.claim.name == "any"))
        shape = diagnose.bias_shape(means - ref, EXACT_TOL * (1.0 + float(np.max(np.abs(means)))))
        if shape:
            lines.insert(1, shape.replace("in every state", "in every start state"))
        fixed = np.concatenate([np.asarray(o.fixed).ravel() for o in outs])
        fp = np.concatenate([np.moveaxis(np.asarray(o.fp_atoms), 1, 0).reshape(len(fp_labels()), -1) for o in outs],
                            axis=1)
        mf = diagnose.match(fixed, fp, fp_labels(), 1.0)
        lines.append(f"fixed point: max |V* - {u.claim.value_label}| = {np.max(np.abs(fixed)):.3g}; "
                     + mf.sentence("V* - V_claim").replace("V* - V_claim matches", "V* is"))
    return lines
