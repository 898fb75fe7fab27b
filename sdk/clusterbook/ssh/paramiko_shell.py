"""The ssh :class:`~clusterbook.ssh.shell.RemoteShell`: one paramiko connection per host,
straight, through jump hosts (``direct-tcpip`` channels of their connections), or through the
host's ``ProxyCommand`` (:mod:`clusterbook.ssh.proxy_command`), made and logged in by
:mod:`clusterbook.ssh.paramiko_transport`; here, the commands run over it, each on a channel
of its own.

With :mod:`clusterbook.ssh.credentials` (the keys) and ``paramiko_transport``, the only
modules that import paramiko. Its errors (and the socket's) are translated here into
:class:`~clusterbook.errors.SSHError` subclasses that name the host and what to do.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import paramiko

from clusterbook.errors import (
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
)
from clusterbook.spec import validate_host
from clusterbook.ssh.bridge import bridge
from clusterbook.ssh.credentials import Credentials
from clusterbook.ssh.hostkeys import HostKey, HostKeyPolicy, host_entry_name
from clusterbook.ssh.paramiko_transport import Tunnels, log_in, reach
from clusterbook.ssh.shell import (
    CommandResult,
    OutputCallback,
    command_line,
    take,
    write_file_argv,
)
from clusterbook.ssh.target import Hop, Target

__all__ = ["ParamikoShell", "Waiter", "connect", "connect_hop", "wait_for_news"]

#: Waits a while for news on a command's channel: data, its end, its exit status, its close.
Waiter = Callable[[paramiko.Channel], None]


def connect(
    host: str,
    *,
    user: str,
    identity: str | Path,
    policy: HostKeyPolicy,
    port: int = 22,
    timeout: float = 10.0,
) -> ParamikoShell:
    """Open a connection to ``host`` with the key in ``identity`` only (no agent, no ssh
    config): for keys clusterbook made itself. See :func:`connect_hop` for the rest."""
    hop = Hop(host, host, port, user, (Path(identity).expanduser(),), identities_only=True)
    credentials = Credentials.gather([hop], explicit=identity, use_agent=False)
    return connect_hop(Target(hop), credentials=credentials, policy=policy, timeout=timeout)


def connect_hop(
    target: Target,
    *,
    credentials: Credentials,
    policy: HostKeyPolicy,
    timeout: float = 10.0,
    tunnels: Tunnels | None = None,
) -> ParamikoShell:
    """Open an authenticated connection to ``target`` (through its jump hosts, with
    ``tunnels``), checking the host key of every hop against ``policy``.

    Raises
    ------
    SSHConnectError, SSHTimeoutError, HostKeyUnknownError, HostKeyChangedError, SSHAuthError
        Each naming the host and what to do.
    """
    node = target.node
    validate_host(node.hostname)
    if target.jumps:
        if tunnels is None:
            raise ValueError("a target behind jump hosts needs the tunnels to reach it")
        sock: socket.socket | paramiko.Channel = tunnels.channel(
            target.jumps, node.hostname, node.port, timeout
        )
        local = tunnels.local_addr(target.jumps)
    else:
        sock, local = reach(node, timeout)
    transport = log_in(node, sock, credentials, policy, timeout)
    return ParamikoShell(node.hostname, node.port, transport, timeout=timeout, local_addr=local)


#: A channel's window and largest packet from the node: gather() streams files on the node's
#: session, and paramiko's work on the head is per packet (sshd takes up to 256 KiB).
_WINDOW = 16 << 20
_MAX_PACKET = 128 << 10


class ParamikoShell:
    """An authenticated ssh connection to one host, reused for every command."""

    def __init__(
        self,
        host: str,
        port: int,
        transport: paramiko.Transport,
        *,
        timeout: float = 10.0,
        local_addr: str = "",
        wait: Waiter | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._transport = transport
        self._timeout = timeout
        # How a command's loops wait for news on its channel (:func:`wait_for_news`).
        self._wait: Waiter = wait or wait_for_news
        #: This machine's address as the host (or its first jump host) sees it.
        self.local_addr = local_addr

    def server_key(self) -> HostKey:
        """The host key the host showed (checked when the connection was made)."""
        key = self._transport.get_remote_server_key()
        return HostKey(key.get_name(), key.get_base64())

    @property
    def active(self) -> bool:
        """Whether the connection is still up."""
        return self._transport.is_active()

    def _open(self) -> paramiko.Channel:
        """A new channel; a connection that cannot open one is closed, so that the next step
        logs in again instead of waiting on it (a node cut off for a while, say)."""
        try:
            return self._transport.open_session(
                window_size=_WINDOW, max_packet_size=_MAX_PACKET, timeout=self._timeout
            )
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._transport.close()
            raise SSHConnectError(
                f"Lost the connection to {self.host}: {exc or type(exc).__name__}.", host=self.host
            ) from exc

    def __repr__(self) -> str:
        state = "open" if self.active else "closed"
        return f"<ParamikoShell {host_entry_name(self.host, self.port)} {state}>"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        check: bool = False,
        on_output: OutputCallback | None = None,
    ) -> CommandResult:
        line = command_line(argv, env)
        deadline = None if timeout is None else time.monotonic() + timeout
        chan = self._open()
        try:
            chan.exec_command(line)
            if input:
                _send_all(chan, input)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    out += chunk
                    if on_output is not None:
                        on_output("stdout", chunk)
                    got = True
                while chan.recv_stderr_ready():
                    chunk = chan.recv_stderr(65536)
                    err += chunk
                    if on_output is not None:
                        on_output("stderr", chunk)
                    got = True
                if (
                    chan.exit_status_ready()
                    and not chan.recv_ready()
                    and not (chan.recv_stderr_ready())
                ):
                    break
                if chan.closed and not got:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise SSHTimeoutError(
                        f"Command {argv[0]!r} on {self.host} ran over its {timeout:g} s; it was "
                        "stopped.",
                        host=self.host,
                    )
                if not got:
                    self._wait(chan)
            code = chan.recv_exit_status()
        except SSHError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHConnectError(
                f"Lost the connection to {self.host} while running {argv[0]!r}: {exc}.",
                host=self.host,
            ) from exc
        finally:
            chan.close()
        result = CommandResult(
            self.host, tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace")
        )
        return result.check() if check else result

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> _Process:
        chan = self._open()
        try:
            chan.exec_command(command_line(argv, env))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHConnectError(
                f"Lost the connection to {self.host}: {exc or type(exc).__name__}.", host=self.host
            ) from exc
        return _Process(self.host, chan, self._wait)

    def open_socket(self, argv: Sequence[str]) -> socket.socket:
        """Start ``argv`` on the host and return a socket whose other end is its standard
        input and output: closing the socket ends its input, and its end (or the
        connection's) ends what the socket reads."""
        chan = self._open()
        try:
            chan.exec_command(command_line(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise SSHConnectError(
                f"Lost the connection to {self.host}: {exc or type(exc).__name__}.", host=self.host
            ) from exc
        return bridge(chan, f"clusterbook-ssh-{self.host}")

    def keep_alive(self, interval: float) -> None:
        """Have the connection end by itself when the host no longer answers: a keepalive
        goes out after ``interval`` s without traffic, and a connection whose data is not
        acknowledged for three times that is dropped by the kernel (where the connection is
        a TCP socket of its own), ending every wait on it."""
        self._transport.set_keepalive(max(1, round(interval)))
        sock = self._transport.sock
        option = getattr(socket, "TCP_USER_TIMEOUT", None)
        if option is not None and isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, round(interval * 3000))

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.run(write_file_argv(path, mode), input=data, check=True, timeout=60)

    def copy(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self.write_file(remote, Path(local).read_bytes(), mode)

    def remove(self, paths: Sequence[str]) -> None:
        if paths:
            self.run(["rm", "-f", "--", *paths], check=True, timeout=60)

    def close(self) -> None:
        self._transport.close()


def _send_all(chan: paramiko.Channel, data: bytes) -> None:
    """``chan.sendall(data)`` without its copy of the rest of ``data`` after every packet
    (quadratic: 26 s for 64 MiB); slices of a memoryview copy nothing."""
    view = memoryview(data)
    while view:
        # (paramiko's stubs say bytes; it takes any buffer, and the slice copies nothing)
        sent = chan.send(view[:_SEND_SLICE])  # type: ignore[arg-type]
        if not sent:  # the other side closed the channel (sendall would spin forever)
            raise OSError("the channel was closed while data was being sent")
        view = view[sent:]


_SEND_SLICE = 1 << 20
#: The longest wait for a channel between looks at it. A channel's file number becomes readable
#: when data, its end or its close comes in, so the loops below wake for those at once; this
#: bounds only the rest (an exit status alone, a deadline), and how often an idle wait wakes.
_WAIT = 0.2


def wait_for_news(chan: paramiko.Channel) -> None:
    """Wait up to ``_WAIT`` s for news on ``chan``: data, its end, its exit status, its close.

    Once the command's output has ended, the channel's file number stays readable for good;
    a select on it would return at once and the caller would spin until the exit status came
    (seconds, for a command that closes its output and goes on). So after the end this waits
    for the exit status (or the close) itself."""
    if chan.eof_received:
        chan.status_event.wait(_WAIT)
    else:
        select.select([chan], [], [], _WAIT)


class _Process:
    """A command running on a channel, read line by line."""

    def __init__(self, host: str, chan: paramiko.Channel, wait: Waiter) -> None:
        self.host = host
        self._chan = chan
        self._wait = wait
        self._buf = bytearray()
        self._err = bytearray()

    def send(self, data: bytes, timeout: float | None = None) -> None:
        self._chan.settimeout(timeout)
        try:
            _send_all(self._chan, data)
        except TimeoutError:
            raise SSHTimeoutError(
                f"{self.host} took nothing of what was sent for {timeout:g} s.", host=self.host
            ) from None
        except (paramiko.SSHException, OSError) as exc:
            raise SSHConnectError(
                f"Lost the connection to {self.host}: {exc}.", host=self.host
            ) from exc
        finally:
            self._chan.settimeout(None)

    def read(self, size: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < size:
            if self._chan.recv_ready():
                # All the channel holds, in one call: each call may wait for the GIL behind
                # paramiko's busy thread, and a partial read makes paramiko move the rest of
                # its buffer down (quadratic with a large window).
                chunk = self._chan.recv(_WINDOW)
                if not chunk:
                    break
                self._buf += chunk
                deadline = time.monotonic() + timeout
                continue
            while self._chan.recv_stderr_ready():
                self._err += self._chan.recv_stderr(65536)
            if (
                self._chan.closed or self._chan.exit_status_ready() or self._chan.eof_received
            ) and not self._chan.recv_ready():
                break  # nothing more can come
            if time.monotonic() > deadline:
                raise SSHTimeoutError(
                    f"No data from {self.host} within {timeout:g} s.", host=self.host
                )
            self._wait(self._chan)
        return take(self._buf, size)

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        scanned = 0  # a long line arrives in many chunks: look for its end in new bytes only
        while (nl := self._buf.find(b"\n", scanned)) < 0:
            scanned = len(self._buf)
            while self._chan.recv_stderr_ready():
                self._err += self._chan.recv_stderr(65536)
            if self._chan.recv_ready():
                chunk = self._chan.recv(1 << 20)
                if not chunk:
                    break
                self._buf += chunk
                continue
            if (
                self._chan.exit_status_ready() or self._chan.eof_received
            ) and not self._chan.recv_ready():
                break
            if time.monotonic() > deadline:
                raise SSHTimeoutError(
                    f"No answer from the bootstrap step on {self.host} within {timeout:g} s.",
                    host=self.host,
                )
            self._wait(self._chan)
        if nl < 0:
            line, self._buf = bytes(self._buf), bytearray()
            return line
        line = bytes(self._buf[: nl + 1])
        del self._buf[: nl + 1]
        return line

    def close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        deadline = time.monotonic() + timeout
        try:
            self._chan.shutdown_write()
            while not self._chan.exit_status_ready() and time.monotonic() < deadline:
                while self._chan.recv_stderr_ready():
                    self._err += self._chan.recv_stderr(65536)
                self._wait(self._chan)
                while self._chan.recv_ready():
                    self._chan.recv(65536)
            while self._chan.recv_stderr_ready():
                self._err += self._chan.recv_stderr(65536)
            code = self._chan.recv_exit_status() if self._chan.exit_status_ready() else None
        except (paramiko.SSHException, OSError, EOFError):
            code = None
        finally:
            self._chan.close()
        return code, self._err.decode(errors="replace")
