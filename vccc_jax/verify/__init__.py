"""``vccc verify``: every identity of the method checked exactly, then by sampling.

On a batch of random finite MDPs of mixed sizes (several (S, A) groups; each group is one
``jax.vmap`` over its MDPs, compiled once) in float64, each identity of the write-up is
checked in closed form and reported as one :class:`Row`: name, equation, MDPs checked, max
abs error, tolerance, pass/fail. The estimators checked are the *library's*
(``estimators.critic_targets``, ``importance``, ``vtrace``, ``actor``): they are
elementwise, so they are evaluated on the enumerated (s, a, s') grid (:mod:`.cells`) and
exact expectations are taken under mu(a|s) P(s'|s, a).

The sampled half (:mod:`.targets`) draws N transitions per state from the behaviour policy
(or a replay mixture of versions) under a fixed key, evaluates every one-step target on the
sampled [S, N] batch, and z-scores the sample mean against the mean the method *claims*
with the target's exact variance. Per target: the fraction of |z| > 3.29 must stay below
the binomial 99.9% upper bound and a KS test against N(0, 1) must not reject at 0.1%
(scipy.stats, :mod:`.stats`). The uncorrected target must be *rejected* (KS, and the
per-MDP chi-square test wherever its power is certified >= 99.9%).

Default run: 256 MDPs in 4 groups ((S, A) = (2, 2), (5, 3) episodic with gamma = 1 for
half of them, (8, 4) Garnet, (12, 5)), 4096 transitions per state; ``quick``: 96 MDPs in 2
groups, 2048 transitions per state.

Speed: the group graphs compile in a background thread while the row sections run (see
:mod:`.runner`); every section is one small compiled graph.

Layout
------
- :mod:`.problems`   random problems (MDP, pi, stale versions mu_k, replay mixture, Vbar)
- :mod:`.cells`      enumeration of (s, a, s') grids as estimator inputs
- :mod:`.trajectories` enumeration of every length-T trajectory (multi-step estimators)
- :mod:`.identities` per-problem exact identity sections (Eq 1-13), one vmapped graph per group
- :mod:`.sections`   row sections: the Sec 4.1 bandit, the library V-trace (E[vs], E[pg],
                     GAE, time-limit cuts), expected_weight, stop-gradients, actor gradients,
                     the token testbed (Eq 5 with tool steps, Sec 7 top-k / raw-logits
                     biases), BRACE, decoupled-correction routes, RAC and PS-PPO claims (the
                     tabular operators), and each comparator's LIBRARY estimator
                     (``estimators.related``) against its exact operator: ``*_library``;
                     ``trainer``: the trainer's own code path (``train``) on every enumerated
                     path of an exact tabular env, against the closed forms and the library
- :mod:`.targets`    one-step targets vs their claims, exact and sampled
- :mod:`.stats`      KS / binomial / chi-square via scipy.stats
- :mod:`.runner`     :func:`run_verify`;  :mod:`.report` :class:`Row`, :func:`format_table`
- :mod:`.user`       :func:`check`: a user's estimator through the same machinery
                     (``vccc verify --target module:function``); :mod:`.contracts` the
                     function contracts (registry one-step / sequence, actor weight / loss),
                     :mod:`.claimed` the claims' closed forms, :mod:`.diagnose` the
                     least-squares diagnosis, :mod:`.user_one_step`, :mod:`.user_sequence`,
                     :mod:`.user_actor` the rows per kind

Adding checks (e.g. for a new testbed)
--------------------------------------
One registration each:

- a new *row section*: a function ``(ctx: sections.Context) -> list[Row]`` in a new module
  of ``verify/sections/``, appended to ``sections.SECTIONS`` (keys via
  ``jax.random.fold_in(ctx.key, k)`` with an unused k; build rows with
  :func:`report.exact_row`). Pass the library functions you check into your compiled graph
  as *static* arguments looked up when the section runs, so that a test can monkeypatch a
  bug into the library and see the row fail (tests/verify/test_injected_bugs.py).
- a new per-problem identity: a key in a section of ``identities`` plus an ``IdentityRow``.
- a new one-step target: a :class:`TargetSpec` in ``targets.default_targets``.

The command (argparse, printing, exit status) is :mod:`vccc_jax.commands.verify`.
"""

from vccc_jax.verify.problems import GroupSpec, Problem, default_groups, make_problems
from vccc_jax.verify.report import Row, exact_row, format_table, json_report
from vccc_jax.verify.runner import DEFAULT_TARGETS, check_targets, make_problems_jit, run_verify
from vccc_jax.verify.sections import SECTIONS, Context
from vccc_jax.verify.targets import TargetSpec, default_targets
from vccc_jax.verify.user import Report, Target, TargetError, check, check_all

__all__ = [
    "Context", "DEFAULT_TARGETS", "GroupSpec", "Problem", "Report", "Row", "SECTIONS", "Target", "TargetError",
    "TargetSpec", "check", "check_all", "check_targets", "default_groups", "default_targets", "exact_row",
    "format_table", "json_report", "make_problems", "make_problems_jit", "run_verify",
]
