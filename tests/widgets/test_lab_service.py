"""The clusters API's parts without HTTP: log positions that never move, the window of kept
lines, the status of each error, and a cluster attached once however often it is asked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from clusterbook.errors import (
    ClusterError,
    ClusterStateError,
    ConfigError,
    RecordError,
    UnknownClusterError,
    UnknownProfileError,
)
from clusterbook.launch.logs import LogRecord
from clusterbook.launch.result import JobResult
from clusterbook_widgets.lab.follow import LogCursor
from clusterbook_widgets.lab.routes import status_of
from clusterbook_widgets.lab.service import ClusterService, Handle, UnknownJobError
from tests.widgets.labserver import start_detached, stop_all


class _Job:
    """A job whose files grow by what the test appends (records arrive in batches)."""

    def __init__(self) -> None:
        self.batches: list[list[LogRecord]] = []
        self.ended = False

    @property
    def outcome(self) -> JobResult | None:
        return (
            None
            if not self.ended
            else JobResult.from_dict({"job_id": "job-0001", "returncode": 0, "duration": 1.0})
        )

    def read_new(self, offsets: dict[Path, int]) -> list[LogRecord]:
        out = [r for batch in self.batches for r in batch]
        self.batches.clear()
        return out


def _lines(rank: int, n: int, start: int = 0) -> list[LogRecord]:
    return [LogRecord(float(i), rank, f"h{rank}", "stdout", f"l{i}") for i in range(start, n)]


def test_a_position_names_the_same_line_whatever_arrives_later() -> None:
    job = _Job()
    cursor = LogCursor(job)
    job.batches.append(_lines(0, 3))
    first = cursor.page(0)
    assert [(ln["position"], ln["text"]) for ln in first["lines"]] == [
        (0, "l0"), (1, "l1"), (2, "l2"),
    ]  # fmt: skip
    assert (first["next"], first["ended"], first["missed"]) == (3, False, 0)
    job.batches.append(_lines(1, 2))  # earlier times, read later: after the first three
    second = cursor.page(first["next"])
    assert [(ln["position"], ln["rank"]) for ln in second["lines"]] == [(3, 1), (4, 1)]
    assert [ln["text"] for ln in cursor.page(1, limit=2)["lines"]] == ["l1", "l2"]
    job.ended = True
    last = cursor.page(5)
    assert (last["lines"], last["next"], last["ended"]) == ([], 5, True)
    assert cursor.page(0, limit=1)["ended"] is False  # more lines after this page


def test_a_reader_behind_the_kept_window_is_told_what_it_missed() -> None:
    job = _Job()
    cursor = LogCursor(job, keep=4)
    job.batches.append(_lines(0, 10))
    page = cursor.page(2)
    assert [ln["position"] for ln in page["lines"]] == [6, 7, 8, 9]
    assert (page["missed"], page["next"]) == (4, 10)
    assert cursor.page(99)["next"] == 10


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UnknownClusterError("x", known=()), 404),
        (UnknownJobError("x"), 404),
        (UnknownProfileError("x", path="p", profile="q", known=()), 404),
        (RecordError("x", path="p"), 404),
        (ClusterStateError("x"), 409),
        (ConfigError("x"), 400),
        (ClusterError("x"), 500),
    ],
)
def test_each_error_has_its_status(error: ClusterError, status: int) -> None:
    assert status_of(error) == status


def test_bad_positions_and_ids_are_refused_naming_them(tmp_path: Path) -> None:
    service = ClusterService(root=tmp_path)
    with pytest.raises(ConfigError, match="after=-1"):
        service.logs("x", "job-0001", -1)
    with pytest.raises(UnknownClusterError, match=r"'\.\./etc'"):
        service.jobs("../etc")
    with pytest.raises(ConfigError, match="window=0"):
        service.resources("x", 0)
    with pytest.raises(ConfigError, match="profile=None"):
        service.new(None)


class _Counted:
    """An attached handle that says whether it was closed."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.closed = handle, False

    def stop(self, timeout: float = 30.0) -> None:
        self.handle.stop(timeout=timeout)

    def resource_history(self, window: float | None = None) -> dict[str, Any]:
        return self.handle.resource_history(window)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.closed = True
        self.handle.close()


@pytest.mark.mpi
def test_a_running_cluster_is_attached_once_and_let_go_when_it_stops(
    tmp_path: Path, openmpi_python: str
) -> None:
    from clusterbook.cluster.remote.attached import AttachedCluster
    from tests.notebooks.runner import kernel_env

    env = kernel_env(tmp_path / "home") | {"CLUSTERBOOK_RUN_ROOT": str(tmp_path / "runs")}
    attached: list[_Counted] = []

    def attach(directory: str) -> Handle:
        attached.append(_Counted(AttachedCluster.attach(directory)))
        return attached[-1]

    service = ClusterService(root=tmp_path / "runs", attach=attach)
    try:
        cluster_id = start_detached(env, "once")
        assert sys.executable == openmpi_python
        for _ in range(5):  # a sidebar polling
            assert service.clusters()[0]["id"] == cluster_id
            assert list(service.resources(cluster_id, 60)["nodes"]) == ["local-0"]
        assert len(attached) == 1
        assert service.stop(cluster_id)["state"] == "stopped"
        assert attached[0].closed  # let go of once the cluster stopped
        with pytest.raises(ClusterStateError, match="stopped, not running"):
            service.handle(cluster_id)
        assert len(attached) == 1
    finally:
        service.close()
        stop_all(env)


def test_a_damaged_record_is_listed_as_such_and_asked_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken-20260101-000000"
    broken.mkdir()
    (broken / "cluster.json").write_text("{not json")
    service = ClusterService(root=tmp_path, attach=_never)
    (listed,) = service.clusters()
    assert (listed["id"], listed["state"], listed["running"]) == (broken.name, "damaged", False)
    assert listed["problem"]
    with pytest.raises(UnknownClusterError, match="broken"):
        service.stop(broken.name)


def _never(directory: str) -> Handle:
    raise AssertionError(f"attached to {directory}")
