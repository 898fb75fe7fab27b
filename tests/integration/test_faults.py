"""Faults on this machine: a full disk under the run directory, a run directory used twice,
a failing background thread. Nothing may hang, nothing may be lost without being said."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.logs import read_log_file
from tests.conftest import mpi_debris

pytestmark = pytest.mark.mpi

CHATTY = """\
import sys
for i in range(4000):
    print(f"line {i:05d} " + "x" * 990, flush=True)
print("done", flush=True)
"""


def stops_within(cluster: cb.Cluster, seconds: float) -> bool:
    stopper = threading.Thread(target=cluster.stop, daemon=True)
    stopper.start()
    stopper.join(seconds)
    return not stopper.is_alive()


@pytest.mark.root
def test_a_full_disk_fails_the_job_clearly_and_nothing_hangs(
    openmpi_python: str, small_disk: Path, program
) -> None:
    run_dir = small_disk / "run"
    cluster = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=run_dir).start()
    try:
        job = cluster.mpirun(["python", program("chatty.py", CHATTY)], np=1, timeout=120)
        result = job.wait(timeout=60)  # returns: the job is stopped, not left hanging
        assert not result.ok
        assert result.error is not None
        assert str(run_dir / "jobs" / job.id) in result.error
        assert "no space left" in result.error
        with pytest.raises(cb.ClusterError, match="no space left"):
            result.check()
        assert isinstance(job.error, cb.RunDirError)
        # What could not be written is still in memory.
        on_disk = read_log_file(job.directory / "rank-0.log", 0)
        in_memory = job.logs(rank=0).line.tolist()
        assert len(in_memory) > len(on_disk)
        # (the last line on disk may be cut where the space ended)
        assert in_memory[: len(on_disk) - 1] == [r.line for r in on_disk[:-1]]
        assert in_memory[len(on_disk) - 1].startswith(on_disk[-1].line)
        # The next job cannot even get a directory: a clear error, not a raw OSError.
        with pytest.raises(cb.RunDirError, match="no space left") as caught:
            cluster.mpirun(["python", "-c", "pass"], np=1)
        assert str(run_dir / "jobs") in str(caught.value)
    finally:
        assert stops_within(cluster, 30), "cluster.stop() hung"
    assert cluster.state == "stopped"


def test_a_run_directory_used_twice_numbers_jobs_after_the_existing_ones(
    openmpi_python: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    ids = []
    for _ in range(2):
        with cb.Cluster.local(1, 1, python=openmpi_python, run_dir=run_dir) as cluster:
            for _ in range(2):
                job = cluster.mpirun(["python", "-c", "print('hi')"], np=1, timeout=60)
                assert job.wait().ok
                ids.append(job.id)
    assert ids == ["job-0001", "job-0002", "job-0003", "job-0004"]
    assert sorted(p.name for p in (run_dir / "jobs").iterdir()) == ids
    for job_id in ids:  # each job's log is its own
        (record,) = read_log_file(run_dir / "jobs" / job_id / "rank-0.log", 0)
        assert record.line == "hi"


STUBBORN = """\
import signal, time
from mpi4py import MPI
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it: MPI cannot clean up
MPI.COMM_WORLD.Barrier()
print("up", flush=True)
time.sleep(600)
"""


@pytest.mark.alone  # what it checks is every MPI job's files in /dev/shm and /tmp
def test_a_killed_job_leaves_no_shared_memory_or_session_directory(
    mpi_python: str, make_cluster, program
) -> None:
    before = mpi_debris()
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(["python", program("stubborn.py", STUBBORN)], np=2, timeout=120)
    started = 0
    for record in job.stream():
        started += record.line == "up"
        if started == 2:
            break
    during = mpi_debris() - before
    assert during, "the job made no shared memory segment to check"
    assert job.cancel()
    result = job.wait()
    assert result.cancelled
    assert mpi_debris() - before == set()
