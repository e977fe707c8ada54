"""Starting jax.distributed (issue 22): explicit flags keep their meaning; SLURM, Open MPI
and TPU pod launches of more than one process are detected from their variables and start
``jax.distributed.initialize()`` with no arguments (JAX reads them). Fake environments
only: nothing is initialised (``jax.distributed.initialize`` is replaced by a recorder)."""

import jax
import pytest

from vccc_jax.runs import distributed as dist

SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2",
         "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
OMPI = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1:34911",
        "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}


def test_detect_cluster_from_fake_environments():
    assert dist.detect_cluster({}) is None
    assert dist.detect_cluster(SLURM) == "slurm"
    assert dist.detect_cluster(dict(SLURM, SLURM_NTASKS="1")) is None  # one task: one process
    assert dist.detect_cluster({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}) is None
    assert dist.detect_cluster(OMPI) == "ompi"
    assert dist.detect_cluster(dict(OMPI, OMPI_COMM_WORLD_SIZE="1")) is None
    assert dist.detect_cluster({"OMPI_COMM_WORLD_SIZE": "4"}) is None  # not launched by mpirun
    assert dist.detect_cluster({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3"}) == "tpu"
    assert dist.detect_cluster({"TPU_PROCESS_ADDRESSES": "a:1,b:1"}) == "tpu"
    assert dist.detect_cluster({"TPU_WORKER_HOSTNAMES": "localhost"}) is None  # one host
    assert dist.detect_cluster({"MEGASCALE_COORDINATOR_ADDRESS": "h:8080"}) == "tpu"
    # submitit's local executor (a shard job) is one process: nothing to start
    assert dist.detect_cluster({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "1"}) is None


def test_plan_start_precedence():
    assert dist.plan_start(environ={}) is None
    assert dist.plan_start("10.0.0.1:99", 2, 0, environ=SLURM) == "explicit"  # flags win
    assert dist.plan_start(environ=dict(SLURM, VCCC_COORDINATOR="h:1")) == "explicit"
    assert dist.plan_start("auto", environ={}) == "auto"
    assert dist.plan_start(environ={"VCCC_COORDINATOR": "AUTO"}) == "auto"
    assert dist.plan_start(environ=OMPI) == "ompi"
    with pytest.raises(ValueError, match="need --coordinator"):
        dist.plan_start(None, 2, 0, environ={})


@pytest.fixture
def recorder(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.config, "update", lambda *a: calls.append(a))
    return calls


def test_start_calls_initialize_without_arguments_when_detected(recorder):
    assert dist.start(environ={}) is False and recorder == []
    assert dist.start(environ=SLURM) is True
    assert recorder == [("jax_cpu_collectives_implementation", "gloo"),
                        {"num_processes": None, "process_id": None}]
    recorder.clear()
    assert dist.start("auto", 8, 3, environ={}) is True  # auto with explicit overrides
    assert recorder[-1] == {"num_processes": 8, "process_id": 3}
    recorder.clear()
    assert dist.start("127.0.0.1:5", 2, 1, environ=SLURM) is True  # the explicit flags
    assert recorder[-1] == {"coordinator_address": "127.0.0.1:5", "num_processes": 2,
                            "process_id": 1, "initialization_timeout": 300}
