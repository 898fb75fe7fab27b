"""``cluster.map`` on the Slurm test bed: the pool is a step of the cluster's batch job on its
nodes, its ranks reach the head over the nodes' network, and nothing of it is left there once
the cluster stops."""

from __future__ import annotations

import os
import socket
import time

import pytest

import clusterbook as cb
from tests.integration.test_slurm import _left_on_nodes
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture


def test_a_sweep_on_a_slurm_cluster(slurm, openmpi_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seen = tmp_path / "seen"  # (the test bed's nodes share this machine's files)
    seen.mkdir()

    def where(x: int) -> tuple[int, str]:
        if x == 5:
            raise LookupError("five")
        host = socket.gethostname()
        (seen / host).touch()
        # Each item waits (30 s at most) until ranks on both nodes took one: on a loaded
        # machine one node's ranks can start late enough for the other's to take every item.
        give_up = time.monotonic() + 30
        while len(os.listdir(seen)) < 2 and time.monotonic() < give_up:
            time.sleep(0.02)
        return x + 1, host

    cluster = cb.Cluster.slurm(nodes=2, time="10m", python=openmpi_python, run_dir=tmp_path / "r")
    with cluster:
        cluster.wait_ready(timeout=60)
        result = cluster.map(where, range(30), progress=False)
        assert set(result.failed) == {5}
        assert "LookupError: five" in result.failed[5].remote_traceback
        values = [v for v in result.values() if v is not None]
        assert [v[0] for v in values] == [x + 1 for x in range(30) if x != 5]
        assert {v[1] for v in values} == set(slurm.hosts)
    assert _left_on_nodes(slurm) == {}
