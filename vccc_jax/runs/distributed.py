"""Runs over several processes (issue 10): every process computes, process 0 writes.

Starting: :func:`start` calls ``jax.distributed.initialize`` from explicit flags / VCCC_*
variables (``train.sharding.initialize_distributed``), or with no arguments when a
multi-process launcher's variables are present (:func:`detect_cluster`: SLURM with more
than one task, Open MPI's ``mpirun``, a Cloud TPU pod slice), letting JAX read them; or
when the coordinator is spelled ``auto``. It must run before any jax array exists.

A multi-host run executes the same sweep / training code on every process; the sharded
programs need all of them. Only process 0 opens the resumable result store for writing;
the others read a snapshot of it (:class:`SnapshotStore`), and the set of cells still to
compute is process 0's (:func:`agree`), so all processes run the same programs in the same
order. (Sharding a *sweep* over machines is another axis: ``runs.store.Shard``, one store
file per writer; each shard may itself be a multi-process run.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from vccc_jax.runs.store import ResultStore, Shard, rows_by_id

AUTO = "auto"  # --coordinator auto / VCCC_COORDINATOR=auto: jax.distributed.initialize()


def _count(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env.get(name, "") or 0)
    except ValueError:
        return 0


def detect_cluster(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The multi-process launcher whose variables JAX's ``jax.distributed.initialize()``
    reads by itself, when it started more than one process; else None.

    * ``"slurm"``: SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_PROCID, SLURM_LOCALID and
      SLURM_NTASKS > 1 (``srun -n 4 vccc ...``; a one-task job, e.g. one array task of a
      sharded sweep, is a single process and starts nothing);
    * ``"ompi"``: OMPI_MCA_orte_hnp_uri and OMPI_COMM_WORLD_SIZE > 1 (``mpirun -n 4``);
    * ``"tpu"``: TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES naming more than one host
      (a multi-host TPU slice), or MEGASCALE_COORDINATOR_ADDRESS (multislice).
      A TPU VM pod that exposes its hosts only through the metadata server is not seen
      here: pass ``--coordinator auto``.
    """
    env = os.environ if environ is None else environ
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
             "SLURM_LOCALID")
    if all(k in env for k in slurm) and _count(env, "SLURM_NTASKS") > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env and _count(env, "OMPI_COMM_WORLD_SIZE") > 1:
        return "ompi"
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    if len([h for h in hosts.split(",") if h.strip()]) > 1 or env.get(
            "MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    return None


def plan_start(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None,
               environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """How :func:`start` would start: ``"explicit"`` (a coordinator address from the flags
    or VCCC_COORDINATOR), ``"auto"`` (``--coordinator auto``), a cluster name of
    :func:`detect_cluster`, or None (one process). Pure: reads ``environ`` only."""
    env = os.environ if environ is None else environ
    spelled = coordinator or env.get("VCCC_COORDINATOR") or None
    if spelled is not None and spelled.strip().lower() == AUTO:
        return AUTO
    if spelled is not None:
        return "explicit"
    if num_processes is not None or process_id is not None:
        raise ValueError("--num-processes/--process-id need --coordinator HOST:PORT "
                         "(or --coordinator auto)")
    return detect_cluster(env)


def start(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
          process_id: Optional[int] = None, *,
          environ: Optional[Mapping[str, str]] = None) -> bool:
    """Start ``jax.distributed`` as :func:`plan_start` says; returns whether it started.
    The explicit flags keep their meaning; ``num_processes`` / ``process_id`` may be given
    with ``auto`` to override what JAX detects."""
    how = plan_start(coordinator, num_processes, process_id, environ)
    if how is None:
        return False
    if how == "explicit":
        from vccc_jax.train.sharding import initialize_distributed

        return initialize_distributed(coordinator, num_processes, process_id, environ=environ)
    import jax

    # CPU processes need a cross-process collectives backend (no effect on GPU / TPU)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(num_processes=num_processes, process_id=process_id)
    return True


def process_index() -> int:
    import jax

    return jax.process_index()


def is_main() -> bool:
    """Whether this process writes results (process 0; always True on one process)."""
    return process_index() == 0


def agree(flags: Sequence[bool]) -> list[bool]:
    """Process 0's ``flags`` on every process (identity on one process)."""
    import jax

    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    from jax.experimental import multihost_utils

    got = multihost_utils.broadcast_one_to_all(np.asarray(flags, dtype=np.int32))
    return [bool(f) for f in np.asarray(got)]


class SnapshotStore(ResultStore):
    """The read side of a :class:`ResultStore` for processes other than 0: the union of the
    store's files read once at open; ``append`` only remembers the row (process 0 writes)."""

    def open(self) -> "SnapshotStore":
        self._rows = rows_by_id(self.path)
        return self

    def close(self) -> None:
        return None

    def append(self, row: dict) -> bool:
        if row["id"] in self._rows:
            return False
        self._rows[row["id"]] = row
        return True


def open_store(path: str | Path, *, wait: bool = False, shard: Optional[Shard] = None):
    """A :class:`ResultStore` on process 0, a :class:`SnapshotStore` elsewhere."""
    return (ResultStore if is_main() else SnapshotStore)(path, wait=wait, shard=shard)
