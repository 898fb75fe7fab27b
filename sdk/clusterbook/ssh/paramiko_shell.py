"""The ssh :class:`~clusterbook.ssh.shell.RemoteShell`: one paramiko connection per host,
straight, through jump hosts (``direct-tcpip`` channels of their connections), or through the
host's ``ProxyCommand`` (:mod:`clusterbook.ssh.proxy_command`).

With :mod:`clusterbook.ssh.credentials` (the keys), the only module that imports paramiko.
Its errors (and the socket's) are translated here into
:class:`~clusterbook.errors.SSHError` subclasses that name the host and what to do.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import paramiko
from paramiko.common import OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
from paramiko.packet import Packetizer

from clusterbook.errors import (
    HostNotFoundError,
    SSHAuthError,
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
)
from clusterbook.spec import validate_host
from clusterbook.ssh.credentials import Credentials
from clusterbook.ssh.hostkeys import HostKey, HostKeyPolicy, host_entry_name
from clusterbook.ssh.proxy_command import ProxySocket, route_address, start_proxy
from clusterbook.ssh.shell import (
    CommandResult,
    OutputCallback,
    command_line,
    take,
    write_file_argv,
)
from clusterbook.ssh.target import Hop, Target

__all__ = ["ParamikoShell", "Tunnels", "connect", "connect_hop", "handshake_count"]

_handshakes = 0
_count_lock = threading.Lock()


def handshake_count() -> int:
    """Number of ssh handshakes this process has made (for benchmarks and tests)."""
    return _handshakes


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
        sock, local = _first_hand(node, timeout)
    transport = _log_in(node, sock, credentials, policy, timeout)
    return ParamikoShell(node.hostname, node.port, transport, timeout=timeout, local_addr=local)


def _first_hand(hop: Hop, timeout: float) -> tuple[socket.socket, str]:
    """A socket to ``hop`` (through its ProxyCommand, if it has one), and this machine's
    address as the host sees it (through a proxy command: the one on the route to it)."""
    if hop.proxy_command is None:
        sock = _dial(hop, timeout)
        return sock, str(sock.getsockname()[0])
    try:
        proxy = start_proxy(hop.proxy_command)
    except OSError as exc:
        raise SSHConnectError(
            f"Cannot run the ProxyCommand of {hop.where} from the ssh config "
            f"({hop.proxy_command!r}): {exc.strerror or exc}.",
            host=hop.alias,
        ) from exc
    return proxy, route_address(hop.hostname, hop.port)


def _through(sock: object) -> str:
    """For an error: what the ProxyCommand a connection went through did, if it had one."""
    if not isinstance(sock, ProxySocket):
        return ""
    return f" (through its ProxyCommand {sock.command!r}, which {sock.said()})"


def _dial(hop: Hop, timeout: float) -> socket.socket:
    name = host_entry_name(hop.hostname, hop.port)
    try:
        sock = socket.create_connection((hop.hostname, hop.port), timeout=timeout)
        # ssh sends many small messages; without this each waits ~40 ms for a delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except socket.gaierror:
        raise HostNotFoundError(
            f"Host name {hop.hostname!r} does not resolve; check the name, or use its IP address.",
            host=hop.alias,
        ) from None
    except ConnectionRefusedError:
        raise SSHConnectError(
            f"{name} refused the connection: no sshd listens on port {hop.port}; start sshd "
            "there (clusterbook can start a user-level one) or give the right port.",
            host=hop.alias,
        ) from None
    except TimeoutError:
        raise SSHTimeoutError(
            f"No answer from {name} within {timeout:g} s: the host is down, unreachable or "
            f"firewalled; check that it is up and that port {hop.port} is open.",
            host=hop.alias,
        ) from None
    except OSError as exc:
        raise SSHConnectError(
            f"Cannot reach {name}: {exc.strerror or exc}.", host=hop.alias
        ) from exc
    return sock


def _log_in(
    hop: Hop,
    sock: socket.socket | paramiko.Channel,
    credentials: Credentials,
    policy: HostKeyPolicy,
    timeout: float,
) -> paramiko.Transport:
    """The ssh handshake over ``sock``, the host key checked, then the keys offered in turn."""
    global _handshakes
    name = host_entry_name(hop.hostname, hop.port)
    transport = paramiko.Transport(sock, packetizer_class=_Packetizer)
    # paramiko's thread reads with a 0.1 s timeout, to see between reads whether it was closed
    # or must rekey: ten wake-ups a second per node for as long as the cluster lives. Nothing
    # waits on those looks (close() does not wait for the thread, which ends at its next one;
    # a rekey may begin a second late), so one a second is enough.
    sock.settimeout(_IDLE_WAKE)
    try:
        preferred = policy.preferred_types(hop.hostname, hop.port)
        options = transport.get_security_options()
        if preferred:
            options.key_types = [*preferred, *(t for t in options.key_types if t not in preferred)]
        # AES-GCM first: one pass of C for cipher and MAC, where paramiko's default (CTR, then
        # an HMAC) costs the head about a third more CPU per byte of put() and gather().
        options.ciphers = [*_CIPHERS, *(c for c in options.ciphers if c not in _CIPHERS)]
        with _count_lock:
            _handshakes += 1
        started = time.monotonic()
        try:
            transport.start_client(timeout=timeout)
            server_key = transport.get_remote_server_key()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if time.monotonic() - started >= timeout or isinstance(exc, TimeoutError):
                raise SSHTimeoutError(
                    f"{name} did not complete the ssh handshake within {timeout:g} s"
                    f"{_through(sock)}; its sshd may be hung or overloaded.",
                    host=hop.alias,
                ) from exc
            raise SSHConnectError(
                f"ssh handshake with {name} failed{_through(sock)}: {exc or type(exc).__name__}.",
                host=hop.alias,
            ) from exc
        policy.check(
            hop.hostname, hop.port, HostKey(server_key.get_name(), server_key.get_base64())
        )
        _authenticate(transport, hop, credentials)
    except BaseException:
        transport.close()
        raise
    return transport


class _Packetizer(Packetizer):
    """paramiko's packet layer, with the handshake's timeout kept as a deadline that its reads
    check (they wake at least every ``_IDLE_WAKE`` seconds), where paramiko's starts a timer
    thread for it on every connection: one thread start and end per host, for a flag."""

    _handshake_deadline: float | None = None
    _handshake_done = False

    def start_handshake(self, timeout: float) -> None:
        if self._handshake_deadline is None:
            self._handshake_deadline = time.monotonic() + float(timeout)

    def handshake_timed_out(self) -> bool:
        deadline = self._handshake_deadline
        return deadline is not None and not self._handshake_done and time.monotonic() >= deadline

    def complete_handshake(self) -> None:
        if self._handshake_deadline is not None:
            self._handshake_done = True


_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_IDLE_WAKE = 1.0
#: A channel's window and largest packet from the node: gather() streams files on the node's
#: session, and paramiko's work on the head is per packet (sshd takes up to 256 KiB).
_WINDOW = 16 << 20
_MAX_PACKET = 128 << 10


def _authenticate(transport: paramiko.Transport, hop: Hop, credentials: Credentials) -> None:
    name = host_entry_name(hop.hostname, hop.port)
    tried: list[str] = []
    for label, key in credentials.for_hop(hop):
        agent = label.startswith("ssh-agent")
        try:
            if agent:  # the agent's one connection signs for every thread, one at a time
                with credentials.agent_lock:
                    transport.auth_publickey(hop.user, key)
            else:
                transport.auth_publickey(hop.user, key)
            return
        except paramiko.AuthenticationException:
            tried.append(label)
        except (paramiko.SSHException, OSError) as exc:
            raise SSHConnectError(
                f"Authentication with {name} failed: {exc}.", host=hop.alias
            ) from exc
        if not transport.is_active():
            break  # the server hung up (too many tries): what is left cannot be offered
    raise SSHAuthError(credentials.refusal(hop, tried), host=hop.alias)


class Tunnels:
    """Connections to jump hosts, each opened once and shared by every host behind it;
    :meth:`close` ends them (after the connections through them)."""

    def __init__(self, credentials: Credentials, policy: HostKeyPolicy) -> None:
        self._credentials = credentials
        self._policy = policy
        self._open: dict[tuple[Hop, ...], tuple[paramiko.Transport, str]] = {}
        self._lock = threading.Lock()

    def channel(
        self, jumps: tuple[Hop, ...], host: str, port: int, timeout: float
    ) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from the last of ``jumps`` to ``host:port``."""
        transport = self._transport(jumps, timeout)
        try:
            return transport.open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            if exc.code == OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
                raise SSHError(
                    f"{jumps[-1].where} does not let its users connect onward (its sshd has "
                    "AllowTcpForwarding no); allow it there, or reach "
                    f"{host_entry_name(host, port)} through another jump host.",
                    host=host,
                ) from None
            raise SSHConnectError(
                f"{jumps[-1].where} could not reach {host_entry_name(host, port)} "
                f"({exc.text or exc}): check that the host is up and that the jump host may "
                "connect to it.",
                host=host,
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHConnectError(
                f"Lost the connection to jump host {jumps[-1].where}: {exc}.", host=host
            ) from exc

    def local_addr(self, jumps: tuple[Hop, ...]) -> str:
        """This machine's address as the first jump host sees it."""
        with self._lock:
            return self._open[jumps[:1]][1]

    def _transport(self, jumps: tuple[Hop, ...], timeout: float) -> paramiko.Transport:
        with self._lock:
            held = self._open.get(jumps)
            if held is not None and held[0].is_active():
                return held[0]
        if len(jumps) > 1:
            sock: socket.socket | paramiko.Channel = self.channel(
                jumps[:-1], jumps[-1].hostname, jumps[-1].port, timeout
            )
            local = self.local_addr(jumps[:-1])
        else:
            sock, local = _first_hand(jumps[0], timeout)
        transport = _log_in(jumps[-1], sock, self._credentials, self._policy, timeout)
        with self._lock:
            held = self._open.get(jumps)
            if held is not None and held[0].is_active():  # another thread was quicker
                transport.close()
                return held[0]
            self._open[jumps] = (transport, local)
        return transport

    def close(self) -> None:
        with self._lock:
            held, self._open = self._open, {}
        for jumps in sorted(held, key=len, reverse=True):  # the innermost first
            held[jumps][0].close()


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
    ) -> None:
        self.host = host
        self.port = port
        self._transport = transport
        self._timeout = timeout
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
                    _wait(chan)
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
        return _Process(self.host, chan)

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


def _wait(chan: paramiko.Channel) -> None:
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

    def __init__(self, host: str, chan: paramiko.Channel) -> None:
        self.host = host
        self._chan = chan
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
            _wait(self._chan)
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
            _wait(self._chan)
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
                _wait(self._chan)
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
