"""The nodes of an elastic round as the head reaches them: which are on other machines, at
which address, and the ssh files that let the head log in to them (pure, but for
:func:`head_address_towards` and :func:`networks_here`, which ask this machine).

An agent started with ``--start-sshd PORT`` runs its own sshd, reports its host key and
port, and lets in one key: the cluster's, derived from the rendezvous secret (see
:mod:`clusterbook.ssh.keys`). The head pins each node's reported host key in a per-cluster
known_hosts (``StrictHostKeyChecking=yes``) and writes a per-cluster ssh config with each
node's port and user (:mod:`clusterbook.providers.elastic.reach` uses them).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from clusterbook.rendezvous.report import NodeReport
from clusterbook.spec import HERE, NodeSpec
from clusterbook.ssh.hostkeys import HostKey, host_entry_name, known_hosts_line
from clusterbook.ssh.preflight import NodeFacts

__all__ = [
    "FarNode",
    "far_nodes",
    "head_address_towards",
    "known_hosts_text",
    "networks_here",
    "pick_address",
    "reported_facts",
    "round_nodes",
    "ssh_config",
]


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
    daemon_socket: str | None = None  # where its agent starts MPI's daemons, if it does


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
                daemon_socket=report.daemon_socket,
            )
        )
    return far, found


def reported_facts(
    far: Iterable[FarNode],
    reports: Mapping[str, NodeReport],
    *,
    prefix: str,
    flavour: str,
    python: str,
) -> dict[str, NodeFacts]:
    """The pre-flight facts of the nodes of ``far`` that need no login to be checked: their
    agent probed itself for this launcher (``flavour`` at ``prefix``: ``--probe-mpi``) with
    the cluster's ``python`` (what it found of mpi4py is that Python's, which the ranks run)
    and starts their MPI daemons, so their ranks get the environment it probed. A report that
    says nothing of the kind, of another launcher or of another Python, is left out."""
    found = {}
    for node in far:
        report = reports.get(node.name)
        if node.daemon_socket is None or report is None or report.probe is None:
            continue
        try:
            probed = json.loads(report.probe)
        except ValueError:
            continue
        if not isinstance(probed, dict) or not isinstance(facts := probed.get("facts"), dict):
            continue
        ran = facts.get("python")
        if (probed.get("prefix"), probed.get("flavour"), ran) == (prefix, flavour, python):
            found[node.name] = replace(NodeFacts.from_json(facts), gpus=report.gpus)
    return found


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
        # X25519 first, as the rendezvous's TLS (which carries the secret this sshd's key is
        # derived from): the post-quantum sntrup761 adds ~0.1 s of CPU to every login here.
        "  KexAlgorithms ^curve25519-sha256\n"
    )
    return "".join(blocks)


def head_address_towards(addr: str) -> str:
    """The head's address on the route to ``addr`` (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


def round_nodes(
    participants: Sequence[tuple[str, NodeReport]], hostname: str, head_networks: Sequence[str]
) -> tuple[NodeSpec, ...]:
    """The nodes of a round (``participants``, by rank, with their reports): those whose
    agent runs on this machine (``hostname``) at :data:`~clusterbook.spec.HERE`, the others at
    their address on a network the head is on (:func:`pick_address`)."""
    out = []
    for node, report in participants:
        addresses = list(report.addresses) or ["?"]
        host = HERE if report.hostname == hostname else pick_address(addresses, head_networks)
        out.append(
            NodeSpec(
                node, host, report.slots, cores=report.cores, gpus=report.gpus, place=report.place
            )
        )
    return tuple(out)


def networks_here() -> list[str]:
    """This machine's IPv4 networks (``addr/netmask``), to pick the node address to use."""
    return [
        f"{a.address}/{a.netmask}"
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and a.netmask and not a.address.startswith("127.")
    ]
