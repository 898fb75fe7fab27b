"""A cluster's place on a node: install, status, clean-up and release, against a private home
directory."""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterbook.nodes.tasks.common import key_tag
from clusterbook.nodes.tasks.install import cleanup, install, release


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def files(**named: tuple[str, bytes]) -> dict[str, list[str]]:
    return {k: [mode, base64.b64encode(data).decode()] for k, (mode, data) in named.items()}


def test_install_writes_files_with_modes_and_adds_the_key_once(home):
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine")  # no newline
    args = {
        "cluster_id": "c1",
        "files": files(id_ed25519=("600", b"secret"), known_hosts=("644", b"node1 k\n")),
        "authorized_key": "ssh-ed25519 BBBB clusterbook:c1",
    }
    out = install(args)
    install(args)  # idempotent
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert out["dir"] == str(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "id_ed25519").stat().st_mode) == 0o600
    assert (directory / "id_ed25519").read_bytes() == b"secret"
    assert stat.S_IMODE((directory / "known_hosts").stat().st_mode) == 0o644
    keys = (home / ".ssh" / "authorized_keys").read_text()
    assert keys == "ssh-ed25519 AAAA mine\nssh-ed25519 BBBB clusterbook:c1\n"
    # and the marker that says this node (by hostname) is in the cluster
    marker = f"node-{socket.gethostname()}"
    assert sorted(p.name for p in directory.iterdir()) == ["id_ed25519", "known_hosts", marker]


def test_the_head_gets_no_marker(home):
    install({"cluster_id": "c1", "files": {}, "authorized_key": None})
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert list(directory.iterdir()) == []


def installed(home: Path, cluster: str = "c1") -> Path:
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    install(
        {
            "cluster_id": cluster,
            "files": files(id_ed25519=("600", b"secret"), token=("600", b"t")),
            "authorized_key": f"ssh-ed25519 BBBB clusterbook:{cluster}",
        }
    )
    return home / ".clusterbook" / "clusters" / cluster


def test_release_removes_what_install_put_when_no_other_node_shares_the_home(home):
    directory = installed(home)
    done = release({"cluster_id": "c1", "tag": key_tag("c1")})
    assert done["kept_for"] == []
    assert done["keys_removed"] == 1
    assert not directory.exists()
    assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"


def test_release_keeps_a_shared_home_for_the_nodes_still_in_the_cluster(home):
    directory = installed(home)
    (directory / "node-othernode").write_bytes(b"")  # a node sharing this home (NFS)
    done = release({"cluster_id": "c1", "tag": key_tag("c1")})
    assert done["kept_for"] == ["node-othernode"]
    assert sorted(p.name for p in directory.iterdir()) == ["id_ed25519", "node-othernode", "token"]
    assert "clusterbook:c1" in (home / ".ssh" / "authorized_keys").read_text()
    # The last node out removes it all.
    (directory / "node-othernode").unlink()
    assert release({"cluster_id": "c1", "tag": key_tag("c1")})["keys_removed"] == 1
    assert not directory.exists()


def test_release_of_a_cluster_that_left_nothing_is_harmless(home):
    done = release({"cluster_id": "gone", "tag": key_tag("gone")})
    assert done == {"killed": [], "keys_removed": 0, "kept_for": []}


def test_install_creates_ssh_dir_private(home):
    install({"cluster_id": "c1", "files": {}, "authorized_key": "k clusterbook:c1"})
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".ssh" / "authorized_keys").stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", ["../x", ".hidden", "", "a/b/c", "a/../b", "/abs", "a/.b"])
def test_install_refuses_bad_names(home, bad):
    with pytest.raises(ValueError, match="is not a cluster id"):
        install({"cluster_id": bad, "files": {}})
    with pytest.raises(ValueError, match="bad file name"):
        install(
            {"cluster_id": "c1", "files": files(**{"x": ("600", b"")}) | {bad or "/": ["600", ""]}}
        )
    with pytest.raises(ValueError, match="bad file name"):
        install({"cluster_id": "c1", "files": {}, "links": {bad or "/": "/opt"}})


def test_install_makes_one_level_of_subdirectory_and_links(home, tmp_path):
    env = tmp_path / "venv"
    env.mkdir()
    install(
        {
            "cluster_id": "c1",
            "files": files(**{"hook/site.py": ("644", b"x = 1\n")}),
            "links": {"env": str(env)},
        }
    )
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert (directory / "hook" / "site.py").read_text() == "x = 1\n"
    assert stat.S_IMODE((directory / "hook").stat().st_mode) == 0o700
    assert (directory / "env").readlink() == env
    # Installed again (a retry): the link is replaced, not an error.
    install({"cluster_id": "c1", "files": {}, "links": {"env": str(tmp_path)}})
    assert (directory / "env").readlink() == tmp_path
    cleanup({"cluster_id": "c1", "tag": None, "grace": 0.1})
    assert not directory.exists()
    assert env.exists()  # clean-up removes the link, never what it points to


def test_cleanup_removes_only_this_clusters_lines_dir_and_processes(home):
    keys = home / ".ssh" / "authorized_keys"
    install(
        {"cluster_id": "c1", "files": files(a=("600", b"1")), "authorized_key": "k1 clusterbook:c1"}
    )
    install({"cluster_id": "c2", "files": {}, "authorized_key": "k2 clusterbook:c2"})
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CLUSTERBOOK_JOB": "c1:abc"},
    )
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CLUSTERBOOK_JOB": "c10:abc"},  # another cluster, similar name
    )
    numbered = subprocess.Popen(  # the cluster started in the same second: its id is c1-2
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CLUSTERBOOK_JOB": "c1-2:abc"},
    )
    try:
        time.sleep(0.2)
        out = cleanup({"cluster_id": "c1", "tag": "clusterbook:c1", "grace": 1.0})
        assert out["killed"] == [sleeper.pid]
        assert sleeper.wait(timeout=5) != 0
        assert bystander.poll() is None
        assert numbered.poll() is None
        assert out["keys_removed"] == 1
        assert keys.read_text() == "k2 clusterbook:c2\n"
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600
        assert not (home / ".clusterbook" / "clusters" / "c1").exists()
        assert (home / ".clusterbook" / "clusters" / "c2").exists()
    finally:
        for p in (sleeper, bystander, numbered):
            p.kill()
            p.wait()
