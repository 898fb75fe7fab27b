"""The node program run on a node over ssh: one task in a process of its own
(:func:`run_task`), or a session that runs tasks one after another in one process
(:class:`NodeSession`: one login shell and one interpreter start for a node's whole
bootstrap), kept for the cluster's later steps (:class:`KeptSession`).

What runs there is :mod:`clusterbook.nodes.tasks`, sent as its source
(:func:`clusterbook.nodes.tasks.program.command`); the bytes of files go in its frames
(:mod:`clusterbook.nodes.tasks.files`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from clusterbook.errors import SSHError
from clusterbook.nodes.tasks.common import REPLY
from clusterbook.nodes.tasks.files import FRAME
from clusterbook.nodes.tasks.program import command
from clusterbook.ssh.shell import ProcessStarter, RemoteShell
from clusterbook.wording import spell

__all__ = ["KeptSession", "NodeSession", "TaskFailedError", "run_task"]


def _missing_python(python: str, host: str) -> str:
    elsewhere = spell("node_python", {host: "/path/bin/python"})
    fix = f", or give its path there with {elsewhere}" if elsewhere else ""
    return (
        f"Python {python!r} is missing on {host}; install the head's environment there at "
        f"the same path{fix}."
    )


def run_task(
    shell: RemoteShell, python: str, task: str, args: Mapping[str, Any], timeout: float = 60.0
) -> dict[str, Any]:
    """Run a node task (:mod:`clusterbook.nodes.tasks`) with ``python`` on the node; return
    its JSON."""
    result = shell.run(command(python, task, "-"), input=json.dumps(args).encode(), timeout=timeout)
    if result.returncode == 127:
        raise SSHError(_missing_python(python, shell.host), host=shell.host)
    if result.returncode != 0:
        tail = " / ".join(result.stderr.strip().splitlines()[-3:])
        raise SSHError(f"The {task} step failed on {shell.host}: {tail}", host=shell.host)
    try:
        reply: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return reply
    except (ValueError, IndexError):
        raise SSHError(
            f"The {task} step on {shell.host} printed no result (its shell start-up files may "
            f"print to stdout): {result.stdout[:200]!r}",
            host=shell.host,
        ) from None


class TaskFailedError(SSHError):
    """A node task raised; the session that ran it is fine and takes the next one."""


class NodeSession:
    """One Python process on a node running the bootstrap tasks one after another (one login
    shell and one interpreter start for the whole bootstrap, instead of one per step)."""

    def __init__(
        self,
        shell: ProcessStarter,
        python: str,
        *,
        owns_shell: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = shell.host
        self._python = python
        # A connection opened for this session alone is closed with it: else its sshd
        # session process stays on the node until the connection is garbage-collected.
        self._shell = shell if owns_shell else None
        # ``env``: what the process starts with (a session started with the agents' tag
        # starts the node's agent as a fork of itself: see ``nodes.tasks.commands.spawn``).
        self._proc = shell.start(command(python, "session"), env=env)

    def call(
        self,
        task: str,
        args: Mapping[str, Any],
        timeout: float = 60.0,
        *,
        frames: Iterable[bytes] | None = None,
        on_frame: Callable[[bytes, bytes], None] | None = None,
        then_import: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Run ``task`` on the node and return its result: with ``frames`` (encoded, see
        :func:`clusterbook.nodes.tasks.files.frame`) sent after the request, as they come, and
        ``on_frame(kind, payload)`` told each frame the task sends before its reply, up to
        the ``Z`` that ends them. ``timeout`` bounds each wait for the node, not the whole.
        ``then_import``: modules the session imports once its reply is out (see
        :func:`clusterbook.nodes.tasks.session.warm`); the next call waits for that."""
        request: dict[str, Any] = {"task": task, "args": args}
        if then_import:
            request["then_import"] = list(then_import)
        self._proc.send(json.dumps(request).encode() + b"\n")
        for piece in frames or ():
            self._proc.send(piece, timeout)
        while True:
            reply = self._reply(task, timeout)
            if "frames" not in reply:
                break
            while True:
                kind, payload = self._frame(task, timeout)
                if kind == b"Z":
                    break
                if on_frame is not None:
                    on_frame(kind, payload)
        if "error" in reply:
            raise TaskFailedError(
                f"The {task} step failed on {self.host}: {reply['error']}", host=self.host
            )
        answer: dict[str, Any] = reply["ok"]
        return answer

    def call_each(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Run several tasks one after the other on the node, with one wait for them all: the
        requests go out together and the replies are read in their order (the first task
        that failed raises, once every reply is in). Once one fails, the tasks after it are
        not run. No frames either way."""
        requests = (
            json.dumps({"task": t, "args": a, **({"if_ok": True} if i else {})}).encode() + b"\n"
            for i, (t, a) in enumerate(calls)
        )
        self._proc.send(b"".join(requests))
        replies = [self._reply(task, timeout) for task, _ in calls]
        for (task, _), reply in zip(calls, replies, strict=True):
            if "error" in reply:
                raise TaskFailedError(
                    f"The {task} step failed on {self.host}: {reply['error']}", host=self.host
                )
        return [reply["ok"] for reply in replies]

    def _reply(self, task: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            line = self._proc.readline(max(0.0, deadline - time.monotonic()))
            if not line:
                self._ended(task)
            text = line.decode(errors="replace")
            if text.startswith(REPLY):  # anything else is noise from shell start-up files
                reply: dict[str, Any] = json.loads(text[len(REPLY) :])
                return reply

    def _frame(self, task: str, timeout: float) -> tuple[bytes, bytes]:
        head = self._proc.read(FRAME.size, timeout)
        if len(head) < FRAME.size:
            self._ended(task)
        kind, size = FRAME.unpack(head)
        payload = self._proc.read(size, timeout) if size else b""
        if len(payload) < size:
            self._ended(task)
        return kind, payload

    def _ended(self, task: str) -> NoReturn:
        code, err = self._proc.close(timeout=5)
        if code == 127:
            raise SSHError(_missing_python(self._python, self.host), host=self.host)
        tail = " / ".join(err.strip().splitlines()[-3:]) or f"exit code {code}"
        raise SSHError(f"The {task} step ended on {self.host}: {tail}", host=self.host)

    def close(self) -> None:
        try:
            self._proc.close(timeout=10)
        finally:
            if self._shell is not None:
                self._shell.close()


class KeptSession:
    """A node's session kept for the cluster's later steps (files, job kills, clean-up), so
    each is a round trip instead of a login; when it is lost, a new one is started (once a
    call) with ``start``. One step at a time."""

    def __init__(self, start: Callable[[], NodeSession], session: NodeSession | None = None):
        self._start = start
        self._session = session
        self._lock = threading.Lock()

    def call(
        self,
        task: str,
        args: Mapping[str, Any],
        timeout: float = 60.0,
        **streams: Any,
    ) -> Any:
        """``NodeSession.call`` in the kept session; a call with ``frames`` or ``on_frame``
        (see there) is tried again in a new session only if none of its frames went or came
        (a session lost while it was idle)."""
        moved = False

        def sent(frames: Iterable[bytes]) -> Iterator[bytes]:
            nonlocal moved
            for piece in frames:
                moved = True
                yield piece

        def told(kind: bytes, payload: bytes) -> None:
            nonlocal moved
            moved = True
            streams["on_frame"](kind, payload)

        wrapped = dict(streams)
        if streams.get("frames") is not None:
            wrapped["frames"] = sent(streams["frames"])
        if streams.get("on_frame") is not None:
            wrapped["on_frame"] = told
        with self._lock:
            try:
                return self._call(task, args, timeout, wrapped)
            except TaskFailedError:
                raise
            except SSHError:
                if moved:
                    raise
                return self._call(task, args, timeout, wrapped)  # in a new session, once

    def _call(
        self, task: str, args: Mapping[str, Any], timeout: float, streams: dict[str, Any]
    ) -> Any:
        if self._session is None:
            self._session = self._start()
        try:
            return self._session.call(task, args, timeout=timeout, **streams)
        except TaskFailedError:
            raise
        except BaseException as exc:
            # Gone, or out of step after a timeout or a stream cut short here: not used again.
            if isinstance(exc, SSHError) or streams:
                lost, self._session = self._session, None
                with contextlib.suppress(Exception):
                    lost.close()
            raise

    def close(self) -> None:
        with self._lock:
            lost, self._session = self._session, None
            if lost is not None:
                with contextlib.suppress(Exception):
                    lost.close()
