"""Logging in to one host as ``Cluster.ssh`` does: :class:`Login`.

The host is looked up in the ssh config (``HostName``, ``User``, ``Port``, ``IdentityFile``,
``ProxyJump``, ``ProxyCommand``), the keys are those of the agent and the key files
(:mod:`clusterbook.ssh.credentials`, opened once: a passphrase is asked once), and its key
must be in known_hosts (:mod:`clusterbook.ssh.hostkeys`). Each :meth:`Login.connect` opens a
new connection with them: what reconnects after a connection dropped.
"""

from __future__ import annotations

import getpass
import os

from clusterbook.ssh.credentials import Credentials, prompt_where_asked
from clusterbook.ssh.hostkeys import make_policy
from clusterbook.ssh.paramiko_shell import ParamikoShell, connect_hop
from clusterbook.ssh.paramiko_transport import Tunnels
from clusterbook.ssh.target import read_ssh_config, resolve

__all__ = ["Login"]


class Login:
    """How to reach ``host`` (as ``user``, on ``port``: None for the ssh config's, else the
    defaults); :meth:`close` lets go of the keys and the jump hosts' connections."""

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        config = read_ssh_config(ssh_config)
        self.target = resolve(
            host, config, local_user=getpass.getuser(), user=user, port=port, identity=identity
        )
        self._policy = make_policy(None, known_hosts)
        self._timeout = timeout
        hops = [*self.target.jumps, self.target.node]
        self._credentials = Credentials.gather(hops, explicit=identity, prompt=prompt_where_asked())
        self._tunnels = Tunnels(self._credentials, self._policy) if self.target.jumps else None

    @property
    def where(self) -> str:
        """``user@host`` (and the port, when not 22), for messages."""
        node = self.target.node
        name = f"{node.user}@{node.alias}"
        return name if node.port == 22 else f"{name}:{node.port}"

    def connect(self) -> ParamikoShell:
        """A new connection; the :class:`~clusterbook.errors.SSHError` that says why not."""
        return connect_hop(
            self.target,
            credentials=self._credentials,
            policy=self._policy,
            timeout=self._timeout,
            tunnels=self._tunnels,
        )

    def close(self) -> None:
        if self._tunnels is not None:
            self._tunnels.close()
        self._credentials.close()
