"""Addresses of clusters on other machines: ``ssh://[user@]host[:port]/ID``.

``Cluster.attach("ssh://me@login1/train")`` reaches cluster ``train`` (an id, a name, or a
directory) of user ``me`` on ``login1`` over ssh (:mod:`clusterbook.cluster.remote.sshdir`);
``clusterbook ls --host me@login1`` lists that machine's clusters. Pure parsing: nothing here
connects.

After the host, one ``/`` and an id or a name; a directory is a path after it: absolute
(``ssh://login1/srv/runs/c1`` is ``/srv/runs/c1``) or in the home (``ssh://login1/~/runs/c1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from clusterbook.errors import ConfigError
from clusterbook.spec import validate_host, validate_port

__all__ = ["SCHEME", "SSHAddress", "is_ssh_address", "parse_host", "parse_ssh_address"]

SCHEME = "ssh://"
_EXAMPLE = "ssh://user@login-node/CLUSTER (an id, a name, or a directory after the host)"


@dataclass(frozen=True, slots=True)
class SSHAddress:
    """A cluster (``what``: its id, name or directory) of ``user`` on ``host``; user and
    port None where the address gives none (the ssh config's, else the defaults)."""

    host: str
    what: str = ""
    user: str | None = None
    port: int | None = None

    @property
    def login(self) -> str:
        """``user@host:port`` as given, for messages."""
        name = f"{self.user}@{self.host}" if self.user else self.host
        return f"{name}:{self.port}" if self.port else name

    def __str__(self) -> str:
        return f"{SCHEME}{self.login}/{self.what}"


def is_ssh_address(what: object) -> bool:
    """Whether ``what`` is an ``ssh://`` address (else an id, a name or a local directory)."""
    return isinstance(what, str) and what.lower().startswith(SCHEME)


def parse_ssh_address(text: str) -> SSHAddress:
    """The address ``text`` names; :class:`ConfigError` saying what is wrong with it."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{text!r} is not an address like {_EXAMPLE}: {exc}.") from None
    if parts.scheme.lower() != "ssh":
        raise ConfigError(f"{text!r} is not an ssh:// address; give one like {_EXAMPLE}.")
    if parts.query or parts.fragment or parts.password is not None:
        raise ConfigError(
            f"{text!r} has a password, '?' or '#' part, which an ssh:// cluster address does "
            f"not take; give one like {_EXAMPLE} (keys come from your ssh-agent or ssh config)."
        )
    path = unquote(parts.path)
    what = path[1:]
    if not what:
        raise ConfigError(f"{text!r} names no cluster after the host; give one like {_EXAMPLE}.")
    if "/" in what and not what.startswith("~"):
        what = path  # a directory: absolute, unless it starts in the home
    return SSHAddress(
        host=_host(parts.hostname, text),
        what=what,
        user=unquote(parts.username) if parts.username else None,
        port=None if port is None else validate_port(port, f"The port of {text!r}"),
    )


def parse_host(text: str) -> SSHAddress:
    """``[user@]host[:port]`` (or ``ssh://`` and that) as an address that names no cluster:
    ``clusterbook ls --host``'s."""
    raw = text if is_ssh_address(text) else SCHEME + text
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"--host {text!r} is not [user@]host[:port]: {exc}.") from None
    if parts.path.strip("/") or parts.query or parts.fragment or parts.password is not None:
        raise ConfigError(f"--host {text!r} is not [user@]host[:port], like me@login1.")
    return SSHAddress(
        host=_host(parts.hostname, text),
        user=unquote(parts.username) if parts.username else None,
        port=None if port is None else validate_port(port, f"The port of {text!r}"),
    )


def _host(host: str | None, text: str) -> str:
    if not host:
        raise ConfigError(f"{text!r} names no host; give one like {_EXAMPLE}.")
    try:
        return validate_host(host)
    except ConfigError as exc:
        raise ConfigError(f"In {text!r}: {exc}") from None
