"""A logged-in paramiko transport to a host: the TCP connection (or the host's
``ProxyCommand``, or a ``direct-tcpip`` channel of a jump host's connection: :class:`Tunnels`),
the ssh handshake with its deadline, the host key checked against a policy, then the keys
offered in turn. :mod:`clusterbook.ssh.paramiko_shell` runs commands over it.

With :mod:`clusterbook.ssh.credentials` and :mod:`clusterbook.ssh.paramiko_shell`, the only
modules that import paramiko. Its errors (and the socket's) are translated here into
:class:`~clusterbook.errors.SSHError` subclasses that name the host and what to do.
"""

from __future__ import annotations

import socket
import threading
import time

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
from clusterbook.ssh.credentials import Credentials
from clusterbook.ssh.hostkeys import HostKey, HostKeyPolicy, host_entry_name
from clusterbook.ssh.proxy_command import ProxySocket, route_address, start_proxy
from clusterbook.ssh.target import Hop

__all__ = ["Tunnels", "handshake_count", "log_in", "reach"]


_handshakes = 0
_count_lock = threading.Lock()


def handshake_count() -> int:
    """Number of ssh handshakes this process has made (for benchmarks and tests)."""
    return _handshakes


def reach(hop: Hop, timeout: float) -> tuple[socket.socket, str]:
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


def log_in(
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
            sock, local = reach(jumps[0], timeout)
        transport = log_in(jumps[-1], sock, self._credentials, self._policy, timeout)
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
