"""``vccc async-mc``: the Sec 3.4 Monte-Carlo demonstration (mid-trajectory version switches
vs one-step targets; ``tabular.async_mc``)."""

from __future__ import annotations

from typing import Optional

from vccc_jax.commands.common import Parser, guarded


def build_parser() -> Parser:
    p = Parser(prog="vccc async-mc", description="Sec 3.4 Monte-Carlo demonstration")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rollouts", type=int, default=4000)
    p.add_argument("--horizon", type=int, default=200)
    p.add_argument("--starts", default="0,2,5", help="steps at which mu_3, mu_5, mu_8 take over")
    return p


@guarded("async-mc")
def main(argv: Optional[list[str]] = None):
    args = build_parser().parse_args(argv)
    try:
        starts = [int(x) for x in args.starts.split(",")]
    except ValueError:
        raise ValueError(f"--starts must be comma-separated integers, got {args.starts!r}") from None
    from vccc_jax.tabular.async_mc import schedule

    schedule(starts, args.horizon)  # validates starts and horizon
    if args.rollouts < 1:
        raise ValueError(f"--rollouts must be >= 1, got {args.rollouts}")

    def run() -> int:
        import jax
        import jax.numpy as jnp

        from vccc_jax.analysis.async_mc import format_report
        from vccc_jax.tabular.async_mc import default_problem, mc_demo

        with jax.enable_x64(True):
            mdp, mus, pi, vbar, labels = default_problem(args.seed, dtype=jnp.float64)
            rep = mc_demo(jax.random.PRNGKey(args.seed + 1), mdp, mus, pi, vbar, starts,
                          num_rollouts=args.rollouts, horizon=args.horizon, labels=labels)
        print(format_report(rep))
        return 0

    return run
