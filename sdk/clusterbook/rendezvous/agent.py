"""The worker agent every node of an elastic cluster runs:
``clusterbook worker join URL --token-file F [--slots N] [--start-sshd PORT]``.

It joins the rendezvous, reports what the node is (hostname, addresses, cores, memory,
Python, MPI, its sshd's host key) and heartbeats with its load. It re-joins when a new round
forms (a node waits and there is room, a participant was lost, or it was itself dropped),
stops the processes of a job when the head asks (every process of a job carries the job's
token in its environment), and exits by itself when the rendezvous closes, or when it has lost
the store for longer than its lease (before its first answer: :data:`FIRST_CONTACT`, at
least), so that no agent outlives a head that died. Before it
exits for that, it stops every process of the cluster's jobs on its node (their MPI daemons
too); with ``clean_on_lost`` (nodes the head bootstrapped over SSH) it also removes what the
bootstrap installed there: the cluster's key line, key files, token and directory.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from clusterbook.durations import duration
from clusterbook.nodes.tasks import common, install, procs
from clusterbook.rendezvous.api import (
    RendezvousBackend,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
)
from clusterbook.rendezvous.handler import RendezvousHandler
from clusterbook.rendezvous.host_facts import UsageMeter
from clusterbook.rendezvous.registry import BackendFactory, backend_for, join_url, parse_join_url
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.view import Observation, decode_answer

__all__ = [
    "AGENT_IMPORTS",
    "HEAD_LEASE",
    "Agent",
    "agent_argv",
    "gives_up_after",
    "join_url",
    "parse_join_url",
]

_log = logging.getLogger("clusterbook.agent")

EXIT_CLOSED = 0
EXIT_LOST_STORE = 3

#: Lease of the agents a head starts itself (local and SSH clusters): seconds without the
#: head after which an agent stops the cluster's processes on its node, cleans up and exits.
HEAD_LEASE = 2.0
#: Seconds an agent that has not reached the store yet keeps trying, whatever its lease: the
#: head waits for it meanwhile, and a network that drops its first packets (a loaded machine,
#: a link coming up) must not end its node's part before it began.
FIRST_CONTACT = 15.0


#: What ``clusterbook worker join`` imports before it joins: a bootstrap session that will
#: fork the node's agent imports these while the head is busy elsewhere (see
#: ``clusterbook.nodes.tasks.session.warm``), so that the agent starts with them.
#: (Not ``clusterbook.__main__``: ``python -m`` runs it afresh, and warns if it was imported.)
AGENT_IMPORTS = (
    "argparse",
    "clusterbook.cli.main",
    "clusterbook.gpus",
    "clusterbook.launch.daemon_server",
    "clusterbook.rendezvous.agent",
    "clusterbook.rendezvous.backends.tcp",
    "clusterbook.rendezvous.report",
    "clusterbook.spec",
    "clusterbook.ssh.aside",
    "clusterbook.wording",
    "locale",  # argparse's messages
    "logging",
    "pwd",  # the user's name
    "shutil",  # argparse's formatter (the terminal's width)
)


def _call_timeout(lease: float) -> float:
    """How long one call to the store may take: half the lease (5 s at most), so that an agent
    notices a silent head within its lease."""
    return min(5.0, lease / 2)


def gives_up_after(lease: float, keep_alive_interval: float) -> float:
    """Seconds after its last heartbeat by which an agent of ``lease`` that lost the store has
    given up (it then stops the cluster's processes on its node and exits). Its last answer
    from the store came at most a heartbeat interval after that heartbeat; from then it tries
    for ``lease`` seconds, its last call taking up to :func:`_call_timeout`, and its first
    failing one too. A second more for a busy machine."""
    return keep_alive_interval + lease + 2 * _call_timeout(lease) + 1.0


def agent_argv(
    python: str | None,
    url: str,
    token_file: str | os.PathLike[str],
    *,
    node_id: str | None = None,
    slots: int | None = None,
    lease: float | None = None,
    clean_on_lost: bool = False,
    start_sshd: int | None = None,
    daemon_socket: str | None = None,
    probe_mpi: tuple[str, str] | None = None,
) -> list[str]:
    """The command that runs an agent with ``python`` (``python -m clusterbook.cli.main worker join
    URL --token-file F [...]``), or with the ``clusterbook`` command when ``python`` is None:
    the one place it is written."""
    program = [python, "-m", "clusterbook"] if python is not None else ["clusterbook"]
    argv = [*program, "worker", "join", url, "--token-file", str(token_file)]
    if node_id is not None:
        argv += ["--node-id", node_id]
    if slots is not None:
        argv += ["--slots", str(slots)]
    if lease is not None:
        argv += ["--lease", f"{lease:g}"]
    if clean_on_lost:
        argv.append("--clean-on-lost")
    if start_sshd is not None:
        argv += ["--start-sshd", str(start_sshd)]
    if daemon_socket is not None:
        argv += ["--daemon-socket", daemon_socket]
    if probe_mpi is not None:
        flavour, prefix = probe_mpi
        argv += ["--probe-mpi", f"{flavour}:{prefix}"]
    return argv


@dataclass
class Agent:
    """One node's agent; :meth:`run` returns the process exit code. ``backends`` makes its
    client of the store from the store's URL (by its scheme, as registered, by default)."""

    url: str
    secret: bytes
    node_id: str
    slots: int
    lease: float = 10.0
    facts: NodeReport | None = None
    clean_on_lost: bool = False
    backends: BackendFactory = backend_for

    def __post_init__(self) -> None:
        self.store_url, self.settings = parse_join_url(self.url)
        self.lease = duration(self.lease, "The lease")  # seconds, whatever form was given
        self.stop_event = threading.Event()
        self._facts = self.facts or NodeReport.here(self.slots)
        self._meter = UsageMeter(self._facts.gpus)
        self._store_lost = False
        self._reached = False  # the store answered once: from then on, the lease holds
        self._stopped: set[str] = set()

    def report(self) -> dict[str, Any]:
        """Facts plus the current load and use: sent at join and with every heartbeat."""
        return self._facts.with_load(self._meter).to_json()

    def run(self) -> int:
        # One connection for it all: the joins, the watch between them and the heartbeats, which
        # this thread sends between watches (the head then serves one TLS session per node).
        # No call waits on a silent head (a cut link drops packets without a word) for longer
        # than the lease: a call gives up after half of it, so that the watch notices in time.
        backend = self.backends(
            self.store_url, self.secret, node=self.node_id, timeout=_call_timeout(self.lease)
        )
        handler = RendezvousHandler(
            backend, self.settings, self.node_id, info=self.report, beat_thread=False
        )
        try:
            code = self._loop(handler, backend)
            if code == EXIT_LOST_STORE:
                # At once: closing the connection below may wait out a call on a dead link.
                self.release()
        finally:
            if not self._store_lost:  # leave cleanly, so the others need not wait for expiry
                handler.shutdown()
            backend.close()
            self._meter.close()
        return code

    def release(self) -> dict[str, Any]:
        """The head is gone: stop the cluster's jobs on this node (and, with
        ``clean_on_lost``, remove what the bootstrap installed here). Returns what was done."""
        cluster = self.settings.run_id
        try:
            if self.clean_on_lost:
                tag = common.key_tag(cluster)
                done = install.release({"cluster_id": cluster, "tag": tag})
            else:
                done = {"killed": procs.stop_jobs(cluster)}
        except Exception:
            _log.exception("Agent %s could not clean up after losing the head.", self.node_id)
            return {}
        if not self.clean_on_lost:
            files = ""
        elif done.get("kept_for"):
            files = f"; its files stay for the nodes that share this home ({done['kept_for']})"
        else:
            files = "; removed the cluster's key and files"
        _log.warning(
            "Agent %s lost the head of cluster %r for over %g s: stopped %d process(es) of its "
            "jobs here%s.",
            self.node_id,
            cluster,
            self.lease,
            len(done.get("killed", [])),
            files,
        )
        return done

    def _loop(self, handler: RendezvousHandler, backend: RendezvousBackend) -> int:
        while not self.stop_event.is_set():
            try:
                info = handler.next_rendezvous()
            except RendezvousClosedError:
                _log.info("The rendezvous is closed; agent %s exits.", self.node_id)
                return EXIT_CLOSED
            except RendezvousConnectionError as exc:
                if self._wait_for_store(backend, exc):
                    continue
                return EXIT_LOST_STORE
            self._reached = True
            _log.info(
                "Node %s has rank %d of %d in round %d.",
                self.node_id,
                info.rank,
                info.world_size,
                info.round,
            )
            outcome = self._follow(handler, backend, info.round, info.world_size)
            if outcome is not None:
                return outcome
        return EXIT_CLOSED

    def _follow(
        self,
        handler: RendezvousHandler,
        backend: RendezvousBackend,
        round_: int,
        members: int,
    ) -> int | None:
        """Watch the state until this node must join again (None) or exit (a code), and
        heartbeat whenever one is due."""
        # From the state the join ended on: the first watch waits for what comes after it.
        state: Observation | None
        state, token = handler.observed()
        last_ok = time.monotonic()
        beat_at = last_ok + handler.heartbeat_due()
        while not self.stop_event.is_set():
            if state is not None:
                if state.closed:
                    return EXIT_CLOSED
                self._stop_jobs(state.stop_jobs)
                if self._must_rejoin(state, round_, members):
                    return None
                state = None
            if time.monotonic() >= beat_at:
                beat_at = time.monotonic() + handler.heartbeat()
            try:
                # Not woken by the heartbeats of every node (O(nodes) answers each, a second).
                wait = min(1.0, max(0.0, beat_at - time.monotonic()))
                current = backend.watch_members(token, wait)
                last_ok = time.monotonic()
            except RendezvousConnectionError as exc:
                if time.monotonic() - last_ok > self.lease:
                    self._store_lost = True
                    _log.error(
                        "Agent %s lost the store for over %g s (%s); it exits.",
                        self.node_id,
                        self.lease,
                        exc,
                    )
                    return EXIT_LOST_STORE
                self.stop_event.wait(0.2)
                continue
            if current is None:
                continue
            token = current[1]
            try:
                state = decode_answer(current[0])
            except RendezvousError:
                continue
        return EXIT_CLOSED

    def _stop_jobs(self, tokens: tuple[str, ...]) -> None:
        """Stop, on this node, the processes of jobs the head asked to stop."""
        for token in tokens:
            if token not in self._stopped:
                self._stopped.add(token)
                threading.Thread(
                    target=procs.kill_tagged,
                    args=([token], 1.0),
                    kwargs={"daemons": True},
                    daemon=True,
                ).start()

    def _must_rejoin(self, state: Observation, round_: int, members: int) -> bool:
        """Whether to join again, from the state or this node's view of it; ``members``: how
        many nodes the round had when it completed."""
        me = self.node_id
        if me not in state.participants and me not in state.wait_list:
            return True  # dropped (paused too long, say): join again
        if state.round != round_:
            return True
        room = state.joined < self.settings.max_nodes
        if state.complete and state.waiting and room:
            return True  # newcomers wait for a new round that has room for them
        # Someone was lost: a complete round only ever loses participants (newcomers wait),
        # so fewer than it had means another set.
        return state.complete and state.joined != members

    def _wait_for_store(self, backend: RendezvousBackend, exc: Exception) -> bool:
        grace = self.lease if self._reached else max(self.lease, FIRST_CONTACT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                backend.watch_members(None, 0.0)  # the node's view: small at any size
                self._reached = True
                return True
            except RendezvousConnectionError:
                self.stop_event.wait(0.2)
        self._store_lost = True
        _log.error("Agent %s cannot reach the store (%s); it exits.", self.node_id, exc)
        return False
