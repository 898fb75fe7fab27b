"""What is left of a finished job's processes (``clean=``), with the real Open MPI and the real
MPICH on local clusters: ``"none"`` keeps a failed job's ranks stopped (state T) until
``job.cleanup()`` or the cluster's ``stop()``; the default leaves nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

import clusterbook as cb
from clusterbook.nodes.tasks.procs import leftovers
from tests.conftest import processes_mentioning, wait_gone

pytestmark = pytest.mark.mpi

# Rank 1 fails while rank 0 waits for it in a collective.
RAISES = """\
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} up", flush=True)
if comm.rank == 1:
    time.sleep(0.3)
    raise RuntimeError("rank 1 gives up")
comm.Barrier()
"""

# The same without a Python exception: the process just ends (as a C program would).
EXITS = """\
import os, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 1:
    time.sleep(0.3)
    os._exit(3)
comm.Barrier()
"""

FLAKY = """\
import os, sys
from mpi4py import MPI
if os.environ["CLUSTERBOOK_ATTEMPT"] == "1" and MPI.COMM_WORLD.rank == 1:
    sys.exit(4)
MPI.COMM_WORLD.Barrier()
"""


def tagged(token: str) -> list[psutil.Process]:
    """Live processes of job ``token`` (a zombie has ended)."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("CLUSTERBOOK_JOB") == token:
                found.append(p)
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def tokens() -> Iterator[list[str]]:
    """Jobs whose processes are killed at teardown, whatever happened (a test that failed
    before its cleanup): a stopped process ends only with SIGKILL."""
    seen: list[str] = []
    yield seen
    for token in seen:
        for p in tagged(token):
            with contextlib.suppress(psutil.Error):
                p.kill()
                p.resume()


def test_clean_none_keeps_the_ranks_stopped_until_cleanup(
    tokens: list[str], mpi_python: str, make_cluster, program
) -> None:
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(["python", program("raises.py", RAISES)], np=2, clean="none")
    tokens.append(job.plan.job_token)
    started = time.monotonic()
    result = job.wait(timeout=60)  # the job ends though its processes stay
    assert time.monotonic() - started < 20

    assert result.failed_ranks == [1]
    assert "RuntimeError: rank 1 gives up" in result.failed[0].last_lines
    assert result.rank_exit_codes == {0: None, 1: 1}
    assert result.returncode == -signal.SIGSTOP
    ranks = {k.rank: k for k in result.kept if k.rank is not None}
    assert sorted(ranks) == [0, 1]
    assert {k.host for k in result.kept} == {os.uname().nodename}
    assert job.pid in {k.pid for k in result.kept}  # the launcher, stopped with them
    time.sleep(0.5)  # still there a while later, where they were
    for kept in result.kept:
        assert psutil.Process(kept.pid).status() == psutil.STATUS_STOPPED, kept
    assert psutil.Process(ranks[0].pid).cmdline()[-1].endswith("raises.py")
    assert f"rank 0 pid {ranks[0].pid}" in result.summary()
    assert {p.pid for p in tagged(job.plan.job_token)} == {k.pid for k in result.kept}
    assert [r.line for r in job.logs(0).itertuples() if r.stream == "stdout"] == ["rank 0 up"]

    # What their MPI keeps (shared memory, the launcher's session directory) goes with them.
    debris = leftovers([k.pid for k in result.kept])
    assert debris, "the job made no shared memory segment to check"
    job.cleanup()
    assert not [k for k in result.kept if alive(k.pid)]
    assert tagged(job.plan.job_token) == []
    assert [path for path in debris if os.path.exists(path)] == []
    job.cleanup()  # twice is nothing more
    assert cb.Job.load(job.directory).outcome == result  # its file says what was kept


def test_clean_none_keeps_the_others_when_a_program_just_exits(
    tokens: list[str], mpi_python: str, make_cluster, program
) -> None:
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(["python", program("exits.py", EXITS)], np=2, clean="none")
    tokens.append(job.plan.job_token)
    result = job.wait(timeout=60)
    assert result.failed_ranks == [1]
    assert result.rank_exit_codes == {0: None, 1: 3}
    (rank0,) = [k for k in result.kept if k.rank is not None]  # rank 1's program has ended
    assert rank0.rank == 0
    assert psutil.Process(rank0.pid).status() == psutil.STATUS_STOPPED
    job.cleanup()
    assert tagged(job.plan.job_token) == []


def test_the_clusters_stop_ends_what_a_job_kept(
    tokens: list[str], mpi_python: str, make_cluster, program
) -> None:
    cluster = make_cluster(mpi_python, workers=2, slots=1)
    job = cluster.mpirun(["python", program("raises.py", RAISES)], np=2, clean="none")
    tokens.append(job.plan.job_token)
    result = job.wait(timeout=60)
    assert len([k for k in result.kept if k.rank is not None]) == 2
    cluster.stop()
    assert not [k for k in result.kept if alive(k.pid)]
    assert tagged(job.plan.job_token) == []


@pytest.mark.parametrize("clean", [None, "all", "running"])
def test_other_policies_leave_nothing(
    tokens: list[str], mpi_python: str, make_cluster, program, clean: str | None
) -> None:
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    how = {} if clean is None else {"clean": clean}
    job = cluster.mpirun(["python", program("raises.py", RAISES)], np=2, **how)
    tokens.append(job.plan.job_token)
    result = job.wait(timeout=60)
    assert result.failed_ranks == [1]
    assert result.kept == ()
    assert "Kept" not in result.summary()
    assert tagged(job.plan.job_token) == []


def test_a_retried_job_ends_what_its_failed_attempt_kept(
    tokens: list[str], mpi_python: str, make_cluster, program
) -> None:
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    flaky = program("flaky.py", FLAKY)
    job = cluster.mpirun(["python", flaky], np=2, clean="none", retries=1, backoff=0)
    tokens.append(job.plan.job_token)
    result = job.wait(timeout=60)
    assert result.ok, result.summary()
    assert [a.outcome for a in result.attempts] == ["failure", "ok"]
    assert result.kept == ()
    assert tagged(tokens[0]) == []  # the first attempt's


def _waits(cluster: cb.Cluster, program: Callable[[str, str], str]) -> cb.Job:
    sleeper = program("sleeps.py", "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    job = cluster.mpirun(["python", sleeper], np=2, clean="none", timeout=2)
    assert isinstance(job, cb.Job)
    return job


def test_a_timeout_or_a_cancel_keeps_nothing(
    tokens: list[str], mpi_python: str, make_cluster, program
) -> None:
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = _waits(cluster, program)
    tokens.append(job.plan.job_token)
    result = job.wait(timeout=60)
    assert result.timed_out
    assert result.kept == ()
    assert tagged(job.plan.job_token) == []

    job = _waits(cluster, program)
    tokens.append(job.plan.job_token)
    for _ in job.stream():
        break
    started = time.monotonic()
    assert job.cancel()
    result = job.wait()
    assert result.cancelled
    assert result.kept == ()
    assert time.monotonic() - started < 10
    assert tagged(job.plan.job_token) == []


DRIVER = """\
import sys, time
import clusterbook as cb
python, script, run_dir = sys.argv[1:4]
cluster = cb.Cluster.local(1, 2, python=python, run_dir=run_dir).start()
result = cluster.mpirun(["python", script], np=2, clean="none").wait(timeout=60)
print(len(result.kept), flush=True)
time.sleep(600)
"""


def test_what_a_job_kept_dies_with_the_python_process_that_kept_it(
    mpi_python: str, tmp_path, program
) -> None:
    script = program("raises.py", RAISES)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, mpi_python, script, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        assert int(driver.stdout.readline()) >= 2
        kept = [p for p in processes_mentioning(script) if p.pid != driver.pid]
        assert kept
        assert {p.status() for p in kept} == {psutil.STATUS_STOPPED}
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        survivors = wait_gone(script, timeout=3.0)
        assert survivors == [], [p.cmdline() for p in survivors]
    finally:
        driver.kill()
        driver.wait(timeout=10)
        if driver.stdout is not None:
            driver.stdout.close()
        for p in processes_mentioning(script):
            p.kill()
