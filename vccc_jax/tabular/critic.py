"""Tabular critics on mixed-version replay: exact fixed points and trained critics.

Setting (DESIGN.md §6; vccc_blog_en.txt Sec 1.3, 3.3, 4.2, 4.4). One MDP, a target policy
pi = pi_K and behaviour versions mu_i = pi_i (i = 0..K) mixed in the replay with weights w_i
(a staleness law, ``tabular.history``). A replayed transition is drawn as

    i ~ w,  s ~ d^{mu_i},  a ~ mu_i(.|s),  s' ~ P(.|s, a)        (one-step targets)

so the replay's state distribution is d_mix = sum_i w_i d^{mu_i} and the version seen at
state s has posterior q_i(s) = w_i d^{mu_i}(s) / d_mix(s). Multi-step targets (V-trace)
continue the trajectory from s with the *same* version mu_i for n steps.

**Methods** are registered in :data:`METHODS` (name -> :class:`MethodSpec`); a comparator
added later registers itself with :func:`register_method` and is swept like the rest.
A one-step method is a single elementwise function of :class:`TargetInputs` (built from the
estimator core, ``vccc_jax.estimators``), evaluated

* on the enumerated [S, A, S'] grid of every version for exact moments
  (``tabular.exact.transition_grid`` / ``target_moments``), and
* on sampled replay batches [B] for the trained critic,

so the exact and stochastic paths can never disagree about what the target is.

**Exact fixed point.** The expected semi-gradient TD update at state s is
d_mix(s) (E_replay[Y | s; Vbar] - V(s)) with Vbar = V. Every target here is affine in Vbar,
so g(V) = E_replay[Y | s; V] = c + M V is recovered exactly from S + 1 evaluations
(:func:`affine_map`) and the fixed point solves (I - M) V = c. States whose expected update
is identically zero (never replayed, d_mix = 0, or every action masked: a zero row of
I - M) keep the critic's initial value 0, which is also what the trained critic does there.

**Trained critic.** Stochastic semi-gradient TD on sampled replay, in one jitted
``lax.scan``: each update draws a batch of B transitions, forms targets with the bootstrap
Vbar (= V, or a Polyak average), and moves each visited state towards the mean of its
targets in the batch with step size lr_t = lr * t0 / (t0 + t). It records the
d^{pi_K}-weighted RMS error to V^{pi_K} and the per-update target variance
mean_b (Y_b - E[Y | s_b; Vbar_t])^2 (the conditional mean is exact, from the affine map).

**V-trace** (Eq 11) with (rhobar, cbar) = (c, c) on the clip axis, ``lambda_`` and n steps:
the exact mean per version is ``exact.expected_vtrace_operator``; its conditional second
moment comes from the recursion in :func:`vtrace_moments`; the trained critic samples
n-step trajectories and regresses V(s_0) on ``estimators.vtrace.vtrace(...).vs[0]``.

Metrics against V^{pi_K} (:func:`evaluate`): max and d^{pi_K}-weighted RMS error of the
fixed point and of the trained critic, the exact target variance at the fixed point
(sum_s d_mix(s) Var_replay[Y | s]), and the population ESS and clip rate by version.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import critic_targets as ct
from vccc_jax.estimators.importance import importance_weights, safe_ratios
from vccc_jax.estimators.vtrace import vtrace
from vccc_jax.tabular import exact
from vccc_jax.tabular.history import replay_state_distribution, version_posterior
from vccc_jax.tabular.mdp import TabularMDP, next_state_discounts

Array = chex.Array


# XLA options for jitting the tabular evaluators: the arrays are tiny and compile time
# dominates. Backend optimisation level 1 (of 0-3) compiled a sweep group about 2.5x
# faster than the default on this 2-core CPU at equal run time; level 0 was 5x slower
# to run.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


# ============================================================================ methods


class TargetInputs(NamedTuple):
    """Per-transition inputs of a one-step target, all of one shape ([S, A, S'] or [B]).

    rewards, discounts (gamma(s')), values (Vbar(s)), next_values (Vbar(s')), log_rhos
    (log pi_K(a|s) - log mu_i(a|s)), baseline (a fixed state baseline b(s), the general
    baseline of Sec 4.2), z (Z_i(s) = E_{mu_i}[w | s] for the method's weight), b_star
    (the replay's variance-minimising state baseline of Eq 9 at the current Vbar).
    """

    rewards: Array
    discounts: Array
    values: Array
    next_values: Array
    log_rhos: Array
    baseline: Array
    z: Array
    b_star: Array


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A critic target the sweep can evaluate.

    name: registry key. description: one line for tables and legends.
    weight_kind: the importance weight whose ESS / clip rate / Z(s) are reported
      ("none" for the uncorrected target, "ratio", "truncate" or "mask").
    uses_clip: whether the method is crossed with the sweep's clip axis.
    one_step: ``f(inputs: TargetInputs, clip, options) -> Y`` (elementwise), or None for a
      multi-step method, which must give ``n_steps(options)``, ``moments(mdp, pi, mu,
      vbar, clip, options) -> (mean [S], var [S])`` (exact, single version) and
      ``trajectory_target(traj: Trajectory, clip, options) -> Y [B]``.
    defaults: the method's options and their default values (a config may override them).
    needs_bstar: whether targets read ``TargetInputs.b_star`` (costs S + 1 extra exact
      evaluations per update of the trained critic).
    """

    name: str
    description: str
    weight_kind: str
    uses_clip: bool
    one_step: Optional[Callable] = None
    n_steps: Optional[Callable] = None
    moments: Optional[Callable] = None
    trajectory_target: Optional[Callable] = None
    defaults: tuple = ()
    needs_bstar: bool = False

    @property
    def multi_step(self) -> bool:
        return self.one_step is None

    def options(self, given: Optional[dict] = None) -> dict:
        """Defaults overridden by ``given``; unknown keys raise ValueError naming them."""
        opts = dict(self.defaults)
        for k, v in (given or {}).items():
            if k not in opts:
                raise ValueError(
                    f"method {self.name!r} has no option {k!r}; options: {sorted(opts)}"
                )
            opts[k] = v
        return opts


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method to :data:`METHODS` (comparators register themselves this way)."""
    if spec.one_step is None and None in (spec.n_steps, spec.moments, spec.trajectory_target):
        raise ValueError(
            f"method {spec.name!r}: a multi-step method needs n_steps, moments and trajectory_target"
        )
    if spec.weight_kind not in ("none", "ratio", "truncate", "mask"):
        raise ValueError(f"method {spec.name!r}: weight_kind must be none|ratio|truncate|mask")
    METHODS[spec.name] = spec
    return spec


def _kwargs(x: TargetInputs) -> dict:
    return dict(rewards=x.rewards, discounts=x.discounts, values=x.values,
                next_values=x.next_values, log_rhos=x.log_rhos)


register_method(MethodSpec(
    name="uncorrected",
    description="uncorrected H = r + gamma Vbar(s')",
    weight_kind="none",
    uses_clip=False,
    one_step=lambda x, clip, o: ct.uncorrected_target(x.rewards, x.discounts, x.next_values),
))
register_method(MethodSpec(
    name="vccc",
    description="VCCC / IW-TD, b = Vbar (Eq 8)",
    weight_kind="ratio",
    uses_clip=False,
    one_step=lambda x, clip, o: ct.vccc_target(**_kwargs(x)),
))
register_method(MethodSpec(
    name="vccc_bstar",
    description="VCCC with b* (Eq 4, Eq 9)",
    weight_kind="ratio",
    uses_clip=False,
    one_step=lambda x, clip, o: ct.vccc_target(**_kwargs(x), baseline=x.b_star),
    needs_bstar=True,
))
register_method(MethodSpec(
    name="truncated",
    description="clipped, w = min(rho, c) (Eq 10)",
    weight_kind="truncate",
    uses_clip=True,
    one_step=lambda x, clip, o: ct.clipped_target(**_kwargs(x), clip=clip, kind="truncate"),
))
register_method(MethodSpec(
    name="masked",
    description="masked, w = rho 1[1/c <= rho <= c] (Eq 10)",
    weight_kind="mask",
    uses_clip=True,
    one_step=lambda x, clip, o: ct.clipped_target(**_kwargs(x), clip=clip, kind="mask"),
))
register_method(MethodSpec(
    name="naive_baseline",
    description="naive clipped, general b (negative control)",
    weight_kind="truncate",
    uses_clip=True,
    one_step=lambda x, clip, o: ct.naive_clipped_target(
        **_kwargs(x), baseline=x.baseline, clip=clip, kind="truncate"),
    defaults=(("baseline", "oldest_value"),),
))
register_method(MethodSpec(
    name="centered_baseline",
    description="Z-centred clipped, general b (Sec 4.2)",
    weight_kind="truncate",
    uses_clip=True,
    one_step=lambda x, clip, o: ct.centered_clipped_target(
        **_kwargs(x), baseline=x.baseline, z=x.z, clip=clip, kind="truncate"),
    defaults=(("baseline", "oldest_value"),),
))

BASELINES = ("oldest_value", "zero")


# ============================================================================ V-trace


class Trajectory(NamedTuple):
    """Time-major sampled n-step replay trajectories [n, B] (+ bootstrap [B])."""

    log_rhos: Array
    discounts: Array
    rewards: Array
    values: Array
    bootstrap_value: Array


def vtrace_moments(
    mdp: TabularMDP,
    pi: Array,
    mu: Array,
    v: Array,
    *,
    n_steps: int,
    lambda_: float,
    clip_rho_threshold,
    clip_c_threshold,
) -> tuple[Array, Array]:
    """Exact E_mu[v_s | s] and Var_mu[v_s | s] of the n-step V-trace target (Eq 11). [S], [S]

    With X_m(s) = v_s - v(s) for m steps to go, rho^c = min(rhobar, rho),
    c = lambda min(cbar, rho), delta = r + gamma(s') v(s') - v(s):

        X_m = rho^c delta + gamma(s') c X'_{m-1}(s'),   X_0 = 0,

    where X'_{m-1}(s') depends on the past only through s' (Markov). Hence
    A_m = E[X_m | s] and B_m = E[X_m^2 | s] follow the recursion

        A_m(s) = E[rho^c delta + gamma' c A_{m-1}(s')]
        B_m(s) = E[(rho^c delta)^2 + 2 rho^c delta gamma' c A_{m-1}(s')
                   + (gamma' c)^2 B_{m-1}(s')],

    the expectation over a ~ mu(.|s), s' ~ P(.|s, a). A_n is the quantity of
    ``exact.expected_vtrace_operator`` (the tests check they agree); Var = B_n - A_n^2.
    """
    rho = exact.ratio_table(pi, mu)
    rho_c = jnp.where(mu > 0, jnp.minimum(clip_rho_threshold, rho), 0.0)
    c = jnp.where(mu > 0, lambda_ * jnp.minimum(clip_c_threshold, rho), 0.0)
    delta = exact.bellman_targets(mdp, v) - v[:, None, None]  # [S, A, S']
    gam = next_state_discounts(mdp)[None, None, :]
    prob = mu[:, :, None] * mdp.P
    rd = rho_c[:, :, None] * delta
    gc = gam * c[:, :, None]

    def step(carry, _):
        a_prev, b_prev = carry
        a = jnp.sum(prob * (rd + gc * a_prev[None, None, :]), axis=(1, 2))
        b = jnp.sum(
            prob * (rd**2 + 2.0 * rd * gc * a_prev[None, None, :] + gc**2 * b_prev[None, None, :]),
            axis=(1, 2),
        )
        return (a, b), None

    zeros = jnp.zeros_like(v)
    (a, b), _ = jax.lax.scan(step, (zeros, zeros), None, length=n_steps)
    return v + a, jnp.maximum(b - a**2, 0.0)


def _vtrace_moments(mdp, pi, mu, vbar, clip, o):
    return vtrace_moments(mdp, pi, mu, vbar, n_steps=o["n_steps"], lambda_=o["lambda_"],
                          clip_rho_threshold=clip, clip_c_threshold=clip)


def _vtrace_trajectory_target(traj: Trajectory, clip, o) -> Array:
    """vs[0] of ``estimators.vtrace.vtrace`` on an n-step trajectory, rhobar = cbar = c.

    With rhobar = cbar the two truncations are one: min(rho, c) = exp(min(log rho, log c)).
    So the log-ratios are truncated first and passed with thresholds None, which is Eq 11
    with rhobar = cbar = c exactly and keeps c a traced value (``vtrace`` wants static
    thresholds), so every c of a sweep shares one compiled program.
    """
    log_rhos = jnp.minimum(traj.log_rhos, jnp.log(clip))
    out = vtrace(
        log_rhos, traj.discounts, traj.rewards, traj.values, traj.bootstrap_value,
        lambda_=o["lambda_"], clip_rho_threshold=None, clip_c_threshold=None,
        clip_pg_rho_threshold=None,
    )
    return out.vs[0]


register_method(MethodSpec(
    name="vtrace",
    description="V-trace, rhobar = cbar = c (Eq 11)",
    weight_kind="truncate",
    uses_clip=True,
    n_steps=lambda o: int(o["n_steps"]),
    moments=_vtrace_moments,
    trajectory_target=_vtrace_trajectory_target,
    defaults=(("lambda_", 1.0), ("n_steps", 3)),
))


# ============================================================================ replay


class Replay(NamedTuple):
    """Everything exact about one MDP's replay mixture (single MDP; vmap for batches).

    pi [S, A], log_pi [S, A]: the target pi_K. mus, log_mus [V, S, A]: versions pi_0..pi_K.
    weights [V]: the staleness law's version weights. visitation [V, S]: d^{mu_i}.
    state_dist [S]: d_mix. posterior [V, S]: q_i(s).
    """

    mdp: TabularMDP
    pi: Array
    log_pi: Array
    mus: Array
    log_mus: Array
    weights: Array
    visitation: Array
    state_dist: Array
    posterior: Array


def make_replay(mdp: TabularMDP, log_probs: Array, visitation: Array, weights: Array) -> Replay:
    """Replay of versions ``log_probs`` [V, S, A] (the last is the target pi_K) mixed with
    ``weights`` [V]; ``visitation`` [V, S] are the versions' normalised visitations."""
    chex.assert_rank(log_probs, 3)
    chex.assert_rank(weights, 1)
    if weights.shape[0] != log_probs.shape[0] or visitation.shape != log_probs.shape[:2]:
        raise ValueError(
            f"weights {weights.shape} / visitation {visitation.shape} do not match "
            f"log_probs {log_probs.shape} (need [V] and [V, S])"
        )
    mus = jnp.exp(log_probs)
    return Replay(
        mdp=mdp, pi=mus[-1], log_pi=log_probs[-1], mus=mus, log_mus=log_probs,
        weights=weights, visitation=visitation,
        state_dist=replay_state_distribution(weights, visitation),
        posterior=version_posterior(weights, visitation),
    )


def general_baseline(kind: str, values_by_version: Array) -> Array:
    """The fixed general baseline b(s) of the Sec 4.2 targets: ``oldest_value`` = V^{pi_0}
    (a stale value head, the natural 'wrong' baseline in async RL) or ``zero``. [S]"""
    if kind == "oldest_value":
        return values_by_version[0]
    if kind == "zero":
        return jnp.zeros_like(values_by_version[0])
    raise ValueError(f"baseline must be one of {BASELINES}, got {kind!r}")


WEIGHT_KINDS = ("none", "ratio", "truncate", "mask")


def _weights_of_kind(kind: str, log_rhos: Array, clip) -> tuple[Array, Array]:
    """(w, clipped) of a weight kind on log-ratios: w = 1 (none), rho, min(rho, c) or the
    mask; ``clipped`` marks where w != rho because of the clip."""
    rho = safe_ratios(log_rhos)
    if kind in ("truncate", "mask"):
        w = importance_weights(log_rhos, kind, clip)
        return w, w != rho
    w = rho if kind == "ratio" else jnp.ones_like(rho)
    return w, jnp.zeros(rho.shape, bool)


def _z_of_kind(kind: str, replay: "Replay", clip) -> Array:
    """Z_i(s) = E_{mu_i}[w | s] of a weight kind (``exact.z_and_clipped_policy``). [V, S]"""
    if kind in ("truncate", "mask"):
        return jax.vmap(lambda mu: exact.z_and_clipped_policy(replay.pi, mu, clip, kind)[0])(
            replay.mus
        )
    return jnp.ones(replay.visitation.shape, replay.pi.dtype)


class Resolved(NamedTuple):
    """A method with its options bound: what the exact and training code call.

    Built by :func:`resolve` (one method) or :func:`resolve_bank` (several one-step methods
    behind a traced index, so they share one compiled program). ``multi_step``,
    ``uses_clip``, ``needs_bstar`` and ``n_steps`` are static; the callables take traced
    arrays: one_step(inputs, clip), moments(mdp, pi, mu, vbar, clip),
    trajectory_target(traj, clip), weights(log_rhos, clip) -> (w, clipped),
    z(replay, clip) -> [V, S], baseline(values_by_version) -> [S].
    """

    multi_step: bool
    uses_clip: bool
    needs_bstar: bool
    n_steps: int
    one_step: Optional[Callable]
    moments: Optional[Callable]
    trajectory_target: Optional[Callable]
    weights: Callable
    z: Callable
    baseline: Callable


def resolve(spec: MethodSpec, options: Optional[dict] = None) -> Resolved:
    """Bind a method's options (validated against its defaults)."""
    o = spec.options(options)
    kind = spec.weight_kind
    return Resolved(
        multi_step=spec.multi_step,
        uses_clip=spec.uses_clip,
        needs_bstar=spec.needs_bstar,
        n_steps=int(spec.n_steps(o)) if spec.multi_step else 1,
        one_step=None if spec.multi_step else (lambda x, clip: spec.one_step(x, clip, o)),
        moments=(lambda m, pi, mu, v, clip: spec.moments(m, pi, mu, v, clip, o))
        if spec.multi_step else None,
        trajectory_target=(lambda traj, clip: spec.trajectory_target(traj, clip, o))
        if spec.multi_step else None,
        weights=lambda log_rhos, clip: _weights_of_kind(kind, log_rhos, clip),
        z=lambda replay, clip: _z_of_kind(kind, replay, clip),
        baseline=lambda values: general_baseline(o.get("baseline", "zero"), values),
    )


def resolve_bank(specs: tuple, options: tuple, index) -> Resolved:
    """Several one-step methods selected by a traced ``index`` (``lax.switch``).

    Everything method-specific (target, weight kind, baseline) switches on the index, so
    one compiled program evaluates every method of the bank. All must be one-step and
    agree on ``uses_clip``. ``index`` must not be batched (a vmapped index would make the
    switch evaluate every branch).
    """
    if len(specs) != len(options) or not specs:
        raise ValueError("resolve_bank needs one options dict per method")
    if len(specs) == 1:
        return resolve(specs[0], options[0])
    if any(s.multi_step for s in specs):
        raise ValueError("resolve_bank takes one-step methods only")
    if len({s.uses_clip for s in specs}) != 1:
        raise ValueError("a bank's methods must agree on uses_clip")
    rs = [resolve(s, o) for s, o in zip(specs, options)]
    kinds = sorted({s.weight_kind for s in specs}, key=WEIGHT_KINDS.index)
    kind_index = jnp.asarray([kinds.index(s.weight_kind) for s in specs])[index]

    def switch_kind(fn):
        return lambda *args: jax.lax.switch(
            kind_index, [functools.partial(fn, k) for k in kinds], *args
        )

    return Resolved(
        multi_step=False,
        uses_clip=specs[0].uses_clip,
        needs_bstar=any(s.needs_bstar for s in specs),
        n_steps=1,
        one_step=lambda x, clip: jax.lax.switch(index, [r.one_step for r in rs], x, clip),
        moments=None,
        trajectory_target=None,
        weights=switch_kind(_weights_of_kind),
        z=switch_kind(_z_of_kind),
        baseline=lambda values: jnp.stack([r.baseline(values) for r in rs])[index],
    )


def _as_resolved(method, options) -> Resolved:
    return method if isinstance(method, Resolved) else resolve(method, options)


def _clip_or_inf(r: Resolved, clip):
    return clip if r.uses_clip else jnp.inf


def version_z(method, replay: Replay, clip, options: Optional[dict] = None) -> Array:
    """Z_i(s) = E_{mu_i}[w | s] for the method's weight (1 for unclipped). [V, S]"""
    r = _as_resolved(method, options)
    return r.z(replay, _clip_or_inf(r, clip))


def mixture_optimal_baseline(replay: Replay, vbar: Array) -> Array:
    """State-only variance-minimising baseline of Eq 9 for the replay mixture. [S]

        b*(s) = E_replay[(rho - 1) rho H | s] / E_replay[(rho - 1)^2 | s],

    both expectations over i ~ q(.|s), a ~ mu_i, s' ~ P. For a single version this is
    ``exact.optimal_baseline`` (tested); where the denominator is 0, Vbar(s).
    """
    def per_version(mu):
        grid = exact.transition_grid(replay.mdp, replay.pi, mu, vbar)
        rho = safe_ratios(grid.log_rhos)
        h = grid.rewards + grid.discounts * grid.next_values
        num, _ = exact.target_moments(replay.mdp, mu, (rho - 1.0) * rho * h)
        den, _ = exact.target_moments(replay.mdp, mu, jnp.square(rho - 1.0))
        return num, den

    num, den = jax.vmap(per_version)(replay.mus)
    num = jnp.sum(replay.posterior * num, axis=0)
    den = jnp.sum(replay.posterior * den, axis=0)
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), vbar)


def _mix_moments(posterior: Array, means: Array, variances: Array) -> tuple[Array, Array]:
    """Moments of a mixture over versions at each state (law of total variance)."""
    mean = jnp.sum(posterior * means, axis=0)
    second = jnp.sum(posterior * (variances + means**2), axis=0)
    return mean, jnp.maximum(second - mean**2, 0.0)


def expected_target(
    method, replay: Replay, vbar: Array, clip, options: Optional[dict], baseline: Array,
    z: Optional[Array] = None,
) -> tuple[Array, Array]:
    """Exact E_replay[Y | s] and Var_replay[Y | s] of a method's target at bootstrap Vbar.

    ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved`.
    One-step methods: the method's own target function on every version's enumerated
    [S, A, S'] grid (``exact.transition_grid``), exact moments by ``exact.target_moments``,
    mixed over versions with the posterior q_i(s). Multi-step: the method's ``moments``.
    Returns (mean [S], var [S]).
    """
    r = _as_resolved(method, options)
    clip = _clip_or_inf(r, clip)
    if r.multi_step:
        means, variances = jax.vmap(
            lambda mu: r.moments(replay.mdp, replay.pi, mu, vbar, clip)
        )(replay.mus)
        return _mix_moments(replay.posterior, means, variances)
    z = r.z(replay, clip) if z is None else z
    b_star = mixture_optimal_baseline(replay, vbar) if r.needs_bstar else vbar

    def per_version(mu, z_i):
        grid = exact.transition_grid(replay.mdp, replay.pi, mu, vbar)
        inputs = TargetInputs(
            rewards=grid.rewards, discounts=grid.discounts, values=grid.values,
            next_values=grid.next_values, log_rhos=grid.log_rhos,
            baseline=grid.state(baseline), z=grid.state(z_i), b_star=grid.state(b_star),
        )
        return exact.target_moments(replay.mdp, mu, r.one_step(inputs, clip))

    means, variances = jax.vmap(per_version)(replay.mus, z)
    return _mix_moments(replay.posterior, means, variances)


def affine_map(f: Callable[[Array], Array], num_states: int, dtype) -> tuple[Array, Array]:
    """(c, M) with f(v) = c + M v for an affine f: [S] -> [S], from S + 1 evaluations.

    Exact for affine maps (every target here is affine in the bootstrap Vbar), and
    indifferent to ``stop_gradient`` inside f, unlike a Jacobian.
    """
    c = f(jnp.zeros((num_states,), dtype))
    cols = jax.vmap(f)(jnp.eye(num_states, dtype=dtype))  # row j = f(e_j)
    return c, (cols - c[None, :]).T


class FixedPoint(NamedTuple):
    """values [S]: the fixed point; c [S], M [S, S]: E_replay[Y | s; V] = c + M V;
    identified [S] bool: states with a non-zero expected update (others keep 0)."""

    values: Array
    c: Array
    M: Array
    identified: Array


def fixed_point(
    method, replay: Replay, clip, options: Optional[dict], baseline: Array
) -> FixedPoint:
    """Exact fixed point of the expected semi-gradient TD update under the replay mixture.

    Solves V = E_replay[Y | s; Vbar = V] on the states the update touches; see the module
    docstring. ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved`.
    Returns a :class:`FixedPoint`.
    """
    r = _as_resolved(method, options)
    S = replay.pi.shape[0]
    dtype = replay.pi.dtype
    z = None if r.multi_step else r.z(replay, _clip_or_inf(r, clip))
    c, M = affine_map(
        lambda v: expected_target(r, replay, v, clip, None, baseline, z)[0], S, dtype
    )
    A = jnp.eye(S, dtype=dtype) - M
    scale = jnp.max(jnp.abs(A)) + jnp.max(jnp.abs(c)) + 1.0
    identified = (replay.state_dist > 0) & (jnp.max(jnp.abs(A), axis=1) > 1e-12 * scale)
    A = jnp.where(identified[:, None], A, jnp.eye(S, dtype=dtype))
    rhs = jnp.where(identified, c, 0.0)
    # I - M with M >= 0 and row sums <= 1 for every registered target: elimination without
    # pivoting is stable, and avoids jaxlib 0.10's CPU LU, which can deadlock when two LU
    # calls run concurrently (see exact.solve_dominant).
    return FixedPoint(values=exact.solve_dominant(A, rhs), c=c, M=M, identified=identified)


# ============================================================================ diagnostics


def weight_diagnostics(
    method, replay: Replay, clip, options: Optional[dict] = None
) -> tuple[Array, Array, Array, Array]:
    """Population ESS fraction and clip rate, overall (replay) and by version.

    For version i with (s, a) ~ d^{mu_i}(s) mu_i(a|s): ESS_i = E[w]^2 / E[w^2] (the Kish
    fraction of ``estimators.importance.ratio_diagnostics`` in the infinite-sample limit)
    and clip_i = P(w != rho). Overall: the same under the replay mixture.
    Returns (ess [], clip_rate [], ess_by_version [V], clip_by_version [V]).
    """
    r = _as_resolved(method, options)
    log_rhos = replay.log_pi[None] - replay.log_mus  # [V, S, A]
    w, clipped = r.weights(log_rhos, _clip_or_inf(r, clip))
    p = replay.visitation[:, :, None] * replay.mus  # [V, S, A]
    m1 = jnp.sum(p * w, axis=(1, 2))
    m2 = jnp.sum(p * w**2, axis=(1, 2))
    cr = jnp.sum(p * clipped, axis=(1, 2))
    ess_v = jnp.where(m2 > 0, m1**2 / jnp.where(m2 > 0, m2, 1.0), 0.0)
    M1, M2 = replay.weights @ m1, replay.weights @ m2
    ess = jnp.where(M2 > 0, M1**2 / jnp.where(M2 > 0, M2, 1.0), 0.0)
    return ess, replay.weights @ cr, ess_v, cr


# ============================================================================ training


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Stochastic semi-gradient TD on sampled replay (saved with every result row).

    enabled: train a critic at all (the fixed point is always computed).
    num_updates, batch_size: updates, and transitions (or trajectories) per update.
    learning_rate, lr_decay: lr_t = learning_rate * lr_decay / (lr_decay + t)
      (``lr_decay = 0`` means constant); each visited state moves by lr_t towards the mean
      of its targets in the batch.
    polyak: tau of the bootstrap Vbar <- (1 - tau) Vbar + tau V after each update
      (1.0: Vbar = V, no target network).
    num_checkpoints: points of the recorded error / variance curves (geometric in t).
    """

    enabled: bool = True
    num_updates: int = 1000
    batch_size: int = 32
    learning_rate: float = 0.5
    lr_decay: float = 100.0
    polyak: float = 1.0
    num_checkpoints: int = 24

    def __post_init__(self):
        for name in ("num_updates", "batch_size", "num_checkpoints"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"train {name} must be an int >= 1, got {v!r}")
        if not 0 < self.learning_rate <= 1:
            raise ValueError(f"train learning_rate must lie in (0, 1], got {self.learning_rate}")
        if not self.lr_decay >= 0:
            raise ValueError(f"train lr_decay must be >= 0, got {self.lr_decay}")
        if not 0 < self.polyak <= 1:
            raise ValueError(f"train polyak must lie in (0, 1], got {self.polyak}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def checkpoints(self) -> np.ndarray:
        """Update counts (1..num_updates) at which the curves are recorded."""
        pts = np.unique(np.round(np.geomspace(1, self.num_updates, self.num_checkpoints)))
        return pts.astype(np.int64)


def _categorical(u: Array, cdf: Array) -> Array:
    """Inverse-CDF sampling: index of the first cdf entry above u (cheap for small supports).

    u [...]; cdf [..., K] (rows of a CDF, batch dims matching u's) -> int [...].
    """
    return jnp.minimum(jnp.sum(u[..., None] >= cdf, axis=-1), cdf.shape[-1] - 1)


class TrainResult(NamedTuple):
    """values [S] at the end; err_rms [T], err_max [T]: error to V^{pi_K} after each update;
    target_var [T]: mean_b (Y_b - E[Y | s_b; Vbar_t])^2 of each update's batch."""

    values: Array
    err_rms: Array
    err_max: Array
    target_var: Array


def train_critic(
    method,
    replay: Replay,
    clip,
    options: Optional[dict],
    baseline: Array,
    key: Array,
    config: TrainConfig,
    *,
    v_true: Array,
    eval_dist: Array,
    cond_mean: tuple[Array, Array],
) -> TrainResult:
    """Tabular critic trained by semi-gradient TD on the replay (one jitted lax.scan).

    ``cond_mean = (c, M)``: E_replay[Y | s; Vbar] = c + M Vbar (from :func:`fixed_point`),
    used only to measure each batch's target variance. ``v_true``/``eval_dist``: V^{pi_K} and
    the state weighting of the RMS error.
    """
    r = _as_resolved(method, options)
    mdp = replay.mdp
    S = replay.pi.shape[0]
    B = config.batch_size
    dtype = replay.pi.dtype
    clip = _clip_or_inf(r, clip)
    c_mean, M_mean = cond_mean
    version_cdf = jnp.cumsum(replay.weights)
    state_cdf = jnp.cumsum(replay.visitation, axis=-1)  # [V, S]
    mu_cdf = jnp.cumsum(replay.mus, axis=-1)  # [V, S, A]
    p_cdf = jnp.cumsum(mdp.P, axis=-1)  # [S, A, S']
    gam = next_state_discounts(mdp)
    if r.multi_step:
        n = r.n_steps
        bstar_map = None
        z_table = None
    else:
        z_table = r.z(replay, clip)
        bstar_map = (
            affine_map(lambda v: mixture_optimal_baseline(replay, v), S, dtype)
            if r.needs_bstar else None
        )

    # One uniform draw per sampled quantity, taken in a single jax.random call per update
    # (each random call site costs compile time on CPU).
    def sample_start(u_v, u_s):
        ver = _categorical(u_v, jnp.broadcast_to(version_cdf, u_v.shape + version_cdf.shape))
        s = _categorical(u_s, state_cdf[ver])
        return ver, s

    def step_env(u_a, u_p, ver, s):
        a = _categorical(u_a, mu_cdf[ver, s])
        s2 = _categorical(u_p, p_cdf[s, a])
        return a, s2

    def one_step_targets(key, vbar):
        u = jax.random.uniform(key, (4, B), dtype)
        ver, s = sample_start(u[0], u[1])
        a, s2 = step_env(u[2], u[3], ver, s)
        b_star = vbar if bstar_map is None else bstar_map[0] + bstar_map[1] @ vbar
        inputs = TargetInputs(
            rewards=mdp.R[s, a, s2], discounts=gam[s2], values=vbar[s], next_values=vbar[s2],
            log_rhos=replay.log_pi[s, a] - replay.log_mus[ver, s, a],
            baseline=baseline[s], z=z_table[ver, s], b_star=b_star[s],
        )
        return s, r.one_step(inputs, clip)

    def trajectory_targets(key, vbar):
        u = jax.random.uniform(key, (2 * n + 2, B), dtype)
        ver, s0 = sample_start(u[0], u[1])

        def walk(s, u_t):
            a, s2 = step_env(u_t[0], u_t[1], ver, s)
            out = (s, replay.log_pi[s, a] - replay.log_mus[ver, s, a], gam[s2], mdp.R[s, a, s2])
            return s2, out

        s_n, (ss, log_rhos, discounts, rewards) = jax.lax.scan(
            walk, s0, u[2:].reshape(n, 2, B)
        )
        traj = Trajectory(log_rhos=log_rhos, discounts=discounts, rewards=rewards,
                          values=vbar[ss], bootstrap_value=vbar[s_n])
        return s0, r.trajectory_target(traj, clip)

    targets = trajectory_targets if r.multi_step else one_step_targets

    def update(carry, xs):
        v, vbar = carry
        t, k = xs
        s, y = targets(k, vbar)
        y = jax.lax.stop_gradient(y)
        onehot = jax.nn.one_hot(s, S, dtype=dtype)  # [B, S]
        counts = jnp.sum(onehot, axis=0)
        sums = y @ onehot
        lr = config.learning_rate * (
            config.lr_decay / (config.lr_decay + t) if config.lr_decay > 0 else 1.0
        )
        mean_y = sums / jnp.maximum(counts, 1.0)
        v_new = jnp.where(counts > 0, v + lr * (mean_y - v), v)
        var = jnp.mean(jnp.square(y - (c_mean + M_mean @ vbar)[s]))
        vbar_new = v_new if config.polyak >= 1.0 else (1 - config.polyak) * vbar + config.polyak * v_new
        err = v_new - v_true
        out = (jnp.sqrt(jnp.sum(eval_dist * err**2)), jnp.max(jnp.abs(err)), var)
        return (v_new, vbar_new), out

    v0 = jnp.zeros((S,), dtype)
    ts = jnp.arange(config.num_updates, dtype=dtype)
    keys = jax.random.split(key, config.num_updates)
    (v, _), (err_rms, err_max, var) = jax.lax.scan(update, (v0, v0), (ts, keys))
    return TrainResult(values=v, err_rms=err_rms, err_max=err_max, target_var=var)


# ============================================================================ evaluation


class CellInputs(NamedTuple):
    """One (cell, MDP) element of a sweep group: arrays for :func:`evaluate`."""

    mdp: TabularMDP
    log_probs: Array  # [V, S, A] versions; [-1] is pi_K
    values: Array  # [V, S] V^{pi_i}
    visitation: Array  # [V, S]
    weights: Array  # [V]
    clip: Array  # []
    key: Array


def evaluate(method, options: Optional[dict], config: TrainConfig, x: CellInputs) -> dict:
    """All metrics of one method on one MDP's replay mixture (single element; vmap/map it).

    ``method``: a :class:`MethodSpec` (with ``options``) or a :class:`Resolved` (e.g. a
    bank from :func:`resolve_bank`). Returns a dict of arrays: fixed-point errors
    (``fp_err_max``, ``fp_err_rms``) and values (``fp_values``), the exact target variance
    at the fixed point (``target_var``), the unidentified-state count, weight diagnostics
    (``ess``, ``clip_rate``, ``ess_by_version``, ``clip_by_version``), and, when training
    is enabled, ``tc_err_rms``/``tc_err_max`` (end of training), ``tc_err_to_fp`` (RMS
    distance to the fixed point), ``tc_target_var`` (mean per-update target variance over
    the second half of training) and the curves ``tc_curve_rms``, ``tc_curve_var``.
    """
    r = _as_resolved(method, options)
    replay = make_replay(x.mdp, x.log_probs, x.visitation, x.weights)
    v_true = x.values[-1]
    d_eval = x.visitation[-1]  # d^{pi_K}
    baseline = r.baseline(x.values)
    fp = fixed_point(r, replay, x.clip, None, baseline)
    err = fp.values - v_true
    _, var = expected_target(r, replay, fp.values, x.clip, None, baseline)
    ess, clip_rate, ess_v, clip_v = weight_diagnostics(r, replay, x.clip)
    out = dict(
        fp_values=fp.values,
        fp_err_max=jnp.max(jnp.abs(err)),
        fp_err_rms=jnp.sqrt(jnp.sum(d_eval * err**2)),
        target_var=jnp.sum(replay.state_dist * var),
        unidentified=jnp.sum(~fp.identified),
        ess=ess, clip_rate=clip_rate, ess_by_version=ess_v, clip_by_version=clip_v,
    )
    if config.enabled:
        tr = train_critic(r, replay, x.clip, None, baseline, x.key, config,
                          v_true=v_true, eval_dist=d_eval, cond_mean=(fp.c, fp.M))
        idx = jnp.asarray(config.checkpoints() - 1)
        tail = config.num_updates // 2
        out.update(
            tc_err_rms=tr.err_rms[-1], tc_err_max=tr.err_max[-1],
            tc_err_to_fp=jnp.sqrt(jnp.sum(d_eval * (tr.values - fp.values) ** 2)),
            tc_target_var=jnp.mean(tr.target_var[tail:]),
            tc_curve_rms=tr.err_rms[idx], tc_curve_var=tr.target_var[idx],
        )
    return out


