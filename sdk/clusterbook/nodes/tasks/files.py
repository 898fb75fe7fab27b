"""Files to and from a node: ``put_*`` writes files at the paths they have on the head (what it
created is logged, and removed at clean-up), ``gather_*`` hands over the files ranks wrote in
a directory, then removes them; ``put_files`` and ``gather_files`` move the bytes raw, in
frames that follow the request or precede the reply on a node's session."""

import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterable

from .common import TYPE_CHECKING, Args, Reply, _inside, cluster_dir, write_all

if TYPE_CHECKING:
    from typing import Any


def _put_log(directory: str) -> str:
    """Where ``put`` logs what it created on this node, a JSON string a line: in the
    cluster's directory, named after the node (homes shared between nodes share that
    directory, while what ``put`` wrote elsewhere is each node's own)."""
    return _inside(directory, f"put-{socket.gethostname()}.log")


def put_begin(args: Args) -> Reply:
    """Make ``dirs`` and the parents of ``files`` (path -> [size, sha256]); return the files
    this node needs: those it lacks or has with other bytes. A file already there with the
    same bytes is left alone (a shared filesystem, or a node that is the head). A file given
    without its sha256 (None) that is here with its size is not in ``need``: its sha256 here
    is in ``digests``, for the head to compare. With ``guard`` (a put to another path than
    the head's, or a write), none may be among this node's files of clusterbook or ssh."""
    if args.get("guard"):
        _refuse_own([*args.get("dirs", []), *args["files"]])
    created = []
    for path in args.get("dirs", []):
        created += _makedirs(path)
    need = []
    digests = {}
    for path, (size, digest) in sorted(args["files"].items()):
        created += _makedirs(os.path.dirname(path))
        here = _digest(path, size)
        if here is not None and digest is None:
            digests[path] = here
        elif here is None or here != digest:
            need.append(path)
    _log_created(args["cluster_id"], created)
    return {"need": need, "digests": digests} if digests else {"need": need}


def _refuse_own(paths: "list[str]") -> None:
    """Raise naming the first of ``paths`` that is (or leads, through links, to) a file of
    ``~/.clusterbook`` or ``~/.ssh`` here: the cluster's own, or what keeps it safe."""
    home = os.path.expanduser("~")
    own = [os.path.realpath(os.path.join(home, d)) for d in (".clusterbook", ".ssh")]
    for path in paths:
        real = os.path.realpath(path)
        for top in own:
            if real == top or real.startswith(top + "/"):
                raise PermissionError(
                    f"{path} is among the cluster's own files on this node ({top}); choose "
                    "a path outside it"
                )


def _digest(path: str, size: int) -> str | None:
    """The sha256 of the file at ``path`` if it has ``size`` bytes, else None."""
    import hashlib

    try:
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _temp_beside(path: str, cluster_id: str) -> str:
    """The temp file a file is written to before it replaces ``path``: the node's own (its
    name in it), since nodes that share a filesystem write the same paths at once, and a temp
    file one node renamed away would leave the other nothing to rename."""
    name = f".{os.path.basename(path)[:100]}.cb-{cluster_id}.{socket.gethostname()}"
    return os.path.join(os.path.dirname(path), name)


def put_chunk(args: Args) -> Reply:
    """Write one piece of a file: into a private temp file beside it, which replaces the
    file at the last piece (with its mode); a file that did not exist before is logged."""
    path, offset = args["path"], int(args["offset"])
    tmp = _temp_beside(path, args["cluster_id"])
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
    if offset == 0:  # logged first: a put cut short leaves no temp file after cleanup
        _log_created(args["cluster_id"], [tmp])
    fd = os.open(tmp, flags, 0o600)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        os.write(fd, base64.b64decode(args["data"]))
        if args["last"]:
            os.fchmod(fd, int(args["mode"], 8))
    finally:
        os.close(fd)
    if args["last"]:
        existed = os.path.lexists(path)
        os.replace(tmp, path)
        if not existed:
            _log_created(args["cluster_id"], [path])
    return {}


def _log_created(cluster_id: str, paths: list[str]) -> None:
    if paths:
        directory = cluster_dir(cluster_id)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(_put_log(directory), "a") as f:
            f.writelines(json.dumps(p) + "\n" for p in paths)  # a name may hold a newline


#: ``put_cleanup``'s two parts, in the order a head asks every node for them.
CLEANUP_PARTS = ("files", "dirs")


def put_cleanup(args: Args) -> Reply:
    """Remove what ``put`` created for the cluster (and nothing else of it: for nodes that
    were not bootstrapped by the head, like an elastic cluster's). ``part``: ``"files"``
    removes the files only, ``"dirs"`` then the directories and the log; the head asks every
    node for the files before any for the directories, since nodes that share a filesystem
    (an NFS work directory) may each have made part of one tree: a directory one node made
    holds a file another made. Without ``part``, both at once (one node cleaning up)."""
    directory = cluster_dir(args["cluster_id"])
    part = args.get("part")
    if part not in (None, *CLEANUP_PARTS):
        raise ValueError(f"put_cleanup: part must be 'files' or 'dirs', not {part!r}")
    _remove_put(directory, part)
    if part != "files":
        with contextlib.suppress(OSError):
            os.unlink(_put_log(directory))
            os.rmdir(directory)
    return {}


def _makedirs(path: str) -> list[str]:
    """Make ``path`` and its missing parents (0700); return those made, outermost first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    return list(reversed(missing))


def _remove_put(directory: str, part: "str | None" = None) -> None:
    """Remove what ``put`` logged it created here: its files, then its directories if they are
    empty (``part``: the files only, or the directories only)."""
    try:
        with open(_put_log(directory)) as f:
            paths = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return
    if part != "dirs":
        for path in paths:
            if not os.path.isdir(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    if part != "files":
        for path in sorted(paths, key=lambda p: p.count("/"), reverse=True):
            if os.path.isdir(path):
                with contextlib.suppress(OSError):
                    os.rmdir(path)


def gather_list(args: Args) -> Reply:
    """The regular files in ``directory`` and the directories in it, but hidden ones and
    those named in ``skip`` (the head has them): relative name -> size. ``directory`` is the
    first of ``directories`` this node has (the head's path, then the path it leads to there,
    when it goes through a symbolic link: the ranks may have used either)."""
    skip = set(args.get("skip", []))
    asked = args.get("directories")
    for directory in asked or [args["directory"]]:
        if not os.path.isdir(directory):
            continue
        files = dict(_walk(directory, "", skip))
        return {"files": files, "directory": directory} if asked else {"files": files}
    return {"files": {}}


def _walk(top: str, prefix: str, skip: set[str]) -> Iterable[tuple[str, int]]:
    """``(relative name, size)`` of the regular files under ``top``, by name, depth first
    (symbolic links are not followed; hidden names and those in ``skip`` are left)."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        name = prefix + e.name
        if e.name.startswith("."):
            continue
        if e.is_file(follow_symlinks=False):
            if name not in skip:
                yield name, e.stat(follow_symlinks=False).st_size
        elif e.is_dir(follow_symlinks=False):
            yield from _walk(e.path, name + "/", skip)


def gather_chunk(args: Args) -> Reply:
    """``size`` bytes of file ``name`` in ``directory`` from ``offset``, base64."""
    path = _inside(args["directory"], args["name"], MAX_DEPTH)
    with open(path, "rb") as f:
        f.seek(int(args["offset"]))
        return {"data": base64.b64encode(f.read(int(args["size"]))).decode()}


def gather_done(args: Args) -> Reply:
    """Remove the files in ``directory`` the head now has, and the directories in it that
    this leaves empty."""
    top = args["directory"]
    parents: set[str] = set()
    for name in args["names"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_inside(top, name, MAX_DEPTH))
        parts = name.split("/")[:-1]
        parents.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for parent in sorted(parents, key=lambda p: p.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # not empty: a rank's file the head did not take
            os.rmdir(os.path.join(top, parent))
    return {}


# -- raw bytes: frames after a request or before a reply ------------------------------------

#: A frame: its kind (one byte) and its payload's length, then the payload.
FRAME = struct.Struct(">cI")
#: Payload bytes per data frame.
FRAME_DATA = 1 << 20
#: How deep ``gather`` goes into the directories of a gathered directory.
MAX_DEPTH = 64


def read_frame(stream: "Any") -> tuple[bytes, bytes]:
    """The next frame of ``stream`` (a binary file): ``(kind, payload)``; EOFError if it ends
    inside one."""
    head = _read_exact(stream, FRAME.size)
    kind, size = FRAME.unpack(head)
    return kind, _read_exact(stream, size)


def _read_exact(stream: "Any", size: int) -> bytes:
    data: bytes = stream.read(size)  # a buffered reader returns all of it, unless at the end
    if len(data) < size:
        raise EOFError("the head's stream ended inside a file")
    return data


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """A frame's header and payload, ready to send."""
    return FRAME.pack(kind, len(payload)) + payload


def put_files(args: Args, stdin: "Any", stdout: "Any") -> Reply:
    """Write ``files`` (``[path, mode]`` each) from the frames that follow the request: for
    each file in turn, data frames (``D``) then ``E``; ``Z`` ends early (``X``: the head gave
    up on the file it was sending, and the rest). Each goes to a private temp file beside its
    path, which replaces the path at ``E`` (with its mode); a file that did not exist before
    is logged, its temp file first. A stream cut short leaves the temp file of the file it was
    in removed. A file that cannot be written here fails the task, once the frames are read."""
    cluster_id = args["cluster_id"]
    files = list(args["files"])
    written = 0
    failed = ""
    fd, tmp = -1, ""
    try:
        for path, mode in files:
            tmp = _temp_beside(path, cluster_id)
            if not failed:
                try:
                    _log_created(cluster_id, [tmp])
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                except OSError as exc:
                    failed = f"{path}: {exc.strerror or exc}"
            while True:
                kind, payload = read_frame(stdin)
                if kind != b"D":
                    break
                if fd >= 0:
                    try:
                        write_all(fd, payload)
                    except OSError as exc:
                        failed = f"{path}: {exc.strerror or exc}"
                        fd = _drop(fd, tmp)
            if kind != b"E":  # X or Z: no more files
                fd = _drop(fd, tmp)
                break
            if fd >= 0:
                os.fchmod(fd, int(mode, 8))
                os.close(fd)
                fd = -1
                existed = os.path.lexists(path)
                os.replace(tmp, path)
                if not existed:
                    _log_created(cluster_id, [path])
                written += 1
        else:
            kind, _ = read_frame(stdin)  # Z
    finally:
        _drop(fd, tmp)
    if failed:
        raise OSError(f"could not write {failed}")
    return {"written": written}


def _drop(fd: int, tmp: str) -> int:
    """Close and remove a temp file being written (if ``fd`` is open); -1."""
    if fd >= 0:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return -1


def gather_files(args: Args, stdin: "Any", stdout: "Any") -> Reply:
    """The files :func:`gather_list` finds, each as frames before the reply: ``H`` (JSON: its
    relative name and size), data frames (``D``), then ``E``, or ``X`` (why) if it could not
    be read; ``Z`` after the last. The first frame (``W``) names the directory they come from
    (the reply too)."""
    found = gather_list(args)
    where = found.get("directory") or args["directory"]
    stdout.write(frame(b"W", json.dumps(where).encode()))
    try:
        for name, size in found["files"].items():
            try:
                f = open(_inside(where, name, MAX_DEPTH), "rb")  # noqa: SIM115 - closed below
            except OSError as exc:
                stdout.write(frame(b"X", f"{name}: {exc.strerror or exc}".encode()))
                continue
            with f:
                stdout.write(frame(b"H", json.dumps({"name": name, "size": size}).encode()))
                try:
                    while data := f.read(FRAME_DATA):
                        stdout.write(FRAME.pack(b"D", len(data)))
                        stdout.write(data)  # written through, not copied
                except OSError as exc:
                    stdout.write(frame(b"X", f"{name}: {exc.strerror or exc}".encode()))
                    continue
                stdout.write(frame(b"E"))
    finally:
        stdout.write(frame(b"Z"))
    return {"directory": where}
