"""How the MPI launcher's ssh reaches the nodes: its options when every node is reached
straight at its name (:func:`node_ssh_args`, the same on the head and on every node), else
an ssh config of the head's (:func:`launcher_ssh_config`), and the wrapper script MPICH's
launcher takes (:func:`ssh_wrapper`). Host keys are checked strictly against the cluster's
own known_hosts, and the cluster's key is the only one offered."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterbook.paths import node_cluster_dir
from clusterbook.ssh.target import Target

__all__ = ["launcher_ssh_config", "node_ssh_args", "plain_login", "ssh_wrapper"]


def node_ssh_args(cluster_id: str, *, user: str, port: int) -> list[str]:
    """ssh options for head-to-node and node-to-node connections made by the MPI launcher.

    Paths start with ``~`` (expanded by ssh) so the same options work on the head and on every
    node, whatever their home directories. Host keys are checked strictly against the
    cluster's own known_hosts, built from the keys the nodes showed at bootstrap.
    """
    base = node_cluster_dir("~", cluster_id)
    args = [
        "-o",
        f"IdentityFile={base}/id_ed25519",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={base}/known_hosts",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        f"User={user}",
    ]
    if port != 22:
        args += ["-o", f"Port={port}"]
    return args


def plain_login(targets: Mapping[str, Target]) -> tuple[str, int] | None:
    """The one (user, port) of ``targets`` when each is reached at its own name, straight:
    then the launcher's ssh needs options only (:func:`node_ssh_args`), and the nodes can
    start each other's daemons (tree spawn). None when a config of hosts is needed."""
    logins = {(t.node.user, t.node.port) for t in targets.values()}
    plain = all(
        not t.jumps and t.node.proxy_command is None and t.node.hostname == alias
        for alias, t in targets.items()
    )
    return next(iter(logins)) if plain and len(logins) == 1 else None


def launcher_ssh_config(
    cluster_dir: str | Path, targets: Mapping[str, Target], proxy_command: str | None
) -> str:
    """The head's ssh config for the MPI launcher: each node's address, port and user (and,
    behind jump hosts, ``proxy_command``: the relay over the head's own connections; a node's
    own ProxyCommand from the user's ssh config, run on the head as the user's ssh would), with
    the cluster's key and known_hosts in ``cluster_dir`` (the head's, absolute: ssh reads
    ``~`` as the passwd home, which need not be ``$HOME``) and strict host key checks, as
    :func:`node_ssh_args`."""
    base = str(cluster_dir)
    lines = [f"# The MPI launcher's ssh for the cluster in {base} (removed at stop)."]
    for alias, target in sorted(targets.items()):
        node = target.node
        lines += [f"Host {alias}", f"  HostName {node.hostname}", f"  Port {node.port}"]
        lines.append(f"  User {node.user}")
        if target.jumps:
            if proxy_command is None:
                raise ValueError(f"{alias} is behind jump hosts: a proxy command is needed")
            lines.append(f"  ProxyCommand {proxy_command}")
        elif node.proxy_command is not None:
            # Its tokens are filled in already: a % left in it is a literal one for ssh.
            lines.append(f"  ProxyCommand {node.proxy_command.replace('%', '%%')}")
    lines += [
        "Host *",
        f"  IdentityFile {base}/id_ed25519",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {base}/known_hosts",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        "  ConnectTimeout 10",
    ]
    return "\n".join(lines) + "\n"


def ssh_wrapper(ssh_args: Sequence[str]) -> str:
    """A script that runs ssh with ``ssh_args`` (MPICH's launcher takes one program)."""
    return "#!/bin/sh\nexec ssh " + shlex.join(ssh_args) + ' "$@"\n'
