"""A cluster's directory must be its user's alone (clusterbook.fs.private): the rules, and
where they are applied (a cluster's start, an attach)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.fs import private
from clusterbook.fs.private import Facts, ancestor_problem, check_run_dir, own_problem
from clusterbook.head.record import ClusterRecord, write_record

ME = os.geteuid()
OTHER = 3_999_999  # a uid no account has
DIR, FILE = stat.S_IFDIR, stat.S_IFREG


@pytest.mark.parametrize(
    ("facts", "problem"),
    [
        (Facts("/r", ME, DIR | 0o700), None),
        (Facts("/r", ME, DIR | 0o755), None),
        (Facts("/r", ME, DIR | 0o775, private_group=True), None),
        (Facts("/r", ME, DIR | 0o775), "is writable by its group (mode 0775)"),
        (Facts("/r", ME, DIR | 0o777, private_group=True), "writable by other users (mode 0777)"),
        (Facts("/r", ME, DIR | 0o1777), "writable by other users (mode 1777)"),
        (Facts("/r", OTHER, DIR | 0o700), f"is owned by uid {OTHER}"),
        (Facts("/r", ME, stat.S_IFLNK | 0o777), "is not a directory (a symbolic link)"),
        (Facts("/r", ME, FILE | 0o600), "is not a directory"),
    ],
)  # fmt: skip
def test_the_clusters_own_directory_is_owned_by_its_user_and_written_by_no_one_else(
    facts: Facts, problem: str | None
) -> None:
    found = own_problem(facts, ME, "directory")
    assert found == problem if problem is None else problem in (found or "")


def test_the_record_is_a_file_of_its_user_that_only_it_writes() -> None:
    assert own_problem(Facts("/r/cluster.json", ME, FILE | 0o644), ME, "file") is None
    assert "writable by other users" in (
        own_problem(Facts("/r/cluster.json", ME, FILE | 0o666), ME, "file") or ""
    )
    assert "not a file" in (own_problem(Facts("/r/c", ME, DIR | 0o700), ME, "file") or "")


@pytest.mark.parametrize(
    ("facts", "problem"),
    [
        (Facts("/tmp", 0, DIR | 0o1777), None),  # sticky: no one moves what is ours
        (Facts("/home", 0, DIR | 0o755), None),
        (Facts("/home/me", ME, DIR | 0o750), None),
        (Facts("/home/me", ME, DIR | 0o770, private_group=True), None),
        (Facts("/proj", 0, DIR | 0o2775), "writable by its group and not sticky"),
        (Facts("/shared", ME, DIR | 0o777), "writable by other users and not sticky"),
        (Facts("/home/you", OTHER, DIR | 0o755), f"is owned by uid {OTHER}"),
    ],
)  # fmt: skip
def test_a_directory_above_it_lets_no_one_else_move_it(facts: Facts, problem: str | None) -> None:
    found = ancestor_problem(facts, ME)
    assert found == problem if problem is None else problem in (found or "")


def test_a_shared_run_directory_is_refused_naming_it_its_mode_and_the_fix(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(cb.UnsafePathError) as info:
        check_run_dir(shared)
    assert info.value.path == str(shared)
    assert info.value.mode == 0o777
    assert info.value.owner == ME
    message = str(info.value)
    assert f"run directory {shared} is writable by other users (mode 0777)" in message
    assert f"chmod go-w {shared}" in message
    assert isinstance(info.value, cb.ConfigError)
    shared.chmod(0o700)
    check_run_dir(shared)


def test_a_run_directory_under_a_directory_others_can_write_is_refused(tmp_path) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    mine = tmp_path / "open" / "mine"
    mine.mkdir(mode=0o700)
    with pytest.raises(cb.UnsafePathError, match=r"writable by other users and not sticky"):
        check_run_dir(mine)
    (tmp_path / "open").chmod(0o1777)  # sticky, as /tmp
    check_run_dir(mine)


def test_a_record_others_can_write_and_a_shared_run_root_are_refused(tmp_path) -> None:
    run_dir, root = tmp_path / "c", tmp_path / "runs"
    run_dir.mkdir(mode=0o700)
    root.mkdir(mode=0o700)
    write_record(ClusterRecord("c", "c", "local", "running", str(run_dir), created=1.0))
    check_run_dir(run_dir, root)
    (run_dir / "cluster.json").chmod(0o666)
    with pytest.raises(cb.UnsafePathError, match=r"record .*cluster.json is writable by other"):
        check_run_dir(run_dir)
    (run_dir / "cluster.json").chmod(0o644)
    root.chmod(0o770)
    group_private = private._private_group(root.stat().st_gid, ME)
    if not group_private:
        with pytest.raises(cb.UnsafePathError, match=r"run root .*runs is writable by its group"):
            check_run_dir(run_dir, root)
    root.chmod(0o777)
    with pytest.raises(cb.UnsafePathError, match=r"run root .*runs is writable by other users"):
        check_run_dir(run_dir, root)


def test_a_link_to_the_run_directory_is_followed_and_its_target_checked(tmp_path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o777)
    real.chmod(0o777)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(cb.UnsafePathError, match=rf"{real} \(from {tmp_path / 'link'}\)"):
        check_run_dir(tmp_path / "link")


def test_a_cluster_does_not_start_in_a_shared_run_dir_and_puts_nothing_there(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cluster = cb.Cluster.local(1, 1, python=sys.executable, run_dir=shared)
    with pytest.raises(cb.UnsafePathError, match="writable by other users"):
        cluster.start()
    assert list(shared.iterdir()) == []
    assert cluster.state != "running"


def test_attach_refuses_a_cluster_whose_directory_became_shared(tmp_path) -> None:
    run_dir = tmp_path / "c"
    run_dir.mkdir(mode=0o700)
    write_record(ClusterRecord("c", "c", "local", "stopped", str(run_dir), created=1.0))
    assert cb.Cluster.attach(str(run_dir)).state == "stopped"
    run_dir.chmod(0o777)
    with pytest.raises(cb.UnsafePathError, match="writable by other users"):
        cb.Cluster.attach(str(run_dir))
    Path(run_dir).chmod(0o700)
