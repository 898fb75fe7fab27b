"""How an attempt ended, told from what its ranks reported to its log store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterbook.errors import ClusterError
from clusterbook.launch.ending import attempt_result, name_kept, ranks_first
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.rankwrap import MARK
from clusterbook.launch.result import KeptProcess
from clusterbook.spec import NodeSpec


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LogStore]:
    made = LogStore(tmp_path, {0: "node1", 1: "node1", 2: "node2"}, launcher_host="head")
    yield made
    made.close()


def report(store: LogStore, rank: int, what: str) -> None:
    store.add(rank, "stderr", f"{MARK} {what}")


def test_the_first_failure_is_the_failure_not_the_ranks_torn_down_after_it(
    store: LogStore,
) -> None:
    for rank, host in ((0, "n1"), (1, "n1"), (2, "n2")):
        report(store, rank, f"start {host} {100 + rank}")
    store.add(1, "stderr", "ValueError: boom")
    report(store, 1, "exit 3")
    report(store, 0, "exit 143")  # the launcher's clean-up: SIGTERM
    store.add(None, "stderr", "mpirun noticed that rank 1 exited")
    result = attempt_result(
        store, "job-0001", 1, 4, 3, 2.5, stop_reason=None, stopped_at=None, error=None
    )
    assert [(f.rank, f.host, f.exit_code, f.last_lines) for f in result.failed] == [
        (1, "n1", 3, ("ValueError: boom",))
    ]
    assert result.rank_exit_codes == {0: 143, 1: 3, 2: None, 3: None}
    assert result.rank_hosts == {0: "n1", 1: "n1", 2: "n2", 3: "?"}
    assert set(result.rank_times) == {0, 1, 2}  # rank 3 never reported
    assert result.rank_times[2][1] is None  # started, never ended
    assert result.launcher_tail == ("mpirun noticed that rank 1 exited",)
    assert (result.returncode, result.duration, result.attempt) == (3, 2.5, 1)
    assert not result.ok


@pytest.mark.parametrize("reason", ["timeout", "cancel", "error"])
def test_ranks_that_exit_after_clusterbook_stopped_the_attempt_were_stopped_not_failed(
    store: LogStore, reason: str
) -> None:
    report(store, 2, "exit 5")  # before the stop: a failure
    report(store, 0, "exit 1")  # after it: stopped
    error = ClusterError("node2 was lost") if reason == "error" else None
    result = attempt_result(
        store, "job-0002", 2, 3, -15, 1.0, stop_reason=reason, stopped_at=1, error=error
    )
    assert [f.rank for f in result.failed] == [2]
    assert (result.timed_out, result.cancelled) == (reason == "timeout", reason == "cancel")
    assert result.error == ("node2 was lost" if reason == "error" else None)
    assert result.attempt == 2


def test_after_a_stop_for_a_failure_every_rank_that_failed_on_its_own_is_told(
    store: LogStore,
) -> None:
    report(store, 2, "exit 5")
    report(store, 1, "exit 7")  # after the stop, but the stop was for rank 2's failure
    result = attempt_result(
        store, "job-0003", 1, 3, 1, 1.0, stop_reason="failure", stopped_at=1, error=None
    )
    assert [f.rank for f in result.failed] == [2, 1]
    assert not result.timed_out


def test_kept_processes_are_named_as_their_ranks_reported_them_ranks_first(
    store: LogStore,
) -> None:
    report(store, 0, "start gpu-a 11")
    report(store, 1, "start gpu-a 12")
    report(store, 2, "start gpu-b 22")
    node1, node2 = NodeSpec("node1", "10.0.0.1", 2), NodeSpec("node2", "10.0.0.2", 1)
    node_of = {0: node1, 1: node1, 2: node2}
    kept = (
        KeptProcess(9, "node2", "orted"),
        KeptProcess(22, "node2", "python"),
        KeptProcess(11, "node1", "python"),
        KeptProcess(5, "elsewhere", "sleep"),
    )
    named = name_kept(kept, node_of, store)
    assert named == (
        KeptProcess(9, "gpu-b", "orted"),
        KeptProcess(22, "gpu-b", "python", rank=2),
        KeptProcess(11, "gpu-a", "python", rank=0),
        KeptProcess(5, "elsewhere", "sleep"),
    )
    assert [(k.rank, k.pid) for k in ranks_first(named)] == [(0, 11), (2, 22), (None, 5), (None, 9)]
