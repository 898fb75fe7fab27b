"""``clusterbook run --profile NAME`` of a Slurm profile on the real Slurm test bed: the job
waits for the batch job's nodes to join, runs across them, and leaves no Slurm job behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clusterbook.config import FILE_NAME
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} on {socket.gethostname()} sum {comm.allreduce(comm.rank)}")
"""


def test_run_with_a_slurm_profile_runs_on_the_batch_job_s_nodes(
    slurm, openmpi_python: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    (config / FILE_NAME).write_text(
        '[profiles.batch]\nkind = "slurm"\nnodes = 2\nslots = 1\ntime = "5m"\n'
        f'python = "{openmpi_python}"\n'
    )
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    env = {**os.environ, "CLUSTERBOOK_CONFIG": str(config)}
    done = subprocess.run(
        [openmpi_python, "-m", "clusterbook", "run", "--profile", "batch", "-n", "2",
         "--run-dir", str(tmp_path / "cli"), "--", "python", str(script)],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}] rank {r} on {slurm.hosts[r]} sum 1" for r in range(2)
    ]
    assert "waiting for the nodes of the Slurm job" in done.stderr
    assert slurm.active_jobs() == []
