"""MPI's daemons started by a node's agent: what the two sides say (a request, its answer, the
frames), and :func:`main`, the launcher's side (what Open MPI's ``plm_ssh_agent`` and MPICH's
``-launcher-exec`` run on the head instead of ssh); the agent's side is
:class:`~clusterbook.launch.daemon_server.DaemonServer`.

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
# collections are 8 ms more); the agent's side (daemon_server) imports the rest.
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


def loads(data: bytes) -> Any:
    """``json.loads`` of one object's text, without json's Python modules."""
    text = data.decode().strip()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        value, end = None, -1
    if end != len(text) or not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {text[:100]!r}")
    return value


def dumps(message: Mapping[str, str | int | bool]) -> bytes:
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
        conn.sendall(dumps(request) + b"\n")
        line, rest = read_line(conn)
        answer = loads(line)
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
