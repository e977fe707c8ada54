"""Suite-wide settings: strict rank promotion, as the project's conventions require; JAX's
persistent compilation cache off for ``vccc`` commands run by tests (in process or as
subprocesses that inherit the environment), so no test writes into the user's cache home.
(A cache shared by the run's processes was tried: it saved 21% CPU on the kill / resume /
shard tests but cost the whole suite 733 s vs 662 s wall, mostly system time writing every
small executable to disk, 2026-12-01.)"""
import os

os.environ["VCCC_COMPILE_CACHE"] = "off"
# XLA's CPU backend at optimisation level 0, for this process and the vccc subprocesses the
# tests start: compiles dominate the suite on 2 cores, and level 0 cuts the trainer tests' CPU
# time by a third (tests/train: 296 -> 196 CPU-s, paired, 2026-12-01). Results agree with the
# default level to float32 rounding; tests that compare two programs hold ulp tolerances.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
