"""Subprocess worker: one of two processes (4 fake CPU devices each) running `vccc train` on
a global (8, 1) mesh. Reads VCCC_COORDINATOR / VCCC_NUM_PROCESSES / VCCC_PROCESS_ID (the
command starts jax.distributed from them before importing the trainer); process 0 writes
OUT/metrics.csv etc., both write their shards of the orbax checkpoints in OUT/checkpoint.

    python _multiproc_worker.py OUT
"""

import sys

from _scale_common import set_devices

set_devices(4)

# the mesh worker's tiny_config(num_seeds=2) as flags (chunks of 2 updates, as it runs)
FLAGS = ["--num-envs", "16", "--num-steps", "4", "--num-minibatches", "2", "--update-epochs",
         "1", "--hidden", "8", "--lag", "fixed:1", "--num-versions", "2", "--critic", "vccc",
         "--total-timesteps", "256", "--eval-envs", "0", "--num-seeds", "2", "--chunk", "2",
         "--checkpoint-every", "2", "--quiet", "--no-figure", "--gt-every", "0"]  # as tiny_config


def main(out: str) -> int:
    from vccc_jax.commands.train import main as train

    code = train(FLAGS + ["--out", out])
    import jax

    assert jax.process_count() == 2 and jax.device_count() == 8, jax.devices()
    jax.distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
