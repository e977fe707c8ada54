"""Shared by the issue-10 subprocess workers (run as scripts: their folder is on sys.path)."""

import os

# Set before jax is imported. SSE4_2 keeps XLA:CPU from contracting a*b+c into FMAs in some
# fusions and not others (the partitioned program fuses differently), which otherwise moves
# CartPole's cart position by 1 ulp (3.7e-9) between meshes.
FLAGS = "--xla_cpu_max_isa=SSE4_2"


def suite_flags() -> str:
    """The suite's compile-speed flags (tests/conftest.py: optimisation level 0), taken from
    this process's XLA_FLAGS, for a subprocess whose environment drops every other XLA_
    variable (a user's device count must not leak in)."""
    keep = ("--xla_backend_optimization_level=", "--xla_llvm_disable_expensive_passes=",
            "--xla_cpu_use_fusion_emitters=")
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f.startswith(keep))


def set_devices(n: int) -> None:
    # + the suite's flags inherited from tests/conftest.py (optimisation level 0)
    inherited = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n} {FLAGS} {inherited}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def tiny_config(**changes):
    from vccc_jax.train.trainer import TrainConfig

    base = dict(num_envs=16, num_steps=4, num_minibatches=2, update_epochs=1, hidden=8,
                lag="fixed:1", num_versions=2, critic="vccc", total_timesteps=16 * 4 * 4,
                eval_envs=0)
    base.update(changes)
    return TrainConfig(**base)


def flat(tree, prefix: str) -> dict:
    """{prefix/leafpath: numpy array} for np.savez."""
    import jax
    import numpy as np

    out = {}
    for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out[prefix + jax.tree_util.keystr(p)] = np.asarray(x)
    return out
