"""Files to and from the nodes of an SSH cluster (``cluster.put``, ``cluster.gather``).

Small transfers go in the node sessions kept since the start (paramiko). From :data:`BULK`
bytes on (a put, or what one node hands over at a gather), the files go through the OpenSSH
client instead (:meth:`Sessions.bulk_callers
<clusterbook.providers.ssh.sessions.Sessions.bulk_callers>`): its encryption is C, paramiko's
is Python on the head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.transfer import fetch_all, gather_ask, send_all
from clusterbook.providers.ssh.sessions import Sessions

__all__ = ["BULK", "gather", "put"]

#: Bytes (of a put, or of what one node hands over at a gather) from which the files go
#: through OpenSSH's client rather than paramiko.
BULK = 32 << 20


def put(
    sessions: Sessions,
    cluster_id: str,
    sent: Outgoing,
    sending: Callable[[int], None],
    wrapper: str | None,
    hosts: Sequence[str] | None = None,
) -> dict[str, Exception]:
    """Send ``sent`` to every node at once (``hosts``: to these); return the nodes it failed
    on, with why. Big ones go through the OpenSSH client (``wrapper``: the launcher's ssh;
    None: not started)."""
    big = sum(f.size for f in sent.files) >= BULK
    to = list(sessions.conns) if hosts is None else [h for h in sessions.conns if h in hosts]
    callers = (
        sessions.bulk_callers(to, wrapper) if big and wrapper is not None else sessions.callers(to)
    )
    return send_all(callers, cluster_id, sent, sending)


def gather(
    sessions: Sessions,
    directory: Path,
    skip: Sequence[str],
    receiving: Callable[[int], None],
    wrapper: str | None,
) -> tuple[list[Path], dict[str, Exception]]:
    """Move the files ranks wrote in ``directory`` on every node here; return what arrived,
    and the nodes it failed on, with why. From a node that has :data:`BULK` bytes or more of
    them, through the OpenSSH client (``wrapper``, as for :func:`put`)."""
    ask = gather_ask(directory, skip)

    def size(host: str) -> int:
        return sum(sessions.task(host, "gather_list", ask, 60)["files"].values())

    sizes = parallel(list(sessions.conns), size)[0]  # a node that does not answer: the
    big = [h for h, n in sizes.items() if n >= BULK]  # gather says why, as it fails
    callers = sessions.callers()
    if wrapper is not None:
        callers.update(sessions.bulk_callers(big, wrapper))
    return fetch_all(callers, directory, skip, receiving)
