"""``%%mpirun`` on SSH nodes that do not share the head's filesystem: the cell, its pushed
values and the pulled results travel over the cluster's connections."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import clusterbook as cb
from clusterbook_widgets.magics import ClusterMagics
from tests.testbed import testbed as fake_hosts
from tests.testbed import unshared

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

CELL = """\
import socket
from mpi4py import MPI
r = MPI.COMM_WORLD.Get_rank()
print('on', socket.gethostname(), 'x is', x)
y = (r, socket.gethostname(), x * 2)
"""


@pytest.fixture
def ip():  # type: ignore[no-untyped-def]
    return start_ipython() or get_ipython()


@pytest.fixture
def unshared_run_dir(testbed, tmp_path: Path) -> Iterator[tuple[Path, dict[str, Path]]]:  # type: ignore[no-untyped-def]
    """The cluster's run directory; node1 and node2 each have an empty one of their own at
    its path (seen on the head under ``tmp_path/seen-nodeN``)."""
    with unshared(testbed.hosts[:2], tmp_path / "run", tmp_path) as seen:
        yield tmp_path / "run", seen


def test_push_and_pull_reach_nodes_without_a_shared_filesystem(  # type: ignore[no-untyped-def]
    ip, testbed, unshared_run_dir, openmpi_python
) -> None:
    run_dir, seen = unshared_run_dir
    magics = ClusterMagics(ip)
    ip.register_magics(magics)
    magics.cluster = testbed.cluster(openmpi_python, run_dir, hosts=2).start()
    try:
        ip.user_ns["x"] = 21
        ip.user_ns.pop("y", None)
        with capture_output() as out:
            ip.run_cell_magic("mpirun", "-n 2 --push x --pull y", CELL)
        assert "[0] on node1 x is 21\n" in out.stdout, out.stderr
        assert "[1] on node2 x is 21\n" in out.stdout
        # Nothing but what Open MPI's ssh launcher may say itself (a setpgid race it warns
        # about on a busy machine) reaches stderr.
        assert [ln for ln in out.stderr.splitlines() if not ln.startswith("[mpirun] ")] == []
        assert ip.user_ns["y"] == [(0, "node1", 42), (1, "node2", 42)]
        on_node = seen["node1"] / "cells" / "cell-0001"
        assert (on_node / "push.pkl").stat().st_mode & 0o777 == 0o600
        assert list((on_node / "pull").iterdir()) == []  # moved to the head
    finally:
        magics.stop_cluster()
    # The nodes' copies of the cell and its values went with the cluster.
    assert [list(d.iterdir()) for d in seen.values()] == [[], []]


FAILS_ON_NODE2 = """\
import socket
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    raise RuntimeError(f'refused on {socket.gethostname()}')
MPI.COMM_WORLD.Barrier()
"""


def test_a_cell_failing_on_a_node_raises_its_host_and_traceback(  # type: ignore[no-untyped-def]
    ip, testbed, unshared_run_dir, openmpi_python
) -> None:
    run_dir, _ = unshared_run_dir
    magics = ClusterMagics(ip)
    ip.register_magics(magics)
    magics.cluster = testbed.cluster(openmpi_python, run_dir, hosts=2).start()
    try:
        with capture_output() as out, pytest.raises(cb.JobFailedError) as raised:
            ip.run_cell_magic("mpirun", "-n 2", FAILS_ON_NODE2)
        said = str(raised.value).split("\n")
        host = testbed.hosts[1].name
        assert said[0] == f"job-0001 failed: rank 1 exited with code 1 on {host}.", said
        assert said[1:3] == ["Error on rank 1:", "Traceback (most recent call last):"]
        assert said[-1] == "RuntimeError: refused on node2"
        assert "RuntimeError" not in out.stderr  # in the error alone
    finally:
        magics.stop_cluster()
