"""A rendezvous store in a directory every node sees at the same path: a local one, or a network
file system such as a cluster's work_dir.

Layout of the directory (created with mode 0700 when missing)::

    state   a header (magic, token, length, SHA-256 of the state) followed by the state
    lock    empty; a POSIX lock on it (fcntl.lockf, which NFS supports) guards compare-and-set

A write holds the lock around read-compare-write and replaces ``state`` with a complete temp
file (``os.replace``), so readers, who take no lock, never see a torn state. ``watch`` polls the
header's token every ``poll_interval`` seconds (opening the file each time, which NFS's
close-to-open consistency revalidates).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import unquote, urlsplit

from clusterbook.durations import duration
from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import (
    RendezvousBackend,
    RendezvousConnectionError,
    RendezvousStateError,
    Token,
)

__all__ = ["FileBackend"]

_MAGIC = b"CBRDZVF1"
_HEADER = struct.Struct(">8sQQ32s")  # magic, token, length, sha256(state)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# POSIX locks belong to a process, not to a file descriptor: a second lock taken by the same
# process succeeds at once, and closing any descriptor of the file drops them all. Threads of one
# process therefore take turns on a lock of their own per directory first.
_THREAD_LOCKS: dict[tuple[int, int], threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(key: tuple[int, int]) -> threading.Lock:
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.Lock())


def _location(path: object) -> Path:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"The rendezvous directory must be a path or a file:// URL, got {path!r}."
        )
    if path.startswith("file:"):
        parts = urlsplit(path)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment or not parts.path:
            raise ConfigError(
                f"The rendezvous directory URL {path!r} is not of the form file:///path/to/dir."
            )
        path = unquote(parts.path)
    elif "://" in path:
        raise ConfigError(f"The rendezvous directory {path!r} is neither a path nor a file:// URL.")
    return Path(os.path.abspath(path))


class FileBackend(RendezvousBackend):
    """Compare-and-set over a file in the directory ``path`` (a path or a ``file://`` URL).

    ``timeout`` bounds the wait for the lock, which other processes hold only for a read and a
    write; ``poll_interval`` is how often ``watch`` looks for a change.
    """

    name = "file"

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 30.0, poll_interval: float = 0.02
    ) -> None:
        self._dir = _location(path)
        self._timeout = duration(timeout, "The lock timeout")
        self._poll = duration(poll_interval, "The poll interval")
        self._state_path = self._dir / "state"
        self._lock_path = self._dir / "lock"
        self._ready = False

    @property
    def path(self) -> Path:
        """The directory of the store."""
        return self._dir

    def get_state(self) -> tuple[bytes, Token] | None:
        self._ensure_dir()
        return self._read()

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if not isinstance(state, bytes):
            raise TypeError(f"state must be bytes, got {type(state).__name__}")
        self._ensure_dir()
        with self._locked():
            current = self._read()
            current_token = None if current is None else current[1]
            valid = token is None or (isinstance(token, int) and not isinstance(token, bool))
            if valid and token == current_token:
                new_token = (current_token or 0) + 1
                self._write(state, new_token)
                return state, new_token, True
            if current is None:
                return b"", 0, False
            return current[0], current[1], False

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        self._ensure_dir()
        deadline = time.monotonic() + (timeout if timeout > 0 else 0.0)  # NaN -> 0
        while True:
            changed = self._peek() != token
            left = deadline - time.monotonic()
            if changed or left <= 0:
                return self._read()
            time.sleep(min(self._poll, left))

    # internals

    def _error(self, exc: OSError, what: str = "") -> RendezvousConnectionError:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOLCK:
            reason += "; the file system does not support POSIX locks (NFS: is lockd running?)"
        return RendezvousConnectionError(
            f"Cannot use the rendezvous directory {self._dir}{what} ({reason}). It must exist or "
            "be creatable, and be writable, at the same path on every node: a local directory "
            "for one machine, a shared file system (such as the cluster's work_dir) for several."
        )

    def _ensure_dir(self) -> None:
        if self._ready:
            return
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise self._error(exc) from exc
        if not os.access(self._dir, os.W_OK | os.X_OK):
            raise self._error(PermissionError(errno.EACCES, "not writable"))
        self._ready = True

    def _open_state(self) -> int | None:
        try:
            return os.open(self._state_path, os.O_RDONLY | _CLOEXEC)
        except FileNotFoundError:
            if not os.path.isdir(self._dir):  # no state, or no store any more?
                raise self._error(FileNotFoundError(errno.ENOENT, "it vanished")) from None
            return None
        except OSError as exc:
            raise self._error(exc, " (reading its state)") from exc

    def _corrupt(self, why: str) -> RendezvousStateError:
        return RendezvousStateError(
            f"The rendezvous state file {self._state_path} is corrupt ({why}); it was not written "
            "by this version of clusterbook. Stop every node of this rendezvous and delete the "
            "file, or use another directory, to start over."
        )

    def _header(self, head: bytes) -> tuple[int, int, bytes]:
        if len(head) < _HEADER.size:
            raise self._corrupt(f"{len(head)} bytes, shorter than its header")
        magic, token, length, digest = _HEADER.unpack_from(head)
        if magic != _MAGIC:
            raise self._corrupt("unknown header")
        return token, length, digest

    def _peek(self) -> Token | None:
        """The stored token: the header only, not the state."""
        fd = self._open_state()
        if fd is None:
            return None
        try:
            head = os.pread(fd, _HEADER.size, 0)
        except OSError as exc:
            raise self._error(exc, " (reading its state)") from exc
        finally:
            os.close(fd)
        return self._header(head)[0]

    def _read(self) -> tuple[bytes, Token] | None:
        fd = self._open_state()
        if fd is None:
            return None
        try:
            with os.fdopen(fd, "rb", closefd=True) as file:
                data = file.read()
        except OSError as exc:
            raise self._error(exc, " (reading its state)") from exc
        token, length, digest = self._header(data)
        state = data[_HEADER.size :]
        if len(state) != length or hashlib.sha256(state).digest() != digest:
            raise self._corrupt("its length or checksum does not match")
        return state, token

    def _write(self, state: bytes, token: int) -> None:
        head = _HEADER.pack(_MAGIC, token, len(state), hashlib.sha256(state).digest())
        temp = self._dir / f".state.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o600)
            try:
                data = memoryview(head + state)
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self._state_path)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(temp)
            raise self._error(exc, " (writing its state)") from exc

    @contextmanager
    def _locked(self) -> Iterator[None]:
        deadline = time.monotonic() + self._timeout
        try:
            info = os.stat(self._dir)
        except OSError as exc:
            raise self._error(exc) from exc
        thread_lock = _thread_lock((info.st_dev, info.st_ino))
        if not thread_lock.acquire(timeout=self._timeout):
            raise self._busy()
        try:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)
            except OSError as exc:
                raise self._error(exc, " (opening its lock file)") from exc
            try:
                delay = 0.0005
                while True:
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EACCES, errno.EAGAIN):
                            raise self._error(exc, " (locking it)") from exc
                    if time.monotonic() >= deadline:
                        raise self._busy()
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
                try:
                    yield
                finally:
                    fcntl.lockf(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            thread_lock.release()

    def _busy(self) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"Could not lock the rendezvous directory {self._dir} within {self._timeout:g} s: "
            f"another process keeps {self._lock_path} locked (a hung process, or a stale lock "
            "on a network file system). Stop that process, or use another directory."
        )
