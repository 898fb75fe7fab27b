"""Starting launcher processes so that they die with us, and stopping process trees."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

import psutil

from clusterbook.launch.guard import tagged
from clusterbook.nodes.tasks.procs import leftovers, remove_leftovers

__all__ = ["kill_tree", "spawn", "tree"]


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (an interrupt meant for us does not reach it) with
    piped output. No pre-exec hook, so Python can use vfork: starting is ~5 ms faster.
    Its death with ours is the guard's business (:mod:`clusterbook.launch.guard`)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _own_tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """:func:`tree` of ``proc`` while it runs or is a zombie of ours; none once reaped."""
    return tree(proc.pid) if proc.returncode is None else []


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants that are alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(proc: subprocess.Popen[bytes], grace: float, token: str = "") -> None:
    """SIGTERM the process (which passes it on to its ranks), SIGKILL what is left after
    ``grace`` seconds: its descendants, and every process tagged with job ``token`` (which
    finds them even after they lost their parent).

    The process's own tree is looked at only while it has not been reaped: once it has, its
    pid may be another process's (pids wrap, soon in a PID namespace of 32768), and its
    orphans carry the token."""
    members = _own_tree(proc)
    if token:
        members += [p for pid in tagged([token]) if (p := _process(pid)) is not None]
    left = leftovers([p.pid for p in members])
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    members += _own_tree(proc)
    if token:
        members += [p for pid in tagged([token]) if (p := _process(pid)) is not None]
    # A zombie has ended, though it stays in /proc until its (new) parent reaps it, which
    # can take a while when that is init: waiting for zombies to vanish wastes the grace.
    alive = [p for p in dict.fromkeys(members) if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _alive(p)]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    # What a killed MPI leaves (shared memory, its session directory) goes with it, once the
    # processes are gone (a SIGKILL takes effect soon, not at once).
    if left:
        end = time.monotonic() + 1.0
        while (busy := any(_alive(p) for p in dict.fromkeys(members))) and time.monotonic() < end:
            time.sleep(0.01)
        if not busy:
            remove_leftovers(left)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
