"""Starting launcher processes so that they die with us, and stopping process trees."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import psutil

from clusterbook.launch.guard import tagged

__all__ = ["kill_tree", "spawn", "tree"]

_PR_SET_PDEATHSIG = 1
# A parent-death signal fires when the *thread* that forked exits, so processes are forked
# from one thread that lives as long as the interpreter.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clusterbook-spawn")


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, stdout_file: int | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with piped output; it gets SIGTERM if we die."""
    parent = os.getpid()
    preexec = (lambda: _die_with_parent(parent)) if sys.platform == "linux" else None

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_file is None else stdout_file,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
        )

    return _SPAWNER.submit(start).result()


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
    finds them even after they lost their parent)."""
    members = tree(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    members += tree(proc.pid)
    if token:
        members += [p for pid in tagged([token]) if (p := _process(pid)) is not None]
    alive = [p for p in dict.fromkeys(members) if _alive(p)]
    if alive:
        psutil.wait_procs(alive, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


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
