"""The actor-correction table (issue 21; ``estimators.actor_registry``): each row's defining
property, exactly, in float64 -- the rows LLM RL systems ship (TIS, MIS, IcePop, sequence
TIS / MIS, GSPO, TOPR, CISPO, PPO vs the behaviour, AReaL decoupled PPO, M2PO).

Rows (docs/method.md "Actor corrections", equations A0-A9):

- A0: the WEIGHT_KINDS rows are ``importance.importance_weights`` (extreme log-ratios
  included), and the exact expected update by path enumeration (``tabular.actor_paths``,
  ``envs.token_actor_truth.token_paths``) equals the per-state closed form
  (``tabular.exact_actor.correction_coefficients``, ``token_actor_truth.update_coefficients``)
  under the enumerated occupancy, for one row of each code path (``CHECKED_ROWS`` on a
  tabular MDP, ``TOKEN_CHECKED_ROWS`` on a token task with tool steps);
- A2: IcePop is exact IS inside its band: mu w = pi 1[alpha <= rho <= beta];
- A3: sequence TIS / MIS: E_mu[f(R) F] = E_pi[f(R) / R F] over whole sequences, and
  sequence IS (c -> inf) is unbiased for E_pi[sum_t A_t u_t] (tabular: pi's own paths;
  token: pi's forward occupancy ``policy_occupancy``, the any-horizon closed form);
- A4: GSPO's s is the geometric mean (prod_t rho_t)^(1/|y|) of the sequence's action
  tokens and its weight is s where the sequence clip lets the gradient through;
- A5: TOPR is unbiased on negative-advantage tokens where pi <= mu (mu w = pi) and
  uncorrected (w = 1) on positive ones;
- A6: CISPO's loss gradient is sg(clip(rho)) A u on EVERY token, nonzero on the tokens
  where PPO's clip zeroes it;
- A7: the ``ppo`` row is the gradient of the library's PPO surrogate with pi_old = mu;
- A8: AReaL = the library's decoupled route (pi_old = pi_prox) at theta = pi_prox, with the
  staleness cap removing the versions older than eta;
- A9: M2PO's mask leaves a batch mean (log r)^2 <= tau and is maximal; its population
  limit keeps E[(log r)^2 keep] = tau E[keep] exactly when it binds.

One compiled graph (``fast_jit``) with the library functions as a static argument (a
patched library recompiles and is checked); keys ``fold_in(ctx.key, 21)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.envs import token_actor_truth as tat
from vccc_jax.estimators import actor as actor_lib
from vccc_jax.estimators import actor_registry as ar
from vccc_jax.estimators import importance
from vccc_jax.estimators.related import decoupled as dec
from vccc_jax.tabular import actor_paths as ap
from vccc_jax.tabular import exact, exact_actor
from vccc_jax.tabular import token as tk
from vccc_jax.tabular.mdp import random_mdp, with_horizon
from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.problems import EXACT_TOL
from vccc_jax.verify.report import Row, exact_row, pair_row, worst

S, A, H, L = 3, 2, 3, 2          # tabular: S (A S)^H = 648 paths, 2 versions
TOKEN = dict(num_tokens=3, horizon=4, num_states=3, num_classes=2, num_prompts=2, tool_length=1,
             num_tool_states=2, gamma=0.9, format_reward=0.1)
CLIP, BAND, EPS, TAU, ETA = 1.5, (0.6, 1.8), 0.2, 0.05, 0
# The per-state cross-check covers one row of each code path: a WEIGHT_KINDS row, a new
# rho-only row, a sign-dependent row, the lag-reading row and the batch row (the other
# token rows differ from these only in their elementwise weight, checked in tests/).
CHECKED_ROWS = ("truncate", "icepop", "ppo", "areal", "m2po")
# On the token task: the rows whose per-state path has token-truth-specific code (version
# lags, M2PO's first pass over all positions); the elementwise part is shared with tabular.
TOKEN_CHECKED_ROWS = ("areal", "m2po")
ROW_PARAMS = {"areal": {"max_staleness": ETA}, "m2po": {"tau": TAU}, "truncate": {"clip": CLIP},
              "mask": {"clip": CLIP}, "icepop": {"alpha": BAND[0], "beta": BAND[1]}}


def library_fns() -> tuple:
    """The library functions the graph checks, looked up now (the graph's cache key)."""
    return (tuple((n, r) for n, r in ar.ACTOR_CORRECTIONS.items()), importance.importance_weights,
            actor_lib.policy_loss, dec.decoupled_policy_loss, exact_actor.correction_coefficients,
            ap.expected_update)


def _row(fns, name):
    return dict(fns[0])[name]


def enumeration_problem(key):
    """The finite-horizon problem both actor sections enumerate: (mdp, pi [S, A], mus [L, S, A],
    version weights vw [L], every path, a time-indexed critic crit_t [H + 1, S] (0 at H), the
    path advantages, and d_lt [L, H, S], the per-version, per-time occupancy of the
    non-terminal states under mu_l)."""
    k_m, k_p, k_m2, k_v = jax.random.split(key, 4)
    mdp = with_horizon(random_mdp(k_m, 1, S, A, gamma=0.9)[0], H)
    pi = jax.nn.softmax(jax.random.normal(k_p, (S, A)), -1)
    mus = jax.nn.softmax(jnp.log(pi)[None] + 1.2 * jax.random.normal(k_m2, (L, S, A)), -1)
    vw = jnp.asarray([0.35, 0.65])
    paths = ap.tabular_paths(mdp, pi, mus)
    crit_t = jax.random.normal(k_v, (H + 1, S)).at[H].set(0.0)
    adv = ap.path_advantages(paths, crit_t.reshape(-1), 0.0)

    def occ(mu):
        def step(d, _):
            return d @ exact.transition_matrix(mdp, mu), d * (1.0 - mdp.terminal)
        return jax.lax.scan(step, mdp.init, None, length=H)[1]  # [H, S]
    return mdp, pi, mus, vw, paths, crit_t, adv, jax.vmap(occ)(mus)


def _tabular_enumeration(fns, key):
    """(max |enumeration - closed form| over the token rows, seq-IS error, pg size, the
    sequence TIS / MIS identities (value, closed) pairs) on a finite-horizon MDP."""
    corr, expected_update = fns[4], fns[5]
    mdp, pi, mus, vw, paths, crit_t, adv, d_lt = enumeration_problem(key)
    lr = jnp.broadcast_to((jnp.log(pi)[None] - jnp.log(mus))[:, None], (L, H, S, A))
    atoms = vw[:, None, None, None] * d_lt[..., None] * mus[:, None]
    # A(s, a, s') at every time, [H, S, A, S'] (critic row t + 1 behind s')
    adv_sas = (mdp.R[None] + mdp.gamma * (1.0 - mdp.terminal)[None, None, None] * crit_t[1:, None, None]
               - crit_t[:H, :, None, None])
    errs = []
    for name in CHECKED_ROWS:
        params = ROW_PARAMS.get(name, {})
        enum = expected_update(paths, adv, vw, correction=name, params=params, num_ids=S,
                               num_actions=A)
        thr = exact_actor.population_threshold(name, params, lr, atoms)
        c = corr(jnp.log(pi)[None, None], jnp.log(mus)[:, None], adv_sas[None], correction=name,
                 params=params, next_prob=mdp.P[None, None], lags=jnp.arange(L)[:, None, None, None],
                 threshold=thr)  # [L, H, S, A]
        errs.append(jnp.max(jnp.abs(enum - jnp.einsum("l,lts,ltsa->sa", vw, d_lt, c))))
    pg = ap.pi_update(paths, adv, num_ids=S, num_actions=A)
    seq_is = expected_update(paths, adv, vw, correction="seq_tis", params={"clip": 1e30},
                             num_ids=S, num_actions=A)
    seq = _sequence_identities(fns, paths, adv, vw, S, A)
    return jnp.max(jnp.stack(errs)), jnp.max(jnp.abs(seq_is - pg)), jnp.max(jnp.abs(pg)), seq


def _sequence_identities(fns, paths, adv, vw, num_ids, num_actions):
    """Sequence TIS and MIS under mu vs the pi-side closed forms E_pi[min(1, c/R) F] and
    E_pi[1[alpha <= R <= beta] F], F = sum_t A_t u_t (stacked (value, closed) pairs)."""
    expected_update = fns[5]
    log_r = jnp.sum(paths.log_pi[None] - paths.log_mus, axis=1)  # [L, N]
    r = jnp.exp(log_r)

    def pi_side(f):  # sum_l v_l E_pi[f(R_l) sum_t A_t u_t]
        coeff = jnp.sum(vw[:, None] * paths.prob_pi[None] * f(r), axis=0)[None] * adv
        return ap.scatter_coefficients(paths, coeff, num_ids, num_actions)

    tis = expected_update(paths, adv, vw, correction="seq_tis", params={"clip": CLIP},
                          num_ids=num_ids, num_actions=num_actions)
    mis = expected_update(paths, adv, vw, correction="seq_mis",
                          params={"alpha": BAND[0], "beta": BAND[1]}, num_ids=num_ids,
                          num_actions=num_actions)
    return jnp.stack([
        jnp.stack([tis, pi_side(lambda x: jnp.minimum(1.0, CLIP / x))]),
        jnp.stack([mis, pi_side(lambda x: ((x >= BAND[0]) & (x <= BAND[1])).astype(x.dtype))]),
    ])


def _token_enumeration(fns, key):
    """The token-task twin of :func:`_tabular_enumeration` (tool steps: no ratio, no u)."""
    k_t, k_p, k_m, k_v = jax.random.split(key, 4)
    task = tk.make_task(k_t, **TOKEN)
    Hk, P, Q, V, K = task.horizon, task.num_prompts, task.num_states, task.num_tokens, task.num_counters
    logits = jax.random.normal(k_p, (P, Hk, Q, V))
    stale = logits[None] + 1.0 * jax.random.normal(k_m, (L, P, Hk, Q, V))
    pi_fn = tk.table_policy(logits)
    mus_fn = lambda t: jax.nn.log_softmax(stale[:, :, t], -1)  # noqa: E731
    vw = jnp.asarray([0.4, 0.6])
    crit = jax.random.normal(k_v, (Hk + 1, P, Q, K))
    paths = tat.token_paths(task, pi_fn, mus_fn)
    ids = Hk * P * Q
    occ_l = jnp.stack([ap.occupancy(paths, jnp.eye(L)[i], ids) for i in range(L)]).reshape(L, Hk, P, Q)
    d = jnp.einsum("l,lhpq->hpq", vw, occ_l)
    post = jnp.where(d[None] > 0, vw[:, None, None, None] * occ_l / jnp.where(d > 0, d, 1.0)[None], 0.5)
    vals = tk.policy_values(task, pi_fn)
    adv = ap.path_advantages(paths, crit.reshape(-1), 0.0)
    errs = []
    for name in TOKEN_CHECKED_ROWS:
        params = ROW_PARAMS.get(name, {})
        enum = ap.expected_update(paths, adv, vw, correction=name, params=params, num_ids=ids,
                                  num_actions=V).reshape(Hk, P, Q, V)
        uc = tat.update_coefficients(task, pi_fn, mus_fn, post, d, crit, kind=name, params=params,
                                     pi_values=vals)
        errs.append(jnp.max(jnp.abs(enum - uc.expected)))
    seq_is = ap.expected_update(paths, adv, vw, correction="seq_tis", params={"clip": 1e30},
                                num_ids=ids, num_actions=V).reshape(Hk, P, Q, V)
    # E_pi[sum_t A_t u_t] by the forward occupancy of pi (any horizon), not by enumeration
    d_pi = tat.policy_occupancy(task, pi_fn)[..., 0]
    pg = tat.update_coefficients(task, pi_fn, lambda t: pi_fn(t)[None], jnp.ones((1, Hk, P, Q)),
                                 d_pi, crit, kind="ratio", pi_values=vals).expected
    tools = jnp.sum(paths.alive & ~paths.is_action)
    return jnp.max(jnp.stack(errs)), jnp.max(jnp.abs(seq_is - pg)), jnp.max(jnp.abs(pg)), tools


def _table_properties(fns, key):
    """Per-token identities on random [N, A] tables (A0, A2, A4-A9)."""
    rows, iw, policy_loss, dec_loss = fns[0], fns[1], fns[2], fns[3]
    row = dict(rows)
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    N, T = 6, 5
    # A0: WEIGHT_KINDS rows = importance_weights, extreme log-ratios included
    lr = jnp.concatenate([2.0 * jax.random.normal(k1, (40,)),
                          jnp.asarray([100.0, -100.0, jnp.inf, -jnp.inf, jnp.nan, 0.0])])
    adv = jnp.ones_like(lr)
    legacy = jnp.max(jnp.stack([
        jnp.max(jnp.abs(row["none"](lr, adv) - 1.0)),
        jnp.max(jnp.abs(row["ratio"](lr, adv) - iw(lr, "ratio"))),
        jnp.max(jnp.abs(row["truncate"](lr, adv, clip=CLIP) - iw(lr, "truncate", CLIP))),
        jnp.max(jnp.abs(row["mask"](lr, adv, clip=CLIP) - iw(lr, "mask", CLIP)))]))
    # per-state tables: pi, mu [N, A], advantages E[A | s, a] [N, A]
    pi = jax.nn.softmax(jax.random.normal(k2, (N, 4)), -1)
    mu = jax.nn.softmax(jnp.log(pi) + 1.5 * jax.random.normal(k3, (N, 4)), -1)
    a_sa = jax.random.normal(k4, (N, 4))
    lrt = jnp.log(pi) - jnp.log(mu)
    rho = pi / mu
    band = ((rho >= BAND[0]) & (rho <= BAND[1])).astype(pi.dtype)
    ice = mu * row["icepop"](lrt, a_sa, alpha=BAND[0], beta=BAND[1])
    icepop = jnp.stack([ice, pi * band])
    topr = mu * row["topr_token"](lrt, a_sa)
    neg = (a_sa < 0) & (pi <= mu)
    topr_pair = jnp.stack([jnp.where(neg, topr, 0.0), jnp.where(neg, pi, 0.0)])
    topr_pos = jnp.max(jnp.where(a_sa >= 0, jnp.abs(topr - mu), 0.0))
    # A4: GSPO on [T, B] with a mask and starts
    lr_seq = 0.4 * jax.random.normal(k5, (T, 4))
    adv_seq = jnp.broadcast_to(jnp.asarray([1.0, -1.0, 1.0, -1.0]), (T, 4))
    mask = jnp.broadcast_to(jnp.arange(T)[:, None] % 3 != 1, (T, 4))
    s_lib = jnp.exp(ar.geometric_mean_log_ratio(lr_seq, mask))[0]
    n = jnp.sum(mask, axis=0)  # |y| per sequence
    s_direct = jnp.prod(jnp.where(mask, jnp.exp(lr_seq), 1.0), axis=0) ** (1.0 / n)
    w_g = row["gspo"](lr_seq, adv_seq, mask=mask, eps_low=0.01, eps_high=0.01)
    clipped = ((adv_seq[0] > 0) & (s_direct > 1.01)) | ((adv_seq[0] < 0) & (s_direct < 0.99))
    gspo = jnp.stack([jnp.concatenate([s_lib, w_g.reshape(-1)]),
                      jnp.concatenate([s_direct, jnp.where(mask, jnp.where(clipped, 0.0, s_direct)[None],
                                                          0.0).reshape(-1)])])
    # A6 / A7 / A8: loss gradients vs w A u (flat tokens of the tables: one token per (s, a))
    lp_all = jnp.log(pi)
    a_idx = jnp.tile(jnp.arange(4), N)
    s_idx = jnp.repeat(jnp.arange(N), 4)
    lmu, adv_t = jnp.log(mu)[s_idx, a_idx], a_sa[s_idx, a_idx]

    def grad_of(loss):  # d loss / d logits [N, 4] at logits = log pi
        return jax.grad(lambda th: loss(jax.nn.log_softmax(th, -1)[s_idx, a_idx]))(lp_all)

    u_tok = exact.softmax_score(pi)[s_idx, a_idx]  # grad of log pi(a|s) wrt theta[s, :]

    def closed(w):  # d/dlogits of -(1/n) sum_tokens w A log pi
        return -jax.ops.segment_sum((w * adv_t)[:, None] * u_tok, s_idx, num_segments=N) / (N * 4)

    lr_tok = lp_all[s_idx, a_idx] - lmu
    w_c = row["cispo"](lr_tok, adv_t, eps_low=EPS, eps_high=EPS)
    cispo = jnp.stack([grad_of(lambda lp: policy_loss(lp, lmu, adv_t, weights=row["cispo"](
        jax.lax.stop_gradient(lp) - lmu, adv_t, eps_low=EPS, eps_high=EPS))), closed(w_c)])
    w_ppo = row["ppo"](lr_tok, adv_t, epsilon=EPS)
    cispo_where_ppo_zero = jnp.max(jnp.where(w_ppo == 0, jnp.abs(w_c * adv_t), 0.0))
    ppo = jnp.stack([grad_of(lambda lp: policy_loss(lp, lmu, adv_t, kind="ratio", ppo_epsilon=EPS,
                                                    log_pi_old=lmu)), closed(w_ppo)])
    lags = jnp.where(s_idx % 2 == 0, 0, 1)
    w_a = row["areal"](lr_tok, adv_t, max_staleness=ETA, lags=lags)
    fresh = (lags <= ETA).astype(pi.dtype)
    areal = jnp.stack([grad_of(lambda lp: dec_loss(lp, lmu, adv_t * fresh, route="exact",
                                                   exact_log_pi_old=lp_all[s_idx, a_idx],
                                                   kind="ratio", clip=None, ppo_epsilon=EPS)),
                       closed(w_a)])
    # A9: M2PO, finite batch and population
    lr_b = 0.5 * jax.random.normal(k1, (T, 8)) + jnp.where(jnp.arange(8) < 2, 1.5, 0.0)[None]
    keep = ar.second_moment_keep(lr_b, TAU)
    x2 = jnp.square(lr_b).reshape(-1)
    kp = keep.reshape(-1) > 0
    m_kept = jnp.sum(jnp.where(kp, x2, 0.0)) / jnp.maximum(jnp.sum(kp), 1)
    nxt = jnp.min(jnp.where(kp, jnp.inf, x2))
    m_plus = (jnp.sum(jnp.where(kp, x2, 0.0)) + nxt) / (jnp.sum(kp) + 1)
    m2_violation = jnp.maximum(m_kept - TAU, 0.0) + jnp.where(jnp.all(kp), 0.0,
                                                              jnp.maximum(TAU - m_plus, 0.0))
    probs = jax.random.uniform(k2, lr_b.shape)
    kappa, frac = ar.second_moment_threshold(lr_b, probs, TAU)
    keep_p = ar.threshold_keep(lr_b, kappa, frac)
    m2_pop = jnp.stack([jnp.sum(probs * keep_p * jnp.square(lr_b)), TAU * jnp.sum(probs * keep_p)])
    dropped = jnp.sum(probs * (1.0 - keep_p)) / jnp.sum(probs)
    return dict(legacy=legacy, icepop=icepop, topr=topr_pair, topr_pos=topr_pos, gspo=gspo,
                cispo=cispo, cispo_nonzero=cispo_where_ppo_zero, ppo=ppo, areal=areal,
                m2_violation=m2_violation, m2_dropped=1.0 - jnp.mean(kp), m2_pop=m2_pop,
                m2_pop_dropped=dropped)


@functools.partial(fast_jit, static_argnums=(1,))
def _actor_numbers(key, fns) -> dict:
    k_tab, k_tok, k_prop = jax.random.split(key, 3)
    tab_err, tab_seq, tab_pg, tab_seq_pairs = _tabular_enumeration(fns, k_tab)
    tok_err, tok_seq, tok_pg, tools = _token_enumeration(fns, k_tok)
    out = _table_properties(fns, k_prop)
    out.update(tab_err=tab_err, tab_seq=tab_seq, tab_pg=tab_pg, tab_seq_pairs=tab_seq_pairs,
               tok_err=tok_err, tok_seq=tok_seq, tok_pg=tok_pg, tools=tools)
    return out


def actor_rows(ctx) -> list[Row]:
    """Rows of the actor-correction table (keys: ``fold_in(ctx.key, 21)``)."""
    with jax.enable_x64(True):
        n = jax.tree_util.tree_map(np.asarray, _actor_numbers(jax.random.fold_in(ctx.key, 21),
                                                               library_fns()))
    tab = f"tabular S={S} A={A} H={H}, {S * (A * S) ** H} paths x {L} versions"
    tok = (f"token V={TOKEN['num_tokens']} H={TOKEN['horizon']} P={TOKEN['num_prompts']}, "
           f"{int(n['tools'])} tool steps on the paths")
    rows = [
        exact_row("actor registry: WEIGHT_KINDS rows = importance_weights", "A0", 1,
                  float(n["legacy"]), EXACT_TOL, "none/ratio/truncate/mask; log rho +-100, +-inf, NaN"),
        exact_row("actor rows: path enumeration = per-state closed form (tabular)", "A0", 1,
                  float(n["tab_err"]), EXACT_TOL, f"rows {', '.join(CHECKED_ROWS)}; {tab}"),
        exact_row("actor rows: path enumeration = per-state closed form (token)", "A0", 1,
                  float(n["tok_err"]), EXACT_TOL, f"rows {', '.join(TOKEN_CHECKED_ROWS)}; {tok}"),
        pair_row("IcePop: mu w = pi 1[alpha <= rho <= beta] (IS inside the band)", "A2", 1,
                 *n["icepop"], EXACT_TOL, f"band {BAND}", min_size=1e-2),
        pair_row("sequence TIS / MIS: E_mu[f(R) F] = E_pi[f(R)/R F]", "A3", 1,
                 n["tab_seq_pairs"][:, 0], n["tab_seq_pairs"][:, 1], EXACT_TOL,
                 f"c={CLIP}, band {BAND}; {tab}", min_size=1e-2),
        exact_row("sequence IS (c -> inf) = E_pi[sum_t A_t u_t] (tabular, token)", "A3", 2,
                  worst(n["tab_seq"], n["tok_seq"]), EXACT_TOL,
                  f"a random critic; |E_pi[sum A u]| = {float(n['tab_pg']):.3g}, "
                  f"{float(n['tok_pg']):.3g}"),
        pair_row("GSPO: s = (prod_t rho_t)^(1/|y|), clipped per sequence", "A4", 1, *n["gspo"],
                 EXACT_TOL, "masked tokens excluded; eps 0.01"),
        pair_row("TOPR: mu w = pi on negatives where pi <= mu", "A5", 1, *n["topr"], EXACT_TOL,
                 f"w = 1 on positives: max |mu w - mu| = {float(n['topr_pos']):.1e}", min_size=1e-3),
        pair_row("CISPO: grad = sg(clip(rho)) A u on every token", "A6", 1, *n["cispo"], EXACT_TOL,
                 f"eps={EPS}; nonzero where PPO's clip zeroes it: {float(n['cispo_nonzero']):.3g}"),
        pair_row("ppo row = grad of the PPO surrogate with pi_old = mu", "A7", 1, *n["ppo"],
                 EXACT_TOL, f"epsilon={EPS}"),
        pair_row("AReaL = decoupled route at theta = pi_prox, staleness cap", "A8", 1, *n["areal"],
                 EXACT_TOL, f"lag <= eta={ETA} kept"),
        exact_row("M2PO: kept mean (log r)^2 <= tau, maximal", "A9", 1, float(n["m2_violation"]),
                  EXACT_TOL, f"tau={TAU}; dropped {float(n['m2_dropped']):.0%} of the batch"),
        pair_row("M2PO population: E[x2 keep] = tau E[keep]", "A9", 1, *n["m2_pop"], EXACT_TOL,
                 f"dropped mass {float(n['m2_pop_dropped']):.1%}", min_size=1e-3),
    ]
    # the CISPO claim needs tokens where PPO's gradient vanishes but CISPO's does not; the
    # M2PO rows need a binding mask
    rows[8].passed = bool(rows[8].passed and float(n["cispo_nonzero"]) > 1e-3)
    rows[11].passed = bool(rows[11].passed and float(n["m2_dropped"]) > 0)
    rows[12].passed = bool(rows[12].passed and float(n["m2_pop_dropped"]) > 0)
    return rows
