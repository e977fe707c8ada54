"""Kill-test driver: trains TOTAL updates in chunks of EVERY on a (2, 1) mesh of fake CPU
devices, saving an async orbax checkpoint after every chunk (the metric rows so far in its
meta) and resuming from the latest one at start. Prints one line per event (flushed) so the
test can SIGKILL it at chosen points; writes OUT/final.npz when done.

    python _ckpt_driver.py OUT TOTAL EVERY [ref]

With ``ref`` it then also runs the uninterrupted schedule in the same process (the same
compiled programs, no checkpoints) into OUT/ref.npz: one process fewer than a separate
reference run.
"""

import sys

from _scale_common import flat, set_devices, tiny_config

set_devices(2)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from vccc_jax.train import checkpoint as ck  # noqa: E402
from vccc_jax.train import sharding as sh  # noqa: E402
from vccc_jax.train.trainer import Trainer  # noqa: E402

ROW_KEYS = ("return", "actor_loss", "critic_loss", "entropy", "kl_pi_mu", "lag_mean")


def say(*words) -> None:
    print(*words, flush=True)


def _rows(m, n):
    m = jax.device_get(m)
    return [[float(m[k][i, 0]) for k in ROW_KEYS] for i in range(n)]


def uninterrupted(st, total: int, every: int, out: str) -> None:
    state, rows, update = st.init(), [], 0
    while update < total:
        n = min(every, total - update)
        state, m = st.train(state, n, start=update)
        rows += _rows(m, n)
        update += n
    np.savez(f"{out}/ref.npz", rows=np.asarray(rows), **flat(jax.device_get(state), "state"))


def main(out: str, total: int, every: int, ref: bool = False) -> None:
    cfg = tiny_config(total_timesteps=16 * 4 * total)
    st = sh.ShardedTrainer(Trainer(cfg), sh.make_mesh((2, 1)))
    mngr = ck.manager(f"{out}/ckpt", keep=2, every=every)
    update = ck.latest_step(mngr)
    if update is None:
        update, rows, state = 0, [], st.init()
    else:
        state, meta = ck.restore(mngr, st.abstract_state, st.shardings)
        rows = meta["rows"]
        assert meta["update"] == update == len(rows)
    say("start", update)
    while update < total:
        n = min(every, total - update)
        state, m = st.train(state, n, start=update)
        rows += _rows(m, n)
        update += n
        say("saving", update)
        ck.save(mngr, update, state, {"update": update, "rows": rows}, force=update == total)
        say("saved", update)  # returned; the write continues in the background
    ck.wait(mngr)
    say("committed", update)
    mngr.close()
    np.savez(f"{out}/final.npz", rows=np.asarray(rows), **flat(jax.device_get(state), "state"))
    if ref:
        uninterrupted(st, total, every, out)
    say("done")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["ref"])
