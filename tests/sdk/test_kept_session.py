"""A node's session kept for later steps: replaced once when lost, never for a task error."""

from __future__ import annotations

import pytest

from clusterbook.errors import SSHConnectError
from clusterbook.ssh.bootstrap import KeptSession, TaskFailedError


class _Session:
    """A stand-in NodeSession: answers ``ok`` until told to fail."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.calls, self.closed = fail, 0, False

    def call(self, task, args, timeout):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return {"task": task}

    def close(self) -> None:
        self.closed = True


def test_a_kept_session_is_replaced_once_when_lost_but_not_when_its_task_fails() -> None:
    lost = _Session(SSHConnectError("gone", host="n1"))
    started = [_Session()]
    kept = KeptSession(lambda: started.pop(), lost)  # type: ignore[arg-type,return-value]
    assert kept.call("kill", {}) == {"task": "kill"}  # lost -> a new session, same call
    assert lost.closed
    assert started == []

    failing = _Session(TaskFailedError("the task raised", host="n1"))
    kept = KeptSession(lambda: pytest.fail("no new session for a task error"), failing)  # type: ignore[arg-type]
    with pytest.raises(TaskFailedError):
        kept.call("put_chunk", {})
    assert failing.calls == 1
    assert not failing.closed

    down = [_Session(SSHConnectError("gone", host="n1")) for _ in range(2)]
    kept = KeptSession(lambda: down.pop(), None)  # type: ignore[arg-type,return-value]
    with pytest.raises(SSHConnectError):  # twice lost: said, not retried for ever
        kept.call("kill", {})
    assert down == []
