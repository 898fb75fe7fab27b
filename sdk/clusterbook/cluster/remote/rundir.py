"""Where an attached handle finds a cluster's directory: :class:`ClusterDir`.

An :class:`~clusterbook.cluster.remote.attached.AttachedCluster` reads the cluster's record and its
jobs' files, and reaches its head's control socket, through one of these: :class:`LocalDir` for a
directory on this machine, or :class:`~clusterbook.cluster.remote.sshdir.SSHDir` for one on the
machine an ssh connection leads to (where the same :class:`LocalDir` answers it, run by
:mod:`clusterbook.cluster.remote.dirservice`). Whether the head is gone (*stale*) is always decided
on the head's machine: only there can its process be looked for.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Protocol

from clusterbook.cluster.remote.address import is_ssh_address
from clusterbook.durations import Duration
from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.fs.private import check_run_dir
from clusterbook.fs.safe import touch
from clusterbook.functions.place import CallPlace, LocalCalls
from clusterbook.head.catalog import Found, find
from clusterbook.head.control import SOCKET_FILE, TOKEN_FILE, ControlClient, unix_dial
from clusterbook.head.record import STOP_FILE, ClusterRecord, is_stale, read_record
from clusterbook.launch.files import LOCAL, Files
from clusterbook.paths import default_run_root
from clusterbook.wording import spell_or

__all__ = ["ClusterDir", "LocalDir", "open_dir"]


class ClusterDir(Protocol):
    """A cluster's directory, wherever it is."""

    @property
    def path(self) -> Path:
        """The directory, as its own machine names it."""
        ...

    @property
    def where(self) -> str:
        """``""`` on this machine, else the login that reaches it (``me@login1``)."""
        ...

    @property
    def files(self) -> Files:
        """Reads of the files in it (the jobs' logs and results)."""
        ...

    def read(self) -> tuple[ClusterRecord, bool]:
        """The record, and whether it is stale; :class:`~clusterbook.errors.RecordError`
        when it cannot be read, :class:`~clusterbook.errors.ClusterStateError` when the
        machine cannot be reached."""
        ...

    def machine(self) -> str:
        """The name of the directory's machine (the head takes requests from it only)."""
        ...

    def control(self) -> ControlClient:
        """A client of the head's control socket in the directory."""
        ...

    def touch_stop(self) -> None:
        """Make the stop file, which the head acts on within a second."""
        ...

    def stop_there(self, timeout: float, reason: str, force: bool = False) -> bool:
        """Stop the cluster on the directory's own machine, as a handle there would (it can
        clean up after a head that is gone; ``force``: also after one it cannot verify), and
        return True; False where that machine is this one: the caller does it."""
        ...

    def call_place(self) -> CallPlace:
        """Where function jobs keep their calls (:mod:`clusterbook.functions.place`)."""
        ...

    def close(self) -> None:
        """Let go of what reaches the directory (nothing is left running for it)."""
        ...


class LocalDir:
    """A cluster's directory on this machine."""

    where = ""

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    @property
    def files(self) -> Files:
        return LOCAL

    def read(self) -> tuple[ClusterRecord, bool]:
        record = read_record(self._path)
        return record, is_stale(record)

    def machine(self) -> str:
        return socket.gethostname()

    def control(self) -> ControlClient:
        # The run directory's own socket, whatever address the record names.
        sock, token = self._path / SOCKET_FILE, self._path / TOKEN_FILE
        try:
            return ControlClient(unix_dial(sock), token, where=str(sock))
        except ConfigError as exc:  # said for the one who writes a secret file: not here
            why = (
                f"cannot read it ({exc})"
                if os.path.lexists(token)
                else "there is none (it was removed, or this is not the directory the head "
                "wrote it in)"
            )
            raise ClusterStateError(
                f"The head of the cluster in {self._path} takes requests only with the secret "
                f"in its token file {token}, and this process {why}."
            ) from exc

    def touch_stop(self) -> None:
        touch(self._path / STOP_FILE)

    def stop_there(self, timeout: float, reason: str, force: bool = False) -> bool:
        return False

    def call_place(self) -> CallPlace:
        return LocalCalls(self._path)

    def close(self) -> None:
        pass


def open_dir(
    what: str | os.PathLike[str],
    *,
    identity: str | os.PathLike[str] | None = None,
    known_hosts: str | os.PathLike[str] | None = None,
    ssh_config: str | os.PathLike[str] | None = None,
    python: str | None = None,
    connect_timeout: Duration = 10.0,
) -> tuple[Found, ClusterDir]:
    """The cluster ``what`` names (an id, a name, a directory, or an ``ssh://`` address: see
    ``Cluster.attach``) and its directory, checked: this user's alone. The keyword arguments
    say how an ``ssh://`` address is reached; beside a cluster of this machine they are a
    :class:`ConfigError`."""
    if is_ssh_address(what):
        from clusterbook.cluster.remote.sshdir import SSHDir

        return SSHDir.open(
            str(what),
            identity=identity,
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            python=python,
            connect_timeout=connect_timeout,
        )
    given = {"identity": identity, "known_hosts": known_hosts, "ssh_config": ssh_config,
             "python": python}  # fmt: skip
    if named := [spell_or(k, v, k) for k, v in given.items() if v is not None]:
        raise ConfigError(
            f"{', '.join(named)} say how to reach a cluster on another machine, and "
            f"{os.fspath(what)!r} names one on this machine; give an ssh://user@host/ID "
            "address with them, or leave them out."
        )
    found = find(what)
    if found.error is not None:
        raise found.error
    root = default_run_root()
    check_run_dir(found.path, root if found.path.parent == root else None)
    return found, LocalDir(found.path)
