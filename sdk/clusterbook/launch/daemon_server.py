"""The agent's side of MPI's daemons started through it (:mod:`clusterbook.launch.daemons`
says what the two sides say): :class:`DaemonServer`, a Unix socket the agent serves (which the
head's master connection forwards) or the connections it is given (its channel to the head),
each answering a question or starting a daemon with the job's tag and relaying its output and
exit status."""

from __future__ import annotations

import contextlib
import os
import pwd
import selectors
import signal
import socket
import struct
import subprocess
import threading

from clusterbook.launch.daemons import ANSWER_WITHIN, FRAME, TAG, dumps, loads, read_line
from clusterbook.nodes.tasks import commands

__all__ = ["DaemonServer"]


class DaemonServer:
    """The agent's socket at ``path`` (made private), serving launches in threads; ``env``:
    the daemons' environment, less the agent's tag. With no ``path`` it serves the connections
    it is given (:meth:`serve`: the agent's channel to the head) and listens nowhere."""

    def __init__(self, path: str | None, env: dict[str, str] | None = None) -> None:
        self.path = path
        self._env = dict(os.environ if env is None else env)
        # Debian's bash reads ~/.bashrc when these say ssh ran it (pyenv init: ~0.1 s of
        # CPU here), which is the login shell's cost a warm launch is for avoiding.
        for name in (TAG, "SSH_CLIENT", "SSH2_CLIENT"):
            self._env.pop(name, None)
        self._sock: socket.socket | None = None
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # one a killed agent left
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # private from the moment it exists
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def close(self) -> None:
        """Stop serving, remove the socket and end the daemons still running."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path or "")
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            _end(proc, 0.0)

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def answer(self, line: bytes) -> bytes | None:
        """The answer to a question (``ping``, ``free_port``), which leaves the connection it
        came on as it was; None for anything else (a launch: :meth:`serve`)."""
        try:
            request = loads(line)
        except ValueError:
            return None
        if request.get("ping"):
            return b'{"ok": true}\n'
        if request.get("free_port"):
            return dumps(commands.free_port({})) + b"\n"  # the node task's answer
        return None

    def serve(self, conn: socket.socket, line: bytes | None = None) -> None:
        """Serve one launch (or question) on ``conn`` (``line``: its request, when read
        already), then close it."""
        with conn:
            try:
                if line is None:
                    conn.settimeout(ANSWER_WITHIN)
                    line = read_line(conn)[0]
                    conn.settimeout(None)
                if (answer := self.answer(line)) is not None:
                    conn.sendall(answer)
                    return
                request = loads(line)
                proc = self._spawn(str(request["command"]), str(request["token"]))
            except Exception as exc:
                with contextlib.suppress(OSError):
                    said = {"error": f"{type(exc).__name__}: {exc}"}
                    conn.sendall(dumps(said) + b"\n")
                return
            try:
                conn.sendall(dumps({"pid": proc.pid}) + b"\n")
                _relay(proc, conn)
            except OSError:
                _end(proc, 1.0)
            finally:
                with self._lock:
                    self._procs.discard(proc)

    def _spawn(self, command: str, token: str) -> subprocess.Popen[bytes]:
        if not token or token.endswith(":agents"):
            raise ValueError(f"a daemon needs its job's tag, not {token!r}")
        shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        with self._lock:  # a close() meanwhile ends it too: it is filed before close() looks
            if self._closed:
                raise ValueError("the agent is stopping: it starts no more daemons")
            proc = subprocess.Popen(
                [shell, "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**self._env, TAG: token},
                cwd=os.path.expanduser("~"),
                start_new_session=True,  # its group is the job's on this node: ended as one
            )
            self._procs.add(proc)
        return proc


def _relay(proc: subprocess.Popen[bytes], conn: socket.socket) -> None:
    """Send the daemon's output as it comes, then its exit status; a closed connection (the
    launcher gone) ends the daemon."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, b"O")
    sel.register(proc.stderr, selectors.EVENT_READ, b"E")
    sel.register(conn, selectors.EVENT_READ, None)
    open_pipes = 2
    with sel:
        while open_pipes:
            for key, _ in sel.select():
                if key.data is None:  # the launcher said something, or went away
                    if not conn.recv(4096):
                        sel.unregister(conn)
                        _end(proc, 1.0)
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                conn.sendall(FRAME.pack(key.data, len(data)) + data)
    code = proc.wait()
    conn.sendall(FRAME.pack(b"X", 4) + struct.pack(">i", code))


def _end(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the daemon's group, SIGKILL after ``grace`` seconds (its ranks with it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace or 0.1)
            return
        except subprocess.TimeoutExpired:
            continue
