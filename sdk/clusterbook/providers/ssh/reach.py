"""How the nodes of an SSH cluster are reached once started: :class:`SSHReach`, the
:class:`~clusterbook.providers.reach.NodeReach` over the sessions kept for them.

The MPI launcher reaches the nodes with the cluster's key and known_hosts (the
:class:`~clusterbook.launch.remote.RemoteLaunch` the start made); everything else is a node
task in the node's kept session. A node the cluster lost is not waited for: its agent stops
the job there when its lease ends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from clusterbook.errors import ClusterError
from clusterbook.launch.keep import end_far, hold_far
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.transfer import uncounted
from clusterbook.providers.ssh import files
from clusterbook.providers.ssh.masters import ControlMasters, warn_agents, warn_cold
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.providers.watch import NodeWatch
from clusterbook.spec import NodeSpec

__all__ = ["SSHReach"]


class SSHReach:
    """The reach of an SSH cluster's nodes (``nodes()``), through ``sessions``; ``watch``
    says which were lost."""

    def __init__(
        self, sessions: Sessions, nodes: Callable[[], tuple[NodeSpec, ...]], watch: NodeWatch
    ) -> None:
        self._sessions = sessions
        self._nodes = nodes
        self._watch = watch
        self._cluster_id: str | None = None
        self._remote: RemoteLaunch | None = None
        self._held: set[str] = set()  # jobs kept stopped on the nodes (clean="none")
        self.put_used = False  # then stop() first removes what put() made, on every node
        self.masters: ControlMasters | None = None  # the warm launches' connections
        self.cold_wrapper: str | None = None  # big files go over ssh logins of their own

    def open(self, cluster_id: str, remote: RemoteLaunch) -> None:
        """The nodes are reached from now on, the launcher by ``remote``."""
        self._cluster_id, self._remote = cluster_id, remote

    def close(self) -> None:
        """The nodes are released: nothing is asked of them any more."""
        self._cluster_id, self._remote = None, None
        masters, self.masters, self.cold_wrapper = self.masters, None, None
        if masters is not None:
            masters.stop()

    def remote(self) -> RemoteLaunch | None:
        """How the launcher reaches the nodes. Launching warm, a master connection that
        ended (to a node not lost) is said in a :class:`~clusterbook.ColdLaunchWarning` and
        started again, for 5 s at most: the job logs in to that node anew if it is not up
        by then. A node whose agent does not answer (through its master) is said too: its
        daemons start over ssh."""
        masters = self.masters
        if masters is not None and self._cluster_id is not None:
            lost = set(self._watch.unreachable(list(self._sessions.conns), lost_only=True))
            ended = {h: how for h, how in masters.dead().items() if h not in lost}
            if ended:
                again = masters.start(min(5.0, self._sessions.connect_timeout), list(ended))
                said = {
                    h: f"{how}; started again: {again.get(h, 'up')}" for h, how in ended.items()
                }
                warn_cold(said, stacklevel=3)
            silent = masters.unanswered(skip=lost | set(ended))
            if silent:
                warn_agents(silent, stacklevel=3)
        return self._remote

    def stop_job(self, token: str) -> None:
        if self._cluster_id is None:
            return
        hosts = self._reachable()
        if token in self._held:  # kept stopped for inspection: no grace to give
            self._held.discard(token)
            end_far(self._sessions.callers(hosts), token)
            return
        parallel(hosts, lambda host: self._sessions.task(host, "kill", {"token": token}, 5))

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        if self._cluster_id is None:
            return ()
        self._held.add(token)
        return hold_far(self._sessions.callers(self._reachable()), token, failing)

    def _reachable(self) -> list[str]:
        """The nodes not lost (a lost node is not waited for)."""
        conns = list(self._sessions.conns)
        lost = self._watch.unreachable(conns, lost_only=True)
        return [h for h in conns if h not in lost]

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        """Send ``sent`` to every node at once (``nodes``: those of these names); return the
        nodes it failed on, with why (big transfers through OpenSSH's client:
        :mod:`clusterbook.providers.ssh.files`)."""
        cluster_id = self._started()
        self.put_used = True
        hosts = None if nodes is None else [n.host for n in self._nodes() if n.name in nodes]
        return files.put(self._sessions, cluster_id, sent, sending, self._wrapper(), hosts)

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` on every node here; return what
        arrived, and the nodes it failed on, with why."""
        return files.gather(self._sessions, directory, skip, receiving, self._wrapper())

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        """Run ``argv`` on every node (``nodes``: those of these names), in the sessions
        kept for them."""
        return run_everywhere(self._nodes(), self._sessions.callers(), argv, timeout, only=nodes)

    def free_port(self, node: NodeSpec) -> int | None:
        """Asked of the node, in its kept session."""
        if node.host not in self._sessions.conns:
            return None
        return int(self._sessions.task(node.host, "free_port", {}, 10.0)["port"])

    def _started(self) -> str:
        if self._cluster_id is None:
            raise ClusterError("The SSH cluster is not started; call start() first.")
        return self._cluster_id

    def _wrapper(self) -> str | None:
        remote = self._remote
        if remote is None:
            return None
        # Not over the warm launches' masters: one ssh process per node would then carry the
        # bytes of every transfer and job start to it.
        return self.cold_wrapper or remote.ssh_wrapper
