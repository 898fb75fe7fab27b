"""The node program's entry: the tasks by name, ``main`` (one task, or a ``session`` that
runs tasks as they come on stdin, one reply line each), and ``warm`` (imports done once a
reply is out)."""

import contextlib
import json
import sys
from collections.abc import Callable, Iterable

from .commands import free_port, run, spawn, tail
from .common import REPLY, TYPE_CHECKING, Args, Reply
from .files import (
    FRAME_DATA,
    gather_chunk,
    gather_done,
    gather_files,
    gather_list,
    put_begin,
    put_chunk,
    put_cleanup,
    put_files,
)
from .install import cleanup, install, release, status
from .probe import probe
from .procs import hold, kill, reap

if TYPE_CHECKING:
    from typing import Any

TASKS: dict[str, Callable[[Args], Reply]] = {
    "probe": probe,
    "install": install,
    "status": status,
    "cleanup": cleanup,
    "release": release,
    "kill": kill,
    "hold": hold,
    "free_port": free_port,
    "run": run,
    "spawn": spawn,
    "tail": tail,
    "put_begin": put_begin,
    "put_chunk": put_chunk,
    "put_cleanup": put_cleanup,
    "gather_list": gather_list,
    "gather_chunk": gather_chunk,
    "gather_done": gather_done,
}


#: Tasks that read frames after their request (``put_files``) or write frames before their
#: reply (``gather_files``, after a ``{"frames": true}`` reply line).
STREAMS: dict[str, Callable[[Args, "Any", "Any"], Reply]] = {
    "put_files": put_files,
    "gather_files": gather_files,
}


class SkippedError(Exception):
    """A request sent with ``if_ok`` came after one that failed: it was not run."""


def session() -> None:
    """Run tasks as they come, one JSON request per line on stdin, one reply line each,
    so that a node pays for one login shell and one Python start for all of its bootstrap.
    The bytes of files travel raw, in frames (:func:`read_frame`) between the lines."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for fd in (0, 1):  # sshd and this process hand files over in 1 MiB, not 64 KiB, pipefuls
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, FRAME_DATA)
    failed = False  # the last request's outcome: one sent "if_ok" is skipped after a failure
    while line := stdin.readline():
        request = json.loads(line)
        reply: dict[str, object]
        try:
            task = request["task"]
            if failed and request.get("if_ok"):
                raise SkippedError("not run: the step before it failed")
            if task in STREAMS:
                if task == "gather_files":
                    stdout.write(f"{REPLY}{json.dumps({'frames': True})}\n".encode())
                reply = {"ok": STREAMS[task](request["args"], stdin, stdout)}
            else:
                reply = {"ok": TASKS[task](request["args"])}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        failed = "error" in reply
        stdout.write(f"{REPLY}{json.dumps(reply)}\n".encode())
        stdout.flush()
        if modules := request.get("then_import"):
            warm(modules)


def warm(modules: Iterable[str]) -> None:
    """Import ``modules`` now, as far as they can be: what a request names for the session to
    do once its reply is out. The node's agent, a fork of this session, starts with them
    imported, and their import falls in the time the head is busy with the other nodes
    rather than on the way to the cluster being ready. Nothing is lost when one is missing:
    whoever needs it imports it again, and meets the error then."""
    import importlib

    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def main(argv: list[str]) -> None:
    if argv[1] == "session":
        session()
        return
    if argv[1] == "reap":
        reap()
        return
    task, payload = argv[1], argv[2] if len(argv) > 2 else "{}"
    args = json.loads(sys.stdin.read() if payload == "-" else payload)
    print(json.dumps(TASKS[task](args)))
