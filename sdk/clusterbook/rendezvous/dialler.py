"""An agent's end of its channel to the head (:mod:`clusterbook.rendezvous.channels`, which
says what goes over it): :class:`Dialler`."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import ssl
import threading
import time

from clusterbook.launch.daemon_server import DaemonServer
from clusterbook.launch.daemons import read_line
from clusterbook.rendezvous.backends._tls import _WrongCertificate, client_tls
from clusterbook.rendezvous.channels import HELLO_WITHIN, message

__all__ = ["Dialler"]

_log = logging.getLogger("clusterbook.rendezvous")

_FIRST_PAUSE, _LONGEST_PAUSE = 0.1, 5.0  # pauses between failed dials
_DIAL_GAP = 0.05  # the shortest time between two dials


class Dialler:
    """An agent's end (see the module): it keeps one connection to the head's channel server
    at ``address`` (whose certificate has ``fingerprint``) as ``node``, showing ``secret``. The
    head's questions on it (a free port) ``daemons`` answers there and then, and it stays; a
    launch ``daemons`` serves (on a thread of its own), and it dials again."""

    def __init__(
        self,
        address: tuple[str, int],
        fingerprint: str,
        secret: bytes,
        node: str,
        daemons: DaemonServer,
    ) -> None:
        self._address, self._fingerprint = address, fingerprint
        self._hello = message({"node": node, "secret": secret.hex()})
        self._daemons = daemons
        self._stop = threading.Event()
        self._tried = threading.Event()  # the first dial ended, either way
        self._up = threading.Event()  # a connection was let in once
        self._lock = threading.Lock()
        self._conn: ssl.SSLSocket | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="clusterbook-dialler", daemon=True).start()

    def first(self, timeout: float) -> bool:
        """Wait until the first dial ended (``timeout`` seconds at most); whether it got in."""
        self._tried.wait(timeout)
        return self._up.is_set()

    def close(self) -> None:
        """Dial no more; close the idle connection (launches under way go on)."""
        self._stop.set()
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _run(self) -> None:
        pause = _FIRST_PAUSE
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                conn = self._dial()
            except (OSError, ValueError, _WrongCertificate) as exc:
                _log.debug("The channel to the head failed: %s", exc)
                self._tried.set()
                self._stop.wait(pause)
                pause = min(_LONGEST_PAUSE, pause * 2)
                continue
            pause = _FIRST_PAUSE
            with self._lock:
                if self._stop.is_set():
                    conn.close()
                    return
                self._conn = conn
            self._up.set()
            self._tried.set()
            line = self._next_launch(conn)
            if self._stop.is_set():
                return  # (close() ended the connection)
            with self._lock:
                self._conn = None
            if line is None:  # the head ended it
                conn.close()
            else:
                args = (conn, line)
                threading.Thread(target=self._daemons.serve, args=args, daemon=True).start()
            self._stop.wait(max(0.0, _DIAL_GAP - (time.monotonic() - began)))

    def _dial(self) -> ssl.SSLSocket:
        raw = socket.create_connection(self._address, timeout=HELLO_WITHIN)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = client_tls(raw, self._fingerprint, time.monotonic() + HELLO_WITHIN)
        except BaseException:
            raw.close()
            raise
        try:
            conn.settimeout(HELLO_WITHIN)
            conn.sendall(self._hello)
            line, rest = read_line(conn)
            if json.loads(line) != {"ok": True} or rest:
                raise ValueError(f"the head answered {line[:100]!r}")
            conn.settimeout(None)
        except BaseException:
            conn.close()
            raise
        return conn

    def _next_launch(self, conn: ssl.SSLSocket) -> bytes | None:
        """Answer the head's questions on ``conn`` until a launch comes: its request; None
        once stopped, or when the head ended the connection."""
        while self._wait_for_launch(conn) and not self._stop.is_set():
            try:
                conn.settimeout(HELLO_WITHIN)
                line, rest = read_line(conn)
                conn.settimeout(None)
                answer = self._daemons.answer(line)
                if answer is None:
                    return line  # (a launch: nothing follows its request that it reads)
                if rest:  # the head waits for the answer to each question
                    raise ValueError("more than one question at once")
                conn.sendall(answer)
            except (OSError, ValueError) as exc:
                _log.debug("The channel to the head ended: %s", exc)
                return None
        return None

    def _wait_for_launch(self, conn: ssl.SSLSocket) -> bool:
        """Until the head sends on ``conn`` (or ends it): True; False once stopped."""
        while not self._stop.is_set():
            if conn.pending():  # read with the head's answer (TLS keeps it)
                return True
            try:
                readable, _, _ = select.select([conn], [], [], 0.5)
            except (OSError, ValueError):
                return not self._stop.is_set()  # closed under us: the next dial says more
            if readable:
                return True
        return False
