"""Bootstrap of SSH nodes: connect to each, and the cluster's files each gets.

Modelled on the bootstrap_master_node / bootstrap_worker_node / write_status_file_to_workers
steps of managed training services: every host is handled in parallel over one connection
(one handshake per host), each step is one remote command (the login shell starts once per
step, not per file; :mod:`clusterbook.ssh.node_session` runs them), and failures are gathered
per host into one :class:`BootstrapError`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from clusterbook.errors import (
    BootstrapError,
    HostNotFoundError,
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
)
from clusterbook.ssh.hostkeys import HostKey, known_hosts_line
from clusterbook.ssh.keys import KeyPair
from clusterbook.ssh.launcher_ssh import ssh_wrapper
from clusterbook.ssh.paramiko_shell import ParamikoShell

__all__ = ["Connection", "cluster_files", "connect", "encode_files", "unreached"]


@dataclass(frozen=True, slots=True)
class Connection:
    """An open connection to a node, with the host key it showed."""

    host: str
    shell: ParamikoShell
    host_key: HostKey
    local_addr: str  # our address as the node sees it


def connect(host: str, dial: Callable[[str, float], ParamikoShell], deadline: float) -> Connection:
    """Connect to ``host`` with ``dial(host, timeout)``, retrying while sshd is not up yet,
    until ``deadline`` (monotonic).

    Host key and authentication failures are final at once; a name that does not resolve too.
    """
    pause = 0.1
    while True:
        left = deadline - time.monotonic()
        try:
            shell = dial(host, max(0.5, min(5.0, left)))
            break
        except HostNotFoundError:
            raise
        except (SSHConnectError, SSHTimeoutError):
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
    return Connection(host, shell, shell.server_key(), shell.local_addr)


def unreached(failed: Mapping[str, Exception]) -> BootstrapError:
    """The error for the hosts :func:`connect` failed on, with why."""
    return BootstrapError({h: [_reason(e)] for h, e in failed.items()})


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, SSHError) else f"{type(exc).__name__}: {exc}"


def cluster_files(
    cluster_id: str,
    keys: KeyPair,
    connections: Mapping[str, Connection],
    names: Mapping[str, Sequence[str]],
    *,
    ssh_args: Sequence[str],
) -> dict[str, tuple[str, bytes]]:
    """The files every node (and the head) gets: name -> (octal mode, content). ``names``:
    the names each connection's host key is known by (``host``, ``[host]:port``)."""
    known = "".join(
        known_hosts_line(dict.fromkeys(names[h]), c.host_key) for h, c in connections.items()
    )
    wrapper = ssh_wrapper(ssh_args)
    return {
        "id_ed25519": ("600", keys.private_path.read_bytes()),
        "id_ed25519.pub": ("644", (keys.public_line + "\n").encode()),
        "known_hosts": ("644", known.encode()),
        "ssh": ("755", wrapper.encode()),
    }


def encode_files(files: Mapping[str, tuple[str, bytes]]) -> dict[str, list[str]]:
    """Files as the install task takes them (base64 content)."""
    return {name: [mode, base64.b64encode(data).decode()] for name, (mode, data) in files.items()}
