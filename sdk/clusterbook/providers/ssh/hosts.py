"""The hosts of an SSH cluster as given, checked before anything starts: the host list with
its slots, and where ``~/.ssh/config`` (and the options given) say each host is."""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence

from clusterbook.errors import ConfigError
from clusterbook.gpus import Slots
from clusterbook.spec import NodeSpec, parse_host_slots, validate_port
from clusterbook.ssh.target import Target, read_ssh_config, resolve

__all__ = ["HEAD", "host_node", "parse_host_list", "parse_hosts", "targets"]

HEAD = "(head)"  # key of the head among hosts (never a valid host name)


def parse_host_list(
    hosts: Sequence[str] | str, default_slots: Slots = 1
) -> tuple[tuple[str, Slots], ...]:
    """``["node1:4", "node2:gpus", "node3"]`` into ``(host, slots)`` pairs (``"gpus"``: one
    slot per GPU, counted once the node is probed); empty lists and duplicate hosts are
    refused."""
    if isinstance(hosts, str):
        raise ConfigError(
            f"hosts must be a list like ['node1:4', 'node2:4'], not the string {hosts!r}."
        )
    entries: dict[str, Slots] = {}
    for entry in hosts:
        host, slots = parse_host_slots(entry, default_slots)
        if host in entries:
            raise ConfigError(
                f"Host {host!r} is listed twice; list each host once and give it all its slots "
                f"('{host}:N')."
            )
        entries[host] = slots
    if not entries:
        raise ConfigError("hosts is empty; give at least one host, like ['node1:4'].")
    return tuple(entries.items())


def parse_hosts(hosts: Sequence[str] | str, default_slots: Slots = 1) -> tuple[NodeSpec, ...]:
    """``["node1:4", "node2"]`` into nodes (:func:`parse_host_list`); a node whose slots are
    ``"gpus"`` has 1 until its GPUs are counted."""
    return tuple(host_node(host, slots) for host, slots in parse_host_list(hosts, default_slots))


def host_node(host: str, slots: Slots) -> NodeSpec:
    """The node of ``host`` before it is probed (``"gpus"`` slots: 1 until counted)."""
    return NodeSpec(host, host, slots if isinstance(slots, int) else 1)


def targets(
    hosts: Sequence[str],
    *,
    ssh_config: str | os.PathLike[str] | None,
    user: str | None,
    port: int | None,
    identity: str | os.PathLike[str] | None,
) -> dict[str, Target]:
    """Where each of ``hosts`` is (its ``HostName``, user, port, keys, jump hosts), read now
    from the ssh config: a bad config or ProxyJump line is named before anything starts."""
    config = read_ssh_config(ssh_config)
    local_user = getpass.getuser()
    given_port = validate_port(port) if port is not None else None
    return {
        host: resolve(
            host, config, local_user=local_user, user=user, port=given_port, identity=identity
        )
        for host in hosts
    }
