"""A :class:`~clusterbook.ssh.shell.RemoteShell` for this machine: argv run directly."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterbook.errors import SSHTimeoutError
from clusterbook.ssh.shell import CommandResult

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
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv),
                input=input,
                capture_output=True,
                timeout=timeout,
                check=False,
                env={**os.environ, **env} if env else None,
            )
        except subprocess.TimeoutExpired:
            raise SSHTimeoutError(
                f"Command {argv[0]!r} on {self.host} ran over its {timeout:g} s; it was killed.",
                host=self.host,
            ) from None
        except FileNotFoundError:
            proc = subprocess.CompletedProcess(
                list(argv), 127, b"", f"{argv[0]}: not found".encode()
            )
        result = CommandResult(
            self.host,
            tuple(argv),
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )
        return result.check() if check else result

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def copy(self, local: Path, remote: str, mode: int = 0o644) -> None:
        target = Path(remote)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            shutil.copyfile(local, tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def remove(self, paths: Sequence[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        pass
