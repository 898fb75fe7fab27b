"""How the head of an elastic cluster reaches nodes on other machines for MPI jobs.

An agent started with ``--start-sshd PORT`` runs its own sshd, reports its host key and
port, and lets in one key: the cluster's, derived from the rendezvous secret (see
:mod:`clusterbook.ssh.keys`). The head derives the same key, pins each node's reported host
key in a per-cluster known_hosts (``StrictHostKeyChecking=yes``), writes a per-cluster ssh
config with each node's port and user, and checks every node once per round over that path
(the same pre-flight checks as ``Cluster.ssh``) before the first job uses it. Only the head
holds the key, so Open MPI starts every daemon from the head (no tree spawn).
"""

from __future__ import annotations

import getpass
import ipaddress
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.errors import BootstrapError
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.nodes.call import Call
from clusterbook.nodes.fanout import parallel
from clusterbook.providers.base import StartContext
from clusterbook.rendezvous.report import NodeReport
from clusterbook.spec import NodeSpec
from clusterbook.ssh.hostkeys import (
    Fingerprints,
    HostKey,
    host_entry_name,
    known_hosts_line,
)

if TYPE_CHECKING:
    from clusterbook.ssh.bootstrap import KeptSession, NodeSession
    from clusterbook.ssh.paramiko_shell import ParamikoShell

__all__ = ["FarNode", "Reach", "far_nodes", "known_hosts_text", "pick_address", "ssh_config"]


@dataclass(frozen=True, slots=True)
class FarNode:
    """A node on another machine, as its agent reported it."""

    name: str
    addr: str
    port: int
    user: str
    host_key: HostKey
    hostname: str
    slots: int


def pick_address(addresses: Sequence[str], head_networks: Sequence[str]) -> str:
    """The node address on a network the head is on, else its first address."""
    nets = [ipaddress.ip_network(n, strict=False) for n in head_networks]
    for addr in addresses:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            continue
        if any(ip in net for net in nets):
            return addr
    return addresses[0]


def far_nodes(
    nodes: Sequence[NodeSpec], reports: Mapping[str, NodeReport], default_user: str
) -> tuple[list[FarNode], dict[str, list[str]]]:
    """The nodes of a round that are not on this machine, and what keeps any from MPI."""
    far: list[FarNode] = []
    found: dict[str, list[str]] = {}
    for node in nodes:
        if node.here:
            continue
        report = reports.get(node.name, NodeReport())
        port, parts = report.sshd_port, (report.sshd_host_key or "").split()
        if not port or len(parts) < 2:
            found[node.name] = [
                f"it runs on another machine ({node.host}) without an sshd the head can reach; "
                "start its agent with --start-sshd PORT (a user-level sshd that lets in only "
                "this cluster's key)."
            ]
            continue
        far.append(
            FarNode(
                name=node.name,
                addr=node.host,
                port=port,
                user=report.user or default_user,
                host_key=HostKey(parts[0], parts[1]),
                hostname=report.hostname if report.hostname != "?" else node.host,
                slots=node.slots,
            )
        )
    return far, found


def known_hosts_text(nodes: Sequence[FarNode]) -> str:
    """known_hosts lines pinning each node's reported host key at its address and port."""
    return "".join(known_hosts_line([host_entry_name(n.addr, n.port)], n.host_key) for n in nodes)


def ssh_config(nodes: Sequence[FarNode], *, identity: Path, known_hosts: Path) -> str:
    """An ssh_config (``ssh -F``) with each node's port and user, strict host keys."""

    def quoted(path: Path) -> str:
        return '"' + str(path) + '"'

    blocks = [f"Host {n.addr}\n  Port {n.port}\n  User {n.user}\n" for n in nodes]
    blocks.append(
        "Host *\n"
        f"  IdentityFile {quoted(identity)}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {quoted(known_hosts)}\n"
        "  GlobalKnownHostsFile none\n"
        "  StrictHostKeyChecking yes\n"
        "  UpdateHostKeys no\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 10\n"
    )
    return "".join(blocks)


def head_address_towards(addr: str) -> str:
    """The head's address on the route to ``addr`` (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


class Reach:
    """The ssh path from the head to an elastic cluster's far nodes, checked once a round."""

    def __init__(self, directory: Path, identity: Path) -> None:
        self._dir = directory
        self._identity = identity
        self._checked: tuple[FarNode, ...] = ()
        self._launch: RemoteLaunch | None = None
        self._sessions: dict[str, KeptSession] = {}
        self._lock = threading.Lock()

    def caller(self, python: str, node: FarNode) -> Call:
        """Runs node tasks on ``node`` in a session kept for the cluster's lifetime, over the
        node's sshd with its host key pinned."""
        from clusterbook.ssh.bootstrap import KeptSession, NodeSession  # paramiko: late

        def start() -> NodeSession:
            return NodeSession(self._connect(node), python, owns_shell=True)

        with self._lock:
            kept = self._sessions.get(node.name)
            if kept is None:
                kept = self._sessions[node.name] = KeptSession(start)
        return kept.call

    def release(self, cluster_id: str) -> dict[str, Exception]:
        """Remove what ``put`` left on the nodes reached so far and close their sessions;
        return the nodes that could not be cleaned, with why."""
        with self._lock:
            sessions, self._sessions = self._sessions, {}

        def clean(name: str) -> None:
            try:
                sessions[name].call("put_cleanup", {"cluster_id": cluster_id}, timeout=15)
            finally:
                sessions[name].close()

        return parallel(list(sessions), clean)[1]

    def _connect(self, node: FarNode) -> ParamikoShell:
        from clusterbook.ssh.paramiko_shell import connect

        pins = Fingerprints({f"{node.addr}:{node.port}": node.host_key.fingerprint})
        return connect(
            node.addr, user=node.user, identity=self._identity, policy=pins, port=node.port
        )

    def launch(
        self,
        ctx: StartContext,
        nodes: Sequence[NodeSpec],
        reports: Mapping[str, NodeReport],
    ) -> RemoteLaunch:
        """The RemoteLaunch for ``nodes``; raise naming each node that cannot run ranks."""
        far, found = far_nodes(nodes, reports, getpass.getuser())
        if found:
            raise BootstrapError(found)
        key = tuple(far)
        if key != self._checked or self._launch is None:
            launch = self._write(far)
            self._preflight(ctx, far)
            self._checked, self._launch = key, launch
        return self._launch

    def _write(self, far: Sequence[FarNode]) -> RemoteLaunch:
        known = self._dir / "known_hosts"
        known.write_text(known_hosts_text(far))
        config = self._dir / "ssh_config"
        config.write_text(ssh_config(far, identity=self._identity, known_hosts=known))
        from clusterbook.ssh.bootstrap import ssh_wrapper

        ssh_args = ("-F", str(config))
        wrapper = self._dir / "ssh"
        wrapper.write_text(ssh_wrapper(ssh_args))
        wrapper.chmod(0o755)
        return RemoteLaunch(
            ssh_args=ssh_args,
            ssh_wrapper=str(wrapper),
            head_addr=head_address_towards(far[0].addr),
            hostnames={n.addr: n.hostname for n in far},
            tree_spawn=False,
        )

    def _preflight(self, ctx: StartContext, far: Sequence[FarNode]) -> None:
        """Log in to every far node the way the launcher will and check its environment."""
        from clusterbook.ssh.bootstrap import run_task
        from clusterbook.ssh.local_shell import LocalShell
        from clusterbook.ssh.preflight import NodeFacts, all_problems

        args = {"prefix": ctx.launcher.prefix, "flavour": ctx.launcher.flavour.value}
        by_name = {n.name: n for n in far}

        def probe(name: str) -> NodeFacts:
            if name == "":
                return NodeFacts.from_json(run_task(LocalShell(), ctx.python, "probe", args))
            shell = self._connect(by_name[name])
            try:
                return NodeFacts.from_json(run_task(shell, ctx.python, "probe", args, timeout=30))
            finally:
                shell.close()

        facts, failed = parallel(["", *by_name], probe)
        if "" in failed:
            raise failed[""]
        head = facts.pop("")
        nodes = {n.name: (n.addr, n.slots, ctx.launcher.prefix) for n in far}
        found = all_problems(head, facts, failed, nodes, ctx.launcher.flavour.value)
        if found:
            raise BootstrapError(found)
