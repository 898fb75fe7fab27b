"""Files between the head and nodes that share no filesystem: what to send, where results land.

``Cluster.put(paths)`` sends files and directories to the same absolute paths on every node
(the paths a job's command line names are the head's); ``Cluster.gather(directory)`` moves
the files ranks wrote in a directory on the nodes to that directory on the head. Files go in
pieces of :data:`~clusterbook.nodes.outgoing.CHUNK` bytes, so that neither side holds a large
file in memory. The node side is the ``put_*`` and ``gather_*`` node tasks; the head's side is
what to send (:mod:`clusterbook.nodes.outgoing`), how an arriving file is stored
(:mod:`clusterbook.nodes.arrival`), and here the two exchanges (:func:`send`, :func:`fetch`)
over any way of running a node's tasks, on every node at once, behind ``put()`` and
``gather()``.

The bytes travel raw, in frames (:func:`clusterbook.nodes.tasks.files.frame`) that follow
the ``put_files`` request or precede the ``gather_files`` reply on the node's session: one
request a node for all its files, streamed at the rate the ssh channel's window allows, with
no reply awaited between pieces.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.nodes.arrival import Arrival
from clusterbook.nodes.call import Call
from clusterbook.nodes.destination import placement, target
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.outgoing import Digests, OutFile, Outgoing, outgoing, pieces, sha256_of
from clusterbook.nodes.tasks.files import FRAME, frame
from clusterbook.views.progress import bar, checked

__all__ = [
    "fetch",
    "fetch_all",
    "gather_ask",
    "gather_into",
    "put_paths",
    "send",
    "send_all",
    "uncounted",
    "write_data",
]

#: What a provider's ``put`` is: send an :class:`Outgoing`, telling a counter the bytes; the
#: nodes it failed on, with why.
Put = Callable[[Outgoing, Callable[[int], None]], Mapping[str, Exception]]


def uncounted(amount: int) -> None:
    """A byte counter that counts nothing (the default of every ``sending``/``receiving``)."""
    return None


def send(
    call: Call,
    cluster_id: str,
    sent: Outgoing,
    sending: Callable[[int], None] = uncounted,
    digests: Digests | None = None,
) -> int:
    """Put ``sent`` on one node: its directories, then the files it lacks or has with other
    bytes (``sending`` is told each piece's bytes once it is on its way). Returns how many
    files were sent."""
    files = {f.path: f for f in sent.files}
    begin: dict[str, Any] = {
        "cluster_id": cluster_id,
        "dirs": list(sent.dirs),
        "files": {f.path: [f.size, f.digest or None] for f in sent.files},
    }
    if sent.relocated:  # the node checks its own home too: the head knows only its own
        begin["guard"] = True
    told = call("put_begin", begin, 300)
    digests = digests or Digests()
    # Files the node has with the same size: sent if their sha256 differs from the node's.
    theirs: dict[str, str] = told.get("digests", {})
    need = sorted([*told["need"], *(p for p, d in theirs.items() if d != digests.of(files[p]))])
    if not need:
        return 0
    at: list[str] = []  # the file being sent
    gave_up: list[Exception] = []

    def frames() -> Iterator[bytes]:
        for path in need:
            at[:] = [path]
            try:
                for _, data, _ in pieces(files[path]):
                    if data:
                        yield FRAME.pack(b"D", len(data))
                        yield data
                        sending(len(data))
            except Exception as exc:  # the node drops the file, and the session stays usable
                gave_up.append(exc)
                yield frame(b"X")
                at.clear()
                return
            yield frame(b"E")
        yield frame(b"Z")
        at.clear()  # all went: an error now is the node's, and names its file

    args = {"cluster_id": cluster_id, "files": [[p, files[p].mode] for p in need]}
    try:
        written = int(call("put_files", args, 300, frames=frames())["written"])
    except Exception as exc:
        if not at:
            raise
        said = (
            f"{at[0]} was not sent whole; the node does not have it under its name, and what "
            "it has of it goes at the cluster's stop"
        )
        if not isinstance(exc, ClusterError):  # not the connection's: said as it is
            raise
        raise ClusterError(f"{said} ({exc}).") from exc
    if gave_up:
        raise gave_up[0]
    return written


def gather_ask(directory: Path, skip: Sequence[str]) -> dict[str, Any]:
    """What a node is asked to hand over of ``directory`` (``gather_files``, and
    ``gather_list`` for how much that is): the ranks may have used the path the head's leads
    to, if it goes through a symbolic link here; ``skip``: the names the head has."""
    paths = list(dict.fromkeys([str(directory), os.path.realpath(directory)]))
    return {"directory": paths[0], "directories": paths, "skip": list(skip)}


def fetch(
    call: Call,
    directory: Path,
    skip: Sequence[str],
    host: str,
    stored: Callable[[Path], None],
    receiving: Callable[[int], None] = uncounted,
) -> None:
    """Move the files ranks wrote in ``directory`` (and the directories in it) on one node
    (``host``) here; each is removed there only once it is stored here (``stored`` is told
    its path). A file that cannot be stored here stays there, and is said once the others
    have arrived."""
    ask = gather_ask(directory, skip)
    taken: list[str] = []
    problems: list[Exception] = []
    now: dict[str, Any] = {"arrival": None, "name": "", "where": ask["directory"]}

    def on_frame(kind: bytes, payload: bytes) -> None:
        arrival: Arrival | None = now["arrival"]
        try:
            if kind == b"D":
                if arrival is not None:
                    arrival.write(payload)
                    receiving(len(payload))
            elif kind == b"H":
                now["name"] = json.loads(payload)["name"]
                now["arrival"] = Arrival(directory, now["name"], host)
            elif kind == b"E" and arrival is not None:
                now["arrival"] = None
                stored(arrival.finish())
                taken.append(now["name"])
            elif kind == b"X":  # the node could not read it (all of it)
                now["arrival"] = None
                if arrival is not None:
                    arrival.abandon()
                problems.append(ClusterError(f"could not read {payload.decode()} there"))
            elif kind == b"W":
                now["where"] = json.loads(payload)
        except Exception as exc:  # the rest is still read: the session stays in step
            if now["arrival"] is not None:
                now["arrival"].abandon()
                now["arrival"] = None
            problems.append(exc)

    try:
        call("gather_files", ask, 300, on_frame=on_frame)
    except Exception as exc:
        arrival = now["arrival"]
        if arrival is None:
            raise
        arrival.abandon()
        said = (
            f"{now['name']} did not arrive whole; nothing of it was kept here, and {host} "
            "still has it"
        )
        if not isinstance(exc, ClusterError):  # not the connection's: said as it is
            raise
        raise ClusterError(f"{said} ({exc}).") from exc
    finally:
        if taken:
            call("gather_done", {"directory": now["where"], "names": taken}, 60)
    if problems:
        raise (
            problems[0] if len(problems) == 1 else ClusterError("; ".join(str(p) for p in problems))
        )


def send_all(
    callers: Mapping[str, Call],
    cluster_id: str,
    sent: Outgoing,
    sending: Callable[[int], None] = uncounted,
) -> dict[str, Exception]:
    """:func:`send` to every node at once (``callers`` by node); the nodes it failed on."""
    digests = Digests()

    def one(node: str) -> int:
        return send(callers[node], cluster_id, sent, sending, digests)

    return parallel(list(callers), one)[1]


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
    put: Put,
    paths: Sequence[str | os.PathLike[str]],
    progress: object = None,
    dest: str | os.PathLike[str] | None = None,
    *,
    base: str = "",
    own: Sequence[str] = (),
) -> None:
    """``cluster.put(*paths, dest=dest)``: send them with ``put`` (a provider's), with a bar
    of the bytes sent; raise naming the nodes it failed on. ``dest``: where they go on the
    nodes (:mod:`clusterbook.nodes.destination`: relative to ``base``, never in ``own``);
    None: their own paths."""
    progress = checked(progress)
    place = None
    if dest is not None:
        there = target(dest, base, own, "put")
        given = [p for p in paths if isinstance(p, (str, os.PathLike))]
        place = placement([Path(p).expanduser().absolute() for p in given], dest, there)
    sent = outgoing(paths, digests=False, place=place)
    if sent.dirs or sent.files:
        with bar(progress, "put", unit="B", leave=True) as shown:
            failed = put(sent, shown.add)
        _raise_for("put", failed, "")


def write_data(
    put: Put,
    path: str | os.PathLike[str],
    data: bytes | str,
    mode: int,
    *,
    base: str,
    own: Sequence[str],
) -> None:
    """``cluster.write(path, data)``: put ``data`` (str: its UTF-8) at ``path`` (as
    ``put``'s ``dest``, which it must name a file with) with ``mode``; raise naming the nodes
    it failed on."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigError(
            f"write(data=...) takes bytes, or str (written as UTF-8), not {type(data).__name__}."
        )
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ConfigError(
            f"write(mode={mode!r}): give the file's permission bits, 0 to 0o777, like mode=0o644."
        )
    if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(("/", os.sep)):
        raise ConfigError(f"write({os.fspath(path)!r}): give the path of a file, not a directory.")
    there = target(path, base, own, "write")
    data = bytes(data)
    with tempfile.TemporaryDirectory(prefix="clusterbook-write-") as private:  # 0700
        source = os.path.join(private, "data")
        with open(source, "wb") as f:
            f.write(data)
        file = OutFile(there, format(mode, "o"), len(data), sha256_of(source), source)
        failed = put(Outgoing((), (file,)), uncounted)
    _raise_for("write", failed, "")


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
    have = sorted(_have(target))
    with bar(progress, "gather", unit="B", leave=True) as shown:
        stored, failed = gather(target, have, shown.add)
    _raise_for("gather", failed, f"; what arrived from the others is in {target}")
    return stored


def _have(top: Path, prefix: str = "") -> Iterator[str]:
    """What is in ``top`` here and in its directories (not hidden; links not followed), by
    relative name: nodes keep their files of these names."""
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for e in entries:
        if not e.name.startswith("."):
            yield prefix + e.name
            if e.is_dir(follow_symlinks=False):
                yield from _have(Path(e.path), f"{prefix}{e.name}/")


def _raise_for(what: str, failed: Mapping[str, Exception], more: str) -> None:
    if failed:
        lines = "".join(f"\n  {host}: {exc}" for host, exc in failed.items())
        raise ClusterError(f"{what}() failed on {len(failed)} node(s){more}:{lines}")
