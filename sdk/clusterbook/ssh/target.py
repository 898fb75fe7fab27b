"""Where a host name leads, the way OpenSSH reads it: ``~/.ssh/config`` (``Host`` aliases,
``HostName``, ``User``, ``Port``, ``IdentityFile``, ``IdentitiesOnly``, ``ProxyJump``,
``ProxyCommand``), with the arguments given to clusterbook winning over it.

Pure decisions on a parsed config (:func:`read_ssh_config` is the one edge that reads a file);
the connections themselves are :mod:`clusterbook.ssh.paramiko_shell`'s.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Protocol

from clusterbook.errors import ConfigError
from clusterbook.spec import validate_host, validate_port

__all__ = ["Hop", "SSHConfigLike", "Target", "read_ssh_config", "resolve", "user_config_path"]

_MAX_JUMPS = 8  # OpenSSH has no limit, but a longer chain is a loop in the config
_TOKEN_RE = re.compile(r"%(.?)", re.DOTALL)
_JUMP_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:\s]+)(?::(?P<port>\d+))?$")


class SSHConfigLike(Protocol):
    """What is read of an OpenSSH client config (``paramiko.SSHConfig`` is one)."""

    def lookup(self, hostname: str) -> Mapping[str, object]: ...


@dataclass(frozen=True, slots=True)
class Hop:
    """One ssh connection of a path: ``alias`` as written, the address it leads to."""

    alias: str
    hostname: str
    port: int
    user: str
    identities: tuple[Path, ...] = ()  # IdentityFile lines for it, in order
    identities_only: bool = False  # IdentitiesOnly yes: no keys from the agent
    proxy_command: str | None = None  # ProxyCommand, its %h, %p, %r... filled in

    @property
    def where(self) -> str:
        """``user@host:port`` (with the alias when it is not the address), for messages."""
        name = f"{self.user}@{self.hostname}:{self.port}"
        return name if self.alias == self.hostname else f"{self.alias} ({name})"


@dataclass(frozen=True, slots=True)
class Target:
    """A host to log in to, and the jump hosts on the way (outermost first)."""

    node: Hop
    jumps: tuple[Hop, ...] = ()


def user_config_path() -> Path:
    return Path("~/.ssh/config").expanduser()


def read_ssh_config(path: str | os.PathLike[str] | None) -> SSHConfigLike | None:
    """The client config at ``path`` (None: ``~/.ssh/config`` if there is one; ``"none"``:
    none, as ``ssh -F none``)."""
    import paramiko

    if path is not None and str(path) == "none":
        return None
    given = path is not None
    file = Path(path).expanduser() if path is not None else user_config_path()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if given:
            raise ConfigError(
                f"ssh_config {str(file)!r} does not exist; give the path of an OpenSSH client "
                "config, or leave it out to read ~/.ssh/config."
            ) from None
        return None
    except OSError as exc:
        raise ConfigError(f"Cannot read ssh_config {str(file)!r}: {exc.strerror}.") from None
    config = paramiko.SSHConfig()
    # ProxyCommand's tokens are filled in here, as OpenSSH does (paramiko knows no %% nor %n,
    # and would fill in the config's user and port where the arguments given win).
    config.TOKENS_BY_CONFIG_KEY = {**config.TOKENS_BY_CONFIG_KEY, "proxycommand": []}
    try:
        config.parse(io.StringIO(text))
        return config
    except Exception as exc:  # paramiko raises a ConfigParseError, or worse on odd input
        raise ConfigError(f"ssh_config {str(file)!r} cannot be read: {exc}.") from None


def resolve(
    alias: str,
    config: SSHConfigLike | None,
    *,
    local_user: str,
    user: str | None = None,
    port: int | None = None,
    identity: str | os.PathLike[str] | None = None,
) -> Target:
    """Where ``alias`` leads: its ``HostName``, ``User``, ``Port``, keys and jump hosts from
    ``config``, but ``user``, ``port`` and ``identity`` when given (as ``ssh -l -p -i``: for the
    host itself, not its jump hosts)."""
    node = _hop(alias, config, local_user, user=user, port=port, identity=identity)
    target = Target(node, _jumps(alias, config, local_user, seen=(alias,)))
    path = (*target.jumps, node)
    for before, hop in pairwise(path):
        # OpenSSH runs a host's ProxyCommand only to reach it first hand: behind a jump host
        # (its own ProxyJump, or a chain's) the jump host's connection takes its place.
        if hop.proxy_command is not None:
            raise ConfigError(
                f"The ssh config gives {hop.alias!r} both a ProxyCommand "
                f"({hop.proxy_command!r}) and a jump host on the way ({before.alias!r}, from "
                "a ProxyJump line); OpenSSH uses whichever comes first and ignores the other: "
                "keep one of them."
            )
    return target


def _hop(
    alias: str,
    config: SSHConfigLike | None,
    local_user: str,
    *,
    user: str | None = None,
    port: int | None = None,
    identity: str | os.PathLike[str] | None = None,
) -> Hop:
    found = config.lookup(alias) if config is not None else {}
    hostname = str(found.get("hostname") or alias)
    validate_host(hostname)
    chosen_port = port if port is not None else _port(found.get("port"), alias)
    files = [identity] if identity is not None else _strings(found.get("identityfile"))
    only = str(found.get("identitiesonly", "no")).lower() == "yes"
    hop = Hop(
        alias=alias,
        hostname=hostname,
        port=validate_port(chosen_port),
        user=user or str(found.get("user") or local_user),
        identities=tuple(Path(f).expanduser() for f in files),
        identities_only=only,
    )
    proxy = str(found.get("proxycommand") or "").strip()  # paramiko: None for "none"
    return replace(hop, proxy_command=_filled_in(proxy, hop)) if proxy else hop


def _filled_in(command: str, hop: Hop) -> str:
    """``command`` (a ProxyCommand) with the tokens OpenSSH fills in for it: %h, %n, %p, %r
    and %%; any other is refused, as OpenSSH does."""
    values = {"h": hop.hostname, "n": hop.alias, "p": str(hop.port), "r": hop.user, "%": "%"}

    def token(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise ConfigError(
                f"ProxyCommand {command!r} of {hop.alias!r} in the ssh config has the token "
                f"{match[0]!r}, which OpenSSH does not fill in there (it knows %h, %n, %p, %r "
                "and %%); fix that line (%% for a % sign)."
            )
        return values[match[1]]

    return _TOKEN_RE.sub(token, command)


def _jumps(
    alias: str, config: SSHConfigLike | None, local_user: str, seen: Sequence[str]
) -> tuple[Hop, ...]:
    found = config.lookup(alias) if config is not None else {}
    spec = str(found.get("proxyjump") or "none")
    if spec.lower() == "none":
        return ()
    hops: list[Hop] = []
    for part in spec.split(","):
        m = _JUMP_RE.match(part.strip())
        if m is None:
            raise ConfigError(
                f"ProxyJump {spec!r} of {alias!r} in the ssh config is not [user@]host[:port]"
                "[,...]; fix that line."
            )
        host = m["host"].strip("[]")
        if host in seen or len(seen) > _MAX_JUMPS:
            chain = " -> ".join([*seen, host])
            raise ConfigError(
                f"The ProxyJump lines of the ssh config loop ({chain}); fix them so that the "
                "chain of jump hosts ends."
            )
        # A jump host is looked up too: its own address, user, port, keys, and jumps.
        hops += _jumps(host, config, local_user, seen=(*seen, host))
        hops.append(
            _hop(
                host, config, local_user, user=m["user"], port=int(m["port"]) if m["port"] else None
            )
        )
    return tuple(hops)


def _port(value: object, alias: str) -> int:
    if value is None:
        return 22
    try:
        return int(str(value))
    except ValueError:
        raise ConfigError(
            f"Port {value!r} of {alias!r} in the ssh config is not a number; fix that line."
        ) from None


def _strings(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence):
        return [str(v) for v in value]
    return [str(value)]
