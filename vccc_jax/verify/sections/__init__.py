"""Row sections: checks that produce their own rows outside the per-problem identity graph.

A row section is ``section(ctx: Context) -> list[Row]``. :data:`SECTIONS` lists them in
table order; ``run_verify`` calls each once, after the identity groups and before the
sampled target checks. To add one (e.g. for a new testbed), write the function in a new
module of this folder and append it to :data:`SECTIONS` -- that is the only registration.
Derive keys from ``ctx.key`` with ``jax.random.fold_in(ctx.key, <unused integer>)`` so
other sections' numbers do not move (taken: 2 estimator_checks, 12 token, 13 BRACE,
14 decoupled (and decoupled_library), 15 RAC (and rac_library), 16 PS-PPO (and
ps_ppo_library), 17 and 18 brace_library, 19 rac_library, 20 ps_ppo_library, 21 actor
corrections, 22 trainer, 23 lqr, 29 actor_rows_field, 30 async_critics;
``split(ctx.key, 3)`` by the groups, the sampled half and vtrace_library). Keep a section
cheap (< ~3 s on 2 idle cores): one compiled graph with the library functions it checks as
a static argument (so a test that patches the library recompiles only that graph), tiny
problems, no per-setting compiles. A library-estimator section takes the exact side (the
operator's values) from the compiled graph of its tabular section (``comparators.
decoupled_numbers`` ...), so its own graph holds only the library calls.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex

from vccc_jax.verify.report import Row
from vccc_jax.verify.sections.actor_corrections import actor_rows
from vccc_jax.verify.sections.actor_rows_field import field_actor_rows
from vccc_jax.verify.sections.async_critics import async_critic_rows
from vccc_jax.verify.sections.bandit import bandit_rows
from vccc_jax.verify.sections.brace_library import brace_library_rows
from vccc_jax.verify.sections.comparators import brace_rows, decoupled_rows, rac_rows
from vccc_jax.verify.sections.decoupled_library import decoupled_library_rows
from vccc_jax.verify.sections.estimator_checks import estimator_rows
from vccc_jax.verify.sections.lqr import lqr_rows
from vccc_jax.verify.sections.ps_ppo import ps_ppo_rows
from vccc_jax.verify.sections.ps_ppo_library import ps_ppo_library_rows
from vccc_jax.verify.sections.rac_library import rac_library_rows
from vccc_jax.verify.sections.token import token_rows
from vccc_jax.verify.sections.trainer import trainer_rows
from vccc_jax.verify.sections.vtrace_library import vtrace_rows


class Context(NamedTuple):
    """What a row section may use: the run's root key and whether it is a quick run."""

    key: chex.PRNGKey
    quick: bool = False


Section = Callable[[Context], "list[Row]"]

# Each comparator: its tabular claims, then its library estimator against the exact operator.
SECTIONS: list[Section] = [bandit_rows, vtrace_rows, estimator_rows, token_rows, brace_rows, brace_library_rows,
                           decoupled_rows, decoupled_library_rows, rac_rows, rac_library_rows, ps_ppo_rows,
                           ps_ppo_library_rows, actor_rows, field_actor_rows, trainer_rows, lqr_rows]
SECTIONS.append(async_critic_rows)  # issue 48: the field's async critics under lag

__all__ = ["Context", "SECTIONS", "Section", "actor_rows", "async_critic_rows", "bandit_rows", "brace_library_rows", "brace_rows",
           "field_actor_rows",
           "decoupled_library_rows", "decoupled_rows", "estimator_rows", "lqr_rows", "ps_ppo_library_rows", "ps_ppo_rows",
           "rac_library_rows", "rac_rows", "token_rows", "trainer_rows", "vtrace_rows"]
