"""A node whose ranks keep failing is set aside, on fake hosts with real sshd and real Open MPI:
its third failure leaves it out of the job's next attempt, status shows it set aside with why
and until when, and ``cluster.reinstate`` brings it back into the next job."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.views.html import render_nodes
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
