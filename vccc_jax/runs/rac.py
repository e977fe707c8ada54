"""RAC experiments (issue 14): the exact bias cut (kind ``rac``,
``experiments/rac_two_channel.toml``; this module) and exact training coupled to a simulated
pipeline (kind ``rac_wallclock``, ``experiments/rac_wallclock.toml``; ``runs.rac_wallclock``).
Both run through ``vccc sweep --config ...`` into a resumable store ``<results>/<name>.jsonl``
(``runs.cells``).

Problem instances (float64). MDPs: ``tabular.mdp.random_mdp(PRNGKey(seed), num_mdps, S, A,
gamma)`` (Dirichlet(1) transitions, N(0, 1) rewards on (s, a, s')); MDP m's reward splits into
C additive channels by ``tabular.rac.split_rewards(PRNGKey(seed + 2 + m), R_m, C, shares)``;
initial logits ``tabular.history.initial_logits(PRNGKey(seed + 1), num_mdps, S, A,
init_scale)``.

``rac`` (bias cut). Policy history pi_0..pi_K of each MDP by exact NPG / PG
(``tabular.history.policy_history``, vmapped over the MDPs). At pi_K, the exact bias norms
of drop / wait / RAC (``tabular.rac.lag_law_bias_norms``) with the behaviour lag drawn from
the cell's law ("LAW:MEAN", ``tabular.history.lag_weights`` over the lags the history
allows), and ratio = ||bias drop|| / ||bias rac||. Also ``p_bind``: the probability, under
the reinjected samples' own behaviour policies (kernel-weighted, state ~ normalised d^pi_K),
that pi_K / mu exceeds the clip -- what makes clipped RAC biased. One cell per (clip, mass,
lag, MDP). (The README's median 10.3x / max 74x is this study at its defaults: seed 0,
16 MDPs, S 5, A 3, gamma 0.9, NPG 0.3, 12 versions, delays (0, 2, 5), kernel (.6, .3, .1),
clip 1, lag fixed:0.)

``rac_wallclock`` (the coupled wall-clock run): ``runs.rac_wallclock``, on the same problem
instances.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from vccc_jax.runs.cells import run_cells
from vccc_jax.runs.schema import Experiment, as_dict

ABSTRACT_CUT = 47.9  # "up to 47.9x" (related_abstracts.txt #1)
UNBIASED = 1e6       # ratios above this: RAC unbiased to float precision (shown as ">1e+06")


def stored_float(x, missing: float = float("inf")) -> float:
    """A stored float (the store writes inf / NaN as None: ``missing``)."""
    return missing if x is None else float(x)


# ------------------------------------------------------------------------------ shared


def parse_lag_law(text: str) -> tuple[str, float]:
    """"LAW:MEAN" -> (law, mean) for ``tabular.history.lag_weights`` (ValueError if bad)."""
    from vccc_jax.tabular.history import STALENESS_LAWS

    law, sep, mean = str(text).partition(":")
    try:
        m = float(mean)
    except ValueError:
        m = None
    if not sep or law not in STALENESS_LAWS or m is None or m < 0:
        raise ValueError(f"lag law must look like LAW:MEAN with LAW in {STALENESS_LAWS} and "
                         f"MEAN >= 0, got {text!r}")
    return law, m


def clip_value(c: float) -> Optional[float]:
    """A grid clip as ``tabular.rac`` takes it: 0 -> None (no clip)."""
    return None if c == 0 else float(c)


def channel_kernels(num_channels: int, slow: list, kernel: list, mass: float) -> list:
    """Per channel: (1,) for a fast channel, the slow kernel rescaled to ``mass`` otherwise."""
    from vccc_jax.estimators.related.rac import scaled_kernel

    k = tuple(float(x) for x in scaled_kernel(kernel, mass))
    return [k if slow[c] else (1.0,) for c in range(num_channels)]


def check_problem(b, where: str, num_channels: int) -> None:
    """Sizes, gamma, kernel and shares of a ``rac`` / ``rac_wallclock`` base (ValueError)."""
    for key in ("num_mdps", "num_states", "num_actions"):
        if getattr(b, key) < 1:
            raise ValueError(f"{where}: base.{key} must be >= 1, got {getattr(b, key)}")
    if not 0 < b.gamma < 1:
        raise ValueError(f"{where}: base.gamma must lie in (0, 1), got {b.gamma}")
    from vccc_jax.estimators.related.rac import validate_kernel

    try:
        if not validate_kernel(b.kernel).sum() > 0:
            raise ValueError("kernel has zero mass")
    except ValueError as e:
        raise ValueError(f"{where}: base.kernel: {e}") from None
    if b.shares and len(b.shares) != num_channels:
        raise ValueError(f"{where}: base.shares needs one entry per channel ({num_channels}), "
                         f"got {len(b.shares)}")


def check_clips_masses(grid, where: str) -> None:
    """grid.clips and grid.masses non-empty and >= 0 (ValueError naming the key)."""
    if not grid.clips or min(grid.clips) < 0:
        raise ValueError(f"{where}: grid.clips must be non-empty and >= 0 (0 = no clip), "
                         f"got {grid.clips}")
    if not grid.masses or min(grid.masses) < 0:
        raise ValueError(f"{where}: grid.masses must be non-empty and >= 0, got {grid.masses}")


@functools.lru_cache(maxsize=8)
def problems(seed: int, num_mdps: int, S: int, A: int, gamma: float, init_scale: float,
              num_channels: int, shares: tuple):
    """(mdps, initial logits [M, S, A], channel rewards [M, C, S, A, S]) in float64."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        sh = jnp.asarray(shares if shares else [1.0 / num_channels] * num_channels, jnp.float64)
        return _problems_jit(seed, gamma, init_scale, sh, num_mdps, S, A, num_channels)


def _problems_jit(*args):
    """:func:`_problems_impl` as one compiled graph (eager random ops compile one by one)."""
    return _compiled(_problems_impl, (4, 5, 6, 7))(*args)


@functools.cache
def _compiled(fn, static_argnums: tuple):
    import jax

    return jax.jit(fn, static_argnums=static_argnums)


def _problems_impl(seed, gamma, init_scale, shares, num_mdps, S, A, num_channels):
    import jax
    import jax.numpy as jnp

    from vccc_jax.tabular.history import initial_logits
    from vccc_jax.tabular.mdp import random_mdp
    from vccc_jax.tabular.rac import split_rewards

    mdps = random_mdp(jax.random.PRNGKey(seed), num_mdps, S, A, gamma=gamma, dtype=jnp.float64)
    th = init_scale * initial_logits(jax.random.PRNGKey(seed + 1), num_mdps, S, A, 1.0, jnp.float64)
    keys = jax.vmap(lambda m: jax.random.PRNGKey(seed + 2 + m))(jnp.arange(num_mdps))
    ch = jax.vmap(lambda k, r: split_rewards(k, r, num_channels, shares))(keys, mdps.R)
    return mdps, th, ch


# ---------------------------------------------------------------------------- bias cut


def bias_cut_cells(exp: Experiment) -> list[dict]:
    """Cells in run order: per (clip, mass, lag) every MDP; each carries the base."""
    base = as_dict(exp.base)
    return [dict(base, clip=float(c), mass=float(k), lag=str(lag), mdp=m)
            for c in exp.grid.clips for k in exp.grid.masses for lag in exp.grid.lags
            for m in range(base["num_mdps"])]


def _max_lag(delays, kernel, num_versions: int) -> int:
    """The oldest behaviour lag whose reinjected versions the history still holds."""
    return num_versions - 1 - (max(delays) + (len(kernel) - 1 if max(delays) > 0 else 0))


def validate_bias_cut(exp: Experiment) -> list[dict]:
    """Cells after checking sizes, delays, kernel, clips and lag laws (ValueError naming the key)."""
    from vccc_jax.tabular.history import lag_weights

    b, where = exp.base, exp.path or "config"
    check_problem(b, where, len(b.delays))
    if not b.delays or min(b.delays) < 0 or 0 not in b.delays or max(b.delays) == 0:
        raise ValueError(f"{where}: base.delays must be >= 0 with at least one fast (0) and one "
                         f"slow (> 0) channel, got {b.delays}")
    top = _max_lag(b.delays, b.kernel, b.num_versions)
    if top < 0:
        raise ValueError(f"{where}: base.num_versions = {b.num_versions} is too short for delays "
                         f"{b.delays} and a kernel of {len(b.kernel)} ages")
    check_clips_masses(exp.grid, where)
    for lag in exp.grid.lags:
        try:
            lag_weights(*parse_lag_law(lag), top)
        except ValueError as e:
            raise ValueError(f"{where}: grid.lags: {lag!r}: {e} (lags up to {top} fit the "
                             f"history)") from None
    return bias_cut_cells(exp)


@functools.lru_cache(maxsize=8)
def _histories(seed, num_mdps, S, A, gamma, init_scale, num_channels, shares, algorithm,
               step_size, num_versions):
    import jax

    from vccc_jax.tabular.history import HistoryConfig, policy_history

    mdps, th, ch = problems(seed, num_mdps, S, A, gamma, init_scale, num_channels, shares)
    cfg = HistoryConfig(algorithm=algorithm, step_size=step_size, num_versions=num_versions)
    with jax.enable_x64(True):
        probs = jax.jit(jax.vmap(lambda m, x: policy_history(m, x, cfg).probs))(mdps, th)
    return mdps, probs, ch


def _p_bind(mdp, probs, delays, kernels, lag_w, clip) -> float:
    """P[pi_K / mu > clip] over the reinjected samples (module docstring); 0 without a clip."""
    from vccc_jax.tabular import exact

    if clip is None:
        return 0.0
    P = np.asarray(probs)
    K = P.shape[0] - 1
    d = np.asarray(exact.visitation(mdp, probs[K]))
    tot = num = 0.0
    for dly, k in zip(delays, kernels):
        if dly == 0:
            continue
        for lag, wl in enumerate(lag_w):
            for j, kj in enumerate(k):
                if wl * kj == 0:
                    continue
                mu = P[K - lag - dly - j]
                num += wl * kj * np.sum(d[:, None] * mu * (P[K] > clip * mu))
                tot += wl * kj
    return float(num / tot) if tot else 0.0


def run_bias_cut_cell(cell: dict) -> dict:
    """{drop, wait, rac, ratio, p_bind} of one (clip, mass, lag, MDP) cell (float64)."""
    import jax

    from vccc_jax.tabular import rac
    from vccc_jax.tabular.history import lag_weights

    C = len(cell["delays"])
    mdps, probs, ch = _histories(cell["seed"], cell["num_mdps"], cell["num_states"],
                                 cell["num_actions"], float(cell["gamma"]), float(cell["init_scale"]),
                                 C, tuple(cell["shares"]), cell["algorithm"],
                                 float(cell["step_size"]), cell["num_versions"])
    m = cell["mdp"]
    kernels = channel_kernels(C, [d > 0 for d in cell["delays"]], cell["kernel"], cell["mass"])
    w = lag_weights(*parse_lag_law(cell["lag"]), _max_lag(cell["delays"], cell["kernel"],
                                                          cell["num_versions"]))
    clip = clip_value(cell["clip"])
    with jax.enable_x64(True):
        mdp = mdps[m]
        out = rac.lag_law_bias_norms(mdp, ch[m], cell["delays"], kernels, probs[m], w, clip=clip)
        out = {k: float(v) for k, v in out.items()}
        out["p_bind"] = _p_bind(mdp, probs[m], cell["delays"], kernels, w, clip)
    return out


def run_bias_cut(exp: Experiment, results_dir: str | Path, *, progress: bool = True,
                 on_cell: Optional[Callable[[int, int, dict], None]] = None) -> tuple[Path, list[dict]]:
    """Compute the missing cells into ``<results_dir>/<name>.jsonl`` -> (path, rows)."""
    path = Path(results_dir) / f"{exp.name}.jsonl"

    def note(cell, metrics):
        return f"clip {cell['clip']} mass {cell['mass']} {cell['lag']} MDP {cell['mdp']}: {metrics['ratio']:.3g}x"

    return path, run_cells(path, validate_bias_cut(exp), run_bias_cut_cell, label="MDPs",
                           note=note, progress=progress, on_cell=on_cell)


def group_rows(rows: list[dict], keys: tuple) -> dict:
    """Store rows by the tuple of their cell's ``keys`` (first-seen order)."""
    out: dict = {}
    for r in rows:
        out.setdefault(tuple(r["cell"][k] for k in keys), []).append(r)
    return out


def bias_cut_table(rows: list[dict]) -> str:
    """Per (clip, mass, lag): a per-MDP table of the bias norms and the ratio, then median /
    max ratio against the abstract's 47.9x."""
    lines = []
    for (clip, mass, lag), rs in group_rows(rows, ("clip", "mass", "lag")).items():
        c = rs[0]["cell"]
        lines += [f"clip {clip or 'none'}, kernel {c['kernel']} x mass {mass}, delays {c['delays']}, "
                  f"behaviour lag {lag}",
                  f"{'MDP':>4} {'|bias drop|':>12} {'|bias wait|':>12} {'|bias rac|':>12} "
                  f"{'drop/rac':>9} {'P[clip binds]':>14}"]
        ratios = []
        for r in sorted(rs, key=lambda r: r["cell"]["mdp"]):
            x = r["metrics"]
            ratio = x["ratio"] if x["ratio"] is not None else float("inf")  # rac exactly unbiased
            ratios.append(ratio)
            shown = f"{ratio:9.3g}" if ratio < UNBIASED else f"{'>' + format(UNBIASED, '.0e'):>9}"
            lines.append(f"{r['cell']['mdp']:>4} {x['drop']:12.4g} {x['wait']:12.4g} "
                         f"{x['rac']:12.4g} {shown} {x['p_bind']:14.3f}")
        ratios = np.array(ratios)
        fmt = lambda v: f"{v:.3g}x" if v < UNBIASED else f">{UNBIASED:.0e}x"  # noqa: E731
        n_unb = int(np.sum(ratios >= UNBIASED))
        lines.append(f"bias cut drop/rac over {len(ratios)} MDPs: median {fmt(np.median(ratios))}, "
                     f"max {fmt(np.max(ratios))}, min {fmt(np.min(ratios))} "
                     f"(abstract: up to {ABSTRACT_CUT}x)"
                     + (f"; {n_unb} with RAC unbiased to float (the clip never binds)" if n_unb else "")
                     + "\n")
    return "\n".join(lines).rstrip()


__all__ = ["parse_lag_law", "bias_cut_cells", "validate_bias_cut", "run_bias_cut_cell",
           "run_bias_cut", "bias_cut_table", "ABSTRACT_CUT", "UNBIASED"]
