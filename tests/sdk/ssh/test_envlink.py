"""Per-node environments: validation and the decisions about links (pure)."""

from __future__ import annotations

import pytest

from clusterbook.errors import ConfigError
from clusterbook.paths import node_cluster_dir
from clusterbook.ssh.envlink import env_prefix, link_problems, linked_paths, validate_node_python

HOSTS = ["node1", "node2"]


def test_node_python_is_checked_against_the_hosts_and_made_normal() -> None:
    assert validate_node_python(None, HOSTS) == {}
    assert validate_node_python({"node2": "/opt//venv/bin/../bin/python"}, HOSTS) == {
        "node2": "/opt/venv/bin/python"
    }
    with pytest.raises(ConfigError, match="'node3', which is not one of the hosts"):
        validate_node_python({"node3": "/opt/venv/bin/python"}, HOSTS)
    for bad in ("python3", "~/venv/bin/python", "/opt/x\n/bin/python", 3):
        with pytest.raises(ConfigError, match="not an absolute path"):
            validate_node_python({"node1": bad}, HOSTS)  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="must map hosts"):
        validate_node_python(["node1", "/opt/venv/bin/python"], HOSTS)  # type: ignore[arg-type]


def test_env_prefix_is_the_directory_above_bin() -> None:
    assert env_prefix("/opt/venv/bin/python") == "/opt/venv"


def test_links_need_the_same_home_and_interpreter_name_everywhere() -> None:
    ok = link_problems(
        "/work/.venv/bin/python",
        "/home/me",
        "/work/.venv/bin/mpirun",
        {
            "node1": ("/work/.venv/bin/python", "/home/me"),
            "node2": ("/opt/v/bin/python", "/home/me"),
        },
    )
    assert ok == {}
    found = link_problems(
        "/work/.venv/bin/python",
        "/home/me",
        "/usr/bin/mpirun",
        {"node2": ("/opt/v/bin/python3.11", "/Users/me")},
    )
    assert list(found) == ["head", "node2"]
    assert "/usr/bin/mpirun is not beside the interpreter" in found["head"][0]
    assert "called 'python3.11'" in found["node2"][0]
    assert "home directory is /Users/me, the head's /home/me" in found["node2"][1]


def test_linked_paths_are_under_the_cluster_directory() -> None:
    paths = linked_paths(
        node_cluster_dir("/home/me", "c1"), "/work/.venv/bin/python", "/work/.venv/bin/mpiexec"
    )
    assert paths.python == "/home/me/.clusterbook/clusters/c1/env/bin/python"
    assert paths.launcher == "/home/me/.clusterbook/clusters/c1/env/bin/mpiexec"
    assert paths.hook_dir == "/home/me/.clusterbook/clusters/c1/rankhook"
