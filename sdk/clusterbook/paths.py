"""Where clusterbook keeps things on disk: one place for every location.

- ``~/.clusterbook/clusters/ID/`` on the head and on every node: a cluster's key, token,
  known_hosts and status, named by the cluster's id (defined with the node tasks, which need
  it on the nodes: :func:`clusterbook.nodes.tasks.common.cluster_dir`);
- ``~/.clusterbook/known_hosts``: host keys trusted on first use (``host_keys="accept-new"``);
- ``~/.clusterbook/sshd-NODE/``: the user-level sshd of an elastic node's agent;
- ``~/.clusterbook/worker-HOSTNAME/``: a training job's worker host (``clusterbook worker
  serve``): its sshd, and the status the leader's cluster leaves it (defined with the node
  tasks, which write it);
- the run directories of clusters (jobs' logs): ``$CLUSTERBOOK_RUN_ROOT``, else
  ``$XDG_STATE_HOME/clusterbook/runs`` (``~/.local/state/clusterbook/runs``).
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterbook.errors import ConfigError
from clusterbook.nodes.tasks import common
from clusterbook.nodes.tasks.common import CLUSTERS_DIR

__all__ = [
    "CLUSTERS_DIR",
    "accept_new_known_hosts",
    "agent_sshd_dir",
    "cluster_dir",
    "clusters_root",
    "default_run_root",
    "node_cluster_dir",
]


def clusters_root() -> Path:
    """Where the clusters' directories are on this machine: ``~/.clusterbook/clusters``."""
    return Path.home() / CLUSTERS_DIR


def cluster_dir(cluster_id: str) -> Path:
    """The directory of the cluster of id ``cluster_id`` on this machine:
    ``~/.clusterbook/clusters/ID``. :class:`ConfigError` for what is not an id."""
    return Path(node_cluster_dir(str(Path.home()), cluster_id))


def node_cluster_dir(home: str, cluster_id: str) -> str:
    """The cluster's directory on a node whose home is ``home`` (a path on that node)."""
    try:
        return common.cluster_dir(cluster_id, home)
    except ValueError as exc:
        raise ConfigError(
            f"{exc}; give the id of a cluster, as clusterbook ls shows it (like "
            "ssh-1a2b3c-20261123-101500)."
        ) from None


def accept_new_known_hosts() -> Path:
    """Where host keys trusted on first use are recorded, unless told otherwise."""
    return Path.home() / ".clusterbook" / "known_hosts"


def agent_sshd_dir(node_id: str) -> Path:
    """The directory of the user-level sshd an agent started with ``--start-sshd`` runs."""
    return Path.home() / ".clusterbook" / f"sshd-{node_id}"


def default_run_root() -> Path:
    """Where run directories go: ``$CLUSTERBOOK_RUN_ROOT``, else ``~/.local/state/clusterbook``."""
    if root := os.environ.get("CLUSTERBOOK_RUN_ROOT"):
        return Path(root)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "clusterbook" / "runs"
