"""MPI's daemons started by a node's agent: :class:`DaemonServer`, a Unix socket the agent
serves, and :func:`main`, the launcher's side (what Open MPI's ``plm_ssh_agent`` and MPICH's
``-launcher-exec`` run on the head instead of ssh).

The head's master connection to the node forwards a socket of the head's (in the masters'
private directory, one per node, named by :func:`forward_name`) to the agent's: a job's
launcher starts ``prted`` / ``hydra_pmi_proxy`` there as it would over ssh (the same command
line, run by the user's shell, stdout and stderr back, its exit code the launcher's child's),
but with no ssh session and no login shell on the node: the agent forks it.

A request is one JSON line: ``{"ping": true}`` (answered ``{"ok": true}``), ``{"free_port":
true}`` (answered ``{"port": N}``: a TCP port free on the node now, for torch.distributed's
store on rank 0's node), or ``{"command": TEXT, "token": JOB}``: the daemon runs ``SHELL -c
TEXT`` in the agent's environment with the job's tag (``CLUSTERBOOK_JOB=JOB``, so that stopping
the job stops it), in its own session, and is answered ``{"pid": N}``; then frames
(:data:`FRAME`: ``O`` stdout, ``E`` stderr, ``X`` the exit status, last). A launcher gone (its
connection closed) takes its daemon with it.

Where the node's agent dialled the head (:mod:`clusterbook.rendezvous.channels`), the head
serves :data:`CHANNELS` in the same directory: the launcher's side asks it first, naming the
host (``{"host": H, ...}``), and the head relays the launch to the agent over the agent's own
connection (no master connection needed); a host without one is answered with an error.

Plain standard library: the launcher's side runs as ``python -S -I daemons.py DIR COLD ARGS``
(:func:`main`), before anything of clusterbook is imported, and falls back to ``COLD`` (the
launcher's ssh) when no agent answers.
"""

# The launcher's side imports only what it needs (each job starts it once per node, and the
# server's modules, json's re and hashlib's OpenSSL among them, cost it ~10 ms more): JSON
# through json's C parts (_json), sockets through _socket (socket.py's enum, selectors and
# collections are 8 ms more); the agent's side imports the rest where it uses it.
from __future__ import annotations

import _json
import _socket
import os
import struct
import sys

try:  # no OpenSSL loaded, as hashlib would
    from _sha2 import sha256  # type: ignore[import-not-found]  # (no stub) Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # < 3.12
    except ImportError:  # a Python built without either
        from hashlib import sha256

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    import subprocess
    from collections.abc import Mapping
    from typing import Any

#: A frame: its kind (``O``, ``E``, ``X``) and the length of what follows.
FRAME = struct.Struct(">cI")
#: What the job's processes carry (``clusterbook.nodes.tasks.common.JOB_ENV``, written here
#: again: this module runs on its own on the head).
TAG = "CLUSTERBOOK_JOB"
#: How long a launcher waits for the agent's answer before it starts the daemon over ssh.
ANSWER_WITHIN = 5.0
_REQUEST_MAX = 1 << 20
#: A Unix socket's path holds 107 bytes at most (108 with its end).
SOCKET_PATH_MAX = 108
#: The head's socket (in the masters' directory) that relays launches over the channels the
#: nodes' agents dialled (:class:`clusterbook.rendezvous.channels.ChannelServer`).
CHANNELS = "channels.sock"
#: ssh's options that take a value (the launcher's side skips them to find the host).
_WITH_VALUE = frozenset("bcDEeFIiJLlmOopQRSWw")


def forward_name(host: str) -> str:
    """The name of the socket, on the head and on the node, that reaches ``host``'s agent:
    the same for the same host, short enough for a Unix socket's path, and different for
    nodes that share a home."""
    digest: str = sha256(host.encode()).hexdigest()
    return "d-" + digest[:16] + ".sock"


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
        import threading

        self._lock = threading.Lock()

    def start(self) -> None:
        import contextlib
        import threading

        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # one a killed agent left
        import socket

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
        import contextlib

        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(_socket.SHUT_RDWR)
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path or "")
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _end(proc, 0.0)

    def _accept(self, sock: socket.socket) -> None:
        import threading

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
            request = _loads(line)
        except ValueError:
            return None
        if request.get("ping"):
            return b'{"ok": true}\n'
        if request.get("free_port"):
            return _dumps({"port": _free_port()}) + b"\n"
        return None

    def serve(self, conn: socket.socket, line: bytes | None = None) -> None:
        """Serve one launch (or question) on ``conn`` (``line``: its request, when read
        already), then close it."""
        import contextlib

        with conn:
            try:
                if line is None:
                    conn.settimeout(ANSWER_WITHIN)
                    line = read_line(conn)[0]
                    conn.settimeout(None)
                if (answer := self.answer(line)) is not None:
                    conn.sendall(answer)
                    return
                request = _loads(line)
                proc = self._spawn(str(request["command"]), str(request["token"]))
            except Exception as exc:
                with contextlib.suppress(OSError):
                    said = {"error": f"{type(exc).__name__}: {exc}"}
                    conn.sendall(_dumps(said) + b"\n")
                return
            try:
                conn.sendall(_dumps({"pid": proc.pid}) + b"\n")
                _relay(proc, conn)
            except OSError:
                _end(proc, 1.0)
            finally:
                with self._lock:
                    self._procs.discard(proc)

    def _spawn(self, command: str, token: str) -> subprocess.Popen[bytes]:
        if not token or token.endswith(":agents"):
            raise ValueError(f"a daemon needs its job's tag, not {token!r}")
        import pwd
        import subprocess

        shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        proc = subprocess.Popen(
            [shell, "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**self._env, TAG: token},
            cwd=os.path.expanduser("~"),
            start_new_session=True,  # its group is the job's on this node: ended as one
        )
        with self._lock:
            self._procs.add(proc)
        return proc


def _free_port() -> int:
    """A TCP port free on this machine now (the node task ``free_port``'s answer)."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port
    finally:
        sock.close()


class _Parsing:
    """What json's C scanner asks of its decoder: plain JSON, nothing hooked."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")


_SCAN = _json.make_scanner(_Parsing())  # type: ignore[arg-type]  # (the stub: a decoder)


def _loads(data: bytes) -> Any:
    """``json.loads`` of one object's text, without json's Python modules."""
    text = data.decode().strip()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        value, end = None, -1
    if end != len(text) or not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {text[:100]!r}")
    return value


def _dumps(message: Mapping[str, str | int | bool]) -> bytes:
    """``json.dumps`` of a flat object of strings, numbers and booleans (what the two sides
    send), without json's Python modules."""
    quote = _json.encode_basestring_ascii
    parts = []
    for key, value in message.items():
        if isinstance(value, bool):
            said = "true" if value else "false"
        elif isinstance(value, int):
            said = str(value)
        else:
            said = quote(str(value))
        parts.append(f"{quote(key)}: {said}")
    return ("{" + ", ".join(parts) + "}").encode()


def read_line(conn: socket.socket) -> tuple[bytes, bytes]:
    """A line from ``conn``, and what came after it in the same reads; ValueError where the
    peer ends first or the line is too long."""
    data = b""
    while b"\n" not in data:
        piece = conn.recv(65536)
        if not piece or len(data) > _REQUEST_MAX:
            raise ValueError("no answer" if data or not piece else "too long")
        data += piece
    line, _, rest = data.partition(b"\n")
    return line, rest


def _relay(proc: subprocess.Popen[bytes], conn: socket.socket) -> None:
    """Send the daemon's output as it comes, then its exit status; a closed connection (the
    launcher gone) ends the daemon."""
    import selectors

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
    import contextlib
    import signal
    import subprocess

    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace or 0.1)
            return
        except subprocess.TimeoutExpired:
            continue


def _split(args: list[str]) -> tuple[str, list[str]]:
    """The host and the command words of an ssh command line (options first)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if len(args[i]) == 2 and args[i][1] in _WITH_VALUE else 1
    if i >= len(args):
        raise ValueError(f"no host in {args!r}")
    return args[i].rpartition("@")[2], args[i + 1 :]


def ask(path: str, request: Mapping[str, str | int | bool], timeout: float = ANSWER_WITHIN) -> Any:
    """Connect to an agent's socket at ``path``; return the connection, the answer and what
    followed it."""
    conn: socket.socket = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # type: ignore[assignment]
    try:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(_dumps(request) + b"\n")
        line, rest = read_line(conn)
        answer = _loads(line)
        conn.settimeout(None)
    except BaseException:
        conn.close()
        raise
    if "error" in answer:
        conn.close()
        raise OSError(answer["error"])
    return conn, answer, rest


def ping(path: str, timeout: float = ANSWER_WITHIN) -> None:
    """Raise OSError or ValueError unless the agent at ``path`` answers."""
    conn, _, _ = ask(path, {"ping": True}, timeout)
    conn.close()


def main(argv: list[str]) -> int:
    """``daemons.py DIR COLD SSH_ARGS...``: start the command on the host of ``SSH_ARGS``
    through its agent (the socket ``DIR/forward_name(host)``) and relay its output; when the
    agent does not take it, run ``COLD SSH_ARGS`` (the launcher's ssh) instead."""
    directory, cold, args = argv[1], argv[2], argv[3:]
    host, words = _split(args)
    request = {"command": " ".join(words), "token": os.environ.get(TAG, "")}
    try:  # the agent's own channel to the head, where it dialled one
        conn, _, rest = ask(os.path.join(directory, CHANNELS), {"host": host, **request})
    except (OSError, ValueError):
        pass  # none: its master's forward, else ssh
    else:
        return _follow(conn, rest)  # started: whatever happens now, never a second one
    try:
        conn, _, rest = ask(os.path.join(directory, forward_name(host)), request)
    except (OSError, ValueError) as exc:
        print(
            f"clusterbook: the agent on {host} did not start the MPI daemon ({exc}); "
            "starting it over ssh",
            file=sys.stderr,
            flush=True,
        )
        os.execv(cold, [cold, *args])  # noqa: S606 - the launcher's own ssh wrapper
    return _follow(conn, rest)


def _follow(conn: socket.socket, buffered: bytes) -> int:
    """Write the daemon's output where the launcher reads it (``buffered``: what came with the
    answer); return its exit status (255, as ssh's, when the connection ends first)."""
    while True:
        while len(buffered) >= FRAME.size:
            kind, size = FRAME.unpack_from(buffered)
            if len(buffered) < FRAME.size + size:
                break
            data = buffered[FRAME.size : FRAME.size + size]
            buffered = buffered[FRAME.size + size :]
            if kind == b"X":
                code = int(struct.unpack(">i", data)[0])
                return 128 - code if code < 0 else code
            fd = 1 if kind == b"O" else 2
            while data:
                data = data[os.write(fd, data) :]
        try:
            piece = conn.recv(65536)
        except OSError:  # reset: ended, as a connection that closes
            piece = b""
        if not piece:
            return 255
        buffered += piece


if __name__ == "__main__":
    sys.exit(main(sys.argv))
