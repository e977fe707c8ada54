"""Statistical equivalence of two trainer versions (issue 22 §1: the rollout / learner layout
change may move float32 results, so it is checked over seeds instead of bit for bit; issue 28
§1: the per-env rollout path, configs uniform:7 / vccc and uniform:31 / vtrace at 8 envs, then
the sorted path, the same laws at 64 and 256 envs: ``--configs sorted``; then both configs
again when pi_k's logits left the step loop of those two paths for one forward after it).

Run the same configs with each version's interpreter (each venv imports its own vccc_jax),
then compare:

    /work/main/.venv/bin/python experiments/layout_equivalence.py run --out /tmp/eq_main.npz
    .venv/bin/python experiments/layout_equivalence.py run --out /tmp/eq_branch.npz
    (``--configs sorted``: only the configs whose rollout takes the sorted path)
    .venv/bin/python experiments/layout_equivalence.py compare /tmp/eq_main.npz /tmp/eq_branch.npz

``run`` trains, for every config of :data:`STAT_CONFIGS`, ``num_seeds`` seeds (the same seed
keys in both versions: ``seed = 0``) and stores per-update return and critic loss; for
:data:`STATE_CONFIG` (one minibatch: the shuffle only reorders sums) it stores the flat
actor + critic params after a few updates. ``compare`` prints, per config and metric, the
mean paired difference (branch - main) over seeds with a 95% t interval, Welch's t test
p-value and a paired sign-flip permutation p-value, and the max |difference| of the state.
Not a test: it takes a few CPU minutes.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

NUM_SEEDS = 16
_COMMON = dict(env="CartPole-v1", num_envs=8, num_steps=32, update_epochs=4, num_minibatches=4,
               critic="vccc", actor="truncate", actor_clip=2.0, critic_lr=1e-3, seed=0,
               num_seeds=NUM_SEEDS)
UPDATES = 300
STAT_CONFIGS = {  # name -> TrainConfig fields (issue 28 §1: non-fixed laws, whose rollout
    # path changed from the lag table to one forward per env; issue 22 ran fixed:2, uniform:4)
    "uniform7_vccc": dict(_COMMON, lag="uniform:7", num_versions=8,
                          total_timesteps=UPDATES * 8 * 32),
    "uniform31_vtrace": dict(_COMMON, lag="uniform:31", num_versions=32, critic="vtrace",
                             total_timesteps=UPDATES * 8 * 32),
}
SORTED_UPDATES = 100  # the sorted path: envs >= 8 K (acting.choose_path)
SORTED_CONFIGS = {
    "uniform7_vccc_64envs": dict(_COMMON, lag="uniform:7", num_versions=8, num_envs=64,
                                 total_timesteps=SORTED_UPDATES * 64 * 32),
    "uniform31_vtrace_256envs": dict(_COMMON, lag="uniform:31", num_versions=32,
                                     critic="vtrace", num_envs=256,
                                     total_timesteps=SORTED_UPDATES * 256 * 32),
}
STATE_UPDATES = 5
STATE_CONFIG = dict(_COMMON, lag="uniform:7", num_versions=8, num_minibatches=1, num_seeds=2,
                    total_timesteps=STATE_UPDATES * 8 * 32)


def _run(out: str, configs: str = "per_env") -> None:
    import jax

    from vccc_jax.train.trainer import TrainConfig, Trainer

    res = {}
    for name, fields in (STAT_CONFIGS if configs == "per_env" else SORTED_CONFIGS).items():
        tr = Trainer(TrainConfig(**fields))
        _, m = tr.train(tr.init())
        m = jax.device_get(m)
        for k in ("return", "critic_loss"):
            res[f"{name}/{k}"] = np.asarray(m[k], np.float64).reshape(tr.num_updates, -1)
        print(name, "done", file=sys.stderr, flush=True)
    state_cfg = STATE_CONFIG if configs == "per_env" else dict(STATE_CONFIG, num_envs=64,
                                                               total_timesteps=5 * 64 * 32)
    tr = Trainer(TrainConfig(**state_cfg))
    st, _ = tr.train(tr.init())
    leaves = jax.tree_util.tree_leaves((st.actor_params, st.critic_params))
    res["state"] = np.concatenate([np.asarray(x, np.float64).ravel() for x in leaves])
    np.savez(out, **res)


def _t95(df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def _perm_p(d: np.ndarray, rounds: int = 20000) -> float:
    """Two-sided paired sign-flip permutation p-value of mean(d) = 0 (fixed key)."""
    rng = np.random.default_rng(0)
    obs = abs(d.mean())
    flips = rng.choice([-1.0, 1.0], size=(rounds, d.size))
    return float((np.sum(np.abs((flips * d).mean(1)) >= obs - 1e-15) + 1) / (rounds + 1))


def _compare(a_path: str, b_path: str) -> None:
    from scipy import stats

    a, b = np.load(a_path), np.load(b_path)
    print(f"{'config/metric':28s} {'summary':6s} {'main':>10s} {'branch':>10s} "
          f"{'diff':>10s} {'95% CI':>22s} {'Welch p':>8s} {'perm p':>7s}")
    for key in sorted(k for k in a.files if k != "state"):
        x, y = a[key], b[key]  # [updates, seeds]
        n_upd = x.shape[0]
        tail = slice(n_upd - n_upd // 10, n_upd)  # last 10% of updates
        for summ, f in (("final", lambda z: np.nanmean(z[tail], 0)),
                        ("AUC", lambda z: np.nanmean(z, 0))):
            xs, ys = f(x), f(y)
            d = ys - xs
            half = _t95(d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
            welch = stats.ttest_ind(ys, xs, equal_var=False).pvalue
            print(f"{key:28s} {summ:6s} {xs.mean():10.4g} {ys.mean():10.4g} {d.mean():10.3g} "
                  f"[{d.mean() - half:9.3g},{d.mean() + half:9.3g}] {welch:8.3f} "
                  f"{_perm_p(d):7.3f}")
    sa, sb = a["state"], b["state"]
    print(f"state after {STATE_UPDATES} updates (one minibatch, {sa.size} params): "
          f"max |diff| {np.max(np.abs(sa - sb)):.3g}, max |param| {np.max(np.abs(sa)):.3g}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--configs", choices=("per_env", "sorted"), default="per_env")
    c = sub.add_parser("compare")
    c.add_argument("main")
    c.add_argument("branch")
    args = p.parse_args(argv)
    if args.cmd == "run":
        _run(args.out, args.configs)
    else:
        _compare(args.main, args.branch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
