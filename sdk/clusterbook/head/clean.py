"""Clean up after a cluster whose owner is gone: ``clusterbook cleanup ID --hosts ...``.

A cluster's nodes clean themselves when they lose the head (their agents' lease), and
``stop()`` cleans them otherwise; this is for what is left when neither could run (an agent
killed with its owner, a node that was off): on this machine and on each host given, it stops
the cluster's processes and removes its key line, files and what ``put()`` made, as ``stop()``
would. Hosts are reached with your own ssh key, host keys checked as for ``Cluster.ssh``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
from collections.abc import Sequence
from typing import Any

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.names import ID_RULE, is_cluster_id
from clusterbook.nodes.tasks import install
from clusterbook.spec import parse_host_slots

__all__ = ["clean_cluster"]


def clean_cluster(
    cluster_id: str,
    hosts: Sequence[str] = (),
    *,
    user: str | None = None,
    identity: str | os.PathLike[str] | None = None,
    known_hosts: str | os.PathLike[str] | None = None,
    port: int | None = None,
    python: str = "python3",
    timeout: float = 30.0,
    ssh_config: str | os.PathLike[str] | None = None,
) -> dict[str, dict[str, Any] | Exception]:
    """Remove what cluster ``cluster_id`` left here and on ``hosts``; return, by host (this
    machine is ``"localhost"``), what was removed or why it could not be. ``cluster_id`` is
    the id ``clusterbook ls`` shows (its directories on the nodes are named by it); a name
    that ``ls`` still lists stands for the newest cluster of that name. Hosts are reached as
    :meth:`Cluster.ssh <clusterbook.Cluster.ssh>` reaches them (ssh config, agent, jump
    hosts)."""
    from clusterbook.ssh.keys import key_tag

    cluster_id = _the_id(cluster_id)
    args = {"cluster_id": cluster_id, "tag": key_tag(cluster_id), "grace": 2.0}
    names = [parse_host_slots(h, 1)[0] for h in hosts]
    out: dict[str, dict[str, Any] | Exception] = {}
    try:
        out["localhost"] = install.cleanup({**args, "tag": None})  # the head has no key line
    except Exception as exc:
        out["localhost"] = exc
    if not names:
        return out
    from clusterbook.nodes.fanout import parallel
    from clusterbook.ssh.credentials import Credentials, prompt_where_asked
    from clusterbook.ssh.hostkeys import make_policy
    from clusterbook.ssh.node_session import run_task
    from clusterbook.ssh.paramiko_shell import connect_hop
    from clusterbook.ssh.paramiko_transport import Tunnels
    from clusterbook.ssh.target import read_ssh_config, resolve

    policy = make_policy(None, known_hosts)
    config = read_ssh_config(ssh_config)
    local = getpass.getuser()
    targets = {
        h: resolve(h, config, local_user=local, user=user, port=port, identity=identity)
        for h in names
    }
    hops = [hop for t in targets.values() for hop in (*t.jumps, t.node)]
    credentials = Credentials.gather(hops, explicit=identity, prompt=prompt_where_asked())
    tunnels = Tunnels(credentials, policy)

    def one(host: str) -> dict[str, Any]:
        shell = connect_hop(
            targets[host], credentials=credentials, policy=policy, timeout=timeout, tunnels=tunnels
        )
        try:
            return run_task(shell, python, "cleanup", args, timeout=timeout)
        finally:
            shell.close()

    try:
        done, failed = parallel(names, one)
    finally:
        tunnels.close()
        credentials.close()
    for host in names:
        out[host] = done[host] if host in done else failed[host]
    return out


def _the_id(given: str) -> str:
    """The id of the cluster ``given`` names: itself, or the id of the newest cluster of that
    name still listed here (a cluster's directories on its nodes are named by its id)."""
    from clusterbook.head.catalog import find

    if not is_cluster_id(given):
        raise ConfigError(
            f"{given!r} is not a cluster id ({ID_RULE}); give the id clusterbook ls shows, "
            "like 'ssh-1a2b3c-20261123-101500'."
        )
    with contextlib.suppress(ClusterError):  # not listed (pruned, or another machine's)
        record = find(given).record
        if record is not None:
            return record.id
    return given
