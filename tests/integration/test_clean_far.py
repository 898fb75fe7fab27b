"""``clean="none"`` on nodes of other machines: fake hosts with real sshd and real Open MPI /
MPICH. A failed job's ranks and MPI daemons stay stopped (state T) on every node, named by
node and rank, until ``job.cleanup()`` or the cluster's ``stop()`` ends them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

# Rank 1 (on the second node) fails while rank 0 (on the first) waits for it.
RAISES = """\
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} up", flush=True)
if comm.rank == 1:
    time.sleep(0.3)
    raise RuntimeError("rank 1 gives up")
comm.Barrier()
"""

DAEMONS = {"prted", "hydra_pmi_proxy"}


def state(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"


def gone(pids: list[int], within: float = 10.0) -> list[int]:
    """Those of ``pids`` still there after ``within`` seconds (a zombie has gone)."""
    give_up = time.monotonic() + within
    while (left := [p for p in pids if state(p) not in ("gone", psutil.STATUS_ZOMBIE)]) and (
        time.monotonic() < give_up
    ):
        time.sleep(0.05)
    return left


@pytest.fixture
def kept() -> Iterator[list[int]]:
    """Pids a test saw kept: killed at teardown whatever happened (a stopped process ends
    only with SIGKILL). The fake hosts share this machine's process ids."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _kept_job(cluster: cb.Cluster, script: Path, kept: list[int]) -> cb.JobResult:
    job = cluster.mpirun(["python", str(script)], np=2, clean="none")
    result = job.wait(timeout=90)
    kept.extend(k.pid for k in result.kept)
    return result


def test_a_failed_job_is_kept_stopped_on_every_node_until_cleanup(
    testbed, mpi_python: str, tmp_path: Path, kept: list[int]
) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    node1, node2 = (h.processes for h in testbed.hosts[:2])
    with testbed.cluster(mpi_python, tmp_path / "run", hosts=2) as cluster:
        job = cluster.mpirun(["python", str(script)], np=2, clean="none")
        result = job.wait(timeout=90)
        kept.extend(k.pid for k in result.kept)
        assert not result.ok
        assert [f.rank for f in result.failed] == [1]
        assert "RuntimeError: rank 1 gives up" in result.failed[0].last_lines  # nothing lost
        launcher = [k for k in result.kept if k.name in ("mpirun", "mpiexec", "prterun")]
        assert launcher, result.kept  # the head's own, kept so that it kills none of them
        ranks = {k.rank: k for k in result.kept if k.rank is not None}
        assert sorted(ranks) == [0, 1], result.kept
        assert (ranks[0].host, ranks[1].host) == ("node1", "node2")
        assert ranks[0].pid in node1()
        assert ranks[1].pid in node2()
        daemons = {k.host for k in result.kept if k.name in DAEMONS}
        assert daemons == {"node1", "node2"}, result.kept  # the nodes' MPI daemons too
        assert {state(k.pid) for k in result.kept} == {psutil.STATUS_STOPPED}
        job.cleanup()
        assert gone([k.pid for k in result.kept]) == []

        # Without cleanup(), the cluster's stop() ends them.
        again = _kept_job(cluster, script, kept)
        assert {k.host for k in again.kept if k.rank is not None} == {"node1", "node2"}
        assert {state(k.pid) for k in again.kept} == {psutil.STATUS_STOPPED}
    assert gone([k.pid for k in again.kept]) == []
