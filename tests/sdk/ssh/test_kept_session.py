"""A node's session kept for later steps: replaced once when lost, never for a task error."""

from __future__ import annotations

import pytest

from clusterbook.errors import SSHConnectError
from clusterbook.ssh.node_session import KeptSession, TaskFailedError


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


class _Streaming(_Session):
    """A stand-in NodeSession for calls with frames: takes ``takes`` of them, then fails
    (if told to) or answers with how many it took."""

    def __init__(self, fail: Exception | None = None, takes: int = 0) -> None:
        super().__init__(fail)
        self.takes = takes

    def call(self, task, args, timeout, frames=(), on_frame=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        taken = [piece for _, piece in zip(range(self.takes), frames, strict=False)]
        if on_frame is not None and self.takes:
            on_frame(b"D", b"x")
        if self.fail is not None:
            raise self.fail
        return {"took": len(taken)}


def test_a_stream_is_sent_again_in_a_new_session_only_if_none_of_it_went() -> None:
    lost = SSHConnectError("gone", host="n1")
    # Lost while idle: the request found no session, no frame went: a new one takes it all.
    kept = KeptSession(lambda: _Streaming(takes=3), _Streaming(lost, takes=0))  # type: ignore[arg-type,return-value]
    assert kept.call("put_files", {}, frames=iter([b"1", b"2", b"3"])) == {"took": 3}
    # Lost with frames gone (or come): said, not sent again.
    for streams in ({"frames": iter([b"1", b"2"])}, {"on_frame": lambda kind, payload: None}):
        kept = KeptSession(_no_new_session, _Streaming(lost, takes=1))  # type: ignore[arg-type]
        with pytest.raises(SSHConnectError):
            kept.call("put_files", {}, **streams)


def _no_new_session() -> None:
    pytest.fail("a stream cut off after some of its frames is not sent again")
