"""Issue 48 item 3(b), small scale: real asynchrony against the simulator's lag laws.

For each mode and seed: one real `--async` run (the pipeline of train.async_pipeline), then the
simulator (train.trainer) on (i) that run's own measured lags (the `trace` law, same seed:
paired) and (ii) a parametric law with the same mean lag (geometric:<mean>, the seeds vmapped:
unpaired). Compared: final return (mean of the last 10 updates' behaviour return; on a
``tabular:`` env the exact V^{pi_k} instead, mean_D exact_v_pi over the last 10 updates), the
critic's error against V^{pi_k} (gt_mse against Monte Carlo, mean over the ground-truth
updates of the second half; on a ``tabular:`` env the exact RMS error exact_err_pi), ESS and
KL(pi_k || mu) (the ratio diagnostics). Statistic: the mean difference real - simulated with a 95% Student-t
interval (paired over seeds for the trace replay, Welch for the parametric law) and the
equivalence verdict for final return at the margin fixed BEFORE running: |difference| <=
MARGIN (CartPole-v1 return units) — equivalent when the whole 90% interval (TOST at 5%) lies
inside +-MARGIN, different when the 95% interval excludes 0, else inconclusive.

    PYTHONPATH=$PWD python experiments/async_sim_study.py OUT [SEEDS] [UPDATES] [ENV] [MARGIN]
        [ACTORS]
    PYTHONPATH=$PWD python experiments/async_sim_study.py --drops OUT [SEEDS] [UPDATES]

Each seed's row is appended to OUT/rows.jsonl as it finishes (an interrupted study keeps them);
OUT/study.json is rewritten after every mode.

``--drops`` (:func:`drops_study`): the ``bounded:4`` cell only, each real run against its
replay without the dropped rollouts (the old trace), its drop-aware replay (``L/d1/d2``
entries) and ``hist:<the runs' pooled lag counts>`` (i.i.d. draws, 8 other seeds vmapped).

Sets two forced host devices and XLA:CPU intra-op threads off before JAX starts. CPU-heavy
(about 1-2 min per real run on a loaded 2-core machine).
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2"
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from vccc_jax.envs.spec import env_gamma  # noqa: E402
from vccc_jax.train import async_lag as al  # noqa: E402
from vccc_jax.train import async_pipeline as ap  # noqa: E402
from vccc_jax.train.config import TrainConfig  # noqa: E402
from vccc_jax.train.trainer import Trainer  # noqa: E402

_ARGS = {"--figure": [], "--drops": sys.argv[2:]}.get(sys.argv[1:2][0] if sys.argv[1:] else "",
                                                     sys.argv[1:])
UPDATES = int(_ARGS[2]) if len(_ARGS) > 2 else 100
ENV = _ARGS[3] if len(_ARGS) > 3 else "CartPole-v1"
# final-return equivalence margins, fixed before running: 25 on CartPole-v1, 50 on Acrobot-v1
# (the 100-update study); issue-scale study (3 actor threads, 200 updates): 25 on CartPole-v1,
# 0.3 (exact V^pi, about 4% of the learned value 7.8) on tabular:family=garnet,S=8,A=3,gamma=0.9
MARGIN = float(_ARGS[4]) if len(_ARGS) > 4 else 25.0
ACTORS = int(_ARGS[5]) if len(_ARGS) > 5 else 2
FIRST_SEED = int(os.environ.get("FIRST_SEED", "0"))  # more seeds of a study: FIRST_SEED=8 ...
TABULAR = ENV.startswith("tabular:")
NUM_ENVS = 12 if ACTORS == 3 else 8  # a multiple of the actor threads
BASE = dict(env=ENV, num_envs=NUM_ENVS, num_steps=32, total_timesteps=NUM_ENVS * 32 * UPDATES,
            update_epochs=2, num_minibatches=2, gt_every=5 if TABULAR else 10, eval_envs=0,
            critic="gae", **({"gamma": env_gamma(ENV)} if TABULAR else {}))
MODES = (("latest", ACTORS, 2), ("bounded:4", ACTORS, 5))
# the per-update columns of (final return, critic error, ESS, KL(pi_k || mu))
COLUMNS = (("exact_v_pi", "exact_err_pi") if TABULAR else ("return", "gt_mse")) + ("ess",
                                                                                  "kl_pi_mu")
METRICS = ("final_return", "critic_err", "ess", "kl_pi_mu")


def real_run(cfg, spec, programs=None, drops=None):
    trainer = Trainer(cfg)
    state = jax.tree_util.tree_map(lambda x: x[0], trainer.init())
    pipe = ap.Pipeline(trainer, spec, state, ap.initial_actor_keys(state.key, spec.actors), 0,
                       programs=programs)
    rows, trace, dropped = [], [], 0
    try:
        state = jax.device_put(state, pipe.learner_device)
        for k, batch, state, m in pipe.drive(state, trainer.num_updates):
            m, version = jax.device_get((m, batch.traj.version))
            rows.append({n: np.asarray(v) for n, v in m.items()})
            trace.append(k - np.asarray(version)[0])
            if drops is not None:  # per update, per env: the lags of the rollouts dropped
                drops.append(al.drop_lags(k, batch.drop_versions, cfg.num_envs))
            dropped += batch.dropped
    finally:
        pipe.close()
    return rows, np.stack(trace), dropped, pipe.programs


def summary(ret, gt, ess, kl):
    """(final return, critic error, ESS, KL) of one run's per-update columns."""
    half = len(gt) // 2
    return (float(np.nanmean(ret[-10:])), float(np.nanmean(gt[half:])), float(np.nanmean(ess)),
            float(np.nanmean(kl)))


def interval(diff, paired=True, other=None, margin=None):
    if paired:
        d = np.asarray(diff)
        m, se, df = d.mean(), d.std(ddof=1) / np.sqrt(len(d)), len(d) - 1
    else:
        a, b = np.asarray(diff), np.asarray(other)
        m = a.mean() - b.mean()
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        se = np.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t95, t90 = stats.t.ppf(0.975, df), stats.t.ppf(0.95, df)
    lo, hi = m - t95 * se, m + t95 * se
    out = {"diff": float(m), "lo": float(lo), "hi": float(hi)}
    if margin is not None:  # the equivalence verdict (final return only)
        out["verdict"] = ("equivalent" if abs(m) + t90 * se <= margin else
                          "different" if lo > 0 or hi < 0 else "inconclusive")
    return out


def main(out: Path, seeds: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record = {"margin": MARGIN, "base": BASE, "seeds": seeds, "modes": {},
              "load_start": os.getloadavg()}
    for mode, actors, queue in MODES:
        spec = ap.AsyncSpec(actors=actors, queue=queue, mode=mode, actor_devices=(0,),
                            learner_devices=(1,), timeout=900.0)
        real, replay, lags, programs = [], [], [], None
        for seed in range(FIRST_SEED, FIRST_SEED + seeds):
            cfg = TrainConfig(**BASE, seed=seed)
            rows, trace, dropped, programs = real_run(cfg, spec, programs)
            col = lambda n: np.array([float(r[n]) for r in rows])  # noqa: E731
            real.append(summary(*map(col, COLUMNS)))
            lags.append(trace)
            path = out / f"{mode.replace(':', '')}_s{seed}.trace"
            al.LagTrace(trace.tolist()).write(out)
            (out / al.TRACE_FILE).replace(path)
            K = int(trace.max()) + 1
            sim = Trainer(dataclasses.replace(cfg, lag=f"trace:@{path}", num_versions=K))
            _, m = sim.train(sim.init())
            replay.append(summary(*(np.asarray(m[n])[:, 0] for n in COLUMNS)))
            print(mode, seed, "real", real[-1], "replay", replay[-1], "dropped", dropped,
                  flush=True)
            with open(out / "rows.jsonl", "a") as f:
                f.write(json.dumps({"mode": mode, "seed": seed, "real": real[-1], "dropped":
                                    dropped, "replay": replay[-1], "load": os.getloadavg(),
                                    "lag_hist": al.histogram(trace).tolist()}) + "\n")
        mean_lag = float(np.mean([t[10:].mean() for t in lags]))
        law = f"geometric:{mean_lag:.2f}"
        par = Trainer(TrainConfig(**BASE, seed=1000 + FIRST_SEED, num_seeds=seeds, lag=law))
        _, m = par.train(par.init())
        parametric = [summary(*(np.asarray(m[n])[:, s] for n in COLUMNS))
                      for s in range(seeds)]
        real_a, rep_a, par_a = map(np.asarray, (real, replay, parametric))
        res = {"law": law, "mean_lag_after_warmup": mean_lag,
               "lag_hist": al.histogram(np.concatenate(lags)).tolist(),
               "real": real_a.tolist(), "replay": rep_a.tolist(), "parametric": par_a.tolist()}
        for j, name in enumerate(METRICS):
            margin = MARGIN if name == "final_return" else None
            res[f"{name}_vs_replay"] = interval(real_a[:, j] - rep_a[:, j], margin=margin)
            res[f"{name}_vs_parametric"] = interval(real_a[:, j], paired=False,
                                                    other=par_a[:, j], margin=margin)
        record["modes"][mode] = res
        print(json.dumps({k: v for k, v in res.items() if "_vs_" in k}, indent=1), flush=True)
        record["load_end"] = os.getloadavg()
        (out / "study.json").write_text(json.dumps(record, indent=1))


# margins fixed before running --drops: final return +-25 (as above), critic MSE +-150 (the
# old replay's gap, 220 [74, 367], lies outside it: "closed" = equivalent within +-150)
DROP_MARGINS = {"final_return": 25.0, "gt_mse": 150.0, "ess": None}


def drops_study(out: Path, seeds: int) -> None:
    """The ``bounded:4`` cell: per seed the real run, its replay without the dropped
    rollouts (old trace), its drop-aware replay (same seed: paired) and the pooled
    measured histogram as an i.i.d. law (``hist:``, seeds 1000.. vmapped: Welch)."""
    out.mkdir(parents=True, exist_ok=True)
    mode, actors, queue = MODES[1]
    spec = ap.AsyncSpec(actors=actors, queue=queue, mode=mode, actor_devices=(0,),
                        learner_devices=(1,), timeout=900.0)
    arms = {"real": [], "replay_old": [], "replay_drops": []}
    lags, n_drops, programs, t0 = [], [], None, time.time()
    record = {"margins": DROP_MARGINS, "base": BASE, "seeds": seeds, "mode": mode,
              "load_start": os.getloadavg()}
    for seed in range(seeds):
        cfg, drops = TrainConfig(**BASE, seed=seed), []
        rows, trace, dropped, programs = real_run(cfg, spec, programs, drops)
        col = lambda n: np.array([float(r[n]) for r in rows])  # noqa: E731
        arms["real"].append(summary(col("return"), col("gt_mse"), col("ess"), col("kl_pi_mu")))
        lags.append(trace)
        n_drops.append(dropped)
        for arm, kept in (("replay_old", None), ("replay_drops", drops)):
            path = out / f"s{seed}_{arm}.trace"
            al.LagTrace(trace.tolist(), kept).write(out)
            (out / al.TRACE_FILE).replace(path)
            sim = Trainer(dataclasses.replace(cfg, lag=f"trace:@{path}"))
            _, m = sim.train(sim.init())
            arms[arm].append(summary(*(np.asarray(m[n])[:, 0]
                                       for n in ("return", "gt_mse", "ess", "kl_pi_mu"))))
        print(seed, {k: v[-1] for k, v in arms.items()}, "dropped", dropped, flush=True)
    counts = np.bincount(np.concatenate(lags).reshape(-1))
    law = "hist:" + ",".join(str(int(c)) for c in counts)
    par = Trainer(TrainConfig(**BASE, seed=1000, num_seeds=seeds, lag=law))
    _, m = par.train(par.init())
    arms["hist"] = [summary(*(np.asarray(m[n])[:, s]
                              for n in ("return", "gt_mse", "ess", "kl_pi_mu")))
                    for s in range(seeds)]
    a = {k: np.asarray(v) for k, v in arms.items()}
    record.update({"law": law, "dropped_per_run": n_drops, "minutes": (time.time() - t0) / 60,
                   **{k: v.tolist() for k, v in a.items()}})
    for j, name in enumerate(("final_return", "gt_mse", "ess")):
        margin = DROP_MARGINS[name]
        for arm in ("replay_old", "replay_drops"):
            record[f"{name}_vs_{arm}"] = interval(a["real"][:, j] - a[arm][:, j], margin=margin)
        record[f"{name}_vs_hist"] = interval(a["real"][:, j], paired=False,
                                             other=a["hist"][:, j], margin=margin)
    record["load_end"] = os.getloadavg()
    (out / "drops.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if "_vs_" in k}, indent=1), flush=True)


def figure(study: Path, png: Path) -> None:
    """Per mode and metric: real, trace replay and parametric law, mean and 95% t-interval
    over seeds.  ``python experiments/async_sim_study.py --figure STUDY.json OUT.png``"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(Path(study).read_text())
    names = METRICS[:len(next(iter(record["modes"].values()))["real"][0])]
    fig, axes = plt.subplots(1, len(names), figsize=(3.7 * len(names), 3.2))
    for j, (ax, name) in enumerate(zip(axes, names)):
        for i, (mode, res) in enumerate(record["modes"].items()):
            for c, (label, key) in enumerate((("real", "real"), ("trace replay", "replay"),
                                              (res["law"], "parametric"))):
                x = np.asarray(res[key])[:, j]
                half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
                ax.errorbar(i + 0.25 * (c - 1), x.mean(), yerr=half, fmt="o", capsize=3,
                            color=f"C{c}", label=("parametric (same mean)" if c == 2 else label)
                            if i == 0 else None)
        ax.set_xticks(range(len(record["modes"])), list(record["modes"]))
        ax.set_title(name)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{record['base']['env']}, {record['seeds']} seeds per cell; mean and 95% "
                 "t-interval",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--figure"]:
        figure(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["--drops"]:
        drops_study(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    else:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/async_sim_study"),
             int(sys.argv[2]) if len(sys.argv) > 2 else 8)
