"""What a user-level sshd is told: its settings, checked, and the sshd_config text (pure).

:mod:`clusterbook.ssh.sshd` starts and stops the daemon; this module only decides what its
configuration says: public keys only, no PAM, no forwarding but what is asked for (TCP
connections onwards for a jump host, Unix sockets of the host for a node's agent), paths that
sshd_config can hold.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ConfigError
from clusterbook.spec import validate_host, validate_port

__all__ = [
    "AGENT_KEY_OPTIONS",
    "BAD_PATH_CHARS",
    "SshdConfig",
    "check_listen",
    "check_path",
    "openable",
    "quote",
    "render_sshd_config",
]

#: The options of the cluster's key on an agent's own sshd: all that OpenSSH's ``restrict``
#: forbids (pty, agent and X11 forwarding, ~/.ssh/rc) but port forwarding, and that to the
#: agent's socket only (``permitopen="[PATH]:*"``, as the sshd's ``PermitOpen``): the head
#: starts MPI's daemons through it. ``{socket}``: its path.
AGENT_KEY_OPTIONS = 'restrict,port-forwarding,permitopen="[{socket}]:*"'


def openable(path: str) -> bool:
    """Whether ``path`` can be an open socket's (``PermitOpen [PATH]:*``, and the key line's
    ``permitopen="[PATH]:*"``): none of ``]``, ``"``, a blank or a backslash in it."""
    return not any(c in path for c in ']" \t\n\\')


#: Characters a path in sshd_config cannot hold.
BAD_PATH_CHARS = frozenset('"\\\n\r\t\0')


@dataclass(frozen=True, slots=True)
class SshdConfig:
    """What a user-level sshd listens on and where its files are.

    Parameters
    ----------
    directory
        Absolute directory holding the host key, config, pid file and log.
    port
        TCP port to listen on, 1-65535.
    listen
        Address to listen on; ``127.0.0.1`` keeps it private to this machine.
    authorized_keys
        The file of public keys allowed to log in; ``directory/"authorized_keys"`` if None. A
        relative path is sshd's: relative to the home of the user logging in (like
        ``.ssh/authorized_keys``).
    forwarding
        Let logged-in users open connections from this host to others (``direct-tcpip``
        channels: this host as a jump host).
    more_keys
        More files of public keys allowed to log in, besides ``authorized_keys`` (absolute).
    socket_forwarding
        Let logged-in users connect to Unix sockets on this host (``ssh -L PATH:PATH``, a
        ``direct-streamlocal`` channel: the head reaches a node's agent so). OpenSSH allows
        that only with connections onward from this host (``forwarding``), so it implies them:
        nothing a key that may run commands here could not do with ``nc``. A key marked
        ``restrict`` also needs ``port-forwarding`` for either. No other forwarding is ever
        allowed: nothing the other way (``-R``), no agent, X11 or tunnel.
    home
        The ``HOME`` of the sessions it starts (absolute), instead of the user's own: what they
        write under ``~`` lands there. None: the home the user database gives.
    open_sockets
        The only destinations of forwarding: these Unix sockets of this host (``ssh -L
        LOCAL:PATH``), no other socket and no TCP port (``PermitOpen [PATH]:*``, which OpenSSH
        matches against a socket's path and no TCP host); nothing the other way.
    """

    directory: Path
    port: int
    listen: str = "127.0.0.1"
    authorized_keys: Path | None = None
    forwarding: bool = False
    more_keys: tuple[Path, ...] = ()
    socket_forwarding: bool = False
    home: Path | None = None
    open_sockets: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", check_path(self.directory, "directory"))
        validate_port(self.port, "sshd port")
        check_listen(self.listen)
        keys = self.authorized_keys
        keys = self.directory / "authorized_keys" if keys is None else keys
        home_relative = isinstance(keys, (str, os.PathLike)) and not Path(keys).is_absolute()
        checked = check_path(keys, "authorized_keys", absolute=not home_relative)
        object.__setattr__(self, "authorized_keys", checked)
        more = tuple(check_path(k, "authorized_keys") for k in self.more_keys)
        object.__setattr__(self, "more_keys", more)
        sockets = tuple(check_path(p, "open_sockets") for p in self.open_sockets)
        for path in sockets:
            if not openable(str(path)):
                raise ConfigError(
                    f"open_sockets {str(path)!r} holds ']', '\"', a blank or a backslash, which "
                    "PermitOpen cannot hold; serve the socket at another path."
                )
        object.__setattr__(self, "open_sockets", sockets)
        if self.home is not None:
            object.__setattr__(self, "home", check_path(self.home, "home"))


def render_sshd_config(cfg: SshdConfig, *, host_key: Path, pid_file: Path) -> str:
    """Return the text of an sshd_config for ``cfg``: public keys only, no PAM, no forwarding
    but what ``cfg`` asks for.

    Parameters
    ----------
    cfg
        Port, listen address and authorized_keys file.
    host_key
        The private host key file.
    pid_file
        Where sshd writes its pid.

    Returns
    -------
    str
        The config text, one ``Keyword value`` per line.
    """
    assert cfg.authorized_keys is not None  # filled in by SshdConfig
    # AuthorizedKeysFile expands %-tokens (%h, %u) at login; HostKey and PidFile do not.
    keys = " ".join(
        quote(str(path)).replace("%", "%%") for path in (cfg.authorized_keys, *cfg.more_keys)
    )
    lines = [
        ("Port", str(cfg.port)),
        ("ListenAddress", cfg.listen),
        ("HostKey", quote(str(check_path(host_key, "host_key")))),
        ("PidFile", quote(str(check_path(pid_file, "pid_file")))),
        ("UsePAM", "no"),
        ("StrictModes", "no"),
        ("PasswordAuthentication", "no"),
        ("KbdInteractiveAuthentication", "no"),
        ("PubkeyAuthentication", "yes"),
        ("AuthorizedKeysFile", keys),
        ("PermitRootLogin", "prohibit-password"),
        # OpenSSH lets a session connect to a Unix socket only where it lets it open TCP
        # connections onward too (AllowTcpForwarding local, no PermitOpen list: seen with 9.2).
        *_forwarding(cfg),
        ("AllowAgentForwarding", "no"),
        ("PermitTunnel", "no"),
        ("X11Forwarding", "no"),
        ("PrintMotd", "no"),
        ("AcceptEnv", "none"),
        ("LogLevel", "VERBOSE"),
        # Many nodes handshake at once when a cluster starts; the default 10:30:100 drops them.
        ("MaxStartups", "64:30:128"),
        ("Subsystem", "sftp internal-sftp"),
    ]
    if cfg.home is not None:
        # SetEnv overrides the HOME that sshd takes from the user database (OpenSSH 7.8+); the
        # sessions' temporary files (MPI's daemons' session directories) go in that home too.
        variables = (f"HOME={cfg.home}", f"TMPDIR={cfg.home / 'tmp'}")
        lines.append(("SetEnv", " ".join(quote(v) for v in variables)))
    return "".join(f"{key} {value}\n" for key, value in lines)


def _forwarding(cfg: SshdConfig) -> list[tuple[str, str]]:
    """The forwarding lines. OpenSSH 9.2 lets a session connect to a Unix socket only under
    ``AllowTcpForwarding local`` and its ``PermitOpen`` list, whose ``[PATH]:*`` entries match
    a socket at exactly PATH and no TCP destination: ``open_sockets`` is that, and nothing
    else; ``socket_forwarding`` any socket (and so onward TCP too)."""
    lines = [
        ("AllowTcpForwarding", "local" if cfg.forwarding or cfg.socket_forwarding else "no"),
        ("AllowStreamLocalForwarding", "local" if cfg.socket_forwarding else "no"),
    ]
    if cfg.open_sockets and not (cfg.forwarding or cfg.socket_forwarding):
        opens = " ".join(f"[{path}]:*" for path in cfg.open_sockets)
        lines = [
            ("AllowTcpForwarding", "local"),
            ("AllowStreamLocalForwarding", "local"),
            ("PermitOpen", opens),
        ]
    return lines


def check_listen(listen: object) -> str:
    import ipaddress  # here: an agent starting its sshd need not (~3 ms)

    if isinstance(listen, str):
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(listen)
            return listen
    try:
        return validate_host(listen)
    except ConfigError as exc:
        raise ConfigError(f"sshd listen address: {exc}") from None


def check_path(path: object, name: str, *, absolute: bool = True) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"sshd {name} must be a path, got {path!r}.")
    path = Path(path).absolute() if absolute else Path(path)
    bad = sorted(set(str(path)) & BAD_PATH_CHARS)
    if bad:
        raise ConfigError(
            f"sshd {name} {str(path)!r} contains {''.join(bad)!r}, which sshd_config cannot "
            "hold; choose a path without quotes, backslashes or control characters."
        )
    return path


def quote(value: str) -> str:
    return f'"{value}"' if any(c in value for c in " #'") else value
