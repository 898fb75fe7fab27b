"""GPUs as slots on real local clusters, with real Open MPI and MPICH: a stand-in
``nvidia-smi`` first on the PATH this machine's probe sees lists four GPUs (this machine has
none), and every rank gets its own GPU in ``CUDA_VISIBLE_DEVICES``; a job's own value stays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterbook.testing import fake_nvidia_smi

pytestmark = pytest.mark.mpi

SHOW = (
    "import os; from mpi4py import MPI; "
    "print(MPI.COMM_WORLD.rank, os.environ['LOCAL_RANK'], "
    "os.environ.get('CUDA_VISIBLE_DEVICES', '-'), os.environ.get('CUDA_DEVICE_ORDER', '-'), "
    "flush=True)"
)


@pytest.fixture
def four_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = fake_nvidia_smi(tmp_path / "smi", 4)
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


def lines(job) -> list[list[str]]:  # type: ignore[no-untyped-def]
    result = job.wait(60)
    assert result.ok, result.summary()
    return sorted(line.split() for line in job.logs()["line"])


def test_each_rank_gets_its_own_gpu_and_a_jobs_own_choice_stays(
    mpi_python, make_cluster, four_gpus
):
    cluster = make_cluster(mpi_python, workers=2, slots="gpus")
    status = cluster.status()
    # The machine's 4 GPUs shared out: 2 each (each agent saw all 4 of them).
    assert status["slots"].tolist() == [2, 2]
    assert status["gpus"].tolist() == [2, 2]
    assert set(status["gpu_model"]) == {"NVIDIA A100-SXM4-40GB"}
    # Local rank i gets GPU i, numbered as nvidia-smi numbers them.
    job = cluster.mpirun(["python", "-c", SHOW], np=4, oversubscribe=True)
    assert lines(job) == [[str(r), str(r), str(r), "PCI_BUS_ID"] for r in range(4)]
    # A job that sets CUDA_VISIBLE_DEVICES keeps it, and its device order too.
    mine = cluster.mpirun(["python", "-c", SHOW], np=2, env={"CUDA_VISIBLE_DEVICES": "3,2"})
    assert lines(mine) == [["0", "0", "3,2", "-"], ["1", "1", "3,2", "-"]]


def test_the_gpus_this_process_may_use_are_the_clusters(
    mpi_python, make_cluster, four_gpus, monkeypatch
):
    # A kernel started with CUDA_VISIBLE_DEVICES: the cluster has those GPUs, in that order.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    cluster = make_cluster(mpi_python, workers=1, slots="gpus")
    assert cluster.status()["slots"].tolist() == [2]
    job = cluster.mpirun(["python", "-c", SHOW], np=2)
    assert lines(job) == [["0", "0", "3", "PCI_BUS_ID"], ["1", "1", "1", "PCI_BUS_ID"]]
