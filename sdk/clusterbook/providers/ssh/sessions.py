"""The head's ways to the nodes of an SSH cluster, kept from its start to its stop:
:class:`Sessions`.

Each node has one connection (opened again, with the same host key policy, if it was lost)
and one node session on it, in which every later step (files, kills, clean-up) is one round
trip, not a login shell and a Python start. Big files go through sessions of their own over
the OpenSSH client (see :mod:`clusterbook.providers.ssh.files`). The keys, the jump hosts'
tunnels and the launcher's relay are kept here too, and closed last.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from clusterbook.nodes.call import Call
from clusterbook.ssh.bootstrap import Connection
from clusterbook.ssh.credentials import Credentials
from clusterbook.ssh.hostkeys import HostKeyPolicy
from clusterbook.ssh.node_session import KeptSession, NodeSession
from clusterbook.ssh.openssh import OpenSSHShell
from clusterbook.ssh.paramiko_shell import ParamikoShell, connect_hop
from clusterbook.ssh.paramiko_transport import Tunnels
from clusterbook.ssh.relay import Relay
from clusterbook.ssh.target import Target

__all__ = ["BULK_TASKS", "Sessions"]

#: The node tasks that move files: those of a big transfer go through the OpenSSH client.
BULK_TASKS = frozenset({"put_files", "gather_files"})


class Sessions:
    """The connections and node sessions of an SSH cluster's nodes (``targets``, by host);
    ``python(host)`` is the interpreter a node session runs there."""

    def __init__(
        self,
        targets: Mapping[str, Target],
        policy: HostKeyPolicy,
        connect_timeout: float,
        python: Callable[[str], str],
    ) -> None:
        self.targets = dict(targets)
        self.policy = policy
        self.connect_timeout = connect_timeout
        self._python = python
        self.credentials: Credentials | None = None
        self.tunnels: Tunnels | None = None
        self.relay: Relay | None = None
        self.conns: dict[str, Connection] = {}
        self._kept: dict[str, KeptSession] = {}
        self._bulk: dict[str, KeptSession] = {}  # sessions through OpenSSH, for big files
        self._lock = threading.Lock()

    # -- connections --------------------------------------------------------------------

    def dial(self, host: str, timeout: float) -> ParamikoShell:
        """A new connection to ``host`` (through its jump hosts), its keys checked."""
        assert self.credentials is not None
        return connect_hop(
            self.targets[host],
            credentials=self.credentials,
            policy=self.policy,
            timeout=timeout,
            tunnels=self.tunnels,
        )

    def shell(self, host: str) -> ParamikoShell:
        """The host's connection, opened again (same host key policy) if it was lost."""
        conn = self.conns[host]
        if not conn.shell.active:
            shell = self.dial(host, min(10.0, self.connect_timeout))
            conn = self.conns[host] = replace(conn, shell=shell)
        return conn.shell

    # -- node sessions ------------------------------------------------------------------

    def keep(self, sessions: Mapping[str, NodeSession]) -> None:
        """Keep the bootstrap's sessions of the nodes for the cluster's later steps."""
        self._kept.update({h: KeptSession(self._starter(h), s) for h, s in sessions.items()})

    def task(
        self, host: str, task: str, args: Mapping[str, Any], timeout: float, **streams: Any
    ) -> Any:
        """Run a node task on ``host``, in the session kept for it (``streams``: the frames
        of a ``put_files`` or ``gather_files``, see ``NodeSession.call``)."""
        with self._lock:
            kept = self._kept.get(host)
            if kept is None:  # a node the bootstrap did not get to
                kept = self._kept[host] = KeptSession(self._starter(host))
        return kept.call(task, args, timeout, **streams)

    def _starter(self, host: str) -> Callable[[], NodeSession]:
        return lambda: NodeSession(self.shell(host), self._python(host))

    def callers(self, hosts: Iterable[str] | None = None) -> dict[str, Call]:
        """Node tasks on each of ``hosts`` (default: every node connected), in its session."""

        def caller(host: str) -> Call:
            return lambda task, args, timeout, **streams: self.task(
                host, task, args, timeout, **streams
            )

        # A copy: host discovery may add a host meanwhile, from its own thread.
        return {host: caller(host) for host in (list(self.conns) if hosts is None else hosts)}

    def bulk_callers(self, hosts: Iterable[str], wrapper: str) -> dict[str, Call]:
        """Node tasks on each of ``hosts``, the file transfers (:data:`BULK_TASKS`) in a
        session of their own through the OpenSSH client (``wrapper``: the MPI launcher's way,
        with the cluster's key and known_hosts), kept until :meth:`close_bulk`: OpenSSH's
        encryption is C, paramiko's is Python on the head (see :mod:`clusterbook.ssh.openssh`)."""

        def caller(host: str) -> Call:
            def call(task: str, args: Mapping[str, Any], timeout: float, **streams: Any) -> Any:
                if task not in BULK_TASKS:
                    return self.task(host, task, args, timeout, **streams)
                with self._lock:
                    kept = self._bulk.get(host)
                    if kept is None:
                        starter = lambda: NodeSession(  # noqa: E731
                            OpenSSHShell(host, wrapper), self._python(host), owns_shell=True
                        )
                        kept = self._bulk[host] = KeptSession(starter)
                return kept.call(task, args, timeout, **streams)

            return call

        return {host: caller(host) for host in hosts}

    @property
    def bulk_hosts(self) -> list[str]:
        """The hosts that have a session through the OpenSSH client now."""
        return list(self._bulk)

    # -- the end --------------------------------------------------------------------------

    def close_bulk(self) -> None:
        """End the sessions through OpenSSH (their ssh processes end with them)."""
        with self._lock:
            bulk, self._bulk = self._bulk, {}
        for kept in bulk.values():
            kept.close()

    def close(self, host: str) -> None:
        """End ``host``'s kept session and close its connection."""
        with self._lock:
            kept = self._kept.pop(host, None)
        if kept is not None:
            kept.close()
        self.conns[host].shell.close()

    def close_ways(self) -> None:
        """End the relay, the jump hosts' connections and the agent's (after the nodes')."""
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.close()
        tunnels, self.tunnels = self.tunnels, None
        if tunnels is not None:
            tunnels.close()
        credentials, self.credentials = self.credentials, None
        if credentials is not None:
            credentials.close()
