"""Warm launches on SSH clusters of fake hosts: MPI's daemons start through each node's agent,
over the ssh connection the cluster keeps to each node (no new login, no login shell per job),
under Open MPI and MPICH, with every job property of a cold launch; a connection that ended, or
an agent that does not answer, falls back to a cold launch, said in a warning, and a connection
is started again."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings

import psutil
import pytest

import clusterbook as cb
from tests.integration.test_ssh_cluster import (
    HOSTNAME_ALLREDUCE,
    SLEEPER,
    TRICKY,
    stray_processes,
)
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

FAILING = """\
import sys
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
sys.exit(3 if MPI.COMM_WORLD.rank == 1 else 0)
"""


def masters(bed) -> list[psutil.Process]:
    """The master connections this process keeps to the testbed's hosts."""
    addrs = {h.addr for h in bed.hosts}
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = proc.cmdline()
            if argv[:2] == ["ssh", "-M"] and argv[-1] in addrs:
                found.append(proc)
    return found


def ended(proc: psutil.Process) -> None:
    """Wait until ``proc`` has ended, leaving it for its parent to reap (psutil's wait()
    would reap it, and the head would then not know how it ended)."""
    deadline = time.monotonic() + 10
    while proc.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"{proc} did not end"
        time.sleep(0.02)


def daemon_tags(cluster, host, sleeper) -> list[str]:
    """The job tag each MPI daemon of a running job on ``host`` carries: a daemon the node's
    agent started carries its job's; one started over ssh, none (sshd's environment)."""
    job = cluster.mpirun(["python", str(sleeper)], np=4, timeout=60)
    try:
        assert any(r.line == "started" for r in job.stream())
        tags = []
        for pid in host.processes():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.name() in ("prted", "hydra_pmi_proxy"):
                    tags.append(proc.environ().get("CLUSTERBOOK_JOB", ""))
        assert tags, f"no MPI daemon on {host.name}"
        return tags
    finally:
        assert job.cancel()


def through_agent(cluster, host, sleeper) -> bool:
    tags = daemon_tags(cluster, host, sleeper)
    agent = f"{cluster.id}:"
    assert all(t.startswith(agent) for t in tags) or not any(tags), tags
    return all(t.startswith(agent) and not t.endswith(":agents") for t in tags)


def run_allreduce(cluster, script, hosts):
    job = cluster.mpirun(["python", str(script)], np=2 * len(hosts), timeout=60)
    result = job.wait(timeout=90)
    logs = job.logs()
    assert result.ok, result.summary() + "\n" + "\n".join(logs.line)
    lines = sorted(logs[logs.stream == "stdout"].line)
    total = sum(range(2 * len(hosts)))
    # Ranks 0,1 on node1 and 2,3 on node2, each line tagged with its rank and host.
    assert lines == [f"rank {r} on node{r // 2 + 1} sum {total} env {TRICKY!r}" for r in range(4)]
    by_rank = logs[logs["rank"] >= 0].groupby("rank").host.first().to_dict()
    assert by_rank == {r: f"node{r // 2 + 1}" for r in range(4)}


def test_warm_jobs_log_in_to_no_node(testbed, mpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    failing = tmp_path / "failing.py"
    failing.write_text(FAILING)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    hosts = testbed.hosts[:2]
    cluster = testbed.cluster(
        mpi_python, tmp_path / "run", hosts=2, slots=2, env={"TRICKY": TRICKY}
    )
    with cluster:
        assert len(masters(testbed)) == 2
        run_allreduce(cluster, script, hosts)
        # The daemons were started by the nodes' agents, tagged as the job's processes.
        assert all(through_agent(cluster, host, sleeper) for host in hosts)
        # No sshd accepts a login now: a job that needed one would not start.
        for host in hosts:
            host.pause_sshd()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", cb.ColdLaunchWarning)
                run_allreduce(cluster, script, hosts)
                result = cluster.mpirun(["python", str(failing)], np=4, timeout=60).wait(90)
                slow_job = cluster.mpirun(["python", str(sleeper)], np=4, timeout=3)
                slow = slow_job.wait(60)
                cancelled_job = cluster.mpirun(["python", str(sleeper)], np=4)
                assert any(r.line == "started" for r in cancelled_job.stream())
                assert cancelled_job.cancel()  # it was running: cancel() stopped it
                cancelled = cancelled_job.outcome
        finally:
            for host in hosts:
                host.resume_sshd()
        assert not result.ok
        assert result.rank_exit_codes[1] == 3
        assert (result.failed[0].rank, result.failed[0].host) == (1, "node1")
        assert result.failed[0].exit_code == 3
        assert slow.timed_out, slow.summary()
        logs = slow_job.logs()
        for rank in range(4):  # each rank's stack, dumped before the stop
            lines = logs[(logs["rank"] == rank) & (logs.stream == "stderr")].line.tolist()
            assert any("most recent call first" in line for line in lines), lines
        assert cancelled.cancelled
        assert cancelled.failed == ()
    assert masters(testbed) == []
    assert stray_processes(testbed) == {}


@pytest.mark.parametrize("how", ["killed", "terminated"])
def test_a_master_that_ended_falls_back_cold_and_comes_back(testbed, mpi_python, tmp_path, how):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    hosts = testbed.hosts[:2]
    cluster = testbed.cluster(
        mpi_python, tmp_path / "run", hosts=2, slots=2, env={"TRICKY": TRICKY}
    )
    with cluster:
        run_allreduce(cluster, script, hosts)
        victim = next(p for p in masters(testbed) if p.cmdline()[-1] == hosts[1].addr)
        victim.send_signal(signal.SIGKILL if how == "killed" else signal.SIGTERM)
        ended(victim)
        said = "killed by signal 9" if how == "killed" else r"exit \d+"  # ssh's own end
        with pytest.warns(cb.ColdLaunchWarning, match=rf"node {hosts[1].addr} .*{said}.*again: up"):
            run_allreduce(cluster, script, hosts)
        assert len(masters(testbed)) == 2  # started again, for the next job
        with warnings.catch_warnings():
            warnings.simplefilter("error", cb.ColdLaunchWarning)
            run_allreduce(cluster, script, hosts)
            # With it, the way to the node's agent: its daemons are the agent's again.
            assert through_agent(cluster, hosts[1], sleeper)
    assert masters(testbed) == []
    assert stray_processes(testbed) == {}


def test_a_cold_cluster_keeps_no_connection(testbed, openmpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    hosts = testbed.hosts[:2]
    cluster = testbed.cluster(
        openmpi_python, tmp_path / "run", hosts=2, slots=2, env={"TRICKY": TRICKY}, launch="cold"
    )
    with cluster:
        assert masters(testbed) == []
        run_allreduce(cluster, script, hosts)


def test_a_master_ended_after_a_host_key_changed_is_refused(testbed, openmpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    hosts = testbed.hosts[:2]
    victim = hosts[1]
    cluster = testbed.cluster(
        openmpi_python, tmp_path / "run", hosts=2, slots=2, env={"TRICKY": TRICKY}
    )
    cluster.start()
    try:
        run_allreduce(cluster, script, hosts)
        # The key rotated by a restart of sshd: the connections checked at start stay, but
        # a new one, the master started again included, must refuse the new key.
        victim.swap_host_key(keep_sessions=True)
        master = next(p for p in masters(testbed) if p.cmdline()[-1] == victim.addr)
        master.kill()
        ended(master)
        with pytest.warns(cb.ColdLaunchWarning, match="again: exit 255: Host key verification"):
            job = cluster.mpirun(["python", str(script)], np=4, timeout=60)
        result = job.wait(timeout=90)
        assert not result.ok
        text = "\n".join(job.logs().line)
        assert "Host key verification failed" in text or "CHANGED" in text, text
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("error", cb.CleanupWarning)
            cluster.stop()
        testbed.write_known_hosts()
    assert masters(testbed) == []


def test_an_agent_that_does_not_answer_falls_back_cold(testbed, mpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    hosts = testbed.hosts[:2]
    cluster = testbed.cluster(
        mpi_python, tmp_path / "run", hosts=2, slots=2, env={"TRICKY": TRICKY}
    )
    with cluster:
        run_allreduce(cluster, script, hosts)
        # The agent's socket on node2 gone between two jobs: the agent refuses through it.
        node_dir = hosts[1].home / ".clusterbook" / "clusters" / cluster.id
        (socket_file,) = [p for p in node_dir.iterdir() if p.name.endswith(".sock")]
        os.unlink(socket_file)
        with pytest.warns(cb.ColdLaunchWarning, match=rf"agent of node {hosts[1].addr} did not"):
            run_allreduce(cluster, script, hosts)
        with pytest.warns(cb.ColdLaunchWarning, match="did not answer"):
            assert not through_agent(cluster, hosts[1], sleeper)  # over ssh, untagged
        with pytest.warns(cb.ColdLaunchWarning, match="did not answer"):
            assert through_agent(cluster, hosts[0], sleeper)  # the other node stays warm
    assert masters(testbed) == []
    assert stray_processes(testbed) == {}
