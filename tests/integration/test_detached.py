"""Clusters that outlive the process that started them, with real processes and real MPI:
detached clusters and their supervisor, attached handles that run and cancel jobs through the
head's control server, and ephemeral clusters (cb.run)."""

from __future__ import annotations

import datetime
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.head.control import ControlClient, unix_dial
from clusterbook.rendezvous.agent import HEAD_LEASE
from tests.conftest import processes_mentioning, rank_lines, ranks_started, wait_gone

CLI = [sys.executable, "-m", "clusterbook"]

# Starts a detached cluster and a job that runs past the death of this process.
STARTER = """\
import sys
import clusterbook as cb
python, script, go, name = sys.argv[1:5]
cluster = cb.Cluster.local(1, 2, python=python, name=name, detached=True).start()
job = cluster.mpirun(["python", script, go], np=2)
seen = 0
for record in job.stream():
    seen += record.line.startswith("line 4")
    if seen == 2:
        break
print(cluster.id, flush=True)
import time
time.sleep(600)
"""

RANKS = """\
import os, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for i in range(5):
    print(f"line {i} of rank {rank}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
for i in range(5, 300):
    print(f"line {i} of rank {rank}", flush=True)
"""


def _wait(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def stop_left(tmp_path):
    """Clusters to stop at teardown, whatever the test did (a detached one outlives it)."""
    ids: list[str] = []
    yield ids
    for cluster_id in ids:
        subprocess.run([*CLI, "stop", cluster_id], capture_output=True, timeout=60)


def test_a_detached_cluster_survives_the_sigkill_of_its_starter(
    openmpi_python, tmp_path, stop_left
):
    script, go = tmp_path / "ranks.py", tmp_path / "go"
    script.write_text(RANKS)
    name = f"dt-{os.getpid()}"
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, openmpi_python, str(script), str(go), name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        cluster_id = starter.stdout.readline().strip()
        stop_left.append(cluster_id)
        assert cluster_id.startswith(name)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=10)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        if starter.stdout is not None:
            starter.stdout.close()
    go.touch()  # the job goes on without the process that started it, and ends
    attached = cb.Cluster.attach(cluster_id)
    assert attached.state == "running"
    assert attached.record.detached
    result = attached.job("job-0001").wait(60)
    assert result.ok, result.summary()
    # Every line of the job's logs, from its files, in another process.
    logs = attached.job("job-0001").logs()
    for rank in (0, 1):
        lines = logs["line"][logs["rank"] == rank].tolist()
        assert lines == [f"line {i} of rank {rank}" for i in range(300)]
    head = psutil.Process(attached.record.head_pid)
    agents = [p for p in head.children(recursive=True)]
    assert agents  # its node agents, under the supervisor
    attached.stop()
    assert attached.state == "stopped"
    assert "attached handle" in (attached.record.stop_reason or "")
    # stop() returns once the supervisor's process has ended (a zombie waits for its parent).
    assert not head.is_running() or head.status() == psutil.STATUS_ZOMBIE
    _gone, alive = psutil.wait_procs([head, *agents], timeout=10)
    assert alive == []
    assert not wait_gone(str(script), 5)


def test_a_detached_cluster_from_this_process_runs_jobs_and_has_a_day_long_life(
    openmpi_python, tmp_path
):
    cluster = cb.Cluster.local(1, 2, python=openmpi_python, detached=True)
    try:
        cluster.start()
        record = cluster.attach(cluster.id).record
        assert record.detached
        assert record.head_pid != os.getpid()
        assert record.life_span == 12 * 3600  # nothing runs forever by accident
        assert 11.9 * 3600 < (cluster.time_left or 0) <= 12 * 3600
        cluster.wait_ready(30)  # asked of the supervisor
        job = cluster.mpirun(["python", "-c", "print('hello')"], np=2)
        assert job.wait(60).ok
        assert rank_lines(job) == ["hello", "hello"]
        assert [j.id for j in cluster.jobs] == ["job-0001"]
        _wait(lambda: cluster.status()["state"].tolist() == ["joined"])
        with pytest.raises(cb.ProgramNotFoundError, match="no-such-program"):
            cluster.mpirun(["no-such-program"], np=1)
        with pytest.raises(cb.ClusterStateError, match="runs in another process"):
            cluster.engines()
    finally:
        cluster.stop()
    assert cluster.state == "stopped"
    assert cb.Cluster.attach(cluster.id).state == "stopped"
    assert cb.Cluster.attach(cluster.id).record.stop_reason == "stop() was called"
    assert not (Path(cluster.run_dir) / "token").exists()


def test_a_detached_cluster_takes_durations_as_timedeltas_and_text(openmpi_python, tmp_path):
    # Its supervisor makes it again from its arguments: a timedelta travels as its seconds.
    cluster = cb.Cluster.local(
        1, 1, python=openmpi_python, detached=True, life_span=datetime.timedelta(hours=2),
        idle_timeout=datetime.timedelta(minutes=30), retention="1d",
    )  # fmt: skip
    try:
        cluster.start()
        record = cluster.attach(cluster.id).record
        assert (record.life_span, record.idle_timeout) == (7200.0, 1800.0)
        cluster.wait_ready("30s")
        job = cluster.mpirun(["true"], np=1, timeout=datetime.timedelta(minutes=5), deadline="1h")
        assert job.wait(datetime.timedelta(minutes=1)).ok
    finally:
        cluster.stop()
    assert cluster.state == "stopped"


def test_a_detached_cluster_has_one_name_whichever_process_reads_it(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 1, python=openmpi_python, detached=True)
    try:
        cluster.start()
        name = cluster.name  # made here; the supervisor makes the cluster again from its spec
        other = subprocess.run(
            [sys.executable, "-c", (
                "import sys, clusterbook as cb\n"
                "c = cb.Cluster.attach(sys.argv[1])\n"
                "print(c.id, c.name, c.state)\n"
            ), name],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr
        assert other.stdout.split() == [cluster.id, name, "running"]
        assert cb.Cluster.attach(cluster.id).record.name == name
        frame = cb.clusters()
        assert frame.loc[frame["id"] == cluster.id, "name"].tolist() == [name]
        listed = subprocess.run([*CLI, "ls"], capture_output=True, text=True, timeout=60)
        rows = [line.split() for line in listed.stdout.splitlines()]
        assert [r[1] for r in rows if r[0] == cluster.id] == [name]
        # Its files on this machine (and on nodes) are named by its id, the unique one.
        assert (Path.home() / ".clusterbook" / "clusters" / cluster.id / "token").exists()
    finally:
        cluster.stop()
    assert not (Path.home() / ".clusterbook" / "clusters" / cluster.id).exists()


def test_an_attached_handle_runs_and_cancels_jobs_through_the_head(openmpi_python, tmp_path):
    with cb.Cluster.local(1, 2, python=openmpi_python, run_dir=tmp_path / "c") as cluster:
        other = subprocess.run(
            [sys.executable, "-c", (
                "import sys, clusterbook as cb\n"
                "c = cb.Cluster.attach(sys.argv[1])\n"
                "job = c.mpirun(['python', '-c', 'import time; time.sleep(60)'], np=1)\n"
                "print(job.id, flush=True)\n"
                "print(job.cancel() and job.outcome.cancelled)\n"
                "print(c.mpirun(['python', '-c', 'print(7 * 6)'], np=2).wait(60).ok)\n"
            ), cluster.id],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr
        assert other.stdout.split() == ["job-0001", "True", "True"]
        # The jobs are the head's own: it ran them, logged them, and knows how they ended.
        assert [j.id for j in cluster.jobs] == ["job-0001", "job-0002"]
        assert cluster.jobs[0].outcome is not None
        assert cluster.jobs[0].outcome.cancelled
        assert rank_lines(cluster.jobs[1]) == ["42", "42"]


def test_the_control_server_refuses_who_does_not_know_the_secret(openmpi_python, tmp_path):
    with cb.Cluster.local(1, 1, python=openmpi_python, run_dir=tmp_path / "c") as cluster:
        record = cb.Cluster.attach(cluster.id).record
        sock = tmp_path / "c" / "control.sock"
        assert record.address == str(sock)
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert oct(sock.lstat().st_mode & 0o777) == "0o600"
        token = tmp_path / "c" / "token"
        assert oct(token.stat().st_mode & 0o777) == "0o600"
        wrong = tmp_path / "wrong"
        wrong.write_text("ab" * 32 + "\n")
        wrong.chmod(0o600)
        with pytest.raises(cb.ClusterStateError, match="do not share the cluster's secret"):
            ControlClient(unix_dial(sock), wrong, where=str(sock)).call("stop")
        assert cluster.state == "running"
        right = ControlClient(unix_dial(sock), token, where=str(sock))
        with pytest.raises(cb.ClusterStateError, match="does not know request 'format_disk'"):
            right.call("format_disk")
        right.close()


def test_cb_run_starts_runs_and_tears_down_also_on_failure(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 2, python=openmpi_python)
    result = cb.run(["python", "-c", "print('x')"], np=2, cluster=cluster)
    assert result.ok
    assert cluster.state == "stopped"
    failing = cb.Cluster.local(1, 2, python=openmpi_python)
    bad = cb.run(["python", "-c", "raise SystemExit(3)"], np=2, cluster=failing)
    assert not bad.ok
    assert failing.state == "stopped"
    with pytest.raises(cb.ClusterStateError, match=r"cb\.run\(\) starts and stops its cluster"):
        cb.run(["true"], cluster=failing)


def test_cb_run_interrupted_cancels_the_job_and_stops_the_cluster(openmpi_python, tmp_path):
    program = (
        "import signal, sys, clusterbook as cb\n"
        # As a terminal's Python has it, whatever this one inherits: a Python started with
        # SIGINT ignored keeps it ignored, and the job then runs to its end.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        # A blocked SIGINT is inherited as well (a test runner's worker may block it): the
        # signal would wait, pending, until the job ended.
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
        "c = cb.Cluster.local(1, 2, python=sys.argv[1], run_dir=sys.argv[2])\n"
        "try:\n"
        "    cb.run(['python', '-c', 'import time; print(\"up\", flush=True); time.sleep(60)'],\n"
        "           np=2, cluster=c)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', c.state, c.jobs[0].outcome.cancelled, flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program, openmpi_python, str(tmp_path / "c")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: (tmp_path / "c" / "jobs" / "job-0001" / "rank-1.log").exists(), 30)
        _wait(lambda: "up" in (tmp_path / "c" / "jobs" / "job-0001" / "rank-1.log").read_text())
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.strip() == "interrupted stopped True"
    assert not processes_mentioning(str(tmp_path / "c"))


def test_an_ephemeral_cluster_stops_when_its_job_ends(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 1, python=openmpi_python, ephemeral=True).start()
    try:
        job = cluster.mpirun(["python", "-c", "import time; time.sleep(1)"], np=1)
        assert cluster.state == "running"
        assert job.wait(60).ok
        _wait(lambda: cluster.state == "stopped")
        reason = cb.Cluster.attach(cluster.id).record.stop_reason
        assert reason == "its job ended (an ephemeral cluster)"
    finally:
        cluster.stop()


def test_a_detached_cluster_its_supervisor_stopped_says_so_in_its_starter(openmpi_python):
    cluster = cb.Cluster.local(1, 1, python=openmpi_python, detached=True, ephemeral=True)
    try:
        cluster.start()
        assert cluster.state == "running"
        assert cluster.mpirun(["python", "-c", "pass"], np=1).wait(60).ok
        # The supervisor stops it once its job ended: the starter reads that in the record.
        _wait(lambda: cluster.state == "stopped", 30)
        assert "stopped (attached" in repr(cluster)
    finally:
        cluster.stop()


def test_a_detached_local_cluster_whose_head_was_paused_starts_its_agents_again(
    openmpi_python, tmp_path
):
    """The head SIGSTOPped past its agents' lease: they stop the job and exit; once it runs
    again, it reaps them, starts them again, and the cluster is whole (no zombie left)."""
    sleeper = "import time\nfrom mpi4py import MPI\nprint('started', flush=True)\ntime.sleep(60)\n"
    cluster = cb.Cluster.local(2, 1, python=openmpi_python, detached=True, run_dir=tmp_path / "r")
    try:
        cluster.start()
        cluster.wait_ready(60)
        job = cluster.mpirun(["python", "-c", sleeper], np=2)
        ranks_started(job, 2)  # type: ignore[arg-type]
        agents = set(cluster.status()["pid"])
        head = psutil.Process(cb.Cluster.attach(cluster.id).record.head_pid)
        head.suspend()
        try:
            time.sleep(HEAD_LEASE + 3)  # the agents give up on the head meanwhile
        finally:
            head.resume()
        result = job.wait(60)
        assert not result.ok
        said = result.summary()
        assert "Node local-0 (" in said
        # Lost, in the words of whichever the head saw first once it ran again: the agent's
        # connection gone, or its heartbeats stopped.
        assert "was lost" in said or "has not been heard from" in said, said
        cluster.wait_ready(60)  # their agents, started again, joined
        _wait(lambda: cluster.status()["state"].tolist() == ["joined", "joined"])  # the record
        assert not set(cluster.status()["pid"]) & agents
        assert cluster.snapshot().problem is None
        zombies = [p.pid for p in head.children() if p.status() == psutil.STATUS_ZOMBIE]
        assert zombies == []  # the agents that ended were reaped
        again = cluster.mpirun(["python", "-c", "print('back')"], np=2).wait(60)
        assert again.ok, again.summary()
    finally:
        cluster.stop()
    assert not wait_gone(str(tmp_path / "r"), 10)


def test_a_detached_cluster_whose_nodes_cannot_change_refuses_scale_from_its_supervisor(
    openmpi_python, capsys
):
    from clusterbook.cli.main import main

    cluster = cb.Cluster.local(1, 1, python=openmpi_python, detached=True)
    try:
        cluster.start()
        attached = cb.Cluster.attach(cluster.id)
        # Asked of the supervisor (not refused here as "in its supervisor only"): it names
        # the kind and what grows.
        with pytest.raises(cb.ConfigError, match=r"a local cluster's nodes are what it started"):
            attached.scale(2)
        with pytest.raises(cb.ConfigError, match=r"cluster\.adapt\(\) grows and shrinks Slurm"):
            cluster.adapt(1, 2)
        assert main(["scale", cluster.id, "2"]) != 0
        assert "Cluster.slurm" in capsys.readouterr().err
        assert cluster.status()["state"].tolist() == ["joined"]  # it keeps what it has
    finally:
        cluster.stop()
