"""A cluster's directory on another machine, reached over ssh: :class:`SSHDir`.

``Cluster.attach("ssh://me@login1/ID")`` logs in to ``login1`` as ``Cluster.ssh`` does
(:class:`~clusterbook.ssh.login.Login`: the ssh config, the agent's keys or key files, known_hosts)
and runs the clusterbook of ``me`` there (:mod:`clusterbook.cluster.remote.dirservice`):
``clusterbook`` on the PATH of its ssh sessions (else ``python3 -m clusterbook``), or ``PYTHON -m
clusterbook`` with ``python=``. Over that one connection:

- the record and the jobs' files are read by a ``clusterbook serve-dir dir`` there, which
  checks the directory as a handle on that machine would and reads nothing outside it;
- each connection to the head's control socket goes through a ``clusterbook serve-dir relay``
  there: the handle and the head prove the secret to each other through it, end to end. The
  secret is read from the token file there when it is needed, and kept in this process's
  memory only.

No port is opened anywhere. Every request has a deadline, and the connection sends keepalives:
one that drops (or stops answering) is a :class:`~clusterbook.errors.ClusterStateError` that
says so, and the next request connects again. :meth:`SSHDir.close` ends the connection, and
with it whatever ran there for it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterbook.cluster.remote.address import SSHAddress, parse_host, parse_ssh_address
from clusterbook.cluster.remote.dirwire import VERSION, pack, unpack
from clusterbook.cluster.remote.sshfiles import RemoteFiles
from clusterbook.durations import Duration
from clusterbook.errors import ClusterError, ClusterStateError, ConfigError, RecordError, SSHError
from clusterbook.functions.place import CallPlace
from clusterbook.head.catalog import Found
from clusterbook.head.control import SOCKET_FILE, ControlClient, rebuilt_error
from clusterbook.head.record import ClusterRecord
from clusterbook.launch.files import Files
from clusterbook.rendezvous.backends.wire import FRAME_HEADER, MAX_FRAME, ProtocolError
from clusterbook.spec import validate_seconds
from clusterbook.ssh.login import Login
from clusterbook.ssh.paramiko_shell import ParamikoShell
from clusterbook.ssh.shell import RemoteProcess
from clusterbook.wording import spell_or

__all__ = ["SSHDir", "remote_clusters"]

_WAIT = 30.0  # seconds an answer of the machine may take (a stop: its timeout more)
_KEEPALIVE = 5.0  # a connection that stops answering is dropped after three times that
_LINE = 4096  # bytes of the relay's first line
# The user's clusterbook there: the command on its PATH, else its python3's.
_FIND = (
    'command -v clusterbook >/dev/null 2>&1 && exec clusterbook "$@"; '
    'exec python3 -m clusterbook "$@"'
)


class _Ended(Exception):
    """The program there ended (or its connection did) before it answered."""


@dataclass
class _Link:
    shell: ParamikoShell
    service: RemoteProcess


class SSHDir:
    """A cluster's directory on the machine ``login`` reaches (see the module's docstring);
    made by :meth:`open`."""

    def __init__(self, login: Login, python: str | None, path: Path, host: str) -> None:
        self._login = login
        self._python = python
        self._path = path
        self._host = host
        self._lock = threading.RLock()  # one request at a time on the one service
        self._link: _Link | None = None
        self._closed = False
        self.files: Files = RemoteFiles(self)

    @classmethod
    def open(
        cls,
        text: str,
        *,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        python: str | None = None,
        connect_timeout: Duration = 10.0,
    ) -> tuple[Found, SSHDir]:
        """Connect to the machine address ``text`` names and find its cluster there."""
        address = parse_ssh_address(text)
        login = _login(address, identity, known_hosts, ssh_config, connect_timeout)
        there = cls(login, python, Path(address.what), address.host)
        try:
            first = there._connect(address.what)
            record = _record(first)
        except BaseException:
            there.close()
            raise
        there._path, there._host = Path(str(first["directory"])), str(first["host"])
        return Found(there._path, record, stale=bool(first.get("stale"))), there

    # -- ClusterDir ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def where(self) -> str:
        return self._login.where

    def read(self) -> tuple[ClusterRecord, bool]:
        message, _ = self.ask("record")
        return _record(message), bool(message.get("stale"))

    def machine(self) -> str:
        return self._host

    def control(self) -> ControlClient:
        message, _ = self.ask("secret")
        return _Control(self, bytes.fromhex(str(message["secret"])))

    @property
    def connected(self) -> bool:
        """Whether the ssh connection is up (a dropped one is made again when needed)."""
        link = self._link
        return link is not None and link.shell.active

    def touch_stop(self) -> None:
        self.ask("stop_file")

    def stop_there(self, timeout: float, reason: str, force: bool = False) -> bool:
        self.ask("stop", wait=timeout + _WAIT, timeout=timeout, reason=reason, force=force)
        return True

    def call_place(self) -> CallPlace:
        from clusterbook.cluster.remote.sshcalls import SSHCalls

        return SSHCalls(self, self.files)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
        self._login.close()

    # -- requests -----------------------------------------------------------------------------

    def ask(
        self, op: str, *, wait: float = _WAIT, data: bytes = b"", **args: Any
    ) -> tuple[dict[str, Any], bytes]:
        """Send request ``op`` (with ``data``) to the service there; its answer and bytes, or
        the error it answered with; :class:`ClusterStateError` when the connection is lost."""
        with self._lock:
            link = self._linked()
            try:
                link.service.send(pack({"op": op, **args}, data), wait)
                message, data = _receive(link.service, wait)
            except (SSHError, _Ended, ProtocolError) as exc:
                why = _why(exc, link)
                self._drop()
                raise ClusterStateError(
                    f"Lost the ssh connection to {self.where} ({why}); the next call connects "
                    "again."
                ) from exc
        if "error" in message:
            raise self._rebuilt(message["error"])
        return message, data

    def _linked(self) -> _Link:
        if self._closed:
            raise ClusterStateError(
                f"This handle on {self.where}:{self._path} was closed; attach to it again."
            )
        if self._link is None or not self._link.shell.active:
            self._drop()
            self._connect(str(self._path))
        assert self._link is not None
        return self._link

    def _connect(self, what: str) -> dict[str, Any]:
        """Log in, start the service there for cluster ``what``; its first message."""
        shell = self._login.connect()
        try:
            shell.keep_alive(_KEEPALIVE)
            service = shell.start(self._command("dir", what))
            try:
                first, _ = _receive(service, _WAIT)
            except _Ended:
                code, said = service.close(2.0)
                raise self._not_run(code, said) from None
            if "error" in first:
                service.close(2.0)
                raise self._rebuilt(first["error"])
            _check_version(first, self.where)
        except BaseException:
            shell.close()
            raise
        self._link = _Link(shell, service)
        return first

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.shell.close()  # ends the service and the relays: their input ends there

    def _dial(self, deadline: float) -> socket.socket:
        """A connection to the head's control socket, through a relay there."""
        with self._lock:
            shell = self._linked().shell
        try:
            sock = shell.open_socket(self._command("relay", str(self._path)))
        except SSHError as exc:
            raise ClusterStateError(f"Lost the ssh connection to {self.where} ({exc}).") from exc
        try:
            line = _first_line(sock, deadline)
        except BaseException:
            sock.close()
            raise
        if line != "ok":
            sock.close()
            said = line.removeprefix("error: ") or "it ended before it answered"
            raise ClusterStateError(f"On {self.where}: {said}")
        sock.settimeout(None)
        return sock

    def _command(self, *args: str) -> list[str]:
        if self._python:
            return [self._python, "-m", "clusterbook", "serve-dir", *args]
        return ["sh", "-c", _FIND, "clusterbook", "serve-dir", *args]

    def _rebuilt(self, error: Any) -> ClusterError:
        exc = rebuilt_error(error if isinstance(error, dict) else {})
        Exception.__init__(exc, f"On {self.where}: {exc}")
        return exc

    def _not_run(self, code: int | None, said: str) -> ConfigError:
        tail = " / ".join(said.strip().splitlines()[-3:]) or f"exit code {code}"
        how = (
            f"{self._python} -m clusterbook"
            if self._python
            else "clusterbook (or python3 -m clusterbook)"
        )
        python = spell_or("python", "/path/to/bin/python", "the path of its Python")
        return ConfigError(
            f"Cannot run {how} on {self.where} ({tail}); install clusterbook there (the "
            f"version of this machine's), or give {python}: the interpreter that has it there."
        )


class _Control(ControlClient):
    """A control client that reaches the head through a relay on its machine: a request that
    fails because the ssh connection dropped says so."""

    def __init__(self, there: SSHDir, secret: bytes) -> None:
        super().__init__(there._dial, secret, where=f"{there.where}:{there.path / SOCKET_FILE}")
        self._there = there

    def call(self, op: str, *, reply_within: float | None = None, **args: Any) -> dict[str, Any]:
        try:
            return super().call(op, reply_within=reply_within, **args)
        except ClusterStateError as exc:
            if self._there.connected:
                raise
            raise ClusterStateError(
                f"Lost the ssh connection to {self._there.where} while the cluster's head was "
                f"asked to {op} (it may have done it); the next call connects again."
            ) from exc


def remote_clusters(
    host: str,
    *,
    identity: str | os.PathLike[str] | None = None,
    known_hosts: str | os.PathLike[str] | None = None,
    ssh_config: str | os.PathLike[str] | None = None,
    python: str | None = None,
    connect_timeout: Duration = 10.0,
) -> list[Found]:
    """The clusters of the user ``host`` (``[user@]host[:port]``) logs in as, as
    :func:`~clusterbook.head.catalog.scan` finds them there: running ones first."""
    address = parse_host(host)
    login = _login(address, identity, known_hosts, ssh_config, connect_timeout)
    there = SSHDir(login, python, Path("."), address.host)
    try:
        shell = login.connect()
        try:
            service = shell.start(there._command("list"))
            try:
                message, _ = _receive(service, _WAIT)
            except _Ended:
                code, said = service.close(2.0)
                raise there._not_run(code, said) from None
            service.close(2.0)
        finally:
            shell.close()
    finally:
        login.close()
    _check_version(message, login.where)
    out = []
    for entry in message.get("clusters", []):
        path = Path(str(entry["path"]))
        error = RecordError(str(entry["error"]), path=path) if entry.get("error") else None
        record = None if entry.get("record") is None else _record(entry)
        out.append(Found(path, record, error, stale=bool(entry.get("stale"))))
    return out


def _login(
    address: SSHAddress,
    identity: str | os.PathLike[str] | None,
    known_hosts: str | os.PathLike[str] | None,
    ssh_config: str | os.PathLike[str] | None,
    timeout: object,
) -> Login:
    return Login(
        address.host,
        user=address.user,
        port=address.port,
        identity=identity,
        known_hosts=known_hosts,
        ssh_config=ssh_config,
        timeout=validate_seconds(timeout, "connect_timeout") or 10.0,
    )


def _record(message: dict[str, Any]) -> ClusterRecord:
    data = message.get("record")
    try:
        if not isinstance(data, dict):
            raise ValueError("no record")
        return ClusterRecord.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"The machine sent no cluster record ({exc}).", path="-") from None


def _check_version(message: dict[str, Any], where: str) -> None:
    if message.get("version") != VERSION:
        raise ConfigError(
            f"The clusterbook on {where} answers version {message.get('version')!r} of the "
            f"attach protocol, this one {VERSION}; install the same clusterbook version on "
            "both machines."
        )


def _receive(service: RemoteProcess, wait: float) -> tuple[dict[str, Any], bytes]:
    header = service.read(FRAME_HEADER.size, wait)
    if len(header) < FRAME_HEADER.size:
        raise _Ended("it ended")
    (size,) = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"an answer of {size} bytes (limit {MAX_FRAME})")
    payload = service.read(size, wait)
    if len(payload) < size:
        raise _Ended("it ended in the middle of an answer")
    return unpack(payload)


def _why(exc: BaseException, link: _Link) -> str:
    """What ended a request: the connection, or the program there (its exit and last words)."""
    if isinstance(exc, _Ended) and link.shell.active:
        code, said = link.service.close(1.0)
        if code is not None:
            tail = " / ".join(said.strip().splitlines()[-2:])
            return f"clusterbook there ended with exit code {code}" + (f": {tail}" if tail else "")
    if isinstance(exc, _Ended) or not link.shell.active:
        return "the connection closed, or stopped answering"
    return str(exc) or type(exc).__name__


def _first_line(sock: socket.socket, deadline: float) -> str:
    """The relay's first line (without its newline); "" when it ended without one."""
    line = b""
    while not line.endswith(b"\n") and len(line) < _LINE:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        got = sock.recv(1)
        if not got:
            return ""
        line += got
    return line.decode(errors="replace").strip()
