"""``cluster.engines()`` on SSH nodes (fake hosts: network namespaces with their own sshd):
the engines reach the controller at the head's address on the nodes' network."""

from __future__ import annotations

import contextlib
import json
import time

import psutil
import pytest

from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts


def _allreduce_where() -> tuple[str, int]:
    import socket

    from mpi4py import MPI

    return socket.gethostname(), MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank() + 1)


def _strays(bed, wait: float = 5.0) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + wait
    while True:
        out: dict[str, list[str]] = {}
        for h in bed.hosts:
            for pid in h.processes():
                if pid != h.sshd.pid:
                    with contextlib.suppress(psutil.Error):
                        out.setdefault(h.name, []).append(" ".join(psutil.Process(pid).cmdline()))
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_engines_on_two_hosts_reach_the_head(testbed, openmpi_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2)
    with cluster:
        rc = cluster.engines(2, timeout=60)
        assert rc.ids == [0, 1]
        assert rc[:].apply_sync(_allreduce_where) == [("node1", 3), ("node2", 3)]
        # Their traffic crosses the nodes' network: CurveZMQ-encrypted by default.
        security = next((cluster.run_dir / "ipyparallel").glob("controller-*/security"))
        info = json.loads((security / "ipcontroller-engine.json").read_text())
        assert info["curve_serverkey"]
    assert _strays(testbed) == {}
