"""Suite-wide settings: strict rank promotion, as the project's conventions require; JAX's
persistent compilation cache in a directory of this test run only (never the user's cache
home), shared by every process of the run: the pytest process (and xdist workers) and the
``vccc`` subprocesses tests start inherit it, so a program compiled once (a trainer a kill
test restarts five times, a sweep's shards) is loaded, not compiled, by the next process.
The directory is removed when the session that made it ends; ``VCCC_TEST_COMPILE_CACHE=off``
turns the cache off."""
import os
import shutil
import tempfile
from pathlib import Path

_CACHE_VAR = "VCCC_TEST_COMPILE_CACHE"
_OWN_CACHE = _CACHE_VAR not in os.environ  # xdist workers inherit the controller's
if _OWN_CACHE:
    os.environ[_CACHE_VAR] = tempfile.mkdtemp(prefix="vccc_jax_test_cache_")
os.environ["VCCC_COMPILE_CACHE"] = os.environ[_CACHE_VAR]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program, however small
# XLA's CPU backend at optimisation level 0, for this process and the vccc subprocesses the
# tests start: compiles dominate the suite on 2 cores, and level 0 cuts the trainer tests' CPU
# time by a third (tests/train: 296 -> 196 CPU-s, paired, 2026-12-01). Results agree with the
# default level to float32 rounding; tests that compare two programs hold ulp tolerances.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()

import jax  # noqa: E402

from vccc_jax.train import compile_cache  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
if os.environ[_CACHE_VAR] != "off":
    compile_cache.apply(Path(os.environ[_CACHE_VAR]))  # in-process compiles too


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE and not hasattr(session.config, "workerinput") and os.environ[_CACHE_VAR] != "off":
        shutil.rmtree(os.environ[_CACHE_VAR], ignore_errors=True)
