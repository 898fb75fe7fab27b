"""What answers a handle attached over ssh, on the cluster's machine: ``clusterbook serve-dir``.

A handle on ``ssh://me@login1/ID`` (:mod:`clusterbook.cluster.remote.sshdir`) runs, over its ssh
connection, the clusterbook of ``me`` on ``login1``:

- ``serve-dir dir ID``: finds the cluster (an id, a name or a directory, as
  :func:`~clusterbook.head.catalog.find` does there), checks that its directory is the user's alone
  (:func:`~clusterbook.fs.private.check_run_dir`, with that machine's users and groups), then
  answers reads of its record and files (:mod:`clusterbook.cluster.remote.dirwire`), within the
  directory only, until its input ends;
- ``serve-dir list``: the clusters there, for ``clusterbook ls --host``;
- ``serve-dir relay DIRECTORY``: connects to the directory's control socket as a handle there
  does (a socket served by another user is refused), says ``ok`` (or ``error: ...``) on a line,
  then copies bytes both ways. The handle and the head run their handshake through it: what
  goes through is what a handle on that machine would send.

Each ends when its input ends (the handle closed, or the connection dropped), so nothing of it
is left running there.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from clusterbook.cluster.remote.dirwire import READ_LIMIT, VERSION, pack, unpack
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.fs.private import check_run_dir
from clusterbook.head.control import SOCKET_FILE, TOKEN_FILE, error_reply, unix_dial
from clusterbook.launch.files import read_from
from clusterbook.nodes.tasks.common import write_all
from clusterbook.paths import default_run_root
from clusterbook.rendezvous.backends.wire import (
    FRAME_HEADER,
    MAX_FRAME,
    ProtocolError,
    read_secret,
)

if TYPE_CHECKING:
    from clusterbook.cluster.remote.rundir import LocalDir
    from clusterbook.head.record import ClusterRecord

# What the relay does not need is imported where it is used: a relay starts for every
# connection to the head, and the catalog alone would double its start.

__all__ = ["Service", "listing", "main", "relay", "serve"]

_DIAL = 10.0  # seconds to connect to the control socket
_USAGE = "usage: clusterbook serve-dir dir ID | list | relay DIRECTORY"


def main(argv: Sequence[str]) -> int:
    """``clusterbook serve-dir ...`` (see the module's docstring); returns the exit code."""
    words = list(argv)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    if len(words) == 2 and words[0] == "dir":
        return serve(words[1], stdin, stdout)
    if words == ["list"]:
        return listing(stdout)
    if len(words) == 2 and words[0] == "relay":
        return relay(Path(words[1]), stdin.fileno(), stdout.fileno())
    print(_USAGE, file=sys.stderr)
    return 2


def _check(path: Path) -> None:
    """Refuse a directory that is not the user's alone, as attach does on this machine."""
    root = default_run_root()
    check_run_dir(path, root if path.parent == root else None)


def serve(what: str, rfile: IO[bytes], wfile: IO[bytes]) -> int:
    """Find cluster ``what``, say what was found on ``wfile``, then answer the requests read
    from ``rfile`` until it ends."""
    from clusterbook.cluster.remote.rundir import LocalDir
    from clusterbook.head.catalog import find

    try:
        found = find(what)
        if found.error is not None:
            raise found.error
        _check(found.path)
        service = Service(LocalDir(Path(os.path.abspath(found.path))))
        first = {"version": VERSION, "directory": str(service.path), "host": socket.gethostname()}
        first |= service.record()
    except ClusterError as exc:
        _send(wfile, error_reply(exc))
        return 1
    _send(wfile, first)
    while (payload := _receive(rfile)) is not None:
        try:
            request, sent = unpack(payload)
            reply, data = service.answer(request, sent)
        except ClusterError as exc:
            reply, data = error_reply(exc), b""
        except ProtocolError as exc:
            reply, data = error_reply(ClusterError(f"A request could not be read: {exc}.")), b""
        except Exception as exc:  # a bug must not end the service with no answer
            reply, data = error_reply(ClusterError(f"{type(exc).__name__}: {exc}")), b""
        _send(wfile, reply, data)
    return 0


def listing(wfile: IO[bytes]) -> int:
    """Say the clusters under the run root on ``wfile``, running ones first."""
    from clusterbook.head.catalog import ordered, scan

    clusters = [
        {
            "path": str(f.path),
            "record": None if f.record is None else _plain(f.record),
            "error": None if f.error is None else str(f.error),
            "stale": f.stale,
        }
        for f in ordered(list(scan()))
    ]
    _send(wfile, {"version": VERSION, "clusters": clusters})
    return 0


class Service:
    """The answers about one cluster directory (see :mod:`clusterbook.cluster.remote.dirwire`)."""

    def __init__(self, here: LocalDir) -> None:
        self._here = here
        self.path = here.path
        self._real = os.path.realpath(here.path)

    def record(self) -> dict[str, Any]:
        record, stale = self._here.read()
        return {"record": _plain(record), "stale": stale}

    def answer(self, request: Mapping[str, Any], sent: bytes = b"") -> tuple[dict[str, Any], bytes]:
        op = request.get("op")
        if isinstance(op, str) and op.startswith("call_"):
            return self._call_folder(op, request, sent), b""
        if op == "record":
            return self.record(), b""
        if op == "read":
            return self._read(request.get("files"))
        if op == "listdir":
            path = self._inside(request.get("path"))
            return {"entries": [list(e) for e in self._here.files.listdir(path)]}, b""
        if op == "size":
            return {"size": self._here.files.size(self._inside(request.get("path")))}, b""
        if op == "secret":
            return {"secret": read_secret(self.path / TOKEN_FILE).hex()}, b""
        if op == "stop_file":
            self._here.touch_stop()
            return {}, b""
        if op == "stop":
            self._stop(
                float(request.get("timeout", 30.0)),
                str(request.get("reason") or ""),
                force=request.get("force") is True,
            )
            return {}, b""
        raise ClusterError(f"The cluster's machine does not know request {op!r}.")

    def _read(self, wanted: object) -> tuple[dict[str, Any], bytes]:
        if not isinstance(wanted, list):
            raise ConfigError("A read names its files as [[PATH, OFFSET], ...].")
        sizes: list[int | None] = []
        complete: list[bool] = []
        chunks: list[bytes] = []
        left = READ_LIMIT
        for item in wanted:
            path, offset = item if isinstance(item, list) and len(item) == 2 else (None, 0)
            data = read_from(self._inside(path), max(0, int(offset)), left)
            sizes.append(None if data is None else len(data))
            complete.append(data is None or (left > 0 and len(data) < left))
            if data:
                chunks.append(data)
                left -= len(data)
        return {"sizes": sizes, "complete": complete}, b"".join(chunks)

    def _call_folder(self, op: str, request: Mapping[str, Any], sent: bytes) -> dict[str, Any]:
        """A function job's call folder (:mod:`clusterbook.functions.place`), made, written,
        dropped or settled here for a handle on another machine."""
        from clusterbook.functions import place

        if op == "call_new":
            return {"folder": str(place.new_call_dir(self.path))}
        folder = place.check_call_dir(self.path, Path(str(request.get("folder"))))
        if op == "call_add":
            place.add_file(folder, str(request.get("name")), sent)
            return {}
        if op == "call_drop":
            place.LocalCalls(self.path).discard(folder)
            return {}
        if op == "call_done":
            return {"values": str(place.settle(folder, self._inside(request.get("job_dir"))))}
        raise ClusterError(f"The cluster's machine does not know request {op!r}.")

    def _inside(self, path: object) -> Path:
        """``path``, once it is sure to be in the cluster's directory."""
        text = str(path) if isinstance(path, str) else ""
        real = os.path.realpath(text) if text else ""
        if not real or (real != self._real and not real.startswith(self._real + os.sep)):
            raise ConfigError(
                f"{path!r} is not in the cluster's directory {self.path}; only files there "
                "are read for an attached handle."
            )
        return Path(text)

    def _stop(self, timeout: float, reason: str, *, force: bool) -> None:
        from clusterbook.cluster.remote.attached import AttachedCluster
        from clusterbook.head.catalog import Found

        record, stale = self._here.read()
        found = Found(self.path, record, stale=stale)
        with AttachedCluster(found, self._here) as cluster:
            cluster.stop(timeout, reason=reason or None, force=force)


def relay(directory: Path, rfd: int, wfd: int) -> int:
    """Connect to ``directory``'s control socket, say so on ``wfd``, then copy bytes between
    it and ``rfd`` / ``wfd`` until the socket ends."""
    from clusterbook.ssh._relay import pump

    try:
        _check(directory)
        sock = unix_dial(directory / SOCKET_FILE)(time.monotonic() + _DIAL)
    except (ClusterError, OSError) as exc:
        said = str(exc) if isinstance(exc, ClusterError) else exc.strerror or str(exc)
        words = f"Cannot connect to the control socket {directory / SOCKET_FILE}: {said}"
        write_all(wfd, f"error: {' '.join(words.split())}\n".encode())
        return 1
    with sock:
        try:
            write_all(wfd, b"ok\n")
            return pump(sock, rfd, wfd)
        except OSError:  # the connection that ran this is gone
            return 1


def _plain(record: ClusterRecord) -> Any:
    return json.loads(record.to_json())


def _send(wfile: IO[bytes], message: Mapping[str, Any], data: bytes = b"") -> None:
    wfile.write(pack(message, data))
    wfile.flush()


def _receive(rfile: IO[bytes]) -> bytes | None:
    """The next frame's payload, None at the end of the input."""
    header = rfile.read(FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME:
        return None  # not a handle of this version: nothing it sends can be followed
    payload = rfile.read(size)
    return payload if len(payload) == size else None
