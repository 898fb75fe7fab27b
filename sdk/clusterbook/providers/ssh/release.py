"""The end of an SSH cluster: every node it reached left as it was found (:func:`release`).

On every node the cluster's processes are stopped, and its key line, its files and what
``put()`` made there are removed, in the session kept for the node (one round trip each); the
head removes its own copy of the cluster's files. A node that cannot be reached (or whose
host key changed) cannot be cleaned: a :class:`~clusterbook.CleanupWarning` names it and says
what is left there. Nothing raises.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Collection

from clusterbook.errors import CleanupWarning
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.tasks.files import CLEANUP_PARTS
from clusterbook.providers.base import StartContext
from clusterbook.providers.ssh.hosts import HEAD
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.ssh.keys import key_tag
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.node_session import run_task

__all__ = ["release"]


def release(
    ctx: StartContext, sessions: Sessions, *, put_used: bool, unprobed: Collection[str]
) -> dict[str, Exception]:
    """Clean every node of ``sessions`` (but ``unprobed`` ones: nothing was put there) and the
    head, close every session and connection; return the nodes that could not be cleaned,
    with why, having warned of them. ``put_used``: ``put()`` made files on the nodes."""
    sessions.close_bulk()  # first: their ssh processes end with them
    args = {"cluster_id": ctx.cluster_id, "tag": key_tag(ctx.cluster_id), "grace": 2.0}
    put_done: dict[str, Exception] = {}
    if put_used:
        # On every node before any node removes the cluster's directory, which holds
        # the nodes' logs of what put() made (one directory when homes are shared).
        # Every node's files before any node's directories: nodes sharing a filesystem may
        # each have made part of one tree (nodes.tasks.files.put_cleanup).
        probed = [h for h in sessions.conns if h not in unprobed]
        for part in CLEANUP_PARTS:
            clean_puts = {"cluster_id": ctx.cluster_id, "part": part}

            def clean_put(host: str, args: dict[str, str] = clean_puts) -> object:
                return sessions.task(host, "put_cleanup", args, 15)

            put_done |= parallel([h for h in probed if h not in put_done], clean_put)[1]

    # What a worker serving a node (clusterbook worker serve) waits for: then it exits.
    done = {"cluster": ctx.cluster_id, "state": "done", "time": time.time()}

    def clean(host: str) -> object:
        try:
            if host in unprobed:
                return None
            result = sessions.task(host, "cleanup", {**args, "status": done}, 15)
            if host in put_done:  # the rest is clean; say what put() may have left
                raise put_done[host]
            return result
        finally:
            sessions.close(host)

    # Best effort: a node that cannot be reached (or whose host key changed) cannot be
    # cleaned; say which, and what is left there.
    def clean_any(key: str) -> object:
        if key == HEAD:
            return run_task(LocalShell(), ctx.python, "cleanup", {**args, "tag": None})
        return clean(key)

    _, found = parallel([HEAD, *sessions.conns], clean_any)
    problems = {k: e for k, e in found.items() if k != HEAD}
    sessions.conns = {}
    sessions.close_ways()
    if problems:
        lines = "".join(f"\n  {h}: {e}" for h, e in problems.items())
        warnings.warn(
            CleanupWarning(
                f"Could not clean up {len(problems)} node(s) of cluster {ctx.cluster_id!r}; its "
                f"key (tagged {key_tag(ctx.cluster_id)!r} in ~/.ssh/authorized_keys) and "
                f"~/.clusterbook/clusters/{ctx.cluster_id} may remain there:{lines}"
            ),
            stacklevel=4,
        )
    return problems
