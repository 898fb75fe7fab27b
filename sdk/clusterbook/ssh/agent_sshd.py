"""A node agent's own sshd (``clusterbook worker join --start-sshd``): the cluster's key alone,
for a session and, where the agent serves one, a connection to its daemon socket."""

from __future__ import annotations

import os
from pathlib import Path

from clusterbook.ssh.sshd import Sshd, start_sshd, write_private
from clusterbook.ssh.sshd_config import AGENT_KEY_OPTIONS

__all__ = ["start_agent_sshd"]


def start_agent_sshd(
    directory: str | os.PathLike[str],
    public_line: str,
    *,
    socket: str | None = None,
    port: int = 0,
    listen: str = "127.0.0.1",
) -> Sshd:
    """A node agent's own sshd (``clusterbook worker join --start-sshd``): it lets in the key
    of ``public_line`` alone (the cluster's, derived from its secret; ``authorized_keys`` in
    ``directory`` is rewritten, so a key of an earlier cluster no longer gets in), for a
    session and, with ``socket``, connections to that Unix socket of the host (the agent's,
    where it starts MPI's daemons: :data:`AGENT_KEY_OPTIONS`); nothing else."""
    directory = Path(directory).expanduser()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = directory / "authorized_keys"
    options = "restrict" if socket is None else AGENT_KEY_OPTIONS.format(socket=socket)
    write_private(keys, f"{options} {public_line}\n")
    sockets = () if socket is None else (socket,)
    return start_sshd(
        directory, port=port, listen=listen, authorized_keys=keys, open_sockets=sockets
    )
