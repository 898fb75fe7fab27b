"""Warm launches: one OpenSSH master connection per node, kept by the head, that the MPI
launcher's ssh reuses (OpenSSH's ControlMaster), so a job pays no key exchange and no login
per node: the same daemons (``prted``, ``hydra_pmi_proxy``) started the same way, over a
connection that is already up.

The launcher's ssh gets ``ControlMaster=no`` and the masters' ``ControlPath``: where a master
is up, its ssh runs the command over it; where none is (never started, died, killed), ssh logs
in anew, as a cold launch does, so a job never waits on a dead master. :meth:`ControlMasters.
dead` says which masters ended, for the head to warn and start them again before a job.

The masters carry a job token that the head's guard watches (:mod:`clusterbook.launch.guard`):
they die with the head, even by SIGKILL. Their sockets live in a private directory of their
own, short enough for a Unix socket's path.
"""

from __future__ import annotations

import contextlib
import os
import py_compile
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from clusterbook.errors import ColdLaunchWarning
from clusterbook.launch import daemons
from clusterbook.launch.daemons import forward_name, ping
from clusterbook.launch.guard import guard
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.tasks.common import JOB_ENV

__all__ = ["LAUNCHES", "LEFT", "ControlMasters", "launch_agent", "warn_agents", "warn_cold"]

#: How an SSH cluster's jobs start MPI's daemons on the nodes (``launch=``).
LAUNCHES = ("warm", "cold")
#: Why :meth:`ControlMasters.start` did not bring up a host's master that left meanwhile.
LEFT = "its host left the cluster"

#: The masters' directory: ``cbm-`` and 8 random characters, in a temp directory.
_PREFIX = "cbm-"
#: The longest temp directory the sockets fit in: a Unix socket's path has 107 bytes, and a
#: master's is ``DIR/cbm-XXXXXXXX/`` and ``%C`` (40 characters), to which ssh appends 17 while
#: it binds it.
ROOM = 107 - (1 + len(_PREFIX) + 8 + 1 + 40 + 17)


def socket_base(candidates: Sequence[str | None], room: int = ROOM) -> str | None:
    """The first of ``candidates`` (temp directories, in order of preference) short enough
    for the masters' sockets (``room``: its longest), or None when none is. A long ``TMPDIR``
    (macOS's ``/var/folders/...``, a notebook's throwaway home) would make ssh refuse to bind
    them, and every job start cold."""
    return next((c for c in candidates if c and len(c.rstrip("/")) <= room), None)


class ControlMasters:
    """A master connection to each of ``hosts`` (the names the launcher's ssh is given), made
    with ``ssh_args`` (the launcher's own options: key, known_hosts, users, ports, config)."""

    def __init__(
        self,
        ssh_args: Sequence[str],
        hosts: Sequence[str],
        daemon_sockets: Mapping[str, str] | None = None,
    ) -> None:
        self._ssh_args = list(ssh_args)
        self._hosts = list(hosts)
        # The agents' sockets that start MPI's daemons, by host: each master forwards a
        # socket of the directory to its node's (see clusterbook.launch.daemons).
        self.daemon_sockets = dict(daemon_sockets or {})
        # 0700, with a random name: the sockets are ours, even in a directory others write in.
        shared = "/tmp"  # noqa: S108 - where the temp directory is too long for a socket
        base = socket_base([tempfile.gettempdir(), os.environ.get("XDG_RUNTIME_DIR"), shared])
        self._dir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=base))
        self._token = f"cbm-{secrets.token_hex(8)}"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def directory(self) -> Path:
        return self._dir

    def options(self) -> list[str]:
        """The launcher's ssh options that use the masters (first: ssh keeps the first
        value it is given of an option)."""
        return ["-o", "ControlMaster=no", "-o", f"ControlPath={self._dir}/%C"]

    def start(self, timeout: float, hosts: Sequence[str] | None = None) -> dict[str, str]:
        """Start the masters (``hosts``: those only) and wait until each is up or ended, at
        most ``timeout`` seconds; return the hosts whose master is not up, with why."""
        guard.watch(self._token)
        wanted = self._hosts if hosts is None else list(hosts)
        before = set(self._sockets())
        spawned = []
        with self._lock:
            if self._closed:
                return {h: "the cluster is stopping" for h in wanted}
            for host in wanted:
                ended = self._procs.get(host)
                if ended is not None and ended.stderr is not None:
                    ended.stderr.close()
                self._procs[host] = self._spawn(host)
                spawned.append(self._procs[host])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = len(set(self._sockets()) - before)
            # Its own: a host that left meanwhile (drop(), from another thread) is gone from
            # the masters, and its process ended with it.
            if up >= len(wanted) or all(p.poll() is not None for p in spawned):
                break
            time.sleep(0.01)
        with self._lock:
            left = {h: LEFT for h in wanted if h not in self._procs}
        return left | {h: why for h, why in self.dead().items() if h in wanted}

    def _spawn(self, host: str) -> subprocess.Popen[bytes]:
        argv = ["ssh", "-M", "-N", "-o", "ControlMaster=yes", "-o", "ControlPersist=no"]
        # Silent for 3 s, a node is given up as its agent is (1 s x 3): the jobs using the
        # master see their daemon there end, instead of waiting on a connection that is gone.
        argv += ["-o", f"ControlPath={self._dir}/%C", "-o", "ServerAliveInterval=1"]
        argv += ["-o", "ServerAliveCountMax=3"]
        there = self.daemon_sockets.get(host)
        if there is not None:  # a socket a master killed left is replaced
            argv += ["-o", "StreamLocalBindUnlink=yes"]
            argv += ["-L", f"{self.forward(host)}:{there}"]
        argv += [*self._ssh_args, host]
        return subprocess.Popen(
            argv,
            env={**os.environ, JOB_ENV: self._token},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the notebook is the head's to handle
        )

    def forward(self, host: str) -> str:
        """The socket here that reaches ``host``'s agent (while its master is up)."""
        return str(self._dir / forward_name(host))

    def unanswered(self, skip: Collection[str] = (), timeout: float = 1.0) -> dict[str, str]:
        """The hosts (but ``skip``: those lost, not waited for) whose agent refuses through
        its master (gone, its socket gone, an error), with why, all asked at once. One that is
        silent for ``timeout`` seconds is left out: its node is cut off, which the cluster's
        watch says (the job's daemon there falls back to ssh after a while, as any other)."""
        hosts = [h for h in self.daemon_sockets if h not in skip]
        _, failed = parallel(hosts, lambda h: ping(self.forward(h), timeout))
        return {
            host: str(exc) or type(exc).__name__
            for host, exc in failed.items()
            if not isinstance(exc, TimeoutError)
        }

    def _sockets(self) -> list[str]:
        with contextlib.suppress(OSError):
            return [p.name for p in self._dir.iterdir() if "." not in p.name]
        return []

    def dead(self) -> dict[str, str]:
        """The hosts whose master has ended, with how."""
        with self._lock:
            procs = dict(self._procs)
        return {h: _ended(p) for h, p in procs.items() if p.poll() is not None}

    def revive(self, timeout: float) -> dict[str, str]:
        """Start again the masters that ended; return those that ended, with how they did."""
        dead = self.dead()
        if dead:
            self.start(timeout, list(dead))
        return dead

    def drop(self, host: str) -> None:
        """End ``host``'s master (the host left the cluster)."""
        with self._lock:
            proc = self._procs.pop(host, None)
            self._hosts = [h for h in self._hosts if h != host]
            self.daemon_sockets.pop(host, None)  # no agent there to ask any more
        if proc is not None:
            proc.kill()
            proc.wait(timeout=5)
            if proc.stderr is not None:
                proc.stderr.close()

    def stop(self) -> None:
        """End every master and remove their sockets."""
        with self._lock:
            self._closed = True
            procs, self._procs = dict(self._procs), {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            if proc.stderr is not None:
                proc.stderr.close()
        guard.release(self._token)
        shutil.rmtree(self._dir, ignore_errors=True)


def _ended(proc: subprocess.Popen[bytes]) -> str:
    code = proc.returncode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
    said = b""
    if proc.stderr is not None and code is not None:
        with contextlib.suppress(OSError, ValueError):
            said = proc.stderr.read(4096)
    text = said.decode(errors="replace").strip().splitlines()
    return f"{how}: {text[-1]}" if text else how


def warn_cold(failed: Mapping[str, str], *, stacklevel: int) -> None:
    """Say which master connections were not up (``failed``: node and how), and what jobs
    do on those nodes."""
    why = "; ".join(f"{host}: {how}" for host, how in sorted(failed.items()))
    one = len(failed) == 1
    warnings.warn(
        ColdLaunchWarning(
            f"The ssh connection kept to {'node' if one else 'nodes'} "
            f"{', '.join(sorted(failed))} for warm launches was not up ({why}). Where it is "
            f"not up now, a job starts MPI's daemons over a new ssh login, as launch='cold' "
            f"does (slower, the same job), and the connection is started again for the next "
            f"one."
        ),
        stacklevel=stacklevel,
    )


def launch_agent(directory: Path, cold: str | Path) -> str:
    """The program the MPI launcher runs instead of ssh: it starts each daemon through the
    node's agent, over the socket in ``directory`` that the node's master forwards, and
    through ``cold`` (the launcher's ssh) where that is not up."""
    # -S -I: no site, no user's environment: the helper imports the standard library only.
    # Its bytecode, compiled once here: a script run as a file is compiled at every start.
    program = directory / "daemons.pyc"
    try:
        py_compile.compile(daemons.__file__, cfile=str(program), doraise=True)
    except (OSError, py_compile.PyCompileError):
        program = Path(daemons.__file__)
    argv = [sys.executable, "-S", "-I", str(program), str(directory), str(cold)]
    return "#!/bin/sh\nexec " + shlex.join(argv) + ' "$@"\n'


def warn_agents(silent: Mapping[str, str], *, stacklevel: int) -> None:
    """Say which nodes' agents did not answer for warm launches (``silent``: node and why),
    and what jobs do on those nodes."""
    why = "; ".join(f"{host}: {how}" for host, how in sorted(silent.items()))
    one = len(silent) == 1
    warnings.warn(
        ColdLaunchWarning(
            f"The agent of {'node' if one else 'nodes'} {', '.join(sorted(silent))} did not "
            f"answer for warm launches ({why}). A job starts MPI's daemons there over ssh "
            "instead (slower, the same job)."
        ),
        stacklevel=stacklevel,
    )
