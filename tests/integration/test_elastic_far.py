"""Elastic clusters whose agents run on other machines (fake hosts): MPI ranks reach them
through the sshd each agent started, with the cluster's derived key and pinned host keys."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.errors import BootstrapError
from clusterbook.rendezvous.backends.tcp import read_secret
from clusterbook.ssh.keys import derived_public_line
from tests.conftest import agent_stderr, print_agent_logs
from tests.integration.test_clean_far import RAISES  # rank 1 raises, the others wait
from tests.integration.test_ssh_cluster import SLEEPER
from tests.integration.test_warm_launch import through_agent
from tests.testbed import FakeHost, agent_argv
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()} sum {comm.allreduce(comm.rank)}")
"""
SSHD_PORT = 2222


@pytest.fixture
def far_agents(tmp_path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start agents inside fake hosts (their network and hostname); all gone at teardown."""
    started: list[tuple[subprocess.Popen[str], str]] = []

    def start(
        host: FakeHost, cluster: cb.Cluster, *extra: str, bind: tuple[Path, Path] | None = None
    ) -> subprocess.Popen[str]:
        with agent_stderr(tmp_path, host.name) as said:
            proc = subprocess.Popen(
                agent_argv(host, cluster, tmp_path, *extra, bind=bind),
                stdout=subprocess.DEVNULL,
                stderr=said,
                text=True,
            )
        node_id = host.agent_id
        started.append((proc, node_id))
        return proc

    yield start
    for proc, node_id in started:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(Path.home() / ".clusterbook" / f"sshd-{node_id}", ignore_errors=True)
    print_agent_logs(tmp_path)


def masters(config: str) -> list[str]:
    """The hosts of the head's ssh master connections made with the ssh config ``config``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv[:2] == ["ssh", "-M"] and config in argv:
            found.append(argv[-1])
    return sorted(found)


def elastic_cluster(bed, python, tmp_path, n):
    return cb.Cluster.elastic(
        n, n, listen=bed.head_addr, last_call=0.1, python=python, run_dir=tmp_path / "run"
    )


def test_ranks_run_on_far_agents_through_their_own_sshd(testbed, far_agents, mpi_python, tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    hosts = testbed.hosts[:2]
    with elastic_cluster(testbed, mpi_python, tmp_path, len(hosts)) as cluster:
        for h in hosts:
            far_agents(h, cluster, "--slots", "2", "--start-sshd", str(SSHD_PORT))
        cluster.wait_ready(timeout=60)
        assert {n.host for n in cluster.nodes} == {h.addr for h in hosts}
        # Each agent dialled its channel to the head before it joined: the head needs no
        # master connection to any of them (nor a login) to start MPI's daemons there.
        channels = cluster._provider.head.channels
        assert not channels.without([h.agent_id for h in hosts], 30.0)

        result = cluster.mpirun(["python", str(script)], np=4, timeout=120).wait()
        result.check()
        # Nor a login to check them: their agents probed their node for the cluster's MPI
        # (the join command asks them to), and the head took what they reported, where they
        # run the cluster's Python (the agents run the test's; MPICH's is another: what an
        # agent found of mpi4py is not the ranks', so the head logs in to check).
        assert cluster.join_command is not None
        assert "--probe-mpi" in shlex.split(cluster.join_command)
        probed = mpi_python == sys.executable
        for h in hosts:
            log = (Path.home() / ".clusterbook" / f"sshd-{h.agent_id}" / "sshd.log").read_text()
            assert ("Accepted publickey" in log) is not probed, log
        logs = cluster.jobs[-1].logs()
        ranks = logs[logs["rank"] >= 0]
        lines = sorted(ranks["line"])
        assert lines == sorted(f"rank {r} of 4 on {hosts[r // 2].name} sum 6" for r in range(4)), (
            lines
        )
        # Each record names the node the rank ran on.
        assert dict(zip(ranks["rank"], ranks["host"], strict=True)) == {
            r: hosts[r // 2].name for r in range(4)
        }
        # MPI's daemons were started by the nodes' agents (through their channels), tagged as
        # the job's: no login, no shell, and no master connection made for it.
        sleeper = tmp_path / "sleeper.py"
        sleeper.write_text(SLEEPER)
        assert all(through_agent(cluster, h, sleeper) for h in hosts)
        config = str(Path.home() / ".clusterbook" / "clusters" / cluster.id / "ssh_config")
        assert masters(config) == []

        # The head pins exactly the host keys the agents reported, and logs in strictly.
        directory = Path.home() / ".clusterbook" / "clusters" / cluster.id
        reports = cluster._provider.head.reports().values()
        reported = {(r.sshd_host_key or "").split()[1] for r in reports}
        pinned = {line.split()[2] for line in (directory / "known_hosts").read_text().splitlines()}
        assert pinned == reported
        config = (directory / "ssh_config").read_text()
        assert "StrictHostKeyChecking yes" in config
        assert "/dev/null" not in config
        assert (directory / "keys" / "id_ed25519").stat().st_mode & 0o777 == 0o600
        # The agents' sshd lets in this cluster's key only, restricted to a session and
        # connections from the node (tests/integration/test_agent_sshd.py).
        secret = read_secret(cluster._provider.token_file)
        for h in hosts:
            keys = Path.home() / ".clusterbook" / f"sshd-{h.agent_id}" / "authorized_keys"
            assert keys.stat().st_mode & 0o777 == 0o600
            socket = keys.parent / "daemons.sock"  # the agent's, and no other destination
            assert keys.read_text().splitlines() == [
                f'restrict,port-forwarding,permitopen="[{socket}]:*" '
                + derived_public_line(secret, cluster.id)
            ]
    assert not (directory / "keys").exists()
    assert not (directory / "ssh_config").exists()


def test_a_command_runs_on_every_far_agent_through_its_sshd(
    testbed, far_agents, openmpi_python, tmp_path
):
    hosts = testbed.hosts[:2]
    with elastic_cluster(testbed, openmpi_python, tmp_path, 2) as cluster:
        far_agents(hosts[0], cluster, "--start-sshd", str(SSHD_PORT))
        far_agents(hosts[1], cluster)  # no sshd of its own: it says why it cannot be asked
        cluster.wait_ready(timeout=60)
        frame = cluster.run_on_nodes(["hostname"]).set_index("host")
        assert frame.loc[hosts[0].addr, "stdout"] == f"{hosts[0].name}\n"
        assert frame.loc[hosts[0].addr, "returncode"] == 0
        assert frame.returncode.isna().sum() == 1
        assert "--start-sshd PORT" in frame.loc[hosts[1].addr, "stderr"]


def test_a_far_agent_without_its_own_sshd_is_refused_with_the_fix(
    testbed, far_agents, openmpi_python, tmp_path
):
    with elastic_cluster(testbed, openmpi_python, tmp_path, 1) as cluster:
        far_agents(testbed.hosts[2], cluster)
        cluster.wait_ready(timeout=60)
        with pytest.raises(BootstrapError, match="--start-sshd PORT") as info:
            cluster.mpirun(["python", "-c", "pass"], np=1)
        assert testbed.hosts[2].agent_id in str(info.value)


def test_a_far_node_whose_sshd_key_is_not_the_reported_one_is_refused(
    testbed, far_agents, openmpi_python, tmp_path
):
    host = testbed.hosts[2]
    with elastic_cluster(testbed, openmpi_python, tmp_path, 1) as cluster:
        far_agents(host, cluster, "--start-sshd", str(SSHD_PORT))
        cluster.wait_ready(timeout=60)
        # Someone else answers on the agent's address and port with another host key (the
        # fake host's own sshd's); and the agent reported no probe of its node, so the head
        # logs in to check it before the job.
        node, report = next(iter(cluster._provider.head.reports().items()))
        changed = replace(report, sshd_host_key=host.host_public_key, probe=None)
        cluster._provider.head.set_report(node, changed)
        with pytest.raises(BootstrapError, match="has CHANGED") as info:
            cluster.mpirun(["python", "-c", "pass"], np=1)
        assert host.addr in str(info.value) or node in str(info.value)


def test_a_probed_far_node_whose_sshd_key_changed_is_refused_at_the_first_login(
    testbed, far_agents, openmpi_python, tmp_path
):
    """A node its agent probed needs no login before a job; the first login there is (a
    put()) refuses the changed key, and stop() says what it could not remove."""
    host = testbed.hosts[2]
    with elastic_cluster(testbed, openmpi_python, tmp_path, 1) as cluster:
        far_agents(host, cluster, "--start-sshd", str(SSHD_PORT))
        cluster.wait_ready(timeout=60)
        node, report = next(iter(cluster._provider.head.reports().items()))
        assert report.probe is not None
        changed = replace(report, sshd_host_key=host.host_public_key)
        cluster._provider.head.set_report(node, changed)
        sent = tmp_path / "sent.txt"
        sent.write_text("x")
        with pytest.raises(cb.ClusterError, match="has CHANGED"):
            cluster.put(sent)
        with pytest.warns(cb.CleanupWarning, match="has CHANGED"):
            cluster.stop()


def test_no_agent_or_sshd_is_left_in_the_hosts_after_stop(
    testbed, far_agents, openmpi_python, tmp_path
):
    hosts = testbed.hosts[:2]
    with elastic_cluster(testbed, openmpi_python, tmp_path, 2) as cluster:
        procs = [far_agents(h, cluster, "--start-sshd", str(SSHD_PORT)) for h in hosts]
        cluster.wait_ready(timeout=60)
        cluster.mpirun(["python", "-c", "pass"], np=2).wait().check()
    for proc in procs:
        assert proc.wait(timeout=20) == 0
    for h in hosts:
        left = [p for p in h.processes() if p != h.sshd.pid and psutil.pid_exists(p)]
        names = [" ".join(psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]
        assert not names, names


READ_AND_WRITE = """\
import os, socket, sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "out", f"r{rank}.txt"), "w") as f:
    f.write(f"{rank} on {socket.gethostname()}")
"""


def test_put_and_gather_reach_far_nodes_without_a_shared_filesystem(
    testbed, far_agents, openmpi_python, tmp_path
):
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "job.py").write_text(READ_AND_WRITE)
    hosts = testbed.hosts[:2]
    seen = {h.name: tmp_path / f"seen-{h.name}" for h in hosts}
    with elastic_cluster(testbed, openmpi_python, tmp_path, 2) as cluster:
        for h in hosts:
            seen[h.name].mkdir()
            far_agents(
                h,
                cluster,
                "--slots",
                "1",
                "--start-sshd",
                str(SSHD_PORT),
                bind=(seen[h.name], work),
            )
        cluster.wait_ready(timeout=60)
        cluster.put(work / "job.py", work / "out")
        assert [sorted(os.listdir(d)) for d in seen.values()] == [["job.py", "out"]] * 2
        cluster.mpirun(["python", str(work / "job.py")], np=2, timeout=120).wait().check()
        arrived = cluster.gather(work / "out")
        assert sorted(p.name for p in arrived) == ["r0.txt", "r1.txt"]
        texts = sorted(p.read_text() for p in arrived)
        assert texts == [f"0 on {hosts[0].name}", f"1 on {hosts[1].name}"]
    # What put() created on the far nodes went with the cluster (the agents were still up).
    assert [sorted(os.listdir(d)) for d in seen.values()] == [[], []]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_failed_job_is_kept_stopped_on_far_agents_until_cleanup(
    testbed, far_agents, openmpi_python, tmp_path
):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    hosts = testbed.hosts[:2]
    kept: list[int] = []
    try:
        with elastic_cluster(testbed, openmpi_python, tmp_path, 2) as cluster:
            for h in hosts:
                far_agents(h, cluster, "--slots", "1", "--start-sshd", str(SSHD_PORT))
            cluster.wait_ready(timeout=60)
            job = cluster.mpirun(["python", str(script)], np=2, clean="none")
            result = job.wait(timeout=90)
            kept += [k.pid for k in result.kept]
            assert [f.rank for f in result.failed] == [1], result
            ranks = {k.rank: k.host for k in result.kept if k.rank is not None}
            assert ranks == {r: hosts[r].name for r in (0, 1)}, result.kept
            assert {k.host for k in result.kept if k.name == "prted"} == {h.name for h in hosts}
            assert {psutil.Process(pid).status() for pid in kept} == {psutil.STATUS_STOPPED}
            job.cleanup()  # returns once they are gone
            assert [k for k in result.kept if _alive(k.pid)] == []
    finally:
        for pid in kept:  # a stopped process ends only with SIGKILL
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def test_without_channels_the_daemons_start_through_the_agents_over_masters(
    testbed, far_agents, openmpi_python, tmp_path
):
    """``channel_port=None`` (a firewall that lets in the store's port only): the agents
    dial nothing, and the head starts MPI's daemons through them over a master connection to
    each node, as designed: no ColdLaunchWarning (our warnings are errors here)."""
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    hosts = testbed.hosts[:2]
    cluster = cb.Cluster.elastic(
        len(hosts), len(hosts), listen=testbed.head_addr, last_call=0.1, python=openmpi_python,
        run_dir=tmp_path / "run", channel_port=None,
    )  # fmt: skip
    with cluster:
        assert cluster.join_command is not None
        assert "channel=" not in cluster.join_command
        for h in hosts:
            far_agents(h, cluster, "--slots", "2", "--start-sshd", str(SSHD_PORT))
        cluster.wait_ready(timeout=60)
        assert cluster._provider.head.channels is None
        cluster.mpirun(["python", str(script)], np=4, timeout=120).wait().check()
        config = str(Path.home() / ".clusterbook" / "clusters" / cluster.id / "ssh_config")
        assert masters(config) == sorted(h.addr for h in hosts)
        assert all(through_agent(cluster, h, sleeper) for h in hosts)


def test_a_far_agent_that_does_not_answer_falls_back_to_ssh(
    testbed, far_agents, openmpi_python, tmp_path
):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    hosts = testbed.hosts[:2]
    with elastic_cluster(testbed, openmpi_python, tmp_path, len(hosts)) as cluster:
        for h in hosts:
            far_agents(h, cluster, "--slots", "2", "--start-sshd", str(SSHD_PORT))
        cluster.wait_ready(timeout=60)
        cluster.mpirun(["python", str(script)], np=4, timeout=120).wait().check()
        config = str(Path.home() / ".clusterbook" / "clusters" / cluster.id / "ssh_config")
        assert masters(config) == []  # the agents' channels served it
        # The head's channel server gone between two jobs: the next job says so, the head
        # keeps a master connection to each node from then on, and the job is the same (its
        # daemons still start through the agents, over the masters' forwards).
        cluster._provider.head.channels.close()
        with pytest.warns(cb.ColdLaunchWarning, match="dialled to the head for warm launches"):
            cluster.mpirun(["python", str(script)], np=4, timeout=120).wait().check()
        assert masters(config) == sorted(h.addr for h in hosts)
        # Then node2's agent socket gone between two jobs: its daemons come over ssh, said
        # once per job; the job is the same, and node1 stays warm.
        reports = cluster._provider.head.reports().values()
        (gone,) = [r.daemon_socket for r in reports if r.hostname == hosts[1].name]
        assert gone is not None
        os.unlink(gone)
        with pytest.warns(cb.ColdLaunchWarning, match=rf"agent of node {hosts[1].addr} did not"):
            cluster.mpirun(["python", str(script)], np=4, timeout=120).wait().check()
        with pytest.warns(cb.ColdLaunchWarning, match="did not answer"):
            assert not through_agent(cluster, hosts[1], sleeper)  # over ssh, untagged
        with pytest.warns(cb.ColdLaunchWarning, match="did not answer"):
            assert through_agent(cluster, hosts[0], sleeper)
