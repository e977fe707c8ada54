"""``vccc verify [--quick] [--json PATH] [--seed N] [--num-mdps N] [--samples N]``.

Runs :func:`vccc_jax.verify.run_verify`, prints the table, optionally writes the rows as
JSON; exit status 0 when every row passes, 1 when one fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
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
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
