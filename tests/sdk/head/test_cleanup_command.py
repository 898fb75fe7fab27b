"""Unit tests of ``clusterbook cleanup ID`` on this machine: the directory it removes is named
by the cluster's id (as ``clusterbook ls`` shows it); a name ls still lists stands for it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.head.clean import clean_cluster
from clusterbook.head.record import ClusterRecord, write_record
from clusterbook.paths import cluster_dir


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CLUSTERBOOK_RUN_ROOT", str(tmp_path / "runs"))
    return home


def _cluster(tmp_path: Path, cluster_id: str, name: str) -> Path:
    run = tmp_path / "runs" / cluster_id
    run.mkdir(parents=True)
    write_record(ClusterRecord(
        id=cluster_id, name=name, kind="ssh", state="stopped", directory=str(run),
        created=1.0, head_pid=os.getpid(), head_host=socket.gethostname(),
    ))  # fmt: skip
    directory = cluster_dir(cluster_id)
    directory.mkdir(parents=True)
    (directory / "token").write_text("x")
    return directory


def test_cleanup_removes_the_directory_named_by_the_id(home, tmp_path) -> None:
    mine = _cluster(tmp_path, "train-20261123-101500", "train")
    other = _cluster(tmp_path, "train-20261123-101500-2", "train")
    done = clean_cluster("train-20261123-101500")["localhost"]
    assert not isinstance(done, Exception), done
    assert done["dir_removed"]
    assert not mine.exists()
    assert other.exists()  # the same name, another cluster


def test_cleanup_takes_a_name_ls_lists_for_the_newest_cluster_of_that_name(home, tmp_path) -> None:
    directory = _cluster(tmp_path, "ssh-1a2b3c-20261123-101500", "ssh-1a2b3c")
    done = clean_cluster("ssh-1a2b3c")["localhost"]
    assert not isinstance(done, Exception), done
    assert not directory.exists()


@pytest.mark.parametrize("bad", ["../etc", "..", ".hidden", "a/b", ""])
def test_cleanup_refuses_what_is_not_an_id(home, bad: str) -> None:
    with pytest.raises(cb.ConfigError, match=r"is not a cluster id \(1-127 letters"):
        clean_cluster(bad)
    with pytest.raises(cb.ConfigError, match="is not a cluster id"):
        cluster_dir(bad)
