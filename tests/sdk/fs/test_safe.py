"""Unit tests of opening and removing files where others may write: no link followed, nothing
removed outside the directory it must be in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.fs.safe import inside, locked, open_regular, remove_tree, touch


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


def test_a_file_is_made_new_with_its_mode_or_opened_as_it_is(tmp_path) -> None:
    path = tmp_path / "lock"
    os.close(open_regular(path, create=True))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text("kept")
    os.close(open_regular(path, create=True))
    assert path.read_text() == "kept"  # never truncated
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent")


def test_a_link_is_refused_and_its_target_left_alone(tmp_path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "lock").symlink_to(victim)
    with pytest.raises(cb.UnsafePathError, match=r"lock: it is a symbolic link") as info:
        open_regular(tmp_path / "lock", create=True)
    assert info.value.path == str(tmp_path / "lock")
    assert victim.read_text() == "precious\n"
    (tmp_path / "stop").symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(cb.UnsafePathError, match="symbolic link"):
        touch(tmp_path / "stop")
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_fifo_or_a_directory_is_refused_without_waiting(tmp_path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(cb.UnsafePathError, match="not a regular file"):
        open_regular(tmp_path / "fifo", create=True)  # no reader: a plain open would hang
    (tmp_path / "dir").mkdir()
    with pytest.raises(cb.UnsafePathError, match="a directory"):
        open_regular(tmp_path / "dir", create=True)


def test_a_lock_held_elsewhere_is_waited_for_until_its_deadline(tmp_path) -> None:
    path = tmp_path / ".stop.lock"
    held = r"has held .*\.stop\.lock for 0\.1 s"
    with locked(path, timeout=1.0), pytest.raises(cb.ClusterStateError, match=held):
        _take(path, 0.1)
    _take(path, 0.1)  # released with the first: taken at once


def _take(path: Path, timeout: float) -> None:
    with locked(path, timeout):
        assert path.stat().st_size == 0


def test_inside_means_below_the_root_once_resolved(tmp_path) -> None:
    (tmp_path / "root" / "jobs").mkdir(parents=True)
    (tmp_path / "root" / "out").symlink_to(tmp_path)
    assert inside(tmp_path / "root" / "jobs", tmp_path / "root")
    assert not inside(tmp_path / "root", tmp_path / "root")
    assert not inside(tmp_path / "root" / "jobs" / ".." / "..", tmp_path / "root")
    assert not inside(tmp_path / "root" / "out" / "x", tmp_path / "root")


def test_a_tree_inside_its_root_is_removed_and_nothing_else(tmp_path) -> None:
    root = tmp_path / "run"
    job = root / "jobs" / "job-0001"
    (job / "raw").mkdir(parents=True)
    (job / "rank-0.log").write_text("x")
    victim = _victim(tmp_path)
    (job / "raw" / "link").symlink_to(victim)  # a link inside is removed, not followed
    assert remove_tree(job, root)
    assert not job.exists()
    assert victim.read_text() == "precious\n"
    assert not remove_tree(job, root)  # gone already: nothing to do


@pytest.mark.parametrize("where", ["outside", "parent", "root", "link", "through-link"])
def test_a_tree_elsewhere_is_refused(tmp_path, where: str) -> None:
    root, keep = tmp_path / "run", tmp_path / "keep"
    (root / "jobs").mkdir(parents=True)
    keep.mkdir()
    (keep / "file").write_text("x")
    (root / "jobs" / "link").symlink_to(keep)
    (root / "linked").symlink_to(tmp_path)
    path = {
        "outside": keep,
        "parent": root / "jobs" / ".." / "..",
        "root": root,
        "link": root / "jobs" / "link",
        "through-link": root / "linked" / "keep",
    }[where]
    with pytest.raises(cb.UnsafePathError, match="Refusing"):
        remove_tree(path, root)
    assert (keep / "file").exists()
    assert (root / "jobs").exists()


def test_the_root_itself_is_removed_only_when_asked(tmp_path) -> None:
    root = tmp_path / "run"
    (root / "jobs").mkdir(parents=True)
    assert remove_tree(root, root, itself=True)
    assert not root.exists()
    assert tmp_path.exists()
