"""The Slurm providers pass the provider contract: a batch job's cluster with Slurm's
commands answered by FakeSlurm (its job stays queued: no node comes), and the nodes of an
allocation reached through a stand-in ``srun`` that runs each node task here (as the
existing srun tests run it), the node program itself."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from clusterbook.providers.slurm.provider import SlurmProvider
from clusterbook.providers.slurm.srun import SrunProvider
from clusterbook.testing import FakeSlurm
from tests.sdk.providers.contract import ProviderCase, ProviderContract
from tests.sdk.providers.slurm.test_srun import FakeSrun

ACTIVE = ("PENDING", "RUNNING", "CONFIGURING")


class SlurmCase(ProviderCase):
    kind = "slurm"
    comes_up = False  # FakeSlurm queues the job and never runs it

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.slurm = FakeSlurm(reason="Priority")

    def make(self) -> SlurmProvider:
        return SlurmProvider(nodes=2, runner=self.slurm, poll_interval=0.05)

    def failing(self) -> SlurmProvider:
        refused = FakeSlurm(refuse="sbatch: error: invalid partition specified: nope")
        return SlurmProvider(nodes=2, partition="nope", runner=refused)

    def miss(self, provider: SlurmProvider) -> str:  # type: ignore[override]
        return f"Slurm job {provider.job_id} is PENDING (Priority)"

    def leftovers(self, cluster_id: str) -> list[str]:
        return [f"Slurm job {n} is {s}" for n, (s, _) in self.slurm.jobs.items() if s in ACTIVE]


class LocalSrun(FakeSrun):
    """srun whose one-task steps run their command here, as srun runs it on the node; the
    start check reports each node's MPI world as FakeSrun does."""

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        if argv[0] == "scontrol" or any(a.startswith("--mpi=") for a in argv):
            return super().__call__(argv, env, timeout)
        self.calls.append(argv)
        command = argv[1:]
        while command[0].startswith("--"):  # srun's options, then the task's command
            command = command[1:]
        done = subprocess.run(
            command, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
        labelled = "".join(f"0: {line}\n" for line in done.stdout.splitlines())
        return subprocess.CompletedProcess(argv, done.returncode, labelled, done.stderr)


class SrunCase(ProviderCase):
    kind = "srun"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def make(self) -> SrunProvider:
        return SrunProvider(["snode1:2", "snode2:2"], job_id=42, srun="sh", runner=LocalSrun())

    def failing(self) -> SrunProvider:
        # MPI does not start on the nodes: the start check fails, naming them.
        broken = LocalSrun(code=1)
        return SrunProvider(["snode1:2", "snode2:2"], job_id=42, srun="sh", runner=broken)


class TestSlurmProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> SlurmCase:
        return SlurmCase(tmp_path)


class TestSrunProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> SrunCase:
        return SrunCase(tmp_path)
