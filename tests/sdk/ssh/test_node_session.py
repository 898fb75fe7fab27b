"""A node's bootstrap session, run here (the same tasks, the same process protocol as over
ssh): tasks sent together are answered in order, one failing does not derail the others."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from clusterbook.ssh.bootstrap import encode_files
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.node_session import NodeSession, TaskFailedError


@pytest.fixture
def session() -> Iterator[NodeSession]:
    s = NodeSession(LocalShell(), sys.executable)
    yield s
    s.close()


def test_tasks_sent_together_are_answered_in_their_order(session) -> None:
    probe = {"prefix": sys.prefix, "flavour": "openmpi"}
    facts, free = session.call_each([("probe", probe), ("free_port", {})])
    assert facts["python"] == sys.executable
    assert isinstance(free["port"], int)


def test_one_failing_among_them_raises_after_all_answered(session) -> None:
    with pytest.raises(TaskFailedError, match="install step failed"):
        session.call_each([("install", {"cluster_id": "../x", "files": {}}), ("free_port", {})])
    # Every reply was read: the session is in step for the next call.
    assert isinstance(session.call("free_port", {})["port"], int)


def test_a_task_after_a_failing_one_is_not_run(tmp_path) -> None:
    # (A node's agent is not started where its files could not be put.)
    session = NodeSession(LocalShell(), sys.executable, env={"HOME": str(tmp_path)})
    marker = {"cluster_id": "cb-test", "files": encode_files({"marker": ("600", b"put")})}
    try:
        with pytest.raises(TaskFailedError, match="install step failed"):
            session.call_each(
                [("install", {"cluster_id": "../x", "files": {}}), ("install", marker)]
            )
        assert list(tmp_path.rglob("marker")) == []
        # After one that worked, it runs; and a failure does not outlive its batch.
        session.call_each([("free_port", {}), ("install", marker)])
        assert [p.read_bytes() for p in tmp_path.rglob("marker")] == [b"put"]
    finally:
        session.close()
