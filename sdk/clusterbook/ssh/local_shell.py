"""A :class:`~clusterbook.ssh.shell.RemoteShell` for this machine: argv run directly."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from clusterbook.errors import SSHTimeoutError
from clusterbook.ssh._node_tasks import write_atomic
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
