"""Launch the shards of a sweep as jobs: submitit's local executor (the default: the same
command on one machine) or a SLURM job array. Optional: nothing else in the package imports
submitit, and ``--shard i/N`` runs one shard under any other scheduler.

A shard job calls the command's own ``main`` with ``--shard i/N`` (:func:`run_shard`); it
computes the units of work it owns into its own store file (``runs.store``), so the jobs
never wait for each other, a killed one resumes alone (rerun it, or the whole launch: the
finished shards find nothing to do), and the union of their files is the one-process
result.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from vccc_jax.runs.store import Shard

LAUNCHERS = ("local", "slurm")
# submitit's defaults kill a local job after 2 min and a SLURM job after 5: far too short.
DEFAULT_OPTIONS = {"local": {"timeout_min": 60 * 24 * 30}, "slurm": {"timeout_min": 60 * 24}}


def load_submitit():
    """The optional launcher library, or ImportError saying how to get it."""
    try:
        import submitit  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(
            "--launcher needs submitit (pip install 'vccc_jax[launch]'); without it run each "
            "shard yourself: the same command with --shard i/N for i = 0..N-1") from e
    return submitit


def check(launcher: str) -> None:
    """ValueError unless ``launcher`` can start jobs here (known name, submitit installed,
    ``sbatch`` on PATH for SLURM): called before anything runs."""
    import shutil

    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    try:
        load_submitit()
    except ImportError as e:
        raise ValueError(str(e)) from None
    if launcher == "slurm" and shutil.which("sbatch") is None:
        raise ValueError("--launcher slurm: no sbatch on PATH (run it where SLURM jobs are "
                         "submitted, or use --launcher local, or --shard i/N per job)")


def parse_options(pairs: Sequence[str]) -> dict:
    """``["timeout_min=60", "slurm_partition=gpu"]`` -> {name: int | float | str}
    (submitit's parameter names: timeout_min, gpus_per_node, cpus_per_task, mem_gb,
    slurm_partition, slurm_array_parallelism, ...)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = str(pair).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--launcher-opt expects KEY=VALUE, got {pair!r}")
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                pass
        out[key.strip()] = value
    return out


def run_shard(main: Callable[[list[str]], int], argv: list[str], env: dict) -> int:
    """The body of one shard job: set ``env`` (before any jax backend starts), then run the
    command's ``main(argv)``; a non-zero exit status raises so the job shows as failed."""
    os.environ.update(env)
    status = int(main(list(argv)) or 0)
    if status:
        raise RuntimeError(f"exit status {status}")
    return status


class ShardResult(NamedTuple):
    shard: Shard
    ok: bool
    error: str  # "" when ok
    log: str  # the job's stderr file


def submit(main: Callable, argvs: Sequence[list[str]], shards: Sequence[Shard], *,
           launcher: str = "local", folder: str | Path, options: Optional[dict] = None,
           name: str = "vccc") -> list:
    """One job per shard running ``main(argv)`` (:func:`run_shard`); returns the jobs.

    ``launcher``: ``local`` (submitit's LocalExecutor: subprocesses on this machine) or
    ``slurm`` (one job array). ``options``: submitit parameters over
    :data:`DEFAULT_OPTIONS`. Local shards share this machine's accelerators, so they do not
    preallocate device memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``).
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if len(argvs) != len(shards):
        raise ValueError("one argv per shard")
    submitit = load_submitit()
    executor = submitit.AutoExecutor(folder=str(folder), cluster=launcher)
    executor.update_parameters(name=name, **{**DEFAULT_OPTIONS[launcher], **(options or {})})
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} if launcher == "local" else {}
    with executor.batch():  # a SLURM job array; local: N processes started together
        jobs = [executor.submit(run_shard, main, list(a), env) for a in argvs]
    return jobs


def wait(jobs: Sequence, shards: Sequence[Shard]) -> list[ShardResult]:
    """Block until every job ends; one :class:`ShardResult` per shard (a job killed or
    failed is reported, not raised)."""
    out = []
    for job, shard in zip(jobs, shards):
        try:
            job.result()
            out.append(ShardResult(shard, True, "", str(job.paths.stderr)))
        except Exception as e:  # noqa: BLE001  (submitit wraps the job's error)
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            out.append(ShardResult(shard, False, last[-1] if last else type(e).__name__,
                                   str(job.paths.stderr)))
    return out
