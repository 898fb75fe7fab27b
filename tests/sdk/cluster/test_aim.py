"""Aiming at some nodes or at a path: ``run_on_nodes(nodes=)``, ``put(dest=)`` and
``write()`` on a cluster whose nodes share this machine's files (``FakeProvider``), and the
bad input each refuses before anything reaches a node."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.nodes.here import put_here
from clusterbook.nodes.outgoing import OutFile, Outgoing
from clusterbook.nodes.transfer import uncounted
from clusterbook.testing import FakeProvider
from tests.conftest import require
from tests.sdk.cluster.test_facade import STAND_IN


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    """An mpirun that says it is Open MPI (no job runs here)."""
    path = tmp_path / "bin" / "mpirun"
    path.parent.mkdir()
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str) -> Iterator[cb.Cluster]:
    """A started cluster of two nodes on this machine, its jobs' directory ``tmp_path/work``."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    provider = FakeProvider(nodes=2)
    options = ClusterOptions.make(provider.kind, launcher=launcher, run_dir=tmp_path / "run")
    made = cb.Cluster(provider, options)
    made.start()
    yield made
    made.stop()


def test_run_on_nodes_runs_on_the_nodes_named(cluster: cb.Cluster) -> None:
    assert cluster.run_on_nodes(["echo", "hi"], nodes=["fake-1"]).node.tolist() == ["fake-1"]
    assert cluster.run_on_nodes(["true"], nodes="fake-0").node.tolist() == ["fake-0"]
    assert cluster.run_on_nodes(["true"], nodes=None).node.tolist() == ["fake-0", "fake-1"]


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        (
            ["fake-0", "fake-9"],
            r"'fake-9' is not a node of the cluster; its nodes are fake-0, fake-1",
        ),
        ([], r"no node is not a node.*fake-0, fake-1"),
        ([0], r"give node names, like nodes=\['fake-0'\]"),
    ],
)
def test_run_on_nodes_refuses_names_that_are_not_nodes_listing_them(
    cluster: cb.Cluster, nodes: object, said: str
) -> None:
    with pytest.raises(cb.ConfigError, match=said):
        cluster.run_on_nodes(["true"], nodes=nodes)  # type: ignore[arg-type]


def test_put_to_a_relative_dest_lands_in_the_jobs_directory(
    cluster: cb.Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("A")
    (tmp_path / "b.txt").write_text("B")
    work = tmp_path / "work"
    cluster.put(src, dest="data")  # one path: at dest, a directory's contents in it
    assert (work / "data" / "sub" / "a.txt").read_text() == "A"
    cluster.put(tmp_path / "b.txt", dest="into/")  # a trailing '/': into it, by its name
    assert (work / "into" / "b.txt").read_text() == "B"
    cluster.put(tmp_path / "b.txt", src, dest="both")  # several: each by its name
    assert (work / "both" / "b.txt").read_text() == "B"
    assert (work / "both" / "src" / "sub" / "a.txt").read_text() == "A"
    cluster.put(tmp_path / "b.txt", dest=tmp_path / "abs.txt")
    assert (tmp_path / "abs.txt").read_text() == "B"


@pytest.mark.parametrize(
    ("dest", "said"),
    [
        ("../outside", "a relative dest stays inside the directory jobs run in"),
        ("a/../../outside", "a relative dest stays inside the directory jobs run in"),
        ("~/.ssh/authorized_keys", "among the cluster's own files"),
        ("~/.clusterbook/clusters/x", "among the cluster's own files"),
        ("", "give a path on the nodes"),
    ],
)
def test_put_refuses_a_dest_that_leaves_the_jobs_directory_or_names_the_clusters_files(
    cluster: cb.Cluster, tmp_path: Path, dest: str, said: str
) -> None:
    (tmp_path / "b.txt").write_text("B")
    with pytest.raises(cb.ConfigError, match=said):
        cluster.put(tmp_path / "b.txt", dest=dest)
    assert not (tmp_path / "outside").exists()


def test_put_refuses_a_dest_that_leads_to_the_users_ssh_files_through_a_link(
    cluster: cb.Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "work" / "keys").symlink_to(home / ".ssh")
    with pytest.raises(cb.ClusterError, match="among the cluster's own files on this node"):
        cluster.write("keys/authorized_keys", b"ssh-ed25519 AAAA")
    assert list((home / ".ssh").iterdir()) == []


def test_put_refuses_a_dest_in_the_clusters_run_directory(
    cluster: cb.Cluster, tmp_path: Path
) -> None:
    (tmp_path / "b.txt").write_text("B")
    with pytest.raises(cb.ConfigError, match="among the cluster's own files"):
        cluster.put(tmp_path / "b.txt", dest=cluster.run_dir / "token")


def test_write_puts_bytes_or_text_at_a_path_with_its_mode(
    cluster: cb.Cluster, tmp_path: Path
) -> None:
    cluster.write("conf/settings.toml", "x = 'é'\n")
    written = tmp_path / "work" / "conf" / "settings.toml"
    assert written.read_bytes() == "x = 'é'\n".encode()
    assert written.stat().st_mode & 0o777 == 0o644
    cluster.write(written, b"\x00secret", nodes=["fake-1"], mode=0o600)  # replaced
    assert written.read_bytes() == b"\x00secret"
    assert written.stat().st_mode & 0o777 == 0o600
    inode = written.stat().st_ino
    cluster.write(written, b"\x00secret", mode=0o600)  # the same bytes: left as it is
    assert written.stat().st_ino == inode
    assert [p.name for p in written.parent.iterdir()] == ["settings.toml"]  # no temp file


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("x", 3), "takes bytes, or str"),
        (("x", b"", "fake-7"), "'fake-7' is not a node of the cluster"),
        (("dir/", b""), "give the path of a file, not a directory"),
        (("../x", b""), "a relative dest stays inside"),
    ],
)
def test_write_refuses_bad_input_naming_it(
    cluster: cb.Cluster, args: tuple[object, ...], said: str
) -> None:
    with pytest.raises(cb.ConfigError, match=said):
        cluster.write(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [0o1777, -1, True, "644"])
def test_write_refuses_a_mode_that_is_not_permission_bits(
    cluster: cb.Cluster, mode: object
) -> None:
    with pytest.raises(cb.ConfigError, match=r"permission bits, 0 to 0o777"):
        cluster.write("x", b"", mode=mode)  # type: ignore[arg-type]


def test_a_file_cut_short_leaves_what_was_there_and_no_temp_file(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"short")
    target = tmp_path / "there" / "file"
    target.parent.mkdir()
    target.write_bytes(b"before")
    # It says it has more bytes than it has: it shrank while being sent.
    cut = OutFile(str(target), "644", 1 << 21, "", str(source))
    with pytest.raises(cb.ConfigError, match="shrank"):
        put_here(Outgoing((), (cut,)), uncounted)
    assert [p.name for p in target.parent.iterdir()] == ["file"]
    assert target.read_bytes() == b"before"


def test_a_full_disk_leaves_what_was_there_and_no_temp_file(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True, timeout=30
    )
    try:
        (disk / "file").write_bytes(b"before")
        source = tmp_path / "big"
        source.write_bytes(b"x" * (1 << 20))
        big = OutFile(str(disk / "file"), "644", 1 << 20, "", str(source))
        with pytest.raises(cb.ClusterError, match=r"could not write .*/disk/file on this machine"):
            put_here(Outgoing((), (big,)), uncounted)
        assert [p.name for p in disk.iterdir()] == ["file"]
        assert (disk / "file").read_bytes() == b"before"
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)
