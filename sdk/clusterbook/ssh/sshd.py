"""A user-level OpenSSH sshd for nodes that have none.

No root is needed: the daemon gets its own host key, config, pid file and log in one directory
and listens on a high port, the way the Kubeflow MPI base image runs sshd as a plain user and
the way Binder users get SSH at all. It runs in the foreground (``sshd -D``) as our child, so we
own its pid, and it gets SIGTERM when the process that started it dies.

>>> from clusterbook.ssh.sshd import start_sshd
>>> with start_sshd("~/.clusterbook/sshd") as sshd:                  # doctest: +SKIP
...     print(sshd.port, sshd.host_public_key)
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from clusterbook.errors import ClusterError
from clusterbook.spec import validate_seconds
from clusterbook.ssh.sshd_config import (
    SshdConfig,
    check_listen,
    check_path,
    render_sshd_config,
)
from clusterbook.ssh.sshd_daemon import Sshd
from clusterbook.wording import spell

__all__ = [
    "HOST_KEY_NAME",
    "Sshd",
    "SshdConfig",
    "SshdError",
    "render_sshd_config",
    "start_sshd",
    "write_private",
]

HOST_KEY_NAME = "ssh_host_ed25519_key"
_DEFAULT_SSHD = "/usr/sbin/sshd"
_INSTALL_HINT = "install OpenSSH's server with `apt-get install openssh-server`"
_PR_SET_PDEATHSIG = 1


class SshdError(ClusterError):
    """sshd could not be started, or did not answer in time.

    The message names the address, port and directory and ends with the last lines of the
    sshd log (which say why, e.g. "Address already in use"); they are also in ``log_tail``.
    """

    def __init__(self, message: str, *, port: int, directory: Path, log_tail: str = "") -> None:
        super().__init__(message)
        self.port = port
        self.directory = directory
        self.log_tail = log_tail


def start_sshd(
    directory: str | os.PathLike[str],
    port: int = 0,
    listen: str = "127.0.0.1",
    *,
    authorized_keys: str | os.PathLike[str] | None = None,
    sshd_path: str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
    launch: Callable[[list[str]], list[str]] | None = None,
    forwarding: bool = False,
    more_authorized_keys: Sequence[str | os.PathLike[str]] = (),
    host_key: str | os.PathLike[str] | None = None,
    socket_forwarding: bool = False,
    home: str | os.PathLike[str] | None = None,
    open_sockets: Sequence[str | os.PathLike[str]] = (),
) -> Sshd:
    """Start an sshd as the current user and return once it listens (its log says so).

    An ed25519 host key is made in ``directory`` on first use and reused after, so a restarted
    sshd keeps its identity. The sshd gets SIGTERM when the *thread* that started it exits
    (Linux parent-death signal), so start it from a thread that lives as long as it should.

    Parameters
    ----------
    directory
        Directory for the host key, ``sshd_config``, ``sshd.pid`` and ``sshd.log`` (made 0700).
    port
        Port to listen on; 0 picks a free one.
    listen
        Address to listen on.
    authorized_keys
        Public keys allowed to log in; default ``directory/"authorized_keys"`` (made empty,
        0600). A relative path is relative to the home of the user logging in.
    sshd_path
        The sshd binary; default ``sshd`` on PATH or ``/usr/sbin/sshd``.
    timeout
        Seconds to wait for it to listen.
    launch
        Turns sshd's command line into the one to run (in a namespace, say); each program it
        adds must ``exec`` the next, so that the pid we own is sshd's.
    forwarding, socket_forwarding, open_sockets
        Forwarding from this host (:class:`SshdConfig`): onward, to any socket, or to these.
    more_authorized_keys
        More files of public keys allowed to log in (read at each login, where they are).
    host_key
        A private key to show as the host key (its ``.pub`` beside it), such as a job's key
        that clients pin; copied into ``directory`` (0600). Default: one made there once.
    home
        The ``HOME`` of the sessions it starts, instead of the user's own (a throwaway home
        for stand-in machines: what a login writes under ``~`` lands there).

    Returns
    -------
    Sshd
        The running daemon.

    Raises
    ------
    ConfigError
        A bad argument (the message says which and why).
    SshdError
        sshd is missing, exited, or did not listen within ``timeout`` (its last log lines).
    """
    limit = validate_seconds(timeout, "start_sshd timeout")
    assert limit is not None
    check_listen(listen)
    directory = check_path(Path(directory).expanduser(), "directory")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    sshd = _find_sshd(sshd_path, directory, port)
    keys = _authorized_keys(directory, authorized_keys)
    host_key_path, host_public_key = _host_key(directory, host_key, port)
    more = tuple(Path(k).expanduser() for k in more_authorized_keys)
    at_home = None if home is None else Path(home).expanduser()
    settings = functools.partial(SshdConfig, directory, listen=listen, authorized_keys=keys)
    settings = functools.partial(settings, forwarding=forwarding, more_keys=more, home=at_home)
    sockets = tuple(Path(p) for p in open_sockets)
    settings = functools.partial(
        settings, socket_forwarding=socket_forwarding, open_sockets=sockets
    )
    return _launch_on(port, listen, settings, sshd, host_key_path, host_public_key, limit, launch)


def _launch_on(
    port: int,
    listen: str,
    settings: Callable[[int], SshdConfig],
    sshd: str,
    host_key: Path,
    host_public_key: str,
    timeout: float,
    launch: Callable[[list[str]], list[str]] | None,
) -> Sshd:
    """:func:`_launch` on ``port``, or on a free port when it is 0: a port picked here can be
    taken before sshd binds it, and then another is picked (three tries)."""
    attempts = 3 if port == 0 else 1
    for attempt in range(attempts):
        cfg = settings(port or _free_port(listen))
        try:
            return _launch(sshd, cfg, host_key, host_public_key, timeout, launch)
        except SshdError as exc:
            if attempt + 1 == attempts or "Address already in use" not in exc.log_tail:
                raise
    raise AssertionError("unreachable")


def _authorized_keys(directory: Path, given: str | os.PathLike[str] | None) -> Path:
    """The file of the public keys allowed to log in: ``given``, or one of the sshd's own in
    ``directory`` (made empty, 0600, on first use)."""
    if given is not None:
        return Path(given).expanduser()
    keys = directory / "authorized_keys"
    if not keys.exists():
        write_private(keys, "")
    return keys


def _host_key(directory: Path, given: str | os.PathLike[str] | None, port: int) -> tuple[Path, str]:
    """The host key the sshd shows (its path, and its public key's line): ``given``, copied
    into ``directory``, or one made there on first use and kept."""
    if given is not None:
        return _copy_host_key(Path(given), directory, port)
    path = directory / HOST_KEY_NAME
    return path, _ensure_host_key(path, directory, port)


def _launch(
    sshd: str,
    cfg: SshdConfig,
    host_key: Path,
    host_public_key: str,
    timeout: float,
    launch: Callable[[list[str]], list[str]] | None,
) -> Sshd:
    if os.geteuid() == 0:
        # Debian's sshd refuses to start as root without its privilege separation directory.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    config_path = cfg.directory / "sshd_config"
    log_path = cfg.directory / "sshd.log"
    pid_file = cfg.directory / "sshd.pid"
    write_private(config_path, render_sshd_config(cfg, host_key=host_key, pid_file=pid_file))
    argv = [sshd, "-D", "-f", str(config_path), "-E", str(log_path)]
    if launch is not None:
        argv = launch(argv)
    log_start = log_path.stat().st_size if log_path.exists() else 0
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(log_fd, "ab") as log:  # errors of a launch wrapper land in the same log
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # a Ctrl-C in the terminal is not meant for sshd
            preexec_fn=_die_with_parent(),
        )
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise _start_error(cfg, f"exited with code {code} at start", log_path, log_start)
        # Our sshd's own log line: it bound the port (not some other server on it) and
        # listens, its host key loaded; a connection from now on is queued and answered.
        # (Not a test login: OpenSSH runs a fresh sshd for each connection, ~15 ms here.)
        if "Server listening on" in _log_tail(log_path, log_start, lines=1000):
            break
        if time.monotonic() >= deadline:
            proc.kill()
            proc.wait()
            what = f"did not listen within {timeout:g} s"
            raise _start_error(cfg, what, log_path, log_start)
        time.sleep(0.005)  # (an agent's join waits for it: ~5 ms of CPU a second of waiting)
    return Sshd(proc, cfg, host_public_key, config_path, log_path, host_key)


def _start_error(cfg: SshdConfig, what: str, log_path: Path, log_start: int) -> SshdError:
    tail = _log_tail(log_path, log_start)
    return SshdError(
        f"sshd for {cfg.listen}:{cfg.port} (directory {cfg.directory}) {what}; its log "
        f"{log_path} says:\n{tail or '(nothing)'}",
        port=cfg.port,
        directory=cfg.directory,
        log_tail=tail,
    )


def _find_sshd(sshd_path: str | os.PathLike[str] | None, directory: Path, port: int) -> str:
    if sshd_path is None:
        found = shutil.which("sshd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin")
        candidate = Path(found or _DEFAULT_SSHD)
    else:
        candidate = Path(sshd_path).expanduser()
    # sshd re-executes itself for every connection, which needs an absolute path.
    candidate = candidate.absolute()
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        raise SshdError(
            f"No sshd binary at {candidate} (needed for the sshd in {directory}); "
            f"{_INSTALL_HINT}"
            + (f", or pass {given}." if (given := spell("sshd_path", "/path/to/sshd")) else "."),
            port=port,
            directory=directory,
        )
    return str(candidate)


def _ensure_host_key(host_key: Path, directory: Path, port: int) -> str:
    public = host_key.with_name(host_key.name + ".pub")
    if not (host_key.exists() and public.exists()):
        from clusterbook.ssh.keys import write_host_key

        for stale in (host_key, public):  # half a key: made again
            stale.unlink(missing_ok=True)
        try:
            return write_host_key(host_key)
        except OSError as exc:
            raise SshdError(
                f"Cannot write a host key at {host_key} (port {port}): {exc.strerror or exc}.",
                port=port,
                directory=directory,
            ) from exc
    return " ".join(public.read_text().split()[:2])


def _copy_host_key(given: Path, directory: Path, port: int) -> tuple[Path, str]:
    """``given`` (and its ``.pub``) as this sshd's host key, copied 0600 into ``directory``."""
    given = given.expanduser()
    public = given.with_name(given.name + ".pub")
    try:
        private_bytes, public_line = given.read_bytes(), public.read_text()
    except OSError as exc:
        raise SshdError(
            f"Cannot read the host key {exc.filename} for the sshd in {directory} (port "
            f"{port}): {exc.strerror}; give a private key with its public key beside it "
            "(KEY and KEY.pub).",
            port=port,
            directory=directory,
        ) from None
    if len(public_line.split()) < 2:
        raise SshdError(
            f"{public} is not an OpenSSH public key ('TYPE BASE64 [COMMENT]'); give the host "
            "key's public key beside it.",
            port=port,
            directory=directory,
        )
    copy = directory / "ssh_host_key"
    write_private(copy, private_bytes)
    return copy, " ".join(public_line.split()[:2])


def _free_port(listen: str) -> int:
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((listen, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when its parent thread ends."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: nothing to import after it
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _log_tail(log_path: Path, start: int, lines: int = 12) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def write_private(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path``, created 0600 in one step (never readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
