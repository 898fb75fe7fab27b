"""A host's ``ProxyCommand`` from the ssh config, run as OpenSSH runs it: ``$SHELL -c 'exec
COMMAND'``, its standard input and output one end of a socket pair whose other end carries the
ssh connection (paramiko reads it as it reads a TCP socket: timeouts, end of file).

The command's stderr goes to an unlinked temporary file, quoted when the connection fails. The
command runs in a session of its own and ends with the connection: closing the socket ends
every process of that session (SIGTERM, SIGKILL after a grace), so none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import weakref

__all__ = ["ProxySocket", "route_address", "start_proxy"]

_GRACE = 2.0  # seconds a proxy command has to end after SIGTERM
_SAID_LINES = 5  # lines of its stderr quoted in an error


class ProxySocket(socket.socket):
    """The connection's end of the socket pair; :meth:`close` also ends the command."""

    def __init__(
        self, end: socket.socket, proc: subprocess.Popen[bytes], err: int, command: str
    ) -> None:
        super().__init__(end.family, end.type, end.proto, fileno=end.detach())
        self.command = command
        self.proc = proc
        self._err = err  # its stderr's temporary file: read after the close too (said())
        weakref.finalize(self, os.close, err)
        self._lock = threading.Lock()
        self._open = True
        self._code_at_close: int | None = None  # its exit status at the close (None: it ran)

    def close(self) -> None:
        # paramiko closes the socket as soon as the connection fails, before saying why.
        super().close()
        with self._lock:  # held while it ends: said() then knows how it ended
            if not self._open:
                return
            self._open, self._code_at_close = False, self.proc.poll()
            _end(self.proc)

    def said(self) -> str:
        """How the command ended (if it did) and the last lines of its stderr: ``"exited 1:
        ssh: connect to host ... refused"``."""
        with self._lock:
            still_open, ran = self._open, self._code_at_close is None
        code = self.proc.returncode
        if still_open:  # it may be ending now, its output on its way
            try:
                code = self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                code = None
        elif ran and code is not None and code < 0:  # the signal was the close's own
            code = None
        try:
            size = os.fstat(self._err).st_size
            text = os.pread(self._err, 1 << 16, max(0, size - (1 << 16)))
        except OSError:
            text = b""
        lines = text.decode(errors="replace").strip().splitlines()[-_SAID_LINES:]
        if code is None:
            ended = "was still running"
        else:
            ended = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        return f"{ended}: {' / '.join(lines)}" if lines else f"{ended}, saying nothing"


def start_proxy(command: str) -> ProxySocket:
    """Run ``command`` (a ProxyCommand with its tokens filled in) as OpenSSH does; return the
    socket the ssh connection goes through."""
    ours, theirs = socket.socketpair()
    err = tempfile.TemporaryFile()  # noqa: SIM115 - its descriptor is kept, the file closed
    shell = os.environ.get("SHELL") or "/bin/sh"
    try:
        proc = subprocess.Popen(
            [shell, "-c", f"exec {command}"],
            stdin=theirs.fileno(),
            stdout=theirs.fileno(),
            stderr=err,
            start_new_session=True,  # its own group: ended whole, untouched by our signals
        )
    except OSError:
        ours.close()
        err.close()
        raise
    finally:
        theirs.close()
    fd = os.dup(err.fileno())
    err.close()
    return ProxySocket(ours, proc, fd, command)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc``'s session: SIGTERM, then SIGKILL if it is still there after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=_GRACE)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the command left in its session
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_GRACE)


def route_address(host: str, port: int) -> str:
    """This machine's address on its route to ``host`` (as a host reached through a proxy
    command reaches us back, when it can), or ``""`` when ``host`` does not resolve or route
    here. Connecting a datagram socket sends nothing."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(addr)
            return str(probe.getsockname()[0])
    except OSError:
        return ""
