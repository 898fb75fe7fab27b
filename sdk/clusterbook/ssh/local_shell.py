"""A :class:`~clusterbook.ssh.shell.RemoteShell` for this machine: argv run directly."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from clusterbook.errors import SSHTimeoutError
from clusterbook.nodes.tasks.common import write_atomic
from clusterbook.ssh.shell import CommandResult, OutputCallback

__all__ = ["LocalShell"]


class LocalShell:
    """Runs commands on this machine; the same protocol as the ssh one, for the head node
    and for tests."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host or socket.gethostname()

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
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **env} if env else None,
            )
        except FileNotFoundError:
            result = CommandResult(self.host, tuple(argv), 127, "", f"{argv[0]}: not found")
            return result.check() if check else result
        chunks: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

        def pump(name: str, pipe: IO[bytes]) -> None:
            while data := pipe.read1(65536):  # type: ignore[attr-defined]
                chunks[name] += data
                if on_output is not None:
                    on_output(name, data)

        assert proc.stdout is not None
        assert proc.stderr is not None
        readers = [
            threading.Thread(target=pump, args=("stdout", proc.stdout), daemon=True),
            threading.Thread(target=pump, args=("stderr", proc.stderr), daemon=True),
        ]
        for t in readers:
            t.start()
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(input or b"")
            proc.stdin.close()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise SSHTimeoutError(
                f"Command {argv[0]!r} on {self.host} ran over its {timeout:g} s; it was stopped.",
                host=self.host,
            ) from None
        finally:
            for t in readers:
                t.join(timeout=5)
            proc.stdout.close()
            proc.stderr.close()
        result = CommandResult(
            self.host,
            tuple(argv),
            code,
            chunks["stdout"].decode(errors="replace"),
            chunks["stderr"].decode(errors="replace"),
        )
        return result.check() if check else result

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> _Process:
        return _Process(self.host, list(argv), env)

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        write_atomic(path, data, mode)

    def copy(self, local: Path, remote: str, mode: int = 0o644) -> None:
        write_atomic(remote, Path(local).read_bytes(), mode)

    def remove(self, paths: Sequence[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        pass


class _Process:
    """A local process, read line by line (a thread moves its stdout lines to a queue) or
    by the byte."""

    def __init__(self, host: str, argv: list[str], env: Mapping[str, str] | None) -> None:
        self.host = host
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._rest = b""  # what a read took of a line and left
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **env} if env else None,
            )
        except FileNotFoundError:
            self._proc = None
            self._lines.put(b"")
            return
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def send(self, data: bytes, timeout: float | None = None) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.write(data)
                self._proc.stdin.flush()

    def readline(self, timeout: float) -> bytes:
        if self._rest:
            line, self._rest = self._rest, b""
            if line.endswith(b"\n"):
                return line
            return line + self.readline(timeout)
        return self._next(timeout)

    def read(self, size: int, timeout: float) -> bytes:
        data = self._rest
        while len(data) < size:
            more = self._next(timeout)
            if not more:
                break
            data += more
        data, self._rest = data[:size], data[size:]
        return data

    def _next(self, timeout: float) -> bytes:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise SSHTimeoutError(
                f"No answer from the bootstrap step on {self.host} within {timeout:g} s.",
                host=self.host,
            ) from None

    def close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        proc = self._proc
        if proc is None:
            return 127, "not found"
        assert proc.stdin is not None
        assert proc.stderr is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        if proc.stdout is not None:
            proc.stdout.close()
        return code, err
