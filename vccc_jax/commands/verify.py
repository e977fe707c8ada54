"""``vccc verify [--quick] [--json PATH] [--seed N] [--num-mdps N] [--samples N]``
``vccc verify --target MODULE:FUNCTION [--kind K] [--claim C] [--kw NAME=VALUE ...] [--lag L] [--loss-ready] [...]``
``vccc verify --field-audit [--libraries rlax,verl,areal,tunix] [--out docs/field_audit.md] [--quick] [--lag-law LAW]``.

``--target library:function`` (``rlax:vtrace``, ``verl:vanilla``, ...) checks another
library's function unchanged through its adapter (``verify.adapters``); ``--lag L`` re-sets
the problems so that the behaviour is the learner L updates ago (``verify.lags``).
``--field-audit`` checks every adapter of the named libraries at lags 0, 1, 4, 16 and writes
the table (``verify.field_audit``); ``--lag-law LAW`` (any ``vccc train --lag`` law, or
``trace:...`` / ``trace:@file`` of measured lags, read as their histogram) writes the same table
with that law's column (the P(L)-weighted mixture of its behaviour versions, ``verify.lags``)
beside lag 0; an actor, sequence or group ``--target`` takes it too.

Without ``--target``: runs :func:`vccc_jax.verify.run_verify` (every identity of the
library), prints the table. With ``--target``: checks the user's estimator with
:func:`vccc_jax.verify.check` on the same problems (``FILE.py:FUNCTION`` works too), prints
its rows and diagnosis. Optionally writes the rows as JSON; exit status 0 when every row
passes (a critic target that carries gradient is a warning, unless ``--loss-ready``), 1
when one fails, 2 on bad input (including a target that cannot be imported, does
not jit, returns the wrong shape or is not pure: one line naming the problem).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from typing import Optional, Sequence

PROG = "vccc verify"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2, no usage dump
        raise _BadInput(message)


class _BadInput(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="exact and sampled checks of every identity")
    parser.add_argument("--quick", action="store_true", help="smaller groups, fewer samples (time: vccc bench commands)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-mdps", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="transitions per state (sampled half)")
    parser.add_argument("--target", metavar="MODULE:FUNCTION",
                        help="check your own estimator (a one-step or sequence critic target, an actor weight or loss)")
    parser.add_argument("--kind", choices=("one-step", "sequence", "actor", "group"),
                        help="the target's contract (default: inferred from its signature)")
    parser.add_argument("--claim", default=None, metavar="vpi|clipped:c|masked:c|any",
                        help="what the target claims (default vpi: E[Y|s] = T_pi Vbar, fixed point V^pi)")
    parser.add_argument("--lag", type=int, default=None,
                        help="problems at a lag: behaviour = the learner LAG NPG updates ago (0..16)")
    parser.add_argument("--lag-law", default=None, metavar="LAW",
                        help="the behaviour versions drawn from LAW, lags 0..16 (fixed:L, uniform:M, "
                             "geometric:m, zipf:a, trace:l0,l1,..., trace:@file); not for one-step targets")
    parser.add_argument("--field-audit", action="store_true",
                        help="check every library adapter at lags 0, 1, 4, 16 and write the table (--out)")
    parser.add_argument("--libraries", default="rlax,tunix,verl,areal",
                        help="--field-audit: comma-separated libraries (default: all)")
    parser.add_argument("--out", metavar="PATH", help="--field-audit: write the markdown table here")
    parser.add_argument("--kw", action="append", default=[], metavar="NAME=VALUE",
                        help="extra keyword argument for the target (repeatable; VALUE is a Python literal)")
    parser.add_argument("--loss-ready", action="store_true",
                        help="a critic target must also be stop-gradient-ed, ready for a loss "
                             "(without it, gradient through the target is a warning)")
    return parser


def _kwargs(items) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise _BadInput(f"--kw must be NAME=VALUE, got {item!r}")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = _parser().parse_args(list(argv) if argv is not None else None)
    except _BadInput as e:
        return _fail(str(e))
    if args.num_mdps is not None and args.num_mdps < 4:
        return _fail(f"--num-mdps must be >= 4 (one per group), got {args.num_mdps}")
    if args.samples is not None and args.samples < 2:
        return _fail(f"--samples must be >= 2, got {args.samples}")
    if args.json:
        try:
            open(args.json, "a").close()
        except OSError as e:
            return _fail(f"cannot write --json {args.json}: {e.strerror}")

    if args.lag is not None and not 0 <= args.lag <= 16:
        return _fail(f"--lag must be in 0..16, got {args.lag}")
    if args.lag_law is not None:
        if args.lag is not None:
            return _fail("give --lag or --lag-law, not both")
        try:
            from vccc_jax.verify import lags

            lags.parse_law(args.lag_law)
        except ValueError as e:
            return _fail(f"--lag-law: {str(e).splitlines()[0]}")
    if args.field_audit:
        if args.target is not None:
            return _fail("--field-audit checks the library adapters: give no --target")
        return _field_audit(args)
    if args.out:
        return _fail("--out needs --field-audit")
    if args.target is None and (args.kind or args.claim or args.kw or args.lag is not None
                                or args.loss_ready or args.lag_law is not None):
        return _fail("--kind, --claim, --kw, --lag, --lag-law and --loss-ready need --target (or --field-audit)")
    if args.target is not None:
        try:
            kwargs = _kwargs(args.kw)
        except _BadInput as e:
            return _fail(str(e))
        return _check_target(args, kwargs)

    import jax

    from vccc_jax import verify

    t0 = time.perf_counter()
    rows = verify.run_verify(
        quick=args.quick, key=jax.random.PRNGKey(args.seed), num_mdps=args.num_mdps,
        num_samples=args.samples, log=lambda s: print(s, flush=True),
    )
    elapsed = time.perf_counter() - t0
    print(verify.format_table(rows))
    print(f"total time {elapsed:.1f}s (compile included)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(verify.json_report(rows, seconds=elapsed, quick=args.quick, seed=args.seed), f, indent=2,
                      allow_nan=False)
    return 0 if all(r.passed for r in rows) else 1


def _check_target(args, kwargs: dict) -> int:
    import jax

    from vccc_jax import verify

    t0 = time.perf_counter()
    try:
        report = verify.check(args.target, kind=args.kind, claim=args.claim or "vpi", kwargs=kwargs,
                              quick=args.quick, key=jax.random.PRNGKey(args.seed), num_mdps=args.num_mdps,
                              num_samples=args.samples, loss_ready=args.loss_ready,
                              make=_lag_maker(args.lag if args.lag_law is None else args.lag_law))
    except ValueError as e:  # TargetError included: one line naming the problem
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    elapsed = time.perf_counter() - t0
    print(report.format())
    print(f"total time {elapsed:.1f}s (compile included)")
    if args.json:
        doc = dict(report.as_dict(), seconds=elapsed, quick=args.quick, seed=args.seed, all_passed=report.passed)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, allow_nan=False)
    return 0 if report.passed else 1


def _lag_maker(lag):
    if lag is None:
        return None
    from vccc_jax.verify import lags

    if isinstance(lag, str):  # a law: its versions, mixed by P(L) (verify.lags.law_maker)
        return lags.law_maker(lag)

    return lags.maker(lag)


def _field_audit(args) -> int:
    import os

    from vccc_jax.verify import adapters, field_audit, lags
    from vccc_jax.verify import field_audit_group as fag

    libs = [x for x in args.libraries.split(",") if x]
    bad = [x for x in libs if x not in adapters.LIBRARIES]
    if bad or not libs:
        return _fail(f"--libraries must name some of {', '.join(adapters.LIBRARIES)}, got {args.libraries!r}")
    if args.out:
        try:
            open(args.out, "a").close()
        except OSError as e:
            return _fail(f"cannot write --out {args.out}: {e.strerror}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.perf_counter()
    chosen = []
    for a in field_audit.adapters_of(libs):
        try:
            a.build()
            chosen.append(a)
        except ImportError as e:
            print(f"skipped {a.key}: {e}", flush=True)
    grouped, chosen = fag.adapters_of(chosen)
    if not chosen and not grouped:
        return _fail("no adapter of --libraries could be built (install the audit extra: make audit)")
    # a law's column beside lag 0 (on-policy: the verdicts read it)
    run_lags = (0, args.lag_law) if args.lag_law else lags.LAGS
    law = lags.parse_law(args.lag_law) if args.lag_law else None
    if law is not None:
        print(law.describe(), flush=True)
    chosen, unchecked = field_audit.checkable(chosen)
    for a, why in unchecked:
        print(f"not checkable {a.key}: {why}", flush=True)
    try:
        audits = field_audit.run(chosen, run_lags, quick=args.quick, seed=args.seed, num_mdps=args.num_mdps,
                                 num_samples=args.samples, log=lambda s: print(s, flush=True)) if chosen else []
        group_audits = fag.run(grouped, run_lags)
    except ValueError as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    print(f"group section: {len(grouped)} estimators at {', '.join(map(str, run_lags))}", flush=True)
    cross = field_audit.cross_rows(adapters.registry()) if audits else []
    kl = field_audit.lag_kl(run_lags, args.quick, args.seed, args.num_mdps) if audits else {}
    group_lines = fag.markdown(group_audits, fag.cross_rows(grouped), fag.kls(run_lags))
    seconds = time.perf_counter() - t0
    options = " ".join(x for x in ("--quick" if args.quick else "",
                                   f"--num-mdps {args.num_mdps}" if args.num_mdps is not None else "",
                                   f"--samples {args.samples}" if args.samples is not None else "",
                                   f"--seed {args.seed}" if args.seed else "") if x)
    cmd = "vccc verify --field-audit --libraries " + ",".join(libs) + (f" {options}" if options else "") + (
        f" --lag-law {args.lag_law}" if args.lag_law else "") + (f" --out {args.out}" if args.out else "")
    text = field_audit.markdown(audits, cross, quick=args.quick, cmd=cmd, seconds=seconds, load=load, kl=kl,
                                unchecked=unchecked, options=options, group_lines=group_lines, law=law)
    print(text)
    if args.out:  # a law's table replaces only the file's law section (field_audit.merged)
        with open(args.out) as f:
            old = f.read()
        with open(args.out, "w") as f:
            f.write(field_audit.merged(old, text, law is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
