"""Whether the process a record names as its cluster's head still is that process.

A pid alone cannot tell: once the head is gone, the system gives its pid to another process
sooner or later, and a record naming it would say the cluster runs forever. The head writes,
besides its pid, its start time (clock ticks since boot, from ``/proc/PID/stat``) and its
program (``/proc/PID/exe``): a process with that pid, that start time and that program is
the head. Only the machine the head ran on can tell, and only where ``/proc`` can be read.
"""

from __future__ import annotations

import os
import socket
from typing import Literal

__all__ = ["HeadState", "head_state", "own_mark", "process_mark"]

#: ``alive``: the head runs; ``gone``: it does not (ended, a zombie, or its pid is another
#: process's now); ``unknown``: this machine cannot tell.
HeadState = Literal["alive", "gone", "unknown"]

_DELETED = " (deleted)"  # what /proc/PID/exe adds once the program's file was replaced
_own: dict[int, tuple[int | None, str | None]] = {}


def process_mark(pid: int) -> tuple[str, int, str | None] | None:
    """Process ``pid``'s state letter, start time (ticks since boot) and program, or None
    when ``/proc`` cannot say (no such process, or no ``/proc``). The program is None where
    it cannot be read (another user's process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        state, started = fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
    try:
        program: str | None = os.readlink(f"/proc/{pid}/exe").removesuffix(_DELETED)
    except OSError:
        program = None
    return state, started, program


def own_mark() -> tuple[int | None, str | None]:
    """This process's start time and program, as a head writes them in its record (once a
    process: neither changes; (None, None) without ``/proc``)."""
    pid = os.getpid()
    if pid not in _own:
        mark = process_mark(pid)
        _own[pid] = (None, None) if mark is None else mark[1:]
    return _own[pid]


def head_state(
    pid: int,
    host: str,
    started: int | None,
    program: str | None,
    *,
    here: str | None = None,
) -> HeadState:
    """Whether process ``pid`` on ``host``, started at ``started`` and running ``program``,
    runs; asked on ``here`` (default: this machine's name). A record without a start time
    (written by an older clusterbook) whose pid runs is ``unknown``: the pid may be another
    process's."""
    if pid <= 0 or host != (here or socket.gethostname()):
        return "unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # another user's process: the pid runs, and is not the head if it started later
    mark = process_mark(pid)
    if mark is None:
        return "unknown"
    state, now_started, now_program = mark
    if state == "Z":  # a zombie only waits for its parent to read its status
        return "gone"
    if started is None:
        return "unknown"
    if now_started != started:
        return "gone"
    if program is not None and now_program is not None and now_program != program:
        return "gone"  # the head's pid and start time, another program: it exec'd another
    return "alive"
