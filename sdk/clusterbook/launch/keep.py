"""What is left of a finished job's processes: the clean policy (``clean=``), and keeping a
failed job's processes stopped for inspection (``clean="none"``).

The policy is Kubeflow MPIJob's ``cleanPodPolicy`` in a job's own terms. Keeping works in
two steps, because a launcher tears the whole job down as soon as a rank fails:

- on the node, the failing rank does not end: the rank hook (a Python rank that raises or
  calls ``sys.exit`` with a non-zero code) or the rank wrapper (any program that exits
  non-zero) writes its exit marker, then stops itself with SIGSTOP, so the launcher sees no
  failure and the other ranks, blocked on it, stay where they are;
- the head, told by the marker, waits until the rank is stopped and its output read, then
  stops every process of the job: on the nodes of other machines first, through the
  provider (:func:`hold_far`, the node task ``hold``: each node's MPI daemons, then its
  ranks), then on this machine (the launcher first, so that it cannot kill the others), and
  ends the attempt without waiting for the launcher, which stays stopped with them.

``job.cleanup()`` (and the cluster's ``stop()``, and the guard if the kernel dies) then kills
them all with SIGKILL, which ends a stopped process too; on other machines the provider's
``stop_job`` does it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import termios
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import IO

import psutil

from clusterbook.errors import ConfigError
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.call import Call
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.tasks.procs import freeze, leftovers, remove_leftovers, settle, tagged
from clusterbook.wording import spell_or

__all__ = [
    "CLEAN",
    "check_clean",
    "drained",
    "end_far",
    "end_kept",
    "hold",
    "hold_far",
    "kept_processes",
]

#: What ``clean=`` takes: what is left of a finished job's processes.
CLEAN = ("all", "running", "none")


def check_clean(value: object) -> str:
    """``value`` as a clean policy, or a :class:`ConfigError` naming the ones there are."""
    if isinstance(value, str) and value in CLEAN:
        return value
    example = spell_or("clean", "none", "'none'")
    raise ConfigError(
        f"Clean {value!r} is not a clean policy; choose among {', '.join(map(repr, CLEAN))} "
        f"({example} keeps a failed job's processes stopped for inspection)."
    )


def hold(
    token: str,
    failing: int | None,
    pipes: Sequence[IO[bytes] | None],
    rank_pids: Mapping[int, int],
    *,
    far: bool = False,
) -> tuple[KeptProcess, ...]:
    """Stop every process of job ``token`` on this machine, once the failing rank's program
    (pid ``failing``; ``far``: it ran on another machine, already held) has stopped itself
    or ended, and return them, once what the launcher wrote to ``pipes`` is read
    (``rank_pids``: the pid of each rank's program on this machine)."""
    # The rank's traceback comes after its marker: written, then forwarded by the launcher.
    if not far:
        settle(failing, within=3.0)
    time.sleep(0.05)
    stopped = freeze(token)
    fds = []
    for pipe in pipes:
        with contextlib.suppress(ValueError, AttributeError):  # closed: all of it was read
            fds.append(pipe.fileno())  # type: ignore[union-attr]
    drained(fds, within=1.0)
    time.sleep(0.05)  # the readers parse what they read last
    return kept_processes(stopped, socket.gethostname(), rank_pids)


def hold_far(
    callers: Mapping[str, Call], token: str, failing: Mapping[str, int]
) -> tuple[KeptProcess, ...]:
    """Stop every process of job ``token`` on the nodes ``callers`` reach (by node name),
    each once the failing rank's program there (``failing``: its pid, by node name) has
    stopped itself; return them, named by node (a node that does not answer keeps nothing:
    the job's ``stop_job`` ends what it has)."""

    def hold_on(name: str) -> list[KeptProcess]:
        reply = callers[name]("hold", {"token": token, "settle": failing.get(name)}, 15.0)
        return [KeptProcess(int(pid), name, str(comm)) for pid, comm in reply["held"]]

    held, _ = parallel(sorted(callers), hold_on)
    return tuple(k for name in sorted(held) for k in held[name])


def end_far(callers: Mapping[str, Call], token: str) -> None:
    """End job ``token``'s processes kept stopped on the nodes ``callers`` reach, at once
    (no grace: SIGKILL), returning once they are gone."""

    def end_on(name: str) -> object:
        return callers[name]("kill", {"token": token, "grace": 0}, 15.0)

    parallel(sorted(callers), end_on)


def drained(fds: Iterable[int], within: float) -> None:
    """Wait, at most ``within`` seconds, until the pipes ``fds`` have nothing left unread."""
    unread = bytearray(4)
    give_up = time.monotonic() + within
    for fd in fds:
        while time.monotonic() < give_up:
            try:
                fcntl.ioctl(fd, termios.FIONREAD, unread)
            except OSError:
                break
            if not int.from_bytes(unread, "little"):
                break
            time.sleep(0.005)


def kept_processes(
    pids: Iterable[int], host: str, rank_pids: Mapping[int, int]
) -> tuple[KeptProcess, ...]:
    """The processes ``pids`` on ``host`` that are still there, ranks first (``rank_pids``:
    each rank's program's pid)."""
    ranks = {pid: rank for rank, pid in rank_pids.items()}
    kept = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            name = process.name()
        except psutil.Error:
            continue
        kept.append(KeptProcess(pid, host, name, ranks.get(pid)))
    return tuple(sorted(kept, key=lambda k: (k.rank is None, k.rank or 0, k.pid)))


def end_kept(token: str, within: float = 5.0) -> list[int]:
    """Kill every process of job ``token`` on this machine at once (SIGKILL ends a stopped
    process; SIGCONT lets it go), wait, at most ``within`` seconds, until they are gone,
    then remove what their MPI left (shared memory, session directories). Returns the
    pids."""
    pids = tagged([token])
    left = leftovers(pids)
    for pid in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    give_up = time.monotonic() + within
    while _any_alive(pids) and time.monotonic() < give_up:
        time.sleep(0.01)
    if left and not _any_alive(pids):
        remove_leftovers(left)
    return pids


def _any_alive(pids: Iterable[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False
