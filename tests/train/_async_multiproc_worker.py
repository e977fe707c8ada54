"""Subprocess worker for tests/train/test_async_mesh.py: one of two processes (VCCC_COORDINATOR
/ VCCC_NUM_PROCESSES / VCCC_PROCESS_ID; one fake CPU device each) running ``vccc train
--async`` (``lag1``, deterministic): one actor thread per process, the learner's mesh over
both processes' device 0; process 0 writes OUT/metrics.csv, both their shards of the
checkpoints.

    python _async_multiproc_worker.py OUT [FLAG ...]
"""

import sys

from _scale_common import set_devices

set_devices(1)

FLAGS = ["--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "8", "--update-epochs", "2",
         "--num-minibatches", "2", "--hidden", "8", "--gt-every", "0", "--eval-envs", "0",
         "--seed", "3", "--total-timesteps", str(4 * 8 * 4), "--async", "--param-mode", "lag1",
         "--actor-threads", "1", "--actor-devices", "0", "--learner-devices", "0",
         "--checkpoint-every", "2", "--quiet", "--no-figure"]  # as _async_mesh_worker.py


def main(out: str, extra: list) -> int:
    from vccc_jax.commands.train import main as train

    code = train(FLAGS + ["--out", out, *extra])
    import jax

    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    jax.distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
