"""A node's session through the OpenSSH client, for bulk bytes.

paramiko encrypts and packs every packet in Python on the head; moving hundreds of MiB that
way costs the head more than the link does. ``cluster.put()`` and ``cluster.gather()`` of large
files run their node task through ``ssh`` instead (the MPI launcher's own way to the node: the
cluster's key, its known_hosts checked strictly, its jump hosts), whose encryption is OpenSSH's
C, as scp's is. The bytes are the node session's frames (:mod:`clusterbook.nodes.tasks`),
over the ssh process's pipes (:class:`PipeProcess`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from clusterbook.errors import SSHConnectError, SSHTimeoutError
from clusterbook.ssh.shell import take

__all__ = ["FAST_CIPHERS", "OpenSSHShell", "PipeProcess"]

_READ = 4 << 20  # what one read of the pipe may take
_PIPE = 1 << 20  # the pipes' size (64 KiB by default: 16 system calls a frame)
#: AES-GCM first (as the head's paramiko connections have it): with the CPU's AES
#: instructions it costs a fraction of OpenSSH's default, ChaCha20-Poly1305.
FAST_CIPHERS = ("-o", "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com")


class PipeProcess:
    """A command run here, spoken to over its pipes (a :class:`~clusterbook.ssh.shell.
    RemoteProcess`): its stdout read in large pieces as it comes, its stderr kept."""

    def __init__(self, host: str, argv: Sequence[str]) -> None:
        self.host = host
        try:
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C in the notebook is the head's to handle
            )
        except OSError as exc:
            raise SSHConnectError(
                f"Cannot start {argv[0]!r} to reach {host}: {exc}.", host=host
            ) from None
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        self._out = self._proc.stdout.fileno()
        for fd in (self._in, self._out):
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError, AttributeError):  # Linux: pipefuls of 1 MiB
                import fcntl

                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE)
        self._buf = bytearray()
        self._ended = False
        self._err = bytearray()
        self._err_reader = threading.Thread(target=self._keep_stderr, daemon=True)
        self._err_reader.start()

    def _keep_stderr(self) -> None:
        assert self._proc.stderr is not None
        while data := self._proc.stderr.read1(65536):  # type: ignore[attr-defined]
            self._err += data[: max(0, 65536 - len(self._err))]

    def send(self, data: bytes, timeout: float | None = None) -> None:
        view = memoryview(data)
        deadline = None if timeout is None else time.monotonic() + timeout
        while view:
            try:
                sent = os.write(self._in, view)
            except BlockingIOError:
                sent = 0
            except (BrokenPipeError, OSError) as exc:
                raise SSHConnectError(
                    f"Lost the connection to {self.host}: {self._said() or exc}.", host=self.host
                ) from None
            if sent:
                view = view[sent:]
                if deadline is not None and timeout is not None:
                    deadline = time.monotonic() + timeout
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise SSHTimeoutError(
                    f"{self.host} took nothing of what was sent for {timeout:g} s.",
                    host=self.host,
                )
            select.select([], [self._in], [], left)

    def _fill(self, deadline: float, timeout: float) -> bool:
        """Read what the pipe holds, waiting until ``deadline``; False at its end."""
        while not self._ended:
            try:
                chunk = os.read(self._out, _READ)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SSHTimeoutError(
                        f"No data from {self.host} within {timeout:g} s.", host=self.host
                    ) from None
                select.select([self._out], [], [], left)
                continue
            if not chunk:
                self._ended = True
                break
            self._buf += chunk
            return True
        return False

    def read(self, size: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < size and self._fill(deadline, timeout):
            deadline = time.monotonic() + timeout
        return take(self._buf, size)

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        scanned = 0
        while (nl := self._buf.find(b"\n", scanned)) < 0:
            scanned = len(self._buf)
            if not self._fill(deadline, timeout):
                line, self._buf = bytes(self._buf), bytearray()
                return line
        line = bytes(self._buf[: nl + 1])
        del self._buf[: nl + 1]
        return line

    def close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            code: int | None = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            code = None
        self._err_reader.join(timeout=5)
        assert self._proc.stdout is not None
        self._proc.stdout.close()
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        return code, self._said()

    def _said(self) -> str:
        return bytes(self._err).decode(errors="replace").strip()


class OpenSSHShell:
    """Starts commands on ``host`` through ``ssh`` (``wrapper``: a script that runs ssh with
    the cluster's options), each in a process of its own here."""

    def __init__(self, host: str, wrapper: str) -> None:
        self.host = host
        self._wrapper = wrapper

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> PipeProcess:
        command = shlex.join(argv)
        if env:
            command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items())]) + " " + command
        return PipeProcess(self.host, [self._wrapper, *FAST_CIPHERS, self.host, command])

    def close(self) -> None:
        """Nothing is shared between its processes: each ends with its session."""
