"""A node whose ranks keep failing is set aside, on fake hosts with real sshd and real Open MPI:
its third failure leaves it out of the job's next attempt, status shows it set aside with why
and until when, and ``cluster.reinstate`` brings it back into the next job."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.views.html import render_nodes
from tests.testbed import FakeHost
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

# Every rank on node3 fails; the others wait for them (and are stopped when one fails).
FAILS_ON_NODE3 = """\
import os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
host = socket.gethostname()
print(f"rank {comm.rank} of {comm.size} attempt {os.environ['CLUSTERBOOK_ATTEMPT']} on {host}",
      flush=True)
if host == "node3":
    sys.exit(3)
comm.Barrier()
"""


def test_a_node_failing_three_times_is_set_aside_then_reinstated(
    testbed, openmpi_python, tmp_path: Path
):
    script = tmp_path / "fails_on_node3.py"
    script.write_text(FAILS_ON_NODE3)
    node3 = testbed.hosts[2].addr
    with testbed.cluster(openmpi_python, tmp_path / "run", hosts=3) as cluster:
        job = cluster.mpirun(["python", str(script)], retries=5, backoff=0.1, timeout=120)
        result = job.wait(timeout=240)
        assert result.ok, result.summary()
        assert [a.outcome for a in result.attempts] == ["failure"] * 3 + ["ok"]
        assert job.np == 2  # every slot of the nodes not set aside
        logs = job.logs()
        last = logs[(logs.attempt == 4) & (logs["rank"] >= 0)]
        assert sorted(last.line.str.extract(r"on (\w+)$")[0]) == ["node1", "node2"]

        status = cluster.status().set_index("node")
        assert status.loc[node3, "state"] == "set-aside"
        assert status.loc[node3, "last_reason"] == "3 failures in 10 min (last: rank 2 exited 3)"
        until = status.loc[node3, "until"].timestamp()
        started = result.attempts[2].started
        assert started < until < started + 120  # a minute's cool-down from the third failure
        assert "set-aside" in render_nodes(cluster.snapshot())

        # A new job gets every node; its retry leaves node3 out at once, until reinstated.
        again = cluster.mpirun(["python", str(script)], retries=1, backoff=0.1, timeout=60)
        assert again.wait(timeout=120).ok
        assert [a.outcome for a in again.outcome.attempts] == ["failure", "ok"]
        assert again.np == 2
        with pytest.raises(cb.ConfigError, match=r"no node 'node9'.*its nodes are"):
            cluster.reinstate("node9")
        cluster.reinstate(node3)
        status = cluster.status().set_index("node")
        assert status.loc[node3, "state"] == "joined"
        back = cluster.mpirun(["python", str(script)], retries=1, backoff=0.1, timeout=60)
        assert not back.wait(timeout=120).ok  # its retry runs on node3 again (and fails)
        assert [a.outcome for a in back.outcome.attempts] == ["failure", "failure"]
        assert back.np == 3


@pytest.fixture
def respawned(tmp_path: Path) -> Iterator[Callable[[FakeHost, cb.Cluster], str]]:
    """Agents inside fake hosts that a loop starts again whenever one ends, as systemd's
    ``Restart=always`` would; every process of theirs is gone at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(host: FakeHost, cluster: cb.Cluster) -> str:
        token = tmp_path / f"token-{host.name}"  # copied to the node, as a user would
        shutil.copy(cluster._provider.token_file, token)
        argv = shlex.split(cluster.join_command)[1:]
        argv = [a if a != str(cluster._provider.token_file) else str(token) for a in argv]
        node = f"far-{host.name}"
        agent = shlex.join([sys.executable, "-m", "clusterbook", *argv, "--node-id", node])
        loop = f"hostname {host.name} && while :; do {agent} --slots 1; sleep 1; done"
        started.append(
            subprocess.Popen(
                ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", loop],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        return node

    yield start
    for proc in started:
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()  # the loop first, so that it starts no agent again
            for child in tree:
                child.kill()
        proc.wait(timeout=10)


def test_a_node_whose_agent_keeps_dropping_while_idle_is_set_aside_then_reinstated(
    testbed, respawned, tmp_path: Path
):
    """No job runs: node3's agent is killed three times (its loop starts it again each time),
    which sets node3 aside as three failing attempts would; reinstate brings it back."""
    cluster = cb.Cluster.elastic(2, 3, listen=testbed.head_addr, run_dir=tmp_path / "run")
    with cluster.start():
        names = [respawned(host, cluster) for host in testbed.hosts[:3]]
        node3 = names[2]

        def state_of(node: str) -> str:
            return str(cluster.status().set_index("node").loc[node, "state"])

        def pid_of(node: str) -> int | None:
            pid = cluster.status().set_index("node").loc[node, "pid"]
            return None if pid != pid else int(pid)  # NaN: no agent reported

        def shown() -> str:
            columns = ["node", "state", "pid", "last_reason"]
            return cluster.status()[columns].to_string()

        def until(check: Callable[[], bool], said: Callable[[], object]) -> None:
            deadline = time.monotonic() + 30
            while not check():
                assert time.monotonic() < deadline, said()
                time.sleep(0.05)

        until(lambda: len(cluster.nodes) == 3, shown)
        for drop in range(3):
            [agent] = [
                p
                for p in psutil.process_iter(["cmdline"])
                if node3 in (p.info["cmdline"] or []) and "worker" in p.info["cmdline"]
            ]
            agent.kill()
            # Back as a new agent, joined again (or, after its third drop, back but set
            # aside). Not its "lost" in between: the loop brings it back within about a
            # second, which a loaded machine's status() calls can miss; the reason below
            # says each drop was counted.
            want = "set-aside" if drop == 2 else "joined"
            until(
                lambda w=want, old=agent.pid: (  # type: ignore[misc]
                    len(cluster.nodes) == 3 and state_of(node3) == w and pid_of(node3) != old
                ),
                lambda d=drop: f"drop {d + 1}:\n{shown()}",  # type: ignore[misc]
            )

        status = cluster.status().set_index("node")
        assert status.loc[node3, "last_reason"] == (
            "3 failures in 10 min (last: agent dropped while idle)"
        )
        assert (status.loc[names[:2], "state"] == "joined").all()
        cluster.reinstate(node3)
        assert state_of(node3) == "joined"
