"""Nodes that join by themselves: the head serves the rendezvous store, agents join it.

``Cluster.elastic(min_nodes, max_nodes)`` starts a :class:`StoreServer` with a per-cluster
secret (a 0600 token file), prints the command nodes join with, and follows the rendezvous
state. The cluster is ready once a round completes (``min_nodes`` plus the last call, or
``max_nodes``); the MPI hostfile is built from that round. A node whose connection drops is
removed at once (the store's connection-loss fast path); one that stops heartbeating, after
``keep_alive_interval x keep_alive_max_attempt`` seconds. Nodes on other machines run MPI
ranks through the sshd their agent started (see :mod:`clusterbook.providers.elastic_reach`).
"""

from __future__ import annotations

import getpass
import logging
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from clusterbook.errors import CleanupWarning, ClusterError, ReadyTimeoutError
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import RemoteLaunch, StartContext
from clusterbook.providers.elastic_reach import Reach, far_nodes, pick_address
from clusterbook.rendezvous.agent import join_url
from clusterbook.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousSettings,
    RendezvousStateError,
    RendezvousTimeout,
)
from clusterbook.rendezvous.backends.tcp import StoreServer, TcpBackend, write_secret
from clusterbook.rendezvous.ops import Action, apply, remove_node, sanitize
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.spec import NodeSpec
from clusterbook.status import NodeStatus
from clusterbook.transfer import Call, Outgoing, fetch_all, send_all

__all__ = ["ElasticProvider"]

_log = logging.getLogger("clusterbook.elastic")

_KEEP_STOPS = 16  # stop requests kept in the state (agents act on the ones they have not seen)


class ElasticProvider:
    """The head side of an elastic cluster."""

    kind = "elastic"

    def __init__(
        self,
        min_nodes: int,
        max_nodes: int,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        last_call: float = 1.0,
        join_timeout: float = 600.0,
        keep_alive_interval: float = 1.0,
        keep_alive_max_attempt: int = 3,
    ) -> None:
        # Validated now (torch's messages), with the real run id set at start().
        self._settings = RendezvousSettings(
            run_id="pending",
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeout=RendezvousTimeout(join=join_timeout, last_call=last_call),
            keep_alive_interval=keep_alive_interval,
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        self._listen = listen
        self._port = port
        self._cond = threading.Condition()
        self._state = RendezvousState()
        self._seen: dict[str, dict[str, object]] = {}  # every node ever seen: its last report
        self._gone: dict[str, str] = {}  # node -> "lost" | "left"
        self._server: StoreServer | None = None
        self._watcher: TcpBackend | None = None
        self._writer: TcpBackend | None = None
        self._stop = threading.Event()
        self.changed: Callable[[], None] = lambda: None
        self.join_command: str | None = None
        self.join_url: str | None = None
        self.token_file: Path | None = None
        self.announce = True
        self._ctx: StartContext | None = None
        self._reach: Reach | None = None
        self._networks: list[str] = []
        self.stop_problems: dict[str, Exception] = {}
        self._problem: str | None = None  # what keeps the head from following the rendezvous

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def settings(self) -> RendezvousSettings:
        return self._settings

    def start(self, ctx: StartContext) -> None:
        self._settings = replace(self._settings, run_id=ctx.cluster_id)
        directory = cluster_dir(ctx.cluster_id)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.token_file = directory / "token"
        self.token_file.unlink(missing_ok=True)
        secret = write_secret(self.token_file)
        from clusterbook.ssh.keys import derive_keypair  # cryptography: only when started

        keys = directory / "keys"
        shutil.rmtree(keys, ignore_errors=True)
        pair = derive_keypair(keys, ctx.cluster_id, secret)
        self._ctx, self._reach = ctx, Reach(directory, pair.private_path)
        self._networks = _networks_here()
        self._server = StoreServer(self._listen, self._port, secret=secret, on_lost=self._lost)
        self._server.start()
        host, port = self._server.address
        self.join_url = join_url(f"tcp://{host}:{port}", self._settings)
        self.join_command = (
            f"clusterbook worker join '{self.join_url}' --token-file {self.token_file}"
        )
        self._watcher = TcpBackend(self._server.url, secret)
        # Writes go on their own connection: the watcher's is held by a long-poll most of
        # the time, and a write queued behind it would wait up to a second.
        self._writer = TcpBackend(self._server.url, secret)
        threading.Thread(target=self._follow, name="clusterbook-elastic", daemon=True).start()
        if self.announce:
            print(f"Nodes join cluster {ctx.cluster_id!r} with:\n  {self.join_command}", flush=True)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        watcher, writer = self._watcher, self._writer
        try:
            if self._reach is not None and self._ctx is not None:
                # While the agents (and their sshd) are still there.
                try:
                    self.stop_problems = self._reach.release(self._ctx.cluster_id)
                except Exception as exc:  # clean-up goes on: close, so the agents leave
                    self.stop_problems = {"(all nodes)": exc}
                if self.stop_problems:
                    lines = "".join(f"\n  {n}: {e}" for n, e in self.stop_problems.items())
                    warnings.warn(
                        CleanupWarning(
                            f"Could not remove what put() created on some nodes of cluster "
                            f"{self._ctx.cluster_id!r}:{lines}"
                        ),
                        stacklevel=3,
                    )
            if writer is not None:
                try:
                    writer.update(self._closed_state)
                except RendezvousError as exc:
                    _log.warning(
                        "Could not close the rendezvous %r: %s", self._settings.run_id, exc
                    )
                else:
                    # Agents leave when they see it closed; give them a moment to go cleanly.
                    deadline = time.monotonic() + 3.0
                    with self._cond:
                        while self._state.participants or self._state.wait_list:
                            left = deadline - time.monotonic()
                            if left <= 0 or not self._cond.wait(left):
                                break
        finally:
            self._stop.set()
            for client in (watcher, writer):
                if client is not None:
                    client.close()
            server.close()
            if self.token_file is not None:
                self.token_file.unlink(missing_ok=True)
                directory = self.token_file.parent
                shutil.rmtree(directory / "keys", ignore_errors=True)
                for name in ("known_hosts", "ssh_config", "ssh"):
                    (directory / name).unlink(missing_ok=True)

    def _closed_state(self, blob: bytes | None) -> bytes | None:
        """The stored state, closed: no node may join any more, the agents leave. A state that
        does not decode is replaced by a closed one (the agents see that too)."""
        try:
            state = RendezvousState() if blob is None else decode(blob)
        except RendezvousStateError:
            state = RendezvousState()
        if state.closed:
            return None
        closed = apply(Action.MARK_RENDEZVOUS_CLOSED, state, "head", self._settings, time.time())
        return encode(closed)

    def problem(self) -> str | None:
        """What keeps the head from following the rendezvous now (a corrupt state), if
        anything: shown in the cluster's status."""
        return self._problem

    # -- following the state ------------------------------------------------------------

    def _lost(self, node: str, blob: bytes) -> bytes | None:
        state = decode(blob)
        if node not in state.last_heartbeats:
            return None
        with self._cond:
            self._gone[node] = "lost"
        return encode(remove_node(state, node, self._settings))

    def _follow(self) -> None:
        """Follow the stored state until stopped; also drop the nodes that stopped
        heartbeating, when no other node's write does it first. Never dies of an error: a
        state that does not decode is reported (:meth:`problem`) until a good one comes."""
        token = None
        assert self._watcher is not None
        while not self._stop.is_set():
            try:
                current = self._watcher.watch(token, 1.0)
                if current is not None and current[1] != token:
                    token = current[1]
                    self._observe(decode(current[0]))
                    self._set_problem(None)
                self._expire()
            except RendezvousConnectionError:
                if self._stop.wait(0.1):
                    return
            except RendezvousStateError as exc:
                self._set_problem(
                    f"The rendezvous state cannot be read ({exc}); node status is stale. "
                    "Stop the cluster (it cleans up every node it can reach)."
                )
            except Exception as exc:
                _log.exception("Following the rendezvous of %r failed.", self._settings.run_id)
                self._set_problem(f"Following the rendezvous failed: {type(exc).__name__}: {exc}")
                if self._stop.wait(0.5):
                    return

    def _set_problem(self, problem: str | None) -> None:
        if problem != self._problem:
            self._problem = problem
            self.changed()

    def _expire(self) -> None:
        """Remove from the stored state the nodes whose heartbeat is overdue (a node cut off
        says nothing; with no other node left to notice, the head must)."""
        writer = self._writer
        with self._cond:
            state = self._state
        if writer is None or sanitize(state, self._settings, time.time()) is state:
            return

        def expire(blob: bytes | None) -> bytes | None:
            if blob is None:
                return None
            current = decode(blob)
            fresh = sanitize(current, self._settings, time.time())
            return None if fresh is current else encode(fresh)

        writer.update(expire)

    def _observe(self, state: RendezvousState) -> None:
        now = time.time()
        with self._cond:
            before = set(self._state.last_heartbeats)
            for node, report in state.node_info.items():
                self._seen[node] = report
                self._gone.pop(node, None)
            for node in before - set(state.last_heartbeats):
                if node not in self._gone:
                    last = self._state.last_heartbeats.get(node, 0.0)
                    dead = now - last > self._settings.keep_alive_interval * 1.5
                    self._gone[node] = "lost" if dead else "left"
            self._state = state
            self._cond.notify_all()
        self.changed()

    # -- what the cluster asks ----------------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The participants of the last complete round, by rank."""
        with self._cond:
            state, seen = self._state, dict(self._seen)
        if not state.complete:
            return ()
        out = []
        for node, _ in sorted(state.participants.items(), key=lambda kv: kv[1]):
            report = seen.get(node, {})
            addresses = [str(a) for a in report.get("addresses") or ["?"]]  # type: ignore[attr-defined]
            host = "localhost" if _is_here(report) else pick_address(addresses, self._networks)
            slots = int(report.get("slots") or 1)  # type: ignore[call-overload]
            out.append(NodeSpec(node, host, slots, cores=report.get("cores")))  # type: ignore[arg-type]
        return tuple(out)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self._state.complete and self._state.participants):
                left = deadline - time.monotonic()
                if left <= 0:
                    joined = sorted(self._state.participants)
                    reason = (
                        f"{len(joined)} of at least {self._settings.min_nodes} nodes joined "
                        f"({', '.join(joined) or 'none'})"
                    )
                    raise ReadyTimeoutError(
                        f"The elastic cluster is not ready after {timeout:g} s: {reason}. Start "
                        f"more nodes with: {self.join_command}",
                        timeout=timeout,
                        reason=reason,
                    )
                self._cond.wait(left)

    def remote(self) -> RemoteLaunch | None:
        """None when every node is on this machine; else the checked ssh path to them."""
        nodes = self.nodes
        if all(n.host == "localhost" for n in nodes):
            return None
        if self._reach is None or self._ctx is None:
            raise ClusterError("The elastic cluster is not started; call start() first.")
        with self._cond:
            reports = dict(self._seen)
        return self._reach.launch(self._ctx, nodes, reports)

    # -- files for nodes on other machines ----------------------------------------------

    def put(self, sent: Outgoing) -> dict[str, Exception]:
        """Send ``sent`` to every node on another machine; return the nodes it failed on."""
        callers, unreachable = self._callers()
        return {**unreachable, **send_all(callers, self._settings.run_id, sent)}

    def gather(
        self, directory: Path, skip: Sequence[str]
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` on nodes on other machines here."""
        callers, unreachable = self._callers()
        stored, failed = fetch_all(callers, directory, skip)
        return stored, {**unreachable, **failed}

    def _callers(self) -> tuple[dict[str, Call], dict[str, Exception]]:
        """Node tasks on each node of the round on another machine; those the head cannot
        reach, with why."""
        if self._reach is None or self._ctx is None:
            raise ClusterError("The elastic cluster is not started; call start() first.")
        with self._cond:
            reports = dict(self._seen)
        far, found = far_nodes(self.nodes, reports, getpass.getuser())
        reach, python = self._reach, self._ctx.python
        callers = {n.name: reach.caller(python, n) for n in far}
        return callers, {name: ClusterError(" ".join(why)) for name, why in found.items()}

    def stop_job(self, token: str) -> None:
        """Ask every agent to stop the processes of job ``token`` on its node."""
        writer = self._writer
        if writer is None:
            return

        def ask(blob: bytes | None) -> bytes | None:
            if blob is None:
                return None
            state = decode(blob)
            return encode(replace(state, stop_jobs=(*state.stop_jobs, token)[-_KEEP_STOPS:]))

        writer.update(ask)

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        """Of the nodes ``names``, those the head has lost (and, unless ``lost_only``, those
        not heard from for over 1.5 heartbeat intervals), each with a sentence saying so."""
        wanted, settings = set(names), self._settings
        out = {}
        for s in self.node_statuses():
            if s.name not in wanted:
                continue
            if s.state in ("lost", "left"):
                how = "left the cluster" if s.state == "left" else "was lost"
                out[s.name] = (
                    f"Node {s.name} ({s.host}) {how}: no heartbeat within "
                    f"{settings.keep_alive_interval:g} s x {settings.keep_alive_max_attempt}, or "
                    "its connection to the head broke"
                )
            elif (
                not lost_only
                and s.heartbeat_age is not None
                and s.heartbeat_age > 1.5 * settings.keep_alive_interval
            ):
                out[s.name] = (
                    f"Node {s.name} ({s.host}) has not been heard from for "
                    f"{s.heartbeat_age:.1f} s: it may be cut off from the head"
                )
        return out

    def node_statuses(self) -> list[NodeStatus]:
        """Every node seen: pending (waiting), joined, lost or left, with heartbeat and load."""
        now = time.time()
        with self._cond:
            state, seen, gone = self._state, dict(self._seen), dict(self._gone)
        rows = []
        for node in sorted(set(seen) | set(state.last_heartbeats)):
            report = seen.get(node, {})
            if node in state.participants:
                status = "joined" if state.complete else "pending"
            elif node in state.wait_list:
                status = "pending"
            else:
                status = gone.get(node, "left")
            last = state.last_heartbeats.get(node)
            rows.append(
                NodeStatus(
                    name=node,
                    host=str(report.get("hostname", "?")),
                    slots=int(report.get("slots") or 1),  # type: ignore[call-overload]
                    state=status,
                    round=state.round if node in state.participants else None,
                    heartbeat_age=None if last is None else max(0.0, now - last),
                    load=report.get("load"),  # type: ignore[arg-type]
                    memory_used=report.get("memory_used"),  # type: ignore[arg-type]
                    memory=report.get("memory"),  # type: ignore[arg-type]
                    pid=report.get("pid"),  # type: ignore[arg-type]
                )
            )
        return rows


def _is_here(report: dict[str, object]) -> bool:
    return report.get("hostname") == socket.gethostname()


def _networks_here() -> list[str]:
    """This machine's IPv4 networks (``addr/netmask``), to pick the node address to use."""
    return [
        f"{a.address}/{a.netmask}"
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and a.netmask and not a.address.startswith("127.")
    ]
