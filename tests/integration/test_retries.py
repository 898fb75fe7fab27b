"""Jobs that are tried again: retries, their logs, the deadline and cancel, with the real Open MPI
and the real MPICH on local clusters."""

from __future__ import annotations

import threading

import pytest

import clusterbook as cb
from clusterbook.launch.logs import read_log_file

pytestmark = pytest.mark.mpi

# Fails on its first attempt (rank 1 exits 1), succeeds on the next: the ranks see which
# attempt they are in.
FLAKY = """\
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
attempt = os.environ["CLUSTERBOOK_ATTEMPT"]
print(f"rank {comm.rank} attempt {attempt}", flush=True)
if attempt == "1" and comm.rank == 1:
    sys.exit(1)
comm.Barrier()
"""

ALWAYS_FAILS = """\
import os, sys
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 0:
    print("attempt", os.environ["CLUSTERBOOK_ATTEMPT"])
    sys.exit(2)
MPI.COMM_WORLD.Barrier()
"""


def test_a_job_that_fails_once_succeeds_on_its_retry_and_keeps_both_logs(
    mpi_python, make_cluster, program
):
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(["python", program("flaky.py", FLAKY)], np=2, retries=2, backoff=0.2)
    result = job.wait(timeout=120)

    assert result.ok, result.summary()
    assert result.attempt == 2
    assert [(a.number, a.outcome, a.failed_ranks) for a in result.attempts] == [
        (1, "failure", (1,)),
        (2, "ok", ()),
    ]
    assert result.attempts[0].reason == "rank 1 exited 1"
    assert "Attempts: 1: rank 1 exited 1" in result.summary()
    assert job.attempt == 2
    assert job.last_reason == "rank 1 exited 1"

    logs = job.logs()
    out = logs[logs.stream == "stdout"].sort_values(["attempt", "rank"])
    said = list(zip(out.attempt, out.line, strict=True))
    # Rank 0 of the first attempt may be killed (by the abort) before it prints.
    assert (1, "rank 1 attempt 1") in said
    assert [s for s in said if s[0] == 2] == [(2, "rank 0 attempt 2"), (2, "rank 1 attempt 2")]
    # Each attempt has its own files: the first in the job's directory, the next beside it.
    first = read_log_file(job.directory / "rank-1.log", 1)
    second = read_log_file(job.directory / "attempt-2" / "rank-1.log", 1, attempt=2)
    assert [r.line for r in first if r.stream == "stdout"] == ["rank 1 attempt 1"]
    assert [r.line for r in second if r.stream == "stdout"] == ["rank 1 attempt 2"]
    assert (job.directory / "attempt-2" / "result.json").exists()

    saved = cb.Job.load(job.directory)  # the same, read from the directory
    assert saved.outcome is not None
    assert saved.outcome.attempt == 2
    assert saved.outcome.attempts == result.attempts
    saved_out = saved.logs().query("stream == 'stdout'")
    assert sorted(zip(saved_out.attempt, saved_out.line, strict=True)) == sorted(
        zip(out.attempt, out.line, strict=True)
    )
    assert [s.attempt for s in cluster.snapshot().jobs] == [2]


def test_retries_end_after_the_last_attempt(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(
        ["python", program("fails.py", ALWAYS_FAILS)], np=2, retries=2, backoff=0.1
    )
    result = job.wait(timeout=120)
    assert not result.ok
    assert [a.outcome for a in result.attempts] == ["failure"] * 3
    assert result.failed_ranks == [0]
    assert "It ran 3 times (retries=2)." in result.notes
    said = job.logs().query("rank == 0 and stream == 'stdout'")
    assert list(zip(said.attempt, said.line, strict=True)) == [
        (n, f"attempt {n}") for n in (1, 2, 3)
    ]


def test_without_retries_a_failure_is_final(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(["python", program("flaky.py", FLAKY)], np=2)
    result = job.wait(timeout=120)
    assert not result.ok
    assert [a.number for a in result.attempts] == [1]
    assert not (job.directory / "attempt-2").exists()


def test_a_timeout_is_retried_only_when_asked(mpi_python, make_cluster, program):
    hangs = program(
        "hangs.py",
        "import os, time\nprint('attempt', os.environ['CLUSTERBOOK_ATTEMPT'], flush=True)\n"
        "if os.environ['CLUSTERBOOK_ATTEMPT'] == '1':\n    time.sleep(600)\n",
    )
    cluster = make_cluster(mpi_python, workers=1, slots=1)
    job = cluster.mpirun(["python", hangs], np=1, timeout=2, retries=1, backoff=0)
    assert job.wait(timeout=120).timed_out
    assert [a.outcome for a in job.outcome.attempts] == ["timeout"]

    job = cluster.mpirun(
        ["python", hangs], np=1, timeout=2, retries=1, backoff=0, retry_on=["timeout"]
    )
    result = job.wait(timeout=120)
    assert result.ok, result.summary()
    assert [a.outcome for a in result.attempts] == ["timeout", "ok"]


def test_the_deadline_ends_a_job_that_keeps_failing(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(
        ["python", program("fails.py", ALWAYS_FAILS)], np=2, retries=100, backoff=0.5, deadline=4
    )
    result = job.wait(timeout=120)
    assert result.deadline_exceeded
    assert result.state == "timed out"
    assert not result.ok
    assert 1 < len(result.attempts) < 101
    assert "stopped by its deadline" in result.summary()


def test_the_deadline_stops_a_running_attempt_and_its_ranks_show_their_stacks(
    mpi_python, make_cluster, program
):
    sleeps = program("sleeps.py", "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    cluster = make_cluster(mpi_python, workers=1, slots=1)
    job = cluster.mpirun(["python", sleeps], np=1, retries=3, deadline=3)
    result = job.wait(timeout=120)
    assert result.deadline_exceeded
    assert result.timed_out
    assert [a.outcome for a in result.attempts] == ["timeout"]
    lines = job.logs().line.tolist()
    assert any("time.sleep(600)" in line or "sleeps.py" in line for line in lines), lines


def test_cancel_during_the_delay_before_a_retry_ends_the_series(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    job = cluster.mpirun(
        ["python", program("fails.py", ALWAYS_FAILS)], np=2, retries=5, backoff=600
    )
    pause = threading.Event()
    while job.retrying_in is None and not job.done():  # until the first attempt has failed
        pause.wait(0.05)
    assert job.retrying_in is not None
    assert job.retrying_in > 500
    assert job.cancel()  # returns without waiting out the delay
    result = job.wait()
    assert result.cancelled
    assert not result.ok
    assert [a.number for a in result.attempts] == [1]
    assert job.done()
    assert not (job.directory / "attempt-2").exists()


def test_bad_recovery_arguments_are_refused_before_anything_runs(
    openmpi_python, make_cluster, program
):
    cluster = make_cluster(openmpi_python, workers=1, slots=1)
    script = program("ok.py", "print('ok')\n")
    cases = [
        ({"retries": -1}, "Retries -1 is negative"),
        ({"restarts": -1}, "Restarts -1 is negative"),
        ({"retries": 1.5}, "Retries 1.5 is not a whole number"),
        ({"retry_on": ["failures"]}, "'failures' is not an ending"),
        ({"backoff": "soon"}, "backoff must be a duration >= 0, got 'soon'"),
        ({"deadline": -3}, "deadline must be a duration > 0, got -3"),
        ({"deadline": 10, "timeout": 60}, "shorter than one attempt's timeout"),
    ]
    for args, message in cases:
        with pytest.raises(cb.ConfigError, match=message):
            cluster.mpirun(["python", script], np=1, **args)
    assert cluster.jobs == []
