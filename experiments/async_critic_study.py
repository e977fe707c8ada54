"""Issue 48 item 4: the field's critics beside VCCC and V-trace under the lag a real pipeline made.

Reads the measured lag traces of a real-vs-simulator study (``experiments/async_sim_study.py``:
``OUT/<mode>_s<seed>.trace``) and trains, in the simulator (train.trainer), each critic
target on the trace of the mode's seed-0 real run, SEEDS seeds vmapped (the measured lag is
nearly deterministic after the warm-up, so one trace per mode stands for the eight; see
docs/results.md). Critics: ``vccc``, ``vtrace``, ``cleanba_mixed`` (values from the actor's
critic copy, bootstrap from the learner's), ``recompute_no_ratio`` (= the trainer's ``gae``:
the critic of the real-vs-simulator study), ``stale_gae`` (all values from the copy).
Compared per critic: final return, critic error against V^{pi_k} (Monte Carlo gt_mse on gymnax
envs, exact RMS exact_err_pi on a ``tabular:`` env), ESS; each against
``recompute_no_ratio`` on the same seeds (paired: same seeds and trace), mean difference and
95% Student-t interval.

    PYTHONPATH=$PWD python experiments/async_critic_study.py STUDY_DIR [SEEDS] [UPDATES] [ENV]

Each (mode, critic) cell is appended to STUDY_DIR/critics.jsonl as it finishes;
STUDY_DIR/critics.json holds all cells and the intervals. The figure of docs/results.md (one
row per study dir: real vs simulated, then the critics):

    python experiments/async_critic_study.py --figure OUT.png STUDY_DIR [STUDY_DIR ...]
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from vccc_jax.envs.spec import env_gamma
from vccc_jax.train.config import TrainConfig
from vccc_jax.train.trainer import Trainer

CRITICS = ("vccc", "vtrace", "cleanba_mixed", "recompute_no_ratio", "stale_gae")
REFERENCE = "recompute_no_ratio"
MODES = (("latest", "latest"), ("bounded:4", "bounded4"))


def base(env: str, updates: int) -> dict:
    """The real-vs-simulator study's config (3 actor threads: B = 12 envs x T = 32)."""
    tabular = env.startswith("tabular:")
    return dict(env=env, num_envs=12, num_steps=32, total_timesteps=12 * 32 * updates,
                update_epochs=2, num_minibatches=2, gt_every=5 if tabular else 10, eval_envs=0,
                **({"gamma": env_gamma(env)} if tabular else {}))


def columns(env: str) -> tuple:
    return (("exact_v_pi", "exact_err_pi") if env.startswith("tabular:") else
            ("return", "gt_mse")) + ("ess",)


def per_seed(m: dict, names: tuple) -> np.ndarray:
    """[seeds, 3]: final return (last 10 updates), critic error (second half), ESS."""
    ret, err, ess = (np.asarray(m[n], np.float64) for n in names)
    half = err.shape[0] // 2
    return np.stack([np.nanmean(ret[-10:], 0), np.nanmean(err[half:], 0),
                     np.nanmean(ess, 0)], 1)


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    d = a - b
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return {"diff": float(d.mean()), "lo": float(d.mean() - half), "hi": float(d.mean() + half)}


def main(study: Path, seeds: int, updates: int, env: str) -> None:
    record = {"env": env, "seeds": seeds, "updates": updates, "critics": CRITICS,
              "load_start": os.getloadavg(), "modes": {}}
    names = columns(env)
    for mode, stem in MODES:
        trace = study / f"{stem}_s0.trace"
        lags = np.array([int(x) for x in trace.read_text().split()])
        cells = {}
        for critic in CRITICS:
            t0 = time.time()
            cfg = TrainConfig(**base(env, updates), critic=critic, seed=2000, num_seeds=seeds,
                              lag=f"trace:@{trace}", num_versions=int(lags.max()) + 1)
            trainer = Trainer(cfg)
            _, m = trainer.train(trainer.init())
            cells[critic] = per_seed(m, names)
            with open(study / "critics.jsonl", "a") as f:
                f.write(json.dumps({"mode": mode, "critic": critic,
                                    "per_seed": cells[critic].tolist(),
                                    "seconds": time.time() - t0,
                                    "load": os.getloadavg()}) + "\n")
            print(mode, critic, cells[critic].mean(0), f"{time.time() - t0:.0f}s", flush=True)
        res = {"trace": str(trace), "per_seed": {c: v.tolist() for c, v in cells.items()}}
        for j, metric in enumerate(("final_return", "critic_err", "ess")):
            res[metric] = {c: paired(cells[c][:, j], cells[REFERENCE][:, j]) | {
                "mean": float(cells[c][:, j].mean())} for c in CRITICS}
        record["modes"][mode] = res
        record["load_end"] = os.getloadavg()
        (study / "critics.json").write_text(json.dumps(record, indent=1))


def _mean_ci(x) -> tuple:
    x = np.asarray(x, np.float64)
    return x.mean(), stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))


def figure(png: Path, dirs: list) -> None:
    """Per study dir (row): final return, critic error, ESS of the real runs, their trace
    replay and the parametric law; then the critic error of every critic under the replayed
    trace. Means and 95% t-intervals over seeds, modes side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(dirs), 4, figsize=(14, 2.9 * len(dirs)), squeeze=False)
    for row, d in zip(axes, map(Path, dirs)):
        sim = json.loads((d / "study.json").read_text())
        env = sim["base"]["env"].split(",")[0]
        tabular = env.startswith("tabular:")
        err = "critic RMS error (exact)" if tabular else "critic MSE (vs Monte Carlo)"
        ret = "final V^pi (exact)" if tabular else "final return"
        for j, (ax, name) in enumerate(zip(row, (ret, err, "ESS"))):
            for i, (mode, res) in enumerate(sim["modes"].items()):
                for c, key in enumerate(("real", "replay", "parametric")):
                    m, h = _mean_ci(np.asarray(res[key])[:, j])
                    label = ("real", "trace replay", "parametric, same mean")[c]
                    ax.errorbar(i + 0.2 * (c - 1), m, yerr=h, fmt="o", capsize=3,
                                color=f"C{c}", label=label if i == 0 else None)
            ax.set_xticks(range(len(sim["modes"])), list(sim["modes"]))
            ax.set_title(f"{env}: {name}", fontsize=9)
        row[0].legend(fontsize=7)
        ax = row[3]
        if (d / "critics.json").exists():
            crit = json.loads((d / "critics.json").read_text())
            for i, (mode, res) in enumerate(crit["modes"].items()):
                for c, critic in enumerate(crit["critics"]):
                    m, h = _mean_ci(np.asarray(res["per_seed"][critic])[:, 1])
                    ax.errorbar(i + 0.12 * (c - 2), m, yerr=h, fmt="s", capsize=2,
                                color=f"C{c + 3}", label=critic if i == 0 else None)
            ax.set_xticks(range(len(crit["modes"])), list(crit["modes"]))
            ax.legend(fontsize=6)
        ax.set_title(f"{env}: {err.split(' (')[0]}, per critic", fontsize=9)
    fig.suptitle("Real --async runs vs the simulator; mean and 95% t-interval over 8 seeds",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=80)


if __name__ == "__main__" and sys.argv[1:2] == ["--figure"]:
    figure(Path(sys.argv[2]), sys.argv[3:])
elif __name__ == "__main__":
    a = sys.argv[1:]
    main(Path(a[0]), int(a[1]) if len(a) > 1 else 8, int(a[2]) if len(a) > 2 else 200,
         a[3] if len(a) > 3 else "CartPole-v1")
