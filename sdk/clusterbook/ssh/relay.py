"""How the MPI launcher's ssh reaches nodes behind jump hosts: over the head's own connections.

The launcher's ssh is given ``ProxyCommand python -S _relay.py SOCKET %h %p``; that asks this
relay (a Unix socket in a private directory only the head's user can enter) for a tunnel to a
node of the cluster, and the relay opens one as a ``direct-tcpip`` channel of the head's
connection to the node's last jump host. The jump hosts' keys were checked when the head
connected to them; the node's own key is checked by ssh against the cluster's known_hosts. No
key is installed on a jump host, and nothing is left there.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from clusterbook.errors import SSHError
from clusterbook.ssh.bridge import pump
from clusterbook.ssh.paramiko_transport import Tunnels
from clusterbook.ssh.target import Hop

__all__ = ["RELAY_SCRIPT", "Relay"]

RELAY_SCRIPT = str(Path(__file__).with_name("_relay.py"))
_log = logging.getLogger("clusterbook")
_ASK_LIMIT = 512  # bytes of a request line: "HOST PORT"


class Relay:
    """Serves tunnels to ``routes`` ((address, port) -> the jump hosts on the way) only."""

    def __init__(self, routes: Mapping[tuple[str, int], tuple[Hop, ...]], tunnels: Tunnels) -> None:
        self._routes = dict(routes)
        self._tunnels = tunnels
        self._directory = Path(tempfile.mkdtemp(prefix="cb-relay-"))  # 0700
        self.path = self._directory / "sock"
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(64)
        self._closed = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, name="clusterbook-relay", daemon=True).start()

    def proxy_command(self) -> str:
        """The ``ProxyCommand`` for ssh (``%h``, ``%p``: the host and port it connects to)."""
        script = shlex.join([sys.executable, "-S", RELAY_SCRIPT, str(self.path)])
        return f"{script} %h %p"

    def close(self) -> None:
        """Stop serving, end the tunnels open now, remove the socket."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        shutil.rmtree(self._directory, ignore_errors=True)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(
                target=self._tunnel, args=(conn,), name="clusterbook-relay-tunnel", daemon=True
            ).start()

    def _tunnel(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            route = self._ask(conn)
            if route is None:
                return
            jumps, host, port = route
            try:
                channel = self._tunnels.channel(jumps, host, port, 10.0)
            except SSHError as exc:
                conn.sendall(f"error: {exc}\n".encode())
                return
            conn.settimeout(None)
            conn.sendall(b"ok\n")
            with channel:
                pump(conn, channel)
        except OSError:
            pass  # the launcher's ssh went away
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def _ask(self, conn: socket.socket) -> tuple[tuple[Hop, ...], str, int] | None:
        line = b""
        while not line.endswith(b"\n"):
            got = conn.recv(1)
            if not got or len(line) > _ASK_LIMIT:
                return None
            line += got
        host, _, port_text = line.decode(errors="replace").strip().partition(" ")
        jumps = self._routes.get((host, int(port_text))) if port_text.isdigit() else None
        if jumps is None:
            conn.sendall(f"error: {host}:{port_text} is not a node of this cluster\n".encode())
            return None
        return jumps, host, int(port_text)
