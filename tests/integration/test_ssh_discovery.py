"""Host discovery on fake hosts with real sshd and real Open MPI: a command lists the cluster's
hosts; a host it adds is bootstrapped and a job with ``restarts=`` and ``restart_on_join``
relaunches onto it; a host it drops is drained (the job relaunches without it) and cleaned;
a command that fails or prints garbage keeps the hosts the cluster has and says why."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.conftest import ranks_started
from tests.integration.test_ssh_faults import strays
from tests.integration.test_ssh_openssh import _jump_config
from tests.integration.test_ssh_openssh import behind_bastion as bastion_fixture
from tests.testbed import Testbed, is_agent
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed, behind_bastion = fake_hosts, bastion_fixture

# Each attempt says where it runs; the third (second restart) ends, the others wait.
WAITS = """\
import os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
restart = os.environ["CLUSTERBOOK_RESTART"]
print(f"rank {comm.rank} of {comm.size} restart {restart} on {socket.gethostname()}", flush=True)
comm.Barrier()
print("started", flush=True)
if restart != "2":
    time.sleep(600)  # until the hosts change
"""


def listed(path: Path, *hosts: str) -> None:
    written(path, "# the cluster's hosts\n\n" + "".join(f"{h}:1\n" for h in hosts))


def written(path: Path, text: str) -> None:
    """``path`` holds ``text``, replaced at once: the discovery command, run every 0.3 s, never
    reads it half written (an empty read lists no host, a torn one too few)."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not {what} within {timeout:g} s"
        time.sleep(0.1)
    return found


def daemon_tags(host) -> list[str]:
    """The job tag each MPI daemon on ``host`` carries: one the node's agent started carries
    its job's (a warm launch); one started over a new ssh login, none."""
    tags = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.name() in ("prted", "hydra_pmi_proxy"):
                tags.append(proc.environ().get("CLUSTERBOOK_JOB", ""))
    return tags


def started(job: cb.Job, attempt: int) -> int:
    logs = job.logs()
    return int(((logs.attempt == attempt) & (logs.line == "started")).sum())


def nodes_of(cluster: cb.Cluster) -> list[str]:
    return sorted(n.name for n in cluster.nodes)


def test_discovered_hosts_join_and_leave_a_running_job(
    testbed: Testbed, mpi_python, tmp_path: Path
):
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    h1, h2, h3 = (h.addr for h in testbed.hosts[:3])
    hostlist = tmp_path / "hosts.txt"
    listed(hostlist, h1, h2)
    cluster = cb.Cluster.ssh(
        discover=f"cat {hostlist}",
        every="0.3s",
        identity=testbed.identity,
        known_hosts=testbed.write_known_hosts(),
        connect_timeout=10,
        python=mpi_python,
        run_dir=tmp_path / "run",
    )
    with cluster:
        assert nodes_of(cluster) == [h1, h2]
        job = cluster.mpirun(["python", str(script)], restarts=2, restart_on_join=True, timeout=300)
        ranks_started(job, 2)

        listed(hostlist, h1, h2, h3)  # node3 appears: bootstrapped, and the job grows onto it
        wait_for("3 nodes", lambda: nodes_of(cluster) == [h1, h2, h3])
        wait_for("the restart on 3 nodes", lambda: job.restarts == 1 and job.np == 3)
        wait_for("its 3 ranks started", lambda: started(job, attempt=2) == 3)
        # The added host's daemons start through its agent, as the first hosts' do (warm).
        tags = daemon_tags(testbed.hosts[2])
        assert tags, "no MPI daemon on node3"
        assert all(t.startswith(f"{cluster.id}:") for t in tags), tags

        listed(hostlist, h1, h3)  # node2 goes: the job relaunches without it
        result = job.wait(timeout=120)
        assert result.ok, result.summary()
        assert [a.outcome for a in result.attempts] == ["node-joined", "node-lost", "ok"]
        assert result.attempts[1].reason == f"node {h2} lost"
        logs = job.logs()
        hosts_of = {
            attempt: sorted(
                re.search(r"on (\w+)$", line).group(1)  # type: ignore[union-attr]
                for line in logs[(logs.attempt == attempt) & logs.line.str.startswith("rank ")].line
            )
            for attempt in (1, 2, 3)
        }
        assert hosts_of == {
            1: ["node1", "node2"],
            2: ["node1", "node2", "node3"],
            3: ["node1", "node3"],
        }
        assert nodes_of(cluster) == [h1, h3]
        # node2 was cleaned: no process, key line or file of the cluster left there.
        node2 = testbed.hosts[1]
        wait_for("node2 cleaned", lambda: not (node2.home / ".clusterbook/clusters").exists()
                 or not any((node2.home / ".clusterbook/clusters").iterdir()))  # fmt: skip
        keys = node2.home / ".ssh/authorized_keys"
        assert cluster.id not in keys.read_text()
        wait_for("node2 without processes", lambda: "node2" not in strays(testbed), 10)

        # A job without restarts fails when a host it runs on goes, saying why; the host
        # comes back when listed again.
        alone = cluster.mpirun(["python", str(script)], timeout=300)
        ranks_started(alone, 2)
        listed(hostlist, h1)
        failed = alone.wait(timeout=60)
        assert not failed.ok
        assert f"Host {h3} left the cluster (its discovery command no longer lists it)" in (
            failed.error or ""
        )
        listed(hostlist, h1, h3)
        wait_for("node3 back", lambda: nodes_of(cluster) == [h1, h3])
        assert cluster.mpirun(["python", "-c", "pass"]).wait(timeout=60).ok

        # A command that prints garbage, or fails, keeps the hosts and says why.
        written(hostlist, "node1 slots=two\n")
        problem = wait_for("the problem shown", lambda: cluster.snapshot().problem)
        assert "slots=two" in problem
        assert "keeps its hosts" in problem
        assert nodes_of(cluster) == [h1, h3]
        hostlist.unlink()
        wait_for("the failure shown", lambda: "exited 1" in (cluster.snapshot().problem or ""))
        assert nodes_of(cluster) == [h1, h3]
        listed(hostlist, h1, h3)
        wait_for("the problem cleared", lambda: cluster.snapshot().problem is None)
        assert cluster.mpirun(["python", "-c", "pass"]).wait(timeout=60).ok
    left = {h.name: h.authorized_keys.read_text().count("clusterbook:") for h in testbed.hosts}
    assert set(left.values()) == {0}, f"cluster keys left behind: {left}"
    wait_for("no process left", lambda: not strays(testbed), 10)


def test_clusterbook_run_discover_runs_on_the_hosts_the_command_prints(
    testbed: Testbed, openmpi_python, tmp_path: Path
):
    hostlist = tmp_path / "hosts.txt"
    listed(hostlist, *(h.addr for h in testbed.hosts[:2]))
    command = [sys.executable, "-m", "clusterbook", "run", "-n", "2", "--discover"]
    command += [f"cat {hostlist}", "--every", "1s", "--identity", str(testbed.identity)]
    command += ["--known-hosts", str(testbed.write_known_hosts()), "--run-dir", str(tmp_path)]
    command += ["--", openmpi_python, "-c", "import socket; print(socket.gethostname())"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(re.findall(r"node\d", done.stdout)) == ["node1", "node2"]


def test_a_host_discovered_behind_a_jump_host_gets_its_agent_and_runs_ranks(
    testbed: Testbed, behind_bastion, mpi_python, tmp_path: Path
):
    """node2 and node3 refuse the head's connections; the ssh config reaches them through
    node1 (ProxyJump). node3, discovered once the cluster runs, joins through node1 as node2
    did at the start, and a job runs ranks on both."""
    bastion, inner = behind_bastion
    with pytest.raises(ConnectionRefusedError):  # the head cannot reach node3 itself
        socket.create_connection((inner[1].addr, 22), timeout=3).close()
    config = _jump_config(testbed, bastion, inner, tmp_path / "ssh_config")
    hostlist = tmp_path / "hosts.txt"
    listed(hostlist, "node2")
    cluster = cb.Cluster.ssh(
        discover=f"cat {hostlist}",
        every="0.3s",
        ssh_config=config,
        known_hosts=testbed.write_known_hosts(),
        connect_timeout=10,
        python=mpi_python,
        run_dir=tmp_path / "run",
    )
    with cluster:
        assert nodes_of(cluster) == ["node2"]
        listed(hostlist, "node2", "node3")
        wait_for("node3 joined", lambda: nodes_of(cluster) == ["node2", "node3"])
        assert cluster.snapshot().problem is None
        assert agent_running(inner[1]), "no agent on node3"
        where = "import socket; from mpi4py import MPI; "
        where += "print(MPI.COMM_WORLD.rank, socket.gethostname(), flush=True)"
        job = cluster.mpirun(["python", "-c", where], np=2, timeout=60)
        job.wait(timeout=90).check()
        lines = job.logs().query("rank >= 0").sort_values("rank")["line"]
        assert list(lines) == ["0 node2", "1 node3"]
    wait_for("no process left", lambda: not strays(testbed), 10)


def agent_running(host) -> bool:
    """Whether a cluster's agent runs on ``host`` (a process of its network namespace)."""
    found = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            found.append(is_agent(psutil.Process(pid)))
    return any(found)
