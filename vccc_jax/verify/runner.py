"""Run every check of ``vccc verify`` and return the rows (no printing).

Groups of random problems (:func:`problems.default_groups`) each run one compiled graph:
the per-problem identity sections and the exact + sampled checks of the one-step targets.
Then each row section of :data:`vccc_jax.verify.sections.SECTIONS` runs. Order of rows:
identities, row sections, exact target means, sampled targets.

Speed: compiling the group graphs is most of the run, so it happens in one background
thread (``lower`` on abstract shapes, then XLA's compile, which releases the GIL) while the
main thread runs the row sections; the main thread then builds each group's problems and
runs the compiled graph. Only compilation is concurrent: every *execution* stays on the
main thread (two concurrent LAPACK calls can deadlock jaxlib's CPU thread pool, see
``exact.solve_dominant``). Compiled group graphs are cached per process.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import Callable, Optional, Sequence

import chex
import jax
import numpy as np

from vccc_jax.verify.compile import fast_jit
from vccc_jax.verify.identities import exact_identity_errors, identity_rows
from vccc_jax.verify.problems import Problem, default_groups, make_problems
from vccc_jax.verify.report import Row
from vccc_jax.verify.sections import SECTIONS, Context
from vccc_jax.verify.targets import (
    TargetCheck,
    TargetSpec,
    default_targets,
    target_checks,
    target_rows,
)

Array = chex.Array
DEFAULT_TARGETS = default_targets()


def _group_all(p: Problem, key: Array, targets: Sequence[TargetSpec], num_samples: int):
    """Everything for one problem, in one graph: (identity errors, target checks)."""
    return exact_identity_errors(p), target_checks(key, p, targets, num_samples)


make_problems_jit = fast_jit(make_problems, static_argnums=(1, 2))
_group_all_batched = fast_jit(jax.vmap(_group_all, in_axes=(0, 0, None, None)), static_argnums=(2, 3))
_target_checks_batched = fast_jit(jax.vmap(target_checks, in_axes=(0, 0, None, None)), static_argnums=(2, 3))


_COMPILED: dict = {}
_COMPILED_LOCK = threading.Lock()


def _compile_group(spec, targets: tuple, num_samples: int):
    """The compiled group graph for ``spec`` (lowered on abstract shapes; cached)."""
    cache_key = (spec, targets, num_samples)
    with _COMPILED_LOCK:
        if cache_key in _COMPILED:
            return _COMPILED[cache_key]
    with jax.enable_x64(True):  # config contexts are per thread: set it here too
        key = jax.ShapeDtypeStruct((2,), np.uint32)
        p = jax.eval_shape(functools.partial(make_problems, spec=spec), key)
        keys = jax.ShapeDtypeStruct((spec.num_mdps, 2), np.uint32)
        compiled = _group_all_batched.lower(p, keys, targets, num_samples).compile()
    with _COMPILED_LOCK:
        _COMPILED[cache_key] = compiled
    return compiled


def group_keys(key: Array, groups: Sequence) -> list[tuple[Array, Array]]:
    """(problem key, sampling key) per group: the derivation of ``run_verify`` (the third key
    of ``split(key, 3)`` belongs to the V-trace section), shared by ``vccc verify --target``
    so that a user's estimator meets exactly the problems and draws of the built-in rows."""
    k_prob, k_samp, _ = jax.random.split(key, 3)
    return list(zip(jax.random.split(k_prob, len(groups)), jax.random.split(k_samp, len(groups))))


def check_targets(key: Array, problems: Sequence[Problem], targets: Sequence[TargetSpec],
                  num_samples: int) -> list[Row]:
    """Exact and sampled rows for the given one-step targets on batches of problems.

    The machinery ``run_verify`` uses, with the targets as an argument so that a wrong
    estimator can be shown to fail (tests/verify/test_verify.py).
    """
    with jax.enable_x64(True):
        results = []
        for p, k in zip(problems, jax.random.split(key, len(problems))):
            keys = jax.random.split(k, p.vbar.shape[0])
            results.append(jax.tree_util.tree_map(np.asarray, _target_checks_batched(keys, p, tuple(targets), num_samples)))
    return target_rows(targets, results, num_samples)


def run_verify(
    *,
    quick: bool = False,
    key: Optional[Array] = None,
    num_mdps: Optional[int] = None,
    num_samples: Optional[int] = None,
    targets: Optional[Sequence[TargetSpec]] = None,
    sections: Optional[Sequence[Callable]] = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[Row]:
    """Run every check in float64 and return the rows (see the package docstring).

    Args:
      quick: smaller groups and fewer samples (the same identities), for the tests.
      key: PRNG key (fixed default: PRNGKey(0)), so the same key gives the same table.
      num_mdps: random MDPs in total over the mixed-size groups (default 256; quick 96).
      num_samples: transitions drawn per state in the sampled half (default 4096; quick 2048).
      targets: the one-step targets to check (default :func:`targets.default_targets`).
      sections: the row sections to run (default :data:`sections.SECTIONS`).
      log: progress callback.
    """
    targets = DEFAULT_TARGETS if targets is None else tuple(targets)
    sections = SECTIONS if sections is None else sections
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(0) if key is None else key
        num_mdps = (96 if quick else 256) if num_mdps is None else num_mdps
        num_samples = (2048 if quick else 4096) if num_samples is None else num_samples
        groups = default_groups(num_mdps, quick)
        log("groups: " + ", ".join(f"{g.kind} S={g.num_states} A={g.num_actions} x{g.num_mdps}" for g in groups))
        t0 = time.perf_counter()
        ctx = Context(key=key, quick=quick)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            compiled = [pool.submit(_compile_group, g, targets, num_samples) for g in groups]
            section_rows = []
            for section in sections:
                t1 = time.perf_counter()
                section_rows += section(ctx)
                log(f"{getattr(section, '__name__', 'section')}: {time.perf_counter() - t1:.1f}s")
            t1 = time.perf_counter()
            outs = []
            # Sequential on purpose: running jitted LAPACK calls from two threads at once can
            # deadlock jaxlib 0.10's CPU thread pool (see exact.solve_dominant).
            for g, fut, (kp, ks) in zip(groups, compiled, group_keys(key, groups)):
                p = make_problems_jit(kp, g)
                keys = jax.random.split(ks, g.num_mdps)
                outs.append(jax.tree_util.tree_map(np.asarray, fut.result()(p, keys)))
            log(f"groups (compiled in the background; waited + ran {time.perf_counter() - t1:.1f}s)")
        log(f"total {time.perf_counter() - t0:.1f}s")
        rows = identity_rows([o[0] for o in outs])
        rows += section_rows
        rows += target_rows(targets, [TargetCheck(*o[1]) for o in outs], num_samples)
    return rows
