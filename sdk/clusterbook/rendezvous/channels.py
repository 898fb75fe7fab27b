"""Channels that the nodes' agents dial to the head, through which the head starts MPI's
daemons on a node without logging in to it: :class:`ChannelServer` (the head's) and
:class:`~clusterbook.rendezvous.dialler.Dialler` (an agent's).

An agent whose join URL names a channel port (``channel=PORT``, see
:func:`~clusterbook.rendezvous.registry.join_url`) keeps one connection to the head's channel
server open and idle. It is TLS to the store's certificate (pinned by the fingerprint in the
URL), and its first line shows the node and the cluster's secret (``{"node": ID, "secret":
HEX}``, answered ``{"ok": true}``): only the head can send launches to an agent, and only an
agent of the cluster receives them, as with the store itself. A launch for the node takes its
idle connection, which the agent serves as its daemon socket serves one
(:meth:`~clusterbook.launch.daemon_server.DaemonServer.serve`: a request line, then the daemon's
output and exit status in frames); the agent then dials the next.

On the head, the launcher's helper (:func:`clusterbook.launch.daemons.main`) asks the server's
Unix socket (:data:`~clusterbook.launch.daemons.CHANNELS`, in the masters' private directory)
``{"host": H, "command": ..., "token": ...}``. The server takes an idle connection of the node
that ``H`` is (:meth:`ChannelServer.route` says which) and relays the request and all that
follows. A host without a channel is answered ``{"error": ...}``, and the helper goes on as it
would without channels: the socket the node's master forwards, else ssh. So a node's first job
starts its daemons as soon as the node has joined, with no ssh session and no login shell.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Mapping

from clusterbook.launch.daemons import read_line
from clusterbook.rendezvous.backends._tls import Certificate, server_context
from clusterbook.rendezvous.backends.tcp_gate import Limits, wait_for_room
from clusterbook.rendezvous.backends.wire import shutdown

__all__ = ["HELLO_WITHIN", "TAKE_WITHIN", "ChannelServer", "message"]

_log = logging.getLogger("clusterbook.rendezvous")

#: Seconds a connection has to shake hands and show who it is (both sides).
HELLO_WITHIN = 5.0
#: Seconds a launch waits for a node's next connection: its agent dials one after each launch
#: (a few milliseconds), so that two daemons in a row on one node both find one.
TAKE_WITHIN = 2.0
_IDLE_MAX = 4  # idle connections kept per node (an agent keeps one; more come after blips)
#: Connections showing who they are at once (``pending``). Past them, newcomers wait in the
#: listen backlog until the oldest has had ``patience`` seconds, then push it out, as the
#: store's gate decides (:func:`~clusterbook.rendezvous.backends.tcp_gate.wait_for_room`):
#: whoever can reach the port cannot keep agents out by holding connections that say nothing,
#: and a burst of agents does not push itself out.
_HELLOS = Limits(handshake=HELLO_WITHIN, pending=32, patience=0.5)


def message(fields: Mapping[str, object]) -> bytes:
    """One line of JSON, as both ends write them."""
    return json.dumps(fields).encode() + b"\n"


def _idle_and_open(conn: ssl.SSLSocket) -> bool:
    """Whether an idle connection is still open: the peer says nothing on one until it is used,
    so anything to read (its end, an alert) means it is gone."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable and not conn.pending()


def _pump(launcher: socket.socket, agent: ssl.SSLSocket) -> None:
    """Relay bytes both ways until either side ends (one thread: no TLS call runs alongside
    another on the same connection)."""
    with selectors.DefaultSelector() as sel:
        sel.register(launcher, selectors.EVENT_READ, agent)
        sel.register(agent, selectors.EVENT_READ, launcher)
        while True:
            for key, _ in sel.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                data = source.recv(65536)
                while data and isinstance(source, ssl.SSLSocket) and source.pending():
                    data += source.recv(source.pending())
                if not data:
                    return
                key.data.sendall(data)


class _Hello:
    """A connection showing who it is: its socket (the accepted one, then its TLS one) and
    since when (``time.monotonic()``)."""

    __slots__ = ("since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.since = sock, time.monotonic()


class ChannelServer:
    """The head's end of the agents' channels (see the module): it listens on ``listen``
    (port 0: any free one; :attr:`port` once started) with ``certificate`` (the store's) and
    lets in connections that show ``secret``."""

    def __init__(
        self, listen: str, certificate: Certificate, secret: bytes, *, port: int = 0
    ) -> None:
        self._listen, self.port = listen, port
        self._context = server_context(certificate)
        self._secret = secret.hex()
        self._cond = threading.Condition()
        self._idle: dict[str, list[ssl.SSLSocket]] = {}
        self._ever: set[str] = set()  # nodes that dialled (a launch waits for their next one)
        self._routes: dict[str, str] = {}  # host (as the launcher names it) -> node
        self._busy: set[socket.socket] = set()  # relays under way: closed at close()
        self._hellos: dict[_Hello, None] = {}  # not let in yet, the oldest first
        self._listeners: list[socket.socket] = []
        self._unix_path: str | None = None
        self._closed = False

    def start(self) -> int:  # the port
        family, kind, proto, _, address = socket.getaddrinfo(
            self._listen, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._serve(sock, self._welcome, "clusterbook-channels", gated=True)
        return self.port

    def listen_at(self, path: str | os.PathLike[str]) -> None:
        """Serve the launcher's helper on the Unix socket ``path`` (made private); again with
        the same path does nothing."""
        path = os.fspath(path)
        with self._cond:
            if self._closed or self._unix_path == path:
                return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # private from the moment it exists
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(128)
        with self._cond:
            self._unix_path = path
        self._serve(sock, self._launch, "clusterbook-launches")

    def route(self, hosts: Mapping[str, str]) -> None:
        """Which node each host is, as the launcher names it (an address): the far nodes of
        the round; launches to other hosts are answered that they have no channel."""
        with self._cond:
            self._routes = dict(hosts)

    def has(self, node: str) -> bool:
        """Whether ``node``'s agent holds a channel now (an idle connection that is open)."""
        return not self.without([node], 0.0)

    def without(self, nodes: Collection[str], within: float) -> set[str]:
        """Of ``nodes``, those whose agent holds no channel, waiting ``within`` seconds at most
        for them (an agent dials again a moment after each launch)."""
        deadline = time.monotonic() + within
        with self._cond:
            while True:
                missing = {n for n in nodes if not self._open(n)}
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self._closed:
                    return missing
                self._cond.wait(left)

    def ask(self, node: str, request: Mapping[str, object]) -> dict[str, object]:
        """``node``'s agent's one-line answer to the question ``request`` (``{"free_port":
        true}``, say), over one of its idle connections, which stays (the agent answers on
        it and waits on); OSError where it holds none or does not answer within
        :data:`HELLO_WITHIN`, ValueError where it answers an error."""
        agent = self._take(node)
        if agent is None:
            raise OSError(f"{node} has no channel to the head")
        kept = False
        try:
            agent.settimeout(HELLO_WITHIN)
            agent.sendall(message(request))
            line, rest = read_line(agent)
            agent.settimeout(None)
            with self._cond:
                if not (self._closed or rest):
                    self._idle.setdefault(node, []).append(agent)
                    kept = True
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._busy.discard(agent)
            if not kept:
                agent.close()
        answer = json.loads(line)
        if not isinstance(answer, dict) or "error" in answer:
            raise ValueError(f"{node}'s agent answered {line[:200]!r}")
        return answer

    def free_port(self, node: str) -> int:
        """A TCP port free on ``node`` now, as its agent says (:meth:`ask`, which says what
        it raises; ValueError for an answer without a port)."""
        port = self.ask(node, {"free_port": True}).get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"{node}'s agent named no port: {port!r}")
        return port

    def _open(self, node: str) -> bool:
        idle = self._idle.get(node, [])
        for conn in [c for c in idle if not _idle_and_open(c)]:
            idle.remove(conn)
            conn.close()
        return bool(idle)

    def close(self) -> None:
        """Stop listening, close every connection; safe to call again."""
        with self._cond:
            self._closed = True
            listeners, self._listeners = self._listeners, []
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle, busy, self._busy = {}, self._busy, set()
            path, self._unix_path = self._unix_path, None
            hellos, self._hellos = list(self._hellos), {}
            self._cond.notify_all()
        # A relay's connections are its thread's to close: one closed under its wait would
        # leave the wait (an epoll) without the end it was woken for.
        theirs = {*busy, *(h.sock for h in hellos)}  # (threads read them, and close them)
        for sock in [*listeners, *conns, *theirs]:
            with contextlib.suppress(OSError):
                shutdown(sock, socket.SHUT_RDWR)
            if sock not in theirs:
                sock.close()
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- serving ----------------------------------------------------------------------------

    def _serve(
        self, sock: socket.socket, handle: Callable[..., None], name: str, *, gated: bool = False
    ) -> None:
        """Accept on ``sock`` (on a thread called ``name``), each connection handled on a
        thread of its own; ``gated``: by :meth:`_welcome`, as :meth:`_room` lets them in."""
        with self._cond:
            if self._closed:
                sock.close()
                return
            self._listeners.append(sock)
        args = (sock, handle, gated)
        threading.Thread(target=self._accept, args=args, name=name, daemon=True).start()

    def _accept(self, sock: socket.socket, handle: Callable[..., None], gated: bool) -> None:
        pause = 0.05
        while True:
            if gated and not self._room():
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._closed or sock.fileno() < 0:
                    return
                time.sleep(pause)  # out of descriptors, say: a little longer each time
                pause = min(1.0, pause * 2)
                continue
            pause = 0.05
            if gated:
                hello = _Hello(conn)
                with self._cond:
                    self._hellos[hello] = None
                threading.Thread(target=handle, args=(hello,), daemon=True).start()
            else:
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

    def _room(self) -> bool:
        """Wait until one more connection may show who it is (pushing out the oldest once it
        had its patience, :data:`_HELLOS`); False once closed."""
        with self._cond:
            while len(self._hellos) >= _HELLOS.pending and not self._closed:
                oldest = next(iter(self._hellos))
                now = time.monotonic()
                until = wait_for_room(len(self._hellos), oldest.since, _HELLOS, now)
                if until is not None:
                    self._cond.wait(until - now)
                    continue
                del self._hellos[oldest]  # its thread finds it out and closes it
                with contextlib.suppress(OSError):
                    shutdown(oldest.sock, socket.SHUT_RDWR)
            return not self._closed

    def _welcome(self, hello: _Hello) -> None:
        """An agent dialled: let it in if it shows the secret; keep its connection idle."""
        raw = hello.sock
        try:
            raw.settimeout(HELLO_WITHIN)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            try:
                with self._cond:
                    hello.sock = conn  # what a newcomer pushing it out shuts down
                conn.do_handshake()
                line, rest = read_line(conn)
                hello_line = json.loads(line)
                node, shown = hello_line.get("node"), hello_line.get("secret")
                if not (isinstance(node, str) and node and isinstance(shown, str)) or rest:
                    raise ValueError("not a channel's hello")
                if not hmac.compare_digest(shown.encode(), self._secret.encode()):
                    raise ValueError("a wrong secret")
                with self._cond:  # kept, then told: what the agent's "ok" reaches finds it
                    if self._closed:
                        raise ValueError("the server closed")
                    if self._hellos.pop(hello, False) is False:
                        raise ValueError("pushed out by newer connections")
                    idle = self._idle.setdefault(node, [])
                    idle.append(conn)
                    try:
                        conn.sendall(message({"ok": True}))
                    except OSError:
                        idle.remove(conn)
                        raise
                    conn.settimeout(None)
                    self._ever.add(node)
                    while len(idle) > _IDLE_MAX:
                        idle.pop(0).close()
                    self._cond.notify_all()
            except BaseException:
                conn.close()
                raise
        except (OSError, ValueError, AttributeError) as exc:
            _log.debug("A channel connection was refused: %s", exc)
            raw.close()
        finally:
            with self._cond:
                if self._hellos.pop(hello, False) is None:  # a place came free
                    self._cond.notify_all()

    def _take(self, node: str) -> ssl.SSLSocket | None:
        """An open idle connection of ``node``'s, waiting :data:`TAKE_WITHIN` seconds at most
        for one where its agent dialled before; None where there is none."""
        deadline = time.monotonic() + (TAKE_WITHIN if node in self._ever else 0.0)
        with self._cond:
            while not self._open(node):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)
            conn = self._idle[node].pop()
            self._busy.add(conn)
            return conn

    def _launch(self, conn: socket.socket) -> None:
        """The launcher's helper asks for a daemon on a host: relay it to the node's agent."""
        with conn:
            try:
                conn.settimeout(HELLO_WITHIN)
                line, rest = read_line(conn)
                request = json.loads(line)
                host = request.pop("host")
                with self._cond:
                    node = self._routes.get(host)
                agent = None if node is None else self._take(node)
                if agent is None:
                    raise LookupError(f"{host} has no channel to the head")
                conn.settimeout(None)
            except (OSError, ValueError, LookupError, AttributeError, KeyError, TypeError) as exc:
                with contextlib.suppress(OSError):
                    conn.sendall(message({"error": str(exc)}))
                return
            try:
                with agent:
                    agent.sendall(message(request) + rest)
                    _pump(conn, agent)
            except OSError as exc:
                _log.debug("A launch through %s's channel ended: %s", node, exc)
            finally:
                with self._cond:
                    self._busy.discard(agent)
