"""``vccc list envs | critics | actors | experiments``: what the other commands accept.

    vccc list envs          # gymnax names and the tabular: / token: / lqr: / brax: specs (--env)
    vccc list critics       # the critic-target table (--critic, grid.methods)
    vccc list actors        # actor corrections (--actor)
    vccc list experiments   # experiments/*.toml: name, kind, description

Each list is read from the table the code itself uses (``envs.make``,
``estimators.registry``, the actor registry, the ``experiments/`` folder), so it cannot go
stale.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Optional

from vccc_jax.commands.common import Parser, guarded
from vccc_jax.runs.schema import default_path

WHAT = ("envs", "critics", "actors", "experiments")


def _table(rows: list[tuple], head: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines = [fmt.format(*head), fmt.format(*("-" * len(h) for h in head))]
    return "\n".join(lines + [fmt.format(*map(str, r)) for r in rows])


def envs() -> str:
    from vccc_jax.envs import brax_env, make, spec, token_env

    rows = [(name, "gymnax", "--env " + name) for name in make.ENVS]
    rows += [(name, "gymnax, continuous actions", "--env " + name + " (Gaussian actor; "
              "--noise-scale, --squash)") for name in spec.CONTINUOUS_GYMNAX]
    rows.append(("tabular:KEY=V,...", "tabular MDP, exact V^pi",
                 "keys: " + " ".join(spec.TABULAR_KEYS) + "; family: "
                 + "|".join(make.TABULAR_FAMILIES) + " (e.g. tabular:family=garnet,S=8)"))
    doc = " ".join((token_env.make_token_env.__doc__ or "").split()).replace("``", "")
    rows.append(("token:KEY=V,...", "LLM-shaped token env, exact V^pi",
                 doc.removeprefix("Build (env, params) from ")))
    rows.append(("lqr:KEY=V,...", "continuous-action LQR, exact V^pi",
                 "keys: " + " ".join(spec.LQR_KEYS) + " (e.g. lqr:dim=2,act=1)"))
    names = brax_env.brax_env_names()
    rows.append(("brax:NAME,KEY=V,...", "Brax (continuous actions)",
                 "keys: " + " ".join(spec.BRAX_KEYS) + "; NAME: "
                 + (" ".join(names) if names is not None
                    else "any brax.envs name, once installed: pip install -e '.[brax]'")))
    return _table(rows, ("env", "kind", "how"))


def critics() -> str:
    from vccc_jax.estimators.registry import CRITIC_TARGETS

    rows = [(t.name, t.weight_kind, "yes" if t.uses_clip else "no", t.description)
            for t in CRITIC_TARGETS.values()]
    rows.append(("gae", "none", "no", "uncorrected lambda-return (trainer only: --critic gae)"))
    rows += [  # the field's async critics (issue 48; train.targets), GAE without a ratio
        ("cleanba_mixed", "none", "no", "Cleanba: values of the actor's critic copy, learner's "
         "bootstrap (trainer only)"),
        ("recompute_no_ratio", "none", "no", "NeMo-RL: every value from the learner's critic "
         "(= gae; trainer only)"),
        ("stale_gae", "none", "no", "verl / OpenRLHF: every value from the actor's critic copy "
         "(trainer only)")]
    return _table(rows, ("critic", "weight", "clip c", "target"))


def actors() -> str:
    try:  # the actor registry (issue 21), where present
        from vccc_jax.estimators.actor_registry import ACTOR_CORRECTIONS
    except ImportError:
        ACTOR_CORRECTIONS = None
    if ACTOR_CORRECTIONS:
        rows = [(a.name, getattr(a, "level", ""),
                 ",".join(f"{k}={v}" for k, v in getattr(a, "params", ())) or "-",
                 getattr(a, "description", "")) for a in ACTOR_CORRECTIONS.values()]
        return _table(rows, ("actor", "level", "params", "correction"))
    from vccc_jax.estimators.importance import WEIGHT_KINDS

    text = {"none": "no correction", "ratio": "importance ratio rho (IS)",
            "truncate": "truncated min(rho, c) (TIS)",
            "mask": "double-sided mask rho 1[1/c <= rho <= c] (MIS)"}
    rows = [(k, text.get(k, "")) for k in WEIGHT_KINDS]
    return _table(rows, ("actor", "weight")) + (
        "\n(prefix centered- for score centering, Eq 2 / 13: e.g. --actor centered-mask)")


def experiments(directory: Optional[Path] = None) -> str:
    directory = directory or default_path().parent
    rows = []
    for path in sorted(directory.glob("*.toml")):
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            rows.append((path.name, "?", f"unreadable: {e}"))
            continue
        text = " ".join(str(table.get("description", "")).split())
        rows.append((path.name, table.get("kind", "?"),
                     text if len(text) <= 100 else text[:99] + "..."))
    return _table(rows, ("file", "kind", "description")) + (
        f"\n(in {directory}; run with vccc sweep --config FILE, or vccc train --config FILE "
        "for kind train, vccc simulate for kind pipeline)")


def build_parser() -> Parser:
    p = Parser(prog="vccc list", description="list what the commands accept: " + ", ".join(WHAT))
    p.add_argument("what", choices=WHAT, help="which list")
    return p


@guarded("list")
def main(argv: Optional[list[str]] = None):
    args = build_parser().parse_args(argv)
    show = {"envs": envs, "critics": critics, "actors": actors, "experiments": experiments}

    def run() -> int:
        print(show[args.what]())
        return 0

    return run
