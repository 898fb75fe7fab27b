"""What ``put()`` sends: the files under the paths given, their modes and digests, in pieces."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from clusterbook.errors import ConfigError
from clusterbook.nodes.outgoing import OutFile, outgoing, pieces


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    mode = format((tmp_path / "f.txt").stat().st_mode & 0o777, "o")
    assert sent.files == (
        OutFile(f"{d}/sub/a.sh", "750", 6, _digest(b"echo a")),
        OutFile(str(tmp_path / "f.txt"), mode, 7, _digest(b"\x00bytes\n")),
    )


@pytest.mark.parametrize("bad", ["no-such-thing", "/dev/null"])
def test_outgoing_refuses_what_is_not_a_file_or_directory(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        outgoing([tmp_path / bad if not bad.startswith("/") else bad])


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, [(0, 0, True)]),
        (10, [(0, 4, False), (4, 4, False), (8, 2, True)]),
        (8, [(0, 4, False), (4, 4, True)]),
    ],
)
def test_pieces_cover_the_file_once(tmp_path: Path, size: int, expected: list) -> None:  # type: ignore[type-arg]
    path = tmp_path / "f"
    path.write_bytes(bytes(range(size)))
    (file,) = outgoing([path]).files
    got = list(pieces(file, size=4))
    assert [(o, len(d), last) for o, d, last in got] == expected
    assert b"".join(d for _, d, _ in got) == bytes(range(size))


def test_a_file_that_shrank_while_sent_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    (file,) = outgoing([path]).files
    path.write_bytes(b"x" * 3)
    with pytest.raises(ConfigError, match="shrank"):
        list(pieces(file, size=4))
