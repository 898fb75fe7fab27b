"""Files for nodes without a shared filesystem: the head's side (what to send, where results
land) and the node tasks ``put``, ``gather`` and ``cleanup``, run here on temp directories."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from clusterbook import _node_tasks as tasks
from clusterbook.errors import ConfigError
from clusterbook.ssh.bootstrap import encode_files
from clusterbook.transfer import outgoing, store_gathered


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's home (the node tasks keep their log in ~/.clusterbook/clusters/ID)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".clusterbook" / "clusters" / "c1").mkdir(parents=True)
    return tmp_path / "home"


def test_outgoing_walks_directories_and_keeps_modes(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.sh").write_text("echo a")
    (tmp_path / "d" / "sub" / "a.sh").chmod(0o750)
    (tmp_path / "d" / "empty").mkdir()
    (tmp_path / "f.txt").write_bytes(b"\x00bytes\n")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")  # not followed
    sent = outgoing([tmp_path / "d", str(tmp_path / "f.txt")])
    d = str(tmp_path / "d")
    assert sent.dirs == (d, f"{d}/empty", f"{d}/sub")
    assert sent.files == {
        f"{d}/sub/a.sh": ("750", b"echo a"),
        str(tmp_path / "f.txt"): (
            format((tmp_path / "f.txt").stat().st_mode & 0o777, "o"),
            b"\x00bytes\n",
        ),
    }


@pytest.mark.parametrize("bad", ["no-such-thing", "/dev/null"])
def test_outgoing_refuses_what_is_not_a_file_or_directory(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        outgoing([tmp_path / bad if not bad.startswith("/") else bad])


def test_put_writes_then_cleanup_removes_only_what_it_created(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "work"
    (target / "kept").mkdir(parents=True)
    (target / "kept" / "same.txt").write_text("same")  # already there, same bytes
    (target / "kept" / "old.txt").write_text("old")  # already there, other bytes
    files = {
        str(target / "kept" / "same.txt"): ("644", b"same"),
        str(target / "kept" / "old.txt"): ("644", b"new"),
        str(target / "new" / "deep" / "x.bin"): ("600", b"\xff\x00"),
    }
    args = {"cluster_id": "c1", "dirs": [str(target / "out")], "files": encode_files(files)}
    assert tasks.put(args) == {"written": 2, "created": 4}  # new, new/deep, x.bin, out
    assert (target / "new" / "deep" / "x.bin").read_bytes() == b"\xff\x00"
    assert (target / "new" / "deep" / "x.bin").stat().st_mode & 0o777 == 0o600
    assert (target / "new").stat().st_mode & 0o777 == 0o700
    assert (target / "kept" / "old.txt").read_text() == "new"
    (target / "out" / "result").write_text("a rank wrote this")  # not put's: stays

    tasks.cleanup({"cluster_id": "c1", "grace": 0.1})
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "kept",
        "kept/old.txt",
        "kept/same.txt",
        "out",
        "out/result",
    ]


def test_gather_hands_over_regular_files_and_removes_them(tmp_path: Path) -> None:
    (tmp_path / "a.pkl").write_bytes(b"A")
    (tmp_path / "have.pkl").write_bytes(b"H")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a.pkl")
    got = tasks.gather({"directory": str(tmp_path), "skip": ["have.pkl"]})
    assert got == {"files": {"a.pkl": base64.b64encode(b"A").decode()}}
    assert sorted(os.listdir(tmp_path)) == ["have.pkl", "link", "sub"]
    assert tasks.gather({"directory": str(tmp_path / "none")}) == {"files": {}}


def test_store_gathered_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "r.pkl").write_bytes(b"head")
    stored = store_gathered(tmp_path, {"n1": {"r.pkl": b"one", "s": b"s1"}, "n2": {"s": b"s2"}})
    assert [p.name for p in stored] == ["r.pkl.from-n1", "s", "s.from-n2"]
    assert (tmp_path / "r.pkl").read_bytes() == b"head"
    assert (tmp_path / "s.from-n2").read_bytes() == b"s2"
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="already has both"):
        store_gathered(tmp_path, {"n1": {"r.pkl": b"again"}})
    with pytest.raises(ConfigError, match=r"'\.\./x'"):
        store_gathered(tmp_path, {"n1": {"../x": b"evil"}})
