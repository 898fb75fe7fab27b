"""Make sure a job's processes die with the Python process that started them, and that a
cluster whose head dies with it leaves no secret behind on this machine.

Every process of a job carries ``CLUSTERBOOK_JOB=<token>`` in its environment (the launcher
passes it to the ranks; their children inherit it). A guard process, one per Python process,
holds the read end of a pipe from us. When we die, even by SIGKILL, the kernel closes the pipe;
the guard then finds every process whose environment carries a live job's token, wherever it
was reparented to, and stops it (SIGTERM, SIGKILL a second later). A launcher's own clean-up
on its parent's death is not relied on: it can die half-way (seen with Open MPI's prterun).
The head of a cluster that runs here registers its directory too: the guard then removes its
rendezvous token and ssh keys (its nodes clean theirs when they lose the head).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading

from clusterbook.nodes.tasks.common import JOB_ENV as ENV
from clusterbook.nodes.tasks.procs import kill_tagged, tagged
from clusterbook.nodes.tasks.program import ENTRY

__all__ = ["ENV", "Guard", "guard", "kill_tagged", "tagged"]

# Run from its files with -S: it imports nothing but the standard library.
_SCRIPT = ENTRY


class Guard:
    """The guard process of this Python process, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-S", _SCRIPT, "reap"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # an interrupt sent to our group does not reach it
                )
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def watch(self, token: str) -> None:
        """Kill the processes tagged with ``token`` if this process dies."""
        self._send(f"+ {token}")

    def release(self, token: str) -> None:
        """The job has ended: nothing to do for ``token`` any more."""
        self._send(f"- {token}")

    def watch_dir(self, directory: str) -> None:
        """Remove what a cluster's head keeps in ``directory`` (its token, its keys) if this
        process dies with the cluster running (``nodes.tasks.procs.remove_head_files``)."""
        self._send(f"+dir {directory}")

    def release_dir(self, directory: str) -> None:
        """The cluster has stopped and cleaned ``directory``: remove it if that emptied it."""
        with contextlib.suppress(OSError):
            os.rmdir(directory)
        self._send(f"-dir {directory}")

    def close(self) -> None:
        """At exit: end the guard the way our death would (jobs still registered die)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


guard = Guard()
atexit.register(guard.close)
