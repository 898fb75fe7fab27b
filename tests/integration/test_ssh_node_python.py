"""SSH clusters whose nodes have the environment at different paths (``node_python``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.errors import BootstrapError
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

WHERE = """\
import os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
hook = sys.modules["sitecustomize"].__file__
print(comm.rank, socket.gethostname(), sys.prefix, os.path.realpath(sys.prefix), hook,
      comm.allreduce(1))
"""


@pytest.fixture
def moved(testbed, mpi_python):
    """node2 has the environment of ``mpi_python`` at another path, and nothing at the
    head's; returns (head env, node2's env). node2 is as built again afterwards."""
    env = Path(mpi_python).parent.parent
    elsewhere = testbed.directory / "elsewhere" / env.name
    empty = testbed.directory / "empty"
    empty.mkdir(mode=0o700, exist_ok=True)
    node2 = testbed.hosts[1]
    node2.rebind([(env, elsewhere), (empty, env)])
    try:
        yield env, elsewhere
    finally:
        node2.rebind()


def cluster_of(bed, python, tmp_path, **kw):
    return bed.cluster(python, tmp_path / "run", hosts=2, **kw)


def test_the_environment_at_the_heads_path_is_missing_on_node2(testbed, moved, mpi_python):
    env, elsewhere = moved
    node2 = testbed.hosts[1]
    seen = testbed.ssh(node2, ["sh", "-c", f"ls {env} | wc -l; ls {elsewhere}/bin/python"])
    assert seen.stdout.split() == ["0", f"{elsewhere}/bin/python"], seen


def test_without_node_python_the_node_is_refused_with_the_fix(testbed, moved, mpi_python, tmp_path):
    with pytest.raises(BootstrapError) as info:
        cluster_of(testbed, mpi_python, tmp_path).start()
    message = str(info.value)
    assert testbed.hosts[1].addr in message
    assert "node_python" in message
    assert testbed.hosts[0].addr not in message.split("cannot join the cluster:")[1]


def test_ranks_run_each_nodes_own_environment(testbed, moved, mpi_python, tmp_path):
    env, elsewhere = moved
    node1, node2 = testbed.hosts[:2]
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    cluster = cluster_of(
        testbed, mpi_python, tmp_path, node_python={node2.addr: f"{elsewhere}/bin/python"}
    )
    with cluster:
        result = cluster.mpirun(["python", str(script)], np=2, timeout=120).wait()
        result.check()
        logs = cluster.jobs[-1].logs()
        rows = sorted(line.split() for line in logs[logs["rank"] >= 0]["line"])
        link = f"{Path.home()}/.clusterbook/clusters/{cluster.id}"
        assert rows == [
            ["0", "node1", f"{link}/env", str(env), f"{link}/rankhook/sitecustomize.py", "2"],
            ["1", "node2", f"{link}/env", str(elsewhere), f"{link}/rankhook/sitecustomize.py", "2"],
        ]
        # The head's link is to its own environment.
        assert os.path.realpath(f"{link}/env") == str(env)
    assert not Path(link).exists()
    for host in (node1, node2):
        assert not (host.home / ".clusterbook" / "clusters" / cluster.id).exists()


def test_a_node_python_for_an_unknown_host_is_refused(testbed, mpi_python):
    with pytest.raises(cb.ConfigError, match="not one of the hosts"):
        cb.Cluster.ssh(["10.0.0.1:1"], node_python={"10.0.0.2": "/opt/venv/bin/python"})
    with pytest.raises(cb.ConfigError, match="not an absolute path"):
        cb.Cluster.ssh(["10.0.0.1:1"], node_python={"10.0.0.1": "venv/bin/python"})
