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
# XLA:CPU's legacy elemental emitters (--xla_cpu_use_fusion_emitters=false) compile a trainer
# 2.7x faster than its MLIR fusion emitters (train program 4.7 -> 1.7 s) and took the suite
# from 19:05 to 10:30-11:47 (same machine, 2026-12-03). The few tests that compare two
# *different* programs bit for bit compile both with the default emitters
# (tests/train/_exact_programs.py): the legacy ones fuse and contract them differently.
_FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                 " --xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# `make test` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`: xdist hands whole files
# to the two workers in collection order (its default order, most tests first, put heavy files
# with few tests last, where one of them alone could keep a worker busy while the other idled).
# The files below (the heaviest, by measured CPU time; a subprocess-heavy file counts its
# subprocesses) go first, longest first, so the many small files fill in at the end
# (greedy longest-processing-time order). Every other file keeps its place after them.
HEAVY_FIRST = (
    "tests/train/test_sharding.py",
    "tests/train/test_async_mesh.py",  # subprocesses on forced host devices
    "tests/verify/test_verify.py",
    "tests/verify/test_lag_law.py",
    "tests/tabular/test_async_ac.py",
    "tests/verify/test_byo.py",
    "tests/train/test_trainer.py",
    "tests/train/test_chunked_runs.py",  # in-process part of test_sharding.py (42 CPU-s)
    "tests/train/test_conformance.py",
    "tests/verify/test_adapters.py",
    "tests/train/test_checkpoint_kill.py",
    "tests/verify/test_injected_bugs.py",
    "tests/runs/test_launch.py",
    "tests/runs/test_resume.py",
    "tests/runs/test_actor_map.py",
    "tests/train/test_compile_cache.py",
    "tests/tabular/test_critic.py",
    "tests/commands/test_train.py",
    "tests/runs/test_results.py",
    "tests/train/test_trainer_envs.py",
    "tests/train/test_topk_centering.py",
    "tests/runs/test_sharded_sweep.py",
    "tests/envs/test_token_samplers.py",
    "tests/commands/test_train_critic_free.py",
    "tests/verify/test_lqr_rows.py",
    "tests/tabular/test_lqr.py",
)


def pytest_collection_modifyitems(session, config, items):
    root = config.rootpath
    missing = [path for path in HEAVY_FIRST if not (root / path).is_file()]
    assert not missing, f"tests/conftest.py HEAVY_FIRST names files that do not exist: {missing}"
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))  # stable
