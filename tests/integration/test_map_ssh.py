"""``cluster.map`` on SSH nodes that share no files with the head (fake hosts: network
namespaces with their own sshd, each with a private run directory): the pool's ranks reach the
head over the nodes' network, items and values travel on that channel only, and the pool's
processes on the nodes end with the cluster."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterbook.functions.sweep import pool_for
from tests.integration.test_ssh_faults import cluster_files, wait_for
from tests.testbed import Testbed
from tests.testbed import testbed as fake_hosts
from tests.testbed import unshared as private_dirs

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts


@pytest.fixture
def run_dir(testbed: Testbed, tmp_path: Path) -> Iterator[Path]:
    """The cluster's run directory, which node1 and node2 each see empty, as their own."""
    with private_dirs(testbed.hosts[:2], tmp_path / "run", tmp_path):
        yield tmp_path / "run"


def test_a_sweep_on_nodes_without_a_shared_filesystem(testbed, run_dir, openmpi_python) -> None:  # type: ignore[no-untyped-def]
    def f(x: int) -> tuple[int, str]:
        if x == 21:
            raise RuntimeError("no twenty-one")
        return x * x, socket.gethostname()

    cluster = testbed.cluster(openmpi_python, run_dir, hosts=2, slots=2)
    with cluster.start():
        result = cluster.map(f, range(50), progress=False)
        assert set(result.failed) == {21}
        assert result.failed[21].host in ("node1", "node2")
        assert "RuntimeError: no twenty-one" in result.failed[21].remote_traceback
        values = [v for v in result.values() if v is not None]
        assert [v[0] for v in values] == [x * x for x in range(50) if x != 21]
        assert {v[1] for v in values} == {"node1", "node2"}
        pool = pool_for(cluster, 4)
        pids = [r.pid for r in pool.ranks]
        assert {r.host for r in pool.ranks} == {"node1", "node2"}
    assert pool.stopped
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if psutil.pid_exists(p)]


def test_a_node_that_goes_silent_mid_sweep_ends_the_sweep_with_the_others_values(
    testbed, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    marks = tmp_path / "marks"  # the hosts share the head's /tmp (not their homes)
    marks.mkdir()

    def f(x: int) -> str:
        host = socket.gethostname()
        (marks / f"{x}-{host}").touch()
        time.sleep(0.2)
        return host

    silent = testbed.hosts[1]
    cut_off = False
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2, slots=1)
    try:
        with cluster.start():

            def cut() -> None:
                deadline = time.monotonic() + 60
                while not list(marks.glob(f"*-{silent.name}"))[2:]:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                silent.drop_traffic()

            cut_off = True  # from here on, in case the sweep fails before the cut
            cutter = threading.Thread(target=cut)
            cutter.start()
            result = cluster.map(f, range(40), progress=False)
            cutter.join()
            assert 0 < len(result.failed) < 40
            assert set(result.values()) - {None} >= {"node1", silent.name}
            # The head finds the node lost and fails the pool's job; the items out then, and
            # those not yet run, end with why no new pool could take them.
            for error in result.failed.values():
                assert "no new pool: " in str(error)
                assert f"lost 1 of its nodes: Node {silent.addr}" in str(error)
            # Cut off past its lease, the node's agent cleans up and exits (as when a node
            # is lost for any job); then the link comes back and stop() has nothing to say.
            assert wait_for(lambda: cluster.id not in cluster_files(silent), 30)
            silent.pass_traffic()
            cut_off = False
    finally:
        if cut_off:
            silent.pass_traffic()
