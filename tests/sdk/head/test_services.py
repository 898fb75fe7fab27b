"""The head's services for a head state, with no cluster: a made-up HeadState (injected) is
written as its record, kept by the keeper, and asked through the real control server what
attached handles ask."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import clusterbook as cb
from clusterbook.head.control import SOCKET_FILE, TOKEN_FILE, ControlClient, unix_dial
from clusterbook.head.record import read_record
from clusterbook.head.services import HeadServices, record_of
from clusterbook.head.state import HeadState, HeadTerms, HeadTimes
from clusterbook.launch.jobdir import make_run_dir
from clusterbook.lifetime import Lifetime
from clusterbook.nodes.commands import NodeRun
from clusterbook.status import ClusterSnapshot, NodeStatus


@dataclass
class MadeUpHead:
    """A head state with one node and no job, which notes what it is asked."""

    run_dir: Path
    id: str = "made-20260101-000000"
    name: str = "made"
    kind: str = "fake"
    state: str = "running"
    python: str = "/usr/bin/python3"
    join_command: str | None = None
    times: HeadTimes = field(default_factory=lambda: HeadTimes(created=1.0, started=2.0))
    terms: HeadTerms = field(
        default_factory=lambda: HeadTerms(Lifetime(life_span=3600.0), retention=60.0)
    )
    jobs: Sequence[Any] = ()
    asked: list[tuple[str, object]] = field(default_factory=list)

    def snapshot(self, *, jobs: bool = True) -> ClusterSnapshot:
        self.asked.append(("snapshot", jobs))
        node = NodeStatus("n0", "localhost", 2, "ready")
        return ClusterSnapshot(self.name, self.kind, self.state, (node,), (), None, "", 1.0)

    def changed(self, *, record: bool = False) -> None:
        self.asked.append(("changed", record))

    def stop_for(self, reason: str) -> None:
        self.asked.append(("stop_for", reason))

    def mpirun(self, argv: Sequence[str], np: int | None = None, **job: Any) -> Any:
        raise cb.ClusterStateError("made up: no jobs here")

    def job(self, job_id: str | None = None) -> Any:
        raise cb.ClusterStateError(f"made up: no job {job_id}")

    def wait_ready(self, timeout: float = 60, *, progress: bool | None = None) -> None:
        self.asked.append(("wait_ready", timeout))

    def reinstate(self, node: str) -> None:
        if node != "n1":
            raise cb.ConfigError(f"made up: no node {node!r}")
        self.asked.append(("reinstate", node))

    def put(
        self,
        *paths: str | os.PathLike[str],
        progress: bool | None = None,
        dest: str | os.PathLike[str] | None = None,
    ) -> None:
        self.asked.append(("put", paths, dest))

    def write(
        self,
        path: str | os.PathLike[str],
        data: bytes | str,
        nodes: str | Collection[str] | None = None,
        *,
        mode: int = 0o644,
    ) -> None:
        self.asked.append(("write", path, data, nodes, mode))

    def gather(
        self, directory: str | os.PathLike[str], *, progress: bool | None = None
    ) -> list[Path]:
        return [Path(directory) / "a"]

    def resource_history(
        self,
        window: float | None = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        self.asked.append(("resource_history", window, nodes, points))
        series = {"t": [1.0], "cpu": [5.0], "memory_used_gib": [1.0], "memory_gib": 4.0}
        return {"interval": 1.0, "nodes": {"n0": {**series, "gpu": [None]}}}

    def node_runs(
        self,
        argv: Sequence[str],
        timeout: float = 60.0,
        nodes: str | Collection[str] | None = None,
    ) -> list[NodeRun]:
        return [NodeRun(n, "localhost", 0, " ".join(argv), "", 0.1) for n in nodes or ["n0"]]


@pytest.fixture
def head(tmp_path: Path) -> MadeUpHead:
    run_dir = tmp_path / "made-20260101-000000"
    make_run_dir(run_dir)
    return MadeUpHead(run_dir)


def test_the_record_is_made_of_the_head_state_alone(head: MadeUpHead) -> None:
    state: HeadState = head  # what the services take (mypy checks the made-up one too)
    record = record_of(state, None, reason="asked")
    assert (record.id, record.name, record.kind, record.state) == (
        head.id,
        "made",
        "fake",
        "running",
    )
    assert (record.created, record.started, record.stop_reason) == (1.0, 2.0, "asked")
    assert (record.life_span, record.retention, record.detached) == (3600.0, 60.0, False)
    assert [n.name for n in record.nodes] == ["n0"]
    assert record.address is None  # no control server before start()
    # The jobs' statuses are left out of the snapshot: the record makes its own entries.
    assert head.asked == [("snapshot", False)]


def test_the_services_answer_attached_handles_for_the_head_state(head: MadeUpHead) -> None:
    services = HeadServices(head)
    services.start(started=2.0)
    try:
        assert read_record(head.run_dir).address == str(head.run_dir / SOCKET_FILE)
        sock = head.run_dir / SOCKET_FILE
        client = ControlClient(unix_dial(sock), head.run_dir / TOKEN_FILE, where=str(sock))
        try:
            client.call("wait_ready", timeout=5)
            rows = client.call("run_on_nodes", argv=["echo", "hi"], timeout=5)["rows"]
            assert [r["stdout"] for r in rows] == ["echo hi"]
            rows = client.call("run_on_nodes", argv=["true"], timeout=5, nodes=["n1"])["rows"]
            assert [r["node"] for r in rows] == ["n1"]
            history = client.call("resource_history", window=30.0, nodes=["n0"], points=9)
            assert history == head.resource_history(30.0)
            assert ("resource_history", 30.0, ["n0"], 9) in head.asked
            client.call("put", paths=["/a"], dest="data/")
            client.call("reinstate", node="n1")
            with pytest.raises(cb.ConfigError, match="no node 'n9'"):
                client.call("reinstate", node="n9")
            client.call("write", path="conf.txt", data="AAE=", nodes=["n0"], mode=0o600)
            with pytest.raises(cb.ConfigError, match="not base64"):
                client.call("write", path="conf.txt", data="not base64!")
            with pytest.raises(cb.ClusterStateError, match="has no job 7"):
                client.call("cancel", job=7)
            client.call("stop", reason="a handle asked")
        finally:
            client.close()
        assert ("wait_ready", 5.0) in head.asked
        assert ("put", ("/a",), "data/") in head.asked
        assert ("reinstate", "n1") in head.asked
        assert ("write", "conf.txt", b"\x00\x01", ["n0"], 0o600) in head.asked
        assert ("changed", True) in head.asked  # the nodes read next come from the record
        deadline = time.monotonic() + 10  # the stop runs on a thread of its own
        while ("stop_for", "a handle asked") not in head.asked:
            assert time.monotonic() < deadline, head.asked
            time.sleep(0.05)
    finally:
        services.close()
    record = read_record(head.run_dir)
    assert (record.state, record.address) == ("stopped", None)


@dataclass
class MadeUpJob:
    """What the record reads of a job; counts how often its status is read."""

    id: str
    directory: Path
    outcome: Any = None
    np: int = 2
    argv: tuple[str, ...] = ("prog",)
    started: float = 1.0
    plan: Any = field(default_factory=lambda: SimpleNamespace(job_token=None))
    last_reason: str | None = None
    restarts: int = 0
    label: str | None = None
    reads: int = 0

    @property
    def attempt(self) -> int:
        self.reads += 1
        return 1


def test_an_ended_jobs_entry_is_made_once_for_every_record(head: MadeUpHead) -> None:
    ok = SimpleNamespace(ok=True, returncode=0, duration=2.0, failed_ranks=())
    done = MadeUpJob("job-0001", head.run_dir / "job-0001", outcome=ok)
    running = MadeUpJob("job-0002", head.run_dir / "job-0002")
    head.jobs = (done, running)
    services = HeadServices(head)
    first, second = record_of(head, services), record_of(head, services)
    assert [(j.id, j.state, j.ended) for j in second.jobs] == [
        ("job-0001", "succeeded", 3.0),
        ("job-0002", "running", None),
    ]
    assert second.jobs[0] is first.jobs[0]
    assert (done.reads, running.reads) == (1, 2)  # a running job's, at every record
    running.outcome = ok  # it ended: its entry says so from then on
    assert record_of(head, services).jobs[1].state == "succeeded"


def test_an_ended_jobs_json_is_made_once_and_the_record_reads_the_same(head: MadeUpHead) -> None:
    ok = SimpleNamespace(ok=True, returncode=0, duration=2.0, failed_ranks=())
    done = MadeUpJob("job-0001", head.run_dir / "job-0001", outcome=ok)
    running = MadeUpJob("job-0002", head.run_dir / "job-0002")
    head.jobs = (done, running)
    head.join_command = 'say "jobs": [] here'  # a value that looks like the jobs' place
    services = HeadServices(head)
    record = record_of(head, services)
    text = record.to_json(services.job_json)
    assert text == record.to_json()  # what json.dumps of the whole record writes
    assert json.loads(text)["jobs"][1]["id"] == "job-0002"
    # The record is rewritten at every job's start and end: an ended job's JSON is kept.
    assert services.job_json(record.jobs[0]) is services.job_json(record.jobs[0])
    assert services.job_json(record.jobs[1]) is not services.job_json(record.jobs[1])
