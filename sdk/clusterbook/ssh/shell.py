"""The :class:`RemoteShell` protocol: what bootstrap needs from a connection to a node.

Commands are argv lists; every word is quoted with :func:`shlex.quote` before it reaches the
remote shell, so nothing is ever interpreted that the caller did not write as a word.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from clusterbook.errors import RemoteCommandError
from clusterbook.spec import validate_env

__all__ = [
    "CommandResult",
    "OutputCallback",
    "ProcessStarter",
    "RemoteProcess",
    "RemoteShell",
    "command_line",
    "take",
    "write_file_argv",
]

#: Called with ("stdout" | "stderr", bytes) as a command's output arrives.
OutputCallback = Callable[[str, bytes], None]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended on a host."""

    host: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> CommandResult:
        """Return self if the command exited 0, else raise :class:`RemoteCommandError`."""
        if self.returncode != 0:
            tail = self.stderr.strip().splitlines()[-5:]
            raise RemoteCommandError(
                f"Command {shlex.join(self.argv)!r} failed on {self.host} with exit code "
                f"{self.returncode}" + (": " + " / ".join(tail) if tail else "."),
                host=self.host,
                returncode=self.returncode,
                stderr=self.stderr,
            )
        return self


@runtime_checkable
class RemoteProcess(Protocol):
    """A process running on a node, started by :meth:`RemoteShell.start`."""

    host: str

    def send(self, data: bytes, timeout: float | None = None) -> None:
        """Write to its stdin; SSHTimeoutError if it takes nothing for ``timeout`` s."""
        ...

    def readline(self, timeout: float) -> bytes:
        """The next line of its stdout (b"" at end); SSHTimeoutError after ``timeout``."""
        ...

    def read(self, size: int, timeout: float) -> bytes:
        """The next ``size`` bytes of its stdout (fewer at its end); SSHTimeoutError if
        nothing comes for ``timeout`` s."""
        ...

    def close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        """Close its stdin, wait for it to end; return its exit code and stderr."""
        ...


class ProcessStarter(Protocol):
    """What a node session needs of a connection: to start its process there."""

    host: str

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> RemoteProcess:
        """Start ``argv`` on the node and return it running."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


@runtime_checkable
class RemoteShell(Protocol):
    """A connection to one node, reused for every step of its bootstrap."""

    host: str

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
        """Run ``argv`` on the node and wait for it (at most ``timeout`` seconds);
        ``on_output`` gets the output as it arrives."""
        ...

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> RemoteProcess:
        """Start ``argv`` on the node and return it running, to talk to it line by line."""
        ...

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` atomically (temp file + rename), created with ``mode``."""
        ...

    def copy(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy a local file to the node, atomically."""
        ...

    def remove(self, paths: Sequence[str]) -> None:
        """Remove files the bootstrap created (missing ones are fine)."""
        ...

    def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        ...


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The one line a remote shell runs for ``argv``: every word quoted, env set by
    ``env NAME=VALUE`` words (so values arrive byte for byte)."""
    words = list(argv)
    if not words:
        raise ValueError("argv is empty")
    variables = validate_env(env)
    if variables:
        words = ["env", *(f"{k}={v}" for k, v in variables.items()), *words]
    return shlex.join(words)


# Atomic write with the mode set before any byte lands: umask 077 makes the temp file private
# from its creation, chmod sets the final mode, mv renames in one step.
_WRITE = 'umask 077 && t="$1.tmp.$$" && cat > "$t" && chmod "$2" "$t" && mv -f "$t" "$1"'


def write_file_argv(path: str, mode: int) -> list[str]:
    """argv of the remote command that writes stdin to ``path`` atomically with ``mode``."""
    return ["sh", "-c", _WRITE, "cb-write", path, format(mode, "o")]


def take(buf: bytearray, size: int) -> bytes:
    """The first ``size`` bytes of ``buf`` (fewer if it holds fewer), taken out of it (a
    bytearray drops its head without moving the rest)."""
    with memoryview(buf) as view:
        data = bytes(view[:size])
    del buf[:size]
    return data
