"""Issue 48 item 4, the real-run check: the critics of experiments/async_critic_study.py in real
``--async`` runs (mode ``latest``, the real-vs-simulator study's pipeline and config).

    PYTHONPATH=$PWD python experiments/async_critic_real.py OUT SEEDS UPDATES ENV MARGIN ACTORS \
        CRITICS [MODE]

(the argument layout of experiments/async_sim_study.py, whose ``real_run`` and config this
reuses; MARGIN is unused; CRITICS comma-separated; MODE ``latest`` (queue 2, the default)
or ``bounded:4`` (queue 5); seeds FIRST_SEED (environment, default 0) onwards). Per critic and seed: final return,
critic error against V^{pi_k}, ESS (async_sim_study's ``summary``), appended to
OUT/critics_real.jsonl as each run finishes.
"""

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import async_sim_study as study  # sets XLA_FLAGS (2 host devices, intra-op threads off)
import numpy as np

from vccc_jax.train import async_pipeline as ap
from vccc_jax.train.config import TrainConfig


def main(out: Path, seeds: int, critics: list, mode: str = "latest") -> None:
    out.mkdir(parents=True, exist_ok=True)
    queue = dict((m, q) for m, _, q in study.MODES)[mode]
    spec = ap.AsyncSpec(actors=study.ACTORS, queue=queue, mode=mode, actor_devices=(0,),
                        learner_devices=(1,), timeout=900.0)
    for critic in critics:
        programs = None
        for seed in range(study.FIRST_SEED, study.FIRST_SEED + seeds):
            t0 = time.time()
            cfg = dataclasses.replace(TrainConfig(**study.BASE, seed=seed), critic=critic)
            rows, trace, _, programs = study.real_run(cfg, spec, programs)
            col = lambda n: np.array([float(r[n]) for r in rows])  # noqa: E731
            res = study.summary(*map(col, study.COLUMNS))
            with open(out / "critics_real.jsonl", "a") as f:
                f.write(json.dumps({"critic": critic, "seed": seed, "mode": mode, "real": res,
                                    "mean_lag": float(trace[10:].mean()),
                                    "seconds": time.time() - t0,
                                    "load": os.getloadavg()}) + "\n")
            print(critic, seed, res, f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[7].split(","),
         sys.argv[8] if len(sys.argv) > 8 else "latest")
