"""Files for nodes without a shared filesystem: the head's side of ``put()`` and ``gather()``
(the exchanges), with the node tasks run here on temp directories."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from clusterbook.errors import ClusterError, ConfigError, SSHConnectError
from clusterbook.nodes.outgoing import CHUNK, outgoing
from clusterbook.nodes.tasks.files import put_begin, read_frame
from clusterbook.nodes.tasks.session import STREAMS, TASKS
from clusterbook.nodes.transfer import fetch, fetch_all, gather_into, send


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's home (the node tasks keep their log in ~/.clusterbook/clusters/ID)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".clusterbook" / "clusters" / "c1").mkdir(parents=True)
    return tmp_path / "home"


def test_fetch_through_a_symlinked_directory_stores_through_it(tmp_path: Path) -> None:
    node = tmp_path / "node-real"
    node.mkdir()
    (node / "out.txt").write_text("from the node")
    head = tmp_path / "head-real"
    head.mkdir()
    link = tmp_path / "link"
    link.symlink_to(head)

    def call(task: str, args: dict, timeout: float, **streams) -> object:  # type: ignore[no-untyped-def]
        # The node has the link's target at the real path only (what a rank wrote to).
        args = dict(args)
        if task == "gather_files":
            assert args["directories"] == [str(link), str(head)]
            args["directories"] = [str(tmp_path / "missing"), str(node)]
        return _in_process(task, args, **streams)

    stored: list[Path] = []
    fetch(call, link, [], "n1", stored.append)
    assert stored == [link / "out.txt"]
    assert (head / "out.txt").read_text() == "from the node"
    assert not (node / "out.txt").exists()


# -- the exchanges, against the node tasks run here on a node that "lives" under a root ----


def _in_process(task: str, args, frames=(), on_frame=None):  # type: ignore[no-untyped-def]
    """A node task run here, as a node's session runs it: with the frames sent after the
    request, and those it sends before its reply told to ``on_frame``."""
    if task not in STREAMS:
        return TASKS[task](args)
    out = io.BytesIO()
    result = STREAMS[task](args, io.BytesIO(b"".join(frames)), out)
    out.seek(0)
    while out.tell() < len(out.getvalue()) and (got := read_frame(out))[0] != b"Z":
        on_frame(*got)
    return result


def _node_at(head: Path, root: Path, fail_on: str | None = None):  # type: ignore[no-untyped-def]
    """A ``Call`` to the node tasks run in this process, for a node whose filesystem is
    ``root``: paths under ``head`` are moved there on the way in and back on the way out."""

    def move(value, src: str, dst: str):  # type: ignore[no-untyped-def]
        if isinstance(value, str):
            return dst + value[len(src) :] if value.startswith(src) else value
        if isinstance(value, list):
            return [move(v, src, dst) for v in value]
        if isinstance(value, dict):
            return {move(k, src, dst): move(v, src, dst) for k, v in value.items()}
        return value

    def call(task: str, args, timeout: float, frames=(), on_frame=None):  # type: ignore[no-untyped-def]
        if task == fail_on:
            raise ConnectionError(f"lost the node during {task}")

        def told(kind: bytes, payload: bytes) -> None:
            if kind == b"W":  # the node's directory
                payload = json.dumps(move(json.loads(payload), str(root), str(head))).encode()
            if fail_on == f"{task} after {kind.decode()}":
                raise ConnectionError(f"lost the node during {task}")
            on_frame(kind, payload)

        args = move(dict(args), str(head), str(root))
        return move(_in_process(task, args, frames, told), str(root), str(head))

    return call


def test_send_then_fetch_move_files_through_the_node_tasks(home: Path, tmp_path: Path) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    (head / "proj" / "data").mkdir(parents=True)
    big = os.urandom(2 * CHUNK + 7)
    (head / "proj" / "data" / "big.bin").write_bytes(big)
    (head / "proj" / "run.py").write_text("print(1)")
    call = _node_at(head, root)
    sent = outgoing([head / "proj"])
    assert send(call, "c1", sent) == 2
    assert (root / "proj" / "data" / "big.bin").read_bytes() == big
    assert (root / "proj" / "run.py").read_text() == "print(1)"
    assert send(call, "c1", sent) == 0  # the node has them now: nothing is sent again

    (root / "proj" / "out").mkdir()
    (root / "proj" / "out" / "r0.bin").write_bytes(big[::-1])
    arrived: list[Path] = []
    fetch(call, head / "proj" / "out", [], "n1", arrived.append)
    assert arrived == [head / "proj" / "out" / "r0.bin"]
    assert arrived[0].read_bytes() == big[::-1]
    assert list((root / "proj" / "out").iterdir()) == []


def test_a_fetch_cut_short_loses_nothing(home: Path, tmp_path: Path) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    (root / "out").mkdir(parents=True)
    (root / "out" / "r0.bin").write_bytes(b"result")
    arrived: list[Path] = []
    with pytest.raises(ConnectionError):
        fetch(
            _node_at(head, root, fail_on="gather_files after D"),
            head / "out",
            [],
            "n1",
            arrived.append,
        )
    assert arrived == []
    assert (root / "out" / "r0.bin").read_bytes() == b"result"  # still on the node
    assert list((head / "out").iterdir()) == []  # and no half file here


def test_a_file_that_shrinks_while_put_is_dropped_on_the_node(home: Path, tmp_path: Path) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    head.mkdir()
    (head / "f.bin").write_bytes(b"x" * (3 * CHUNK))
    sent = outgoing([head / "f.bin"])
    (head / "f.bin").write_bytes(b"x" * (CHUNK + 1))
    with pytest.raises(ConfigError, match="shrank"):
        send(_node_at(head, root), "c1", sent)
    assert list(root.iterdir()) == []  # no part of it, under any name


def test_a_put_cut_off_mid_file_names_the_file(home: Path, tmp_path: Path) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    head.mkdir()
    (head / "small.txt").write_text("s")
    (head / "big.bin").write_bytes(os.urandom(2 * CHUNK))
    node = _node_at(head, root)

    def call(task: str, args, timeout: float, frames=()):  # type: ignore[no-untyped-def]
        if task != "put_files":
            return node(task, args, timeout)
        for count, _ in enumerate(frames):
            if count == 2:  # a piece of big.bin went (files go by name)
                raise SSHConnectError("Lost the connection to n1: EOF.", host="n1")
        raise AssertionError("not cut")

    with pytest.raises(ClusterError, match=re.escape(f"{head / 'big.bin'} was not sent whole")):
        send(call, "c1", outgoing([head]))


def test_gather_moves_nested_directories_and_keeps_what_the_head_has(
    home: Path, tmp_path: Path
) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    out = root / "out"
    for rel, text in [
        ("top.txt", "t"),
        ("a/b/deep.txt", "d"),
        ("a/same.txt", "node's"),
        ("a/.hidden", "h"),
        (".cache/x", "x"),
        ("a/c/only.txt", "o"),
    ]:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    (out / "a" / "link").symlink_to(out / "top.txt")
    (head / "out" / "a").mkdir(parents=True)
    (head / "out" / "a" / "same.txt").write_text("head's")
    arrived: list[Path] = []
    gather_into(
        lambda target, skip, receiving: fetch_all(
            {"n1": _node_at(head, root)}, target, skip, receiving
        ),
        head / "out",
    )
    arrived = sorted(p for p in (head / "out").rglob("*") if p.is_file())
    assert [str(p.relative_to(head / "out")) for p in arrived] == [
        "a/b/deep.txt",
        "a/c/only.txt",
        "a/same.txt",
        "top.txt",
    ]
    assert (head / "out" / "a" / "same.txt").read_text() == "head's"  # never overwritten
    assert (head / "out" / "a" / "b" / "deep.txt").read_text() == "d"
    # Moved: what the head took is gone there, with the directories it leaves empty.
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert left == [".cache", ".cache/x", "a", "a/.hidden", "a/link", "a/same.txt"]


def test_a_gather_cut_off_mid_file_names_it_and_keeps_no_part(home: Path, tmp_path: Path) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    (root / "out").mkdir(parents=True)
    (root / "out" / "r0.bin").write_bytes(os.urandom(3 * CHUNK))
    node = _node_at(head, root)

    def call(task: str, args, timeout: float, on_frame=None):  # type: ignore[no-untyped-def]
        if task != "gather_files":
            return node(task, args, timeout)

        def cut(kind: bytes, payload: bytes) -> None:
            on_frame(kind, payload)
            if kind == b"D":
                raise SSHConnectError("Lost the connection to n1: EOF.", host="n1")

        return node(task, args, timeout, on_frame=cut)

    with pytest.raises(ClusterError, match=r"r0\.bin did not arrive whole.*n1 still has it"):
        fetch(call, head / "out", [], "n1", pytest.fail)
    assert list((head / "out").iterdir()) == []
    assert (root / "out" / "r0.bin").stat().st_size == 3 * CHUNK


def test_put_checks_sha256_only_of_files_a_node_has_with_their_size(
    home: Path, tmp_path: Path
) -> None:
    head, root = tmp_path / "head", tmp_path / "node"
    head.mkdir()
    for name, data in [("same.bin", b"12345"), ("other.bin", b"abcde"), ("new.bin", b"n")]:
        (head / name).write_bytes(data)
    (root / "head").mkdir(parents=True)
    (root / "head" / "same.bin").write_bytes(b"12345")  # the same bytes: left alone
    (root / "head" / "other.bin").write_bytes(b"ABCDE")  # its size, other bytes: replaced
    (root / "head" / "same.bin").chmod(0o400)
    sent = outgoing([head], digests=False)
    assert {f.digest for f in sent.files} == {""}  # nothing read yet
    there = {str(root / "head" / Path(f.path).name): [f.size, None] for f in sent.files}
    asked = put_begin({"cluster_id": "c1", "files": there})
    assert asked["need"] == [str(root / "head" / "new.bin")]
    assert sorted(Path(p).name for p in asked["digests"]) == ["other.bin", "same.bin"]
    assert send(_node_at(tmp_path, tmp_path / "node"), "c1", sent) == 2
    assert (root / "head" / "other.bin").read_bytes() == b"abcde"
    assert (root / "head" / "new.bin").read_bytes() == b"n"
    assert (root / "head" / "same.bin").stat().st_mode & 0o777 == 0o400  # not written again


def test_a_file_the_node_cannot_read_whole_is_named_and_the_others_arrive(tmp_path: Path) -> None:
    def call(task: str, args, timeout: float, on_frame=None):  # type: ignore[no-untyped-def]
        if task == "gather_done":
            assert args == {"directory": "/there", "names": ["b.txt"]}
            return {}
        for kind, payload in [
            (b"W", b'"/there"'),
            (b"H", b'{"name": "a.bin", "size": 9}'),
            (b"D", b"part"),
            (b"X", b"a.bin: Input/output error"),
            (b"H", b'{"name": "b.txt", "size": 1}'),
            (b"D", b"b"),
            (b"E", b""),
        ]:
            on_frame(kind, payload)
        return {"directory": "/there"}

    stored: list[Path] = []
    with pytest.raises(ClusterError, match=r"could not read a\.bin: Input/output error there"):
        fetch(call, tmp_path, [], "n1", stored.append)
    assert stored == [tmp_path / "b.txt"]
    assert sorted(os.listdir(tmp_path)) == ["b.txt"]  # no part of a.bin, no temp file


@pytest.mark.root
def test_a_gather_onto_a_full_disk_keeps_no_part_here_and_leaves_the_file_on_its_node(
    home: Path, small_disk: Path, tmp_path: Path
) -> None:
    head, root = small_disk / "head", tmp_path / "node"
    (root / "out").mkdir(parents=True)
    big = os.urandom(3 * CHUNK)  # more than the 512 KiB disk holds
    (root / "out" / "big.bin").write_bytes(big)
    (root / "out" / "small.txt").write_text("fits")
    arrived: list[Path] = []
    with pytest.raises(ClusterError, match=r"big\.bin.*no space left.*n1 still has it"):
        fetch(_node_at(head, root), head / "out", [], "n1", arrived.append)
    assert arrived == [head / "out" / "small.txt"]
    assert os.listdir(head / "out") == ["small.txt"]  # no part of it, hidden or not
    assert (root / "out" / "big.bin").read_bytes() == big
    assert not (root / "out" / "small.txt").exists()  # moved: it arrived whole
