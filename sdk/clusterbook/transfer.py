"""Files between the head and nodes that share no filesystem: what to send, where results land.

``Cluster.put(paths)`` sends files and directories to the same absolute paths on every node
(the paths a job's command line names are the head's); ``Cluster.gather(directory)`` moves
the files ranks wrote in a directory on the nodes to that directory on the head. Files go in
pieces of :data:`CHUNK` bytes, so that neither side holds a large file in memory. The node
side is the ``put_*`` and ``gather_*`` node tasks; this module is the head's side: what to send
(:func:`outgoing`, :func:`pieces`), how an arriving file is stored (:class:`Arrival`), and
the two exchanges (:func:`send`, :func:`fetch`) over any way of running a node's tasks.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.fanout import parallel
from clusterbook.progress import bar, checked

__all__ = [
    "CHUNK",
    "Arrival",
    "Call",
    "OutFile",
    "Outgoing",
    "fetch",
    "fetch_all",
    "outgoing",
    "pieces",
    "send",
    "send_all",
]

#: Runs a node task on one node: ``call(task, args, timeout)`` returns the task's result.
Call = Callable[[str, Mapping[str, Any], float], Any]

#: Bytes per piece of a file on the wire (base64 in one JSON line of a node session).
CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class OutFile:
    """A file to send: its absolute path (the same on the nodes), mode, size and sha256."""

    path: str
    mode: str
    size: int
    digest: str


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What ``put`` sends: directories to make, and files."""

    dirs: tuple[str, ...]
    files: tuple[OutFile, ...]


def outgoing(paths: Iterable[str | os.PathLike[str]]) -> Outgoing:
    """Files and directories to send, by absolute path; directories with all they hold
    (symbolic links to directories are not followed)."""
    dirs: list[str] = []
    files: dict[str, OutFile] = {}

    def add_file(path: Path) -> None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        info = path.stat()
        files[str(path)] = OutFile(
            str(path), format(info.st_mode & 0o777, "o"), info.st_size, h.hexdigest()
        )

    for given in paths:
        if not isinstance(given, (str, os.PathLike)):
            raise ConfigError(f"put() takes paths of files or directories, not {given!r}.")
        path = Path(given).expanduser().absolute()
        if path.is_file():
            add_file(path)
        elif path.is_dir():
            for top, subdirs, names in os.walk(path):
                dirs.append(top)
                subdirs.sort()
                for name in sorted(names):
                    if (Path(top) / name).is_file():
                        add_file(Path(top) / name)
        else:
            raise ConfigError(
                f"put(): {str(given)!r} is not a file or directory on this machine ({path}); "
                "give the path of something that exists here."
            )
    return Outgoing(tuple(dirs), tuple(files.values()))


def pieces(file: OutFile, size: int = CHUNK) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, data, last)`` for each piece of ``file`` (one empty piece for an empty
    file). The file must still have the size it had in :func:`outgoing`."""
    with open(file.path, "rb") as f:
        offset = 0
        while True:
            data = f.read(size)
            last = offset + len(data) >= file.size
            if len(data) < size and not last:
                raise ConfigError(f"put(): {file.path} shrank while it was being sent.")
            yield offset, data, last
            offset += len(data)
            if last:
                return


class Arrival:
    """A file coming from ``host`` into ``directory``: written to a private temp file, then
    given its name, never over a file that is there (a name another node sent first gets
    ``.from-HOST`` appended)."""

    def __init__(self, directory: Path, name: str, host: str) -> None:
        if "/" in name or name.startswith(".") or not name:
            raise ConfigError(f"{host} sent a file named {name!r}; it was not stored.")
        self.directory, self.name, self.host = directory, name, host
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._tmp = directory / f".{name}.cb-from-{host}"
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def write(self, data: bytes) -> None:
        os.write(self._fd, data)

    def finish(self) -> Path:
        """The file under its name; raise if both names are taken (the temp file is kept)."""
        os.close(self._fd)
        for candidate in (self.name, f"{self.name}.from-{self.host}"):
            try:
                os.link(self._tmp, self.directory / candidate)  # fails if the name is taken
            except FileExistsError:
                continue
            self._tmp.unlink()
            return self.directory / candidate
        raise ConfigError(
            f"{self.host} sent {self.name!r}, but {self.directory} already has both "
            f"{self.name!r} and {self.name + '.from-' + self.host!r}; it is in {self._tmp}."
        )

    def abandon(self) -> None:
        """Drop what arrived so far (the node still has the file)."""
        os.close(self._fd)
        self._tmp.unlink(missing_ok=True)


def uncounted(amount: int) -> None:
    """A byte counter that counts nothing (the default of every ``sending``/``receiving``)."""
    return None


def send(
    call: Call, cluster_id: str, sent: Outgoing, sending: Callable[[int], None] = uncounted
) -> int:
    """Put ``sent`` on one node: its directories, then the files it lacks, piece by piece
    (``sending`` is told each piece's bytes once it is there). Returns how many files were
    sent."""
    files = {f.path: f for f in sent.files}
    begin = {
        "cluster_id": cluster_id,
        "dirs": list(sent.dirs),
        "files": {f.path: [f.size, f.digest] for f in sent.files},
    }
    need = call("put_begin", begin, 300)["need"]
    for path in need:
        f = files[path]
        for offset, data, last in pieces(f):
            piece = {"cluster_id": cluster_id, "path": path, "mode": f.mode, "offset": offset}
            piece |= {"last": last, "data": base64.b64encode(data).decode()}
            call("put_chunk", piece, 300)
            sending(len(data))
    return len(need)


def fetch(
    call: Call,
    directory: Path,
    skip: Sequence[str],
    host: str,
    stored: Callable[[Path], None],
    receiving: Callable[[int], None] = uncounted,
) -> None:
    """Move the files ranks wrote in ``directory`` on one node (``host``) here, piece by
    piece; each is removed there only once it is stored here (``stored`` is told its path)."""
    # The ranks used the path the head's leads to, if it goes through a symbolic link here.
    paths = list(dict.fromkeys([str(directory), os.path.realpath(directory)]))
    found = call(
        "gather_list", {"directory": paths[0], "directories": paths, "skip": list(skip)}, 60
    )
    listed, where = found["files"], found.get("directory") or paths[0]
    taken: list[str] = []
    try:
        for name, size in listed.items():
            arrival = Arrival(directory, name, host)
            try:
                offset = 0
                while True:
                    ask = {"directory": where, "name": name, "offset": offset, "size": CHUNK}
                    data = base64.b64decode(call("gather_chunk", ask, 300)["data"])
                    arrival.write(data)
                    receiving(len(data))
                    offset += len(data)
                    if offset >= size or not data:
                        break
            except BaseException:
                arrival.abandon()
                raise
            stored(arrival.finish())
            taken.append(name)
    finally:
        if taken:
            call("gather_done", {"directory": where, "names": taken}, 60)


def send_all(
    callers: Mapping[str, Call],
    cluster_id: str,
    sent: Outgoing,
    sending: Callable[[int], None] = uncounted,
) -> dict[str, Exception]:
    """:func:`send` to every node at once (``callers`` by node); the nodes it failed on."""
    return parallel(list(callers), lambda node: send(callers[node], cluster_id, sent, sending))[1]


def fetch_all(
    callers: Mapping[str, Call],
    directory: Path,
    skip: Sequence[str],
    receiving: Callable[[int], None] = uncounted,
) -> tuple[list[Path], dict[str, Exception]]:
    """:func:`fetch` from every node at once; what arrived, and the nodes it failed on."""
    stored: list[Path] = []
    lock = threading.Lock()

    def keep(path: Path) -> None:
        with lock:
            stored.append(path)

    def one(node: str) -> None:
        fetch(callers[node], directory, skip, node, keep, receiving)

    failed = parallel(list(callers), one)
    return sorted(stored), failed[1]


def put_paths(
    put: Callable[[Outgoing, Callable[[int], None]], Mapping[str, Exception]],
    paths: Iterable[str | os.PathLike[str]],
    progress: object = None,
) -> None:
    """``cluster.put(*paths)``: send them with ``put`` (a provider's), with a bar of the bytes
    sent; raise naming the nodes it failed on."""
    progress = checked(progress)
    sent = outgoing(paths)
    if sent.dirs or sent.files:
        with bar(progress, "put", unit="B", leave=True) as shown:
            failed = put(sent, shown.add)
        _raise_for("put", failed, "")


def gather_into(
    gather: Callable[
        [Path, Sequence[str], Callable[[int], None]], tuple[list[Path], Mapping[str, Exception]]
    ],
    directory: Path,
    progress: object = None,
) -> list[Path]:
    """``cluster.gather(directory)``: move what the nodes have there here with ``gather`` (a
    provider's), but the names this machine has, with a bar of the bytes received; raise
    naming the nodes it failed on."""
    target = directory.expanduser().absolute()
    have = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
    with bar(progress, "gather", unit="B", leave=True) as shown:
        stored, failed = gather(target, have, shown.add)
    _raise_for("gather", failed, f"; what arrived from the others is in {target}")
    return stored


def _raise_for(what: str, failed: Mapping[str, Exception], more: str) -> None:
    if failed:
        lines = "".join(f"\n  {host}: {exc}" for host, exc in failed.items())
        raise ClusterError(f"{what}() failed on {len(failed)} node(s){more}:{lines}")
