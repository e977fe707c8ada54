"""Kill-test driver: the real ``vccc train ARGS`` in this process, on DEVICES fake CPU
devices, so the test can SIGKILL / SIGINT the command itself at chosen moments.

    python _ckpt_driver.py DEVICES ARGS...

``CKPT_COMMIT_DELAY=S`` (seconds) makes orbax's background thread wait S before it writes
a checkpoint's meta JSON: what a loaded machine does to that thread. Before the fix of
issue 19 s1 the meta then held metric rows appended after ``save`` returned.
"""

import os
import sys
import time

from _scale_common import set_devices

set_devices(int(sys.argv[1]))

delay = float(os.environ.get("CKPT_COMMIT_DELAY", "0"))
if delay:
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh

    write = jh.JsonCheckpointHandler._save_fn

    async def late_write(self, x, directory):
        time.sleep(delay)
        return await write(self, x, directory)

    jh.JsonCheckpointHandler._save_fn = late_write

from vccc_jax import cli  # noqa: E402

sys.exit(cli.main(["train", *sys.argv[2:]]))
