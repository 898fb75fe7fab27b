"""Stand-in machines on this one: user-level sshds whose logins live in a throwaway home.

A tutorial, a demo or a user's test wants "machines you reach with ssh" where there is one
machine, no root and no system sshd (Binder). :func:`stand_in_hosts` starts one sshd per host
on its own loopback address (``127.0.0.2``, ``127.0.0.3``, ...: not ``localhost``, so MPI
reaches them through ssh as it would real machines), each letting in one key made for them,
and gives every login the same throwaway ``HOME`` inside ``directory``. What a cluster writes
on its nodes (its key line in ``~/.ssh/authorized_keys``, ``~/.clusterbook/clusters/ID``)
lands there, never in the user's own home; the ``ssh_config`` and pinned ``known_hosts`` it
writes beside are what ``Cluster.ssh(..., ssh_config=, known_hosts=)`` takes.

>>> from clusterbook.ssh.standin import stand_in_hosts
>>> with stand_in_hosts("machines", 2) as hosts:                      # doctest: +SKIP
...     cb.Cluster.ssh(["node1:2", "node2:2"], ssh_config=hosts.ssh_config,
...                    known_hosts=hosts.known_hosts)
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from clusterbook.errors import ConfigError
from clusterbook.ssh.sshd import Sshd, start_sshd

__all__ = ["StandInHosts", "stand_in_hosts"]

#: The comment of the key made to log in to stand-in hosts.
KEY_COMMENT = "clusterbook-stand-in"


@dataclass(frozen=True)
class StandInHosts:
    """Stand-in machines started by :func:`stand_in_hosts`; :meth:`stop` them, or use ``with``.

    Attributes
    ----------
    names
        The hosts' aliases in ``ssh_config``: ``node1``, ``node2``, ...
    sshds
        Their sshds, in the same order.
    home
        The throwaway home every login gets (``HOME``): what a cluster writes on its nodes.
    key
        The private key that logs in (its public key beside it, ``.pub``).
    ssh_config
        An OpenSSH client config: one ``Host`` per name, with address, port and key.
    known_hosts
        The sshds' host keys, pinned.
    """

    names: tuple[str, ...]
    sshds: tuple[Sshd, ...]
    home: Path
    key: Path
    ssh_config: Path
    known_hosts: Path

    @property
    def authorized_keys(self) -> Path:
        """The file of the keys allowed to log in: the throwaway home's."""
        return self.home / ".ssh" / "authorized_keys"

    @property
    def running(self) -> bool:
        """True while every sshd runs."""
        return all(sshd.running for sshd in self.sshds)

    def stop(self) -> None:
        """Stop every sshd and the sessions it started; the files stay in the directory."""
        for sshd in self.sshds:
            sshd.stop()

    def __enter__(self) -> StandInHosts:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def stand_in_hosts(
    directory: str | os.PathLike[str], count: int = 2, *, first_address: str = "127.0.0.2"
) -> StandInHosts:
    """Start ``count`` stand-in machines, each a user-level sshd, with everything in ``directory``.

    Nothing is written outside ``directory``: the key, the sshds' files, the client's config,
    the pinned host keys and the throwaway home (``directory/home``) that logins get. Called
    again with the same directory, it reuses the key and the host keys.

    Parameters
    ----------
    directory
        Where everything goes (made if missing).
    count
        How many machines, 1-250.
    first_address
        The first machine's loopback address; the next ones count up from it.

    Returns
    -------
    StandInHosts
        The running machines and the files that reach them.

    Raises
    ------
    ConfigError
        ``count`` or ``first_address`` is out of range (the message says which and why).
    SshdError
        An sshd could not start (the message holds its log's last lines).
    """
    addresses = _addresses(count, first_address)
    root = Path(directory).expanduser().absolute()
    home = root / "home"
    (home / ".ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "tmp").mkdir(mode=0o700, exist_ok=True)  # the logins' TMPDIR
    key = root / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", str(key)],
            check=True,
        )
    authorized = home / ".ssh" / "authorized_keys"
    public = key.with_suffix(".pub").read_text(encoding="utf-8")
    if public not in (authorized.read_text(encoding="utf-8") if authorized.exists() else ""):
        with authorized.open("a", encoding="utf-8") as f:
            f.write(public)
    authorized.chmod(0o600)
    names = tuple(f"node{i}" for i in range(1, count + 1))
    sshds: list[Sshd] = []
    try:
        for name, address in zip(names, addresses, strict=True):
            sshd = start_sshd(root / name, listen=address, authorized_keys=authorized, home=home)
            sshds.append(sshd)
    except BaseException:
        for started in sshds:
            started.stop()
        raise
    config = root / "ssh_config"
    config.write_text(
        "".join(
            f"Host {name}\n    HostName {sshd.listen}\n    Port {sshd.port}\n"
            f"    IdentityFile {key}\n    IdentitiesOnly yes\n"
            for name, sshd in zip(names, sshds, strict=True)
        ),
        encoding="utf-8",
    )
    known_hosts = root / "known_hosts"
    known_hosts.write_text(
        "".join(f"[{sshd.listen}]:{sshd.port} {sshd.host_public_key}\n" for sshd in sshds),
        encoding="utf-8",
    )
    return StandInHosts(names, tuple(sshds), home, key, config, known_hosts)


def _addresses(count: object, first: object) -> list[str]:
    """``count`` loopback addresses from ``first`` on, or a ConfigError saying what is wrong."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 250:
        raise ConfigError(f"stand_in_hosts count must be an integer 1-250, got {count!r}.")
    try:
        start = ipaddress.IPv4Address(first)
    except ValueError:
        start = None
    last = None if start is None else start + (count - 1)
    if start is None or last is None or not (start.is_loopback and last.is_loopback):
        raise ConfigError(
            f"stand_in_hosts first_address must be an IPv4 loopback address with {count} "
            f"after it in 127.0.0.0/8, got {first!r}; use 127.0.0.2 (the default)."
        )
    return [str(start + i) for i in range(count)]
