"""Files to and from a node: the node tasks ``put_*``, ``gather_*`` and their frames, and the
clean-up of what ``put`` made, run here on temp directories."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
from pathlib import Path

import pytest

from clusterbook.nodes.tasks.files import (
    frame,
    gather_chunk,
    gather_done,
    gather_list,
    put_begin,
    put_chunk,
    put_cleanup,
    put_files,
)
from clusterbook.nodes.tasks.install import cleanup


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's home (the node tasks keep their log in ~/.clusterbook/clusters/ID)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".clusterbook" / "clusters" / "c1").mkdir(parents=True)
    return tmp_path / "home"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(path: Path, data: bytes, mode: str, piece: int = 3) -> None:
    for offset in range(0, max(len(data), 1), piece):
        chunk = data[offset : offset + piece]
        last = offset + piece >= len(data)
        args = {"cluster_id": "c1", "path": str(path), "mode": mode, "offset": offset}
        put_chunk({**args, "data": base64.b64encode(chunk).decode(), "last": last})


def test_put_writes_then_cleanup_removes_only_what_it_created(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "work"
    (target / "kept").mkdir(parents=True)
    (target / "kept" / "same.txt").write_text("same")  # already there, same bytes
    (target / "kept" / "old.txt").write_text("old")  # already there, other bytes
    new = target / "new" / "deep" / "x.bin"
    # A name with a newline in it: the log of what put() made must not read it as two paths.
    victim = target / "kept" / "same.txt"
    odd = Path(f"{target}/odd\n{victim}")
    files = {
        str(target / "kept" / "same.txt"): [4, _digest(b"same")],
        str(target / "kept" / "old.txt"): [3, _digest(b"new")],
        str(new): [7, _digest(b"\xff\x00 bits")],
        str(odd): [1, _digest(b"o")],
    }
    begin = put_begin({"cluster_id": "c1", "dirs": [str(target / "out")], "files": files})
    assert begin == {"need": [str(target / "kept" / "old.txt"), str(new), str(odd)]}
    assert (target / "new").stat().st_mode & 0o777 == 0o700
    _put(target / "kept" / "old.txt", b"new", "644")
    _put(new, b"\xff\x00 bits", "640")
    _put(odd, b"o", "644")
    assert new.read_bytes() == b"\xff\x00 bits"
    assert new.stat().st_mode & 0o777 == 0o640
    assert (target / "kept" / "old.txt").read_text() == "new"
    assert not [p for p in new.parent.iterdir() if p.name.startswith(".")]  # no temp left
    # A put cut short: the first piece of a file arrived, the rest never did.
    first = {"cluster_id": "c1", "path": str(target / "cut.bin"), "mode": "644", "offset": 0}
    put_chunk({**first, "data": base64.b64encode(b"01").decode(), "last": False})
    assert (target / f".cut.bin.cb-c1.{socket.gethostname()}").exists()
    (target / "out" / "result").write_text("a rank wrote this")  # not put's: stays

    cleanup({"cluster_id": "c1", "grace": 0.1})
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [  # no temp file
        "kept",
        "kept/old.txt",
        "kept/same.txt",
        "out",
        "out/result",
    ]


def test_gather_lists_reads_in_pieces_and_removes(tmp_path: Path) -> None:
    (tmp_path / "a.pkl").write_bytes(b"ABCDEFG")
    (tmp_path / "have.pkl").write_bytes(b"H")
    (tmp_path / ".hidden").write_bytes(b"h")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a.pkl")
    where = str(tmp_path)
    listed = gather_list({"directory": where, "skip": ["have.pkl"]})
    assert listed == {"files": {"a.pkl": 7}}
    got = gather_chunk({"directory": where, "name": "a.pkl", "offset": 4, "size": 100})
    assert base64.b64decode(got["data"]) == b"EFG"
    gather_done({"directory": where, "names": ["a.pkl", "gone-already"]})
    assert sorted(os.listdir(tmp_path)) == [".hidden", "have.pkl", "link", "sub"]
    assert gather_list({"directory": str(tmp_path / "none")}) == {"files": {}}
    with pytest.raises(ValueError, match="bad file name"):
        gather_chunk({"directory": where, "name": "../x", "offset": 0, "size": 1})


def test_gather_follows_a_symlinked_directory_of_the_head_to_where_it_leads(
    tmp_path: Path,
) -> None:
    # On the head, results -> real; on the node the ranks wrote in real (no link there).
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "r.txt").write_text("x")
    asked = [str(tmp_path / "results"), str(tmp_path / "real")]
    listed = gather_list({"directory": asked[0], "directories": asked})
    assert listed == {"files": {"r.txt": 1}, "directory": str(tmp_path / "real")}
    # The head's own path first, when the node has it too.
    (tmp_path / "results").mkdir()
    listed = gather_list({"directory": asked[0], "directories": asked})
    assert listed == {"files": {}, "directory": str(tmp_path / "results")}


def test_nodes_sharing_a_home_each_clean_up_their_own_puts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two nodes with one (NFS) home but their own scratch disks: each logs what it made in
    # the shared cluster directory, and the first to clean up must not take the other's log.
    for node in ("a", "b"):
        monkeypatch.setattr(socket, "gethostname", lambda node=node: node)
        made = tmp_path / f"scratch-{node}" / "f.txt"
        files = {str(made): [1, _digest(b"f")]}
        put_begin({"cluster_id": "c1", "dirs": [], "files": files})
        _put(made, b"f", "644")
    logs = home / ".clusterbook" / "clusters" / "c1"
    assert sorted(p.name for p in logs.iterdir()) == ["put-a.log", "put-b.log"]
    monkeypatch.setattr(socket, "gethostname", lambda: "a")
    put_cleanup({"cluster_id": "c1"})
    assert not (tmp_path / "scratch-a").exists()
    assert (tmp_path / "scratch-b" / "f.txt").exists()  # b's, for b to clean (its disk)
    monkeypatch.setattr(socket, "gethostname", lambda: "b")
    put_cleanup({"cluster_id": "c1"})
    assert not (tmp_path / "scratch-b").exists()
    assert not (home / ".clusterbook" / "clusters" / "c1").exists()  # nothing else was there


def test_nodes_sharing_a_filesystem_write_the_same_file_at_once(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two nodes, one filesystem, the same put: their pieces interleave. Each writes a temp
    # file of its own, so the second to finish still has one to rename.
    path = tmp_path / "same.bin"
    base = {"cluster_id": "c1", "path": str(path), "mode": "644"}
    for node, offset, data, last in (("a", 0, b"ab", False), ("b", 0, b"ab", False),
                                     ("a", 2, b"cd", True), ("b", 2, b"cd", True)):  # fmt: skip
        monkeypatch.setattr(socket, "gethostname", lambda node=node: node)
        piece = {"offset": offset, "data": base64.b64encode(data).decode(), "last": last}
        put_chunk({**base, **piece})
    assert path.read_bytes() == b"abcd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "same.bin"]  # no temp left


def test_nodes_sharing_a_work_directory_clean_up_a_tree_each_made_part_of(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One filesystem for both nodes: a made the directory, b (a moment later) the file in it.
    # Whichever cleans up first, the directory goes once every node's files have gone.
    (tmp_path / "work").mkdir()
    made = tmp_path / "work" / "placed" / "f.txt"
    files = {str(made): [1, _digest(b"f")]}
    for node in ("a", "b"):
        monkeypatch.setattr(socket, "gethostname", lambda node=node: node)
        put_begin({"cluster_id": "c1", "dirs": [], "files": files})
    _put(made, b"f", "644")  # as b, the last: the file is in b's log, its directory in a's
    for part in ("files", "dirs"):
        for node in ("a", "b"):
            monkeypatch.setattr(socket, "gethostname", lambda node=node: node)
            put_cleanup({"cluster_id": "c1", "part": part})
    assert sorted(os.listdir(tmp_path / "work")) == []
    assert not (home / ".clusterbook" / "clusters" / "c1").exists()
    with pytest.raises(ValueError, match="part must be 'files' or 'dirs', not 'all'"):
        put_cleanup({"cluster_id": "c1", "part": "all"})


# -- the raw frames of put_files and gather_files ------------------------------------------


def _frames(*files: bytes, end: bytes = b"Z") -> bytes:
    """The frames a head sends after a put_files request: each file's data, then E."""
    out = b"".join(frame(b"D", data) + frame(b"E") for data in files)
    return out + (frame(end) if end else b"")


def test_put_files_writes_from_frames_and_a_cut_stream_leaves_no_part(
    home: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    stream = io.BytesIO(_frames(b"AAAA", b"") + b"next request\n")
    args = {"cluster_id": "c1", "files": [[str(a), "640"], [str(b), "600"]]}
    assert put_files(args, stream, io.BytesIO()) == {"written": 2}
    assert stream.read() == b"next request\n"  # read up to its end, not a byte more
    assert (a.read_bytes(), b.read_bytes()) == (b"AAAA", b"")
    assert a.stat().st_mode & 0o777 == 0o640

    # The connection goes in the middle of c.bin: neither it nor its temp file is left.
    c = tmp_path / "c.bin"
    cut = io.BytesIO(frame(b"D", b"first piece") + frame(b"D", b"sec")[:-1])
    with pytest.raises(EOFError):
        put_files({"cluster_id": "c1", "files": [[str(c), "644"]]}, cut, io.BytesIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin", "home"]


def test_put_files_names_a_file_it_cannot_write_and_stays_in_step(
    home: Path, tmp_path: Path
) -> None:
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere: a file in the way instead
        (tmp_path / "ro").rmdir()
        (tmp_path / "ro").write_text("not a directory")
    bad, good = tmp_path / "ro" / "x.bin", tmp_path / "y.bin"
    stream = io.BytesIO(_frames(b"xx", b"yy") + b"next request\n")
    args = {"cluster_id": "c1", "files": [[str(bad), "644"], [str(good), "644"]]}
    with pytest.raises(OSError, match=f"could not write {bad}"):
        put_files(args, stream, io.BytesIO())
    assert stream.read() == b"next request\n"
    assert not good.exists()  # after the first failure the rest is read, not written


def test_a_guarded_put_refuses_this_nodes_own_files_even_through_a_link(
    home: Path, tmp_path: Path
) -> None:
    (home / ".ssh").mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keys").symlink_to(home / ".ssh")
    for path in (home / ".ssh" / "authorized_keys", target / "keys" / "authorized_keys"):
        files = {str(path): [4, _digest(b"evil")]}
        with pytest.raises(PermissionError, match=r"among the cluster's own files on this node"):
            put_begin({"cluster_id": "c1", "files": files, "guard": True})
    inside = {"cluster_id": "c1", "dirs": [str(home / ".clusterbook" / "x")], "files": {}}
    with pytest.raises(PermissionError, match=r"\.clusterbook"):
        put_begin({**inside, "guard": True})
    assert not (home / ".clusterbook" / "x").exists()
    # A put of the head's own paths is not guarded: a user may send their ssh config.
    files = {str(home / ".ssh" / "config"): [4, _digest(b"Host")]}
    assert put_begin({"cluster_id": "c1", "files": files}) == {
        "need": [str(home / ".ssh" / "config")]
    }
