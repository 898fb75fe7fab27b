"""Nodes that join by themselves: the head serves the rendezvous store, agents join it.

``Cluster.elastic(min_nodes, max_nodes)`` serves the rendezvous (:class:`RendezvousHead`),
prints the command nodes join with, and is ready once a round completes (``min_nodes`` plus the
last call, or ``max_nodes``); the MPI hostfile is built from that round. The head watches the
nodes (an :class:`~clusterbook.providers.watch.AgentWatch` of it), and nodes on other machines
run MPI ranks through the sshd their agent started
(:class:`~clusterbook.providers.elastic.reach.FarReach`), with a key both sides derive from the
token.
"""

from __future__ import annotations

import shlex
import socket
import warnings
from pathlib import Path

from clusterbook.durations import Duration, duration
from clusterbook.errors import CleanupWarning
from clusterbook.launch.flavour import Launcher
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.elastic.far import networks_here, round_nodes
from clusterbook.providers.elastic.reach import FarReach
from clusterbook.providers.reach import NodeReach
from clusterbook.providers.watch import AgentWatch, NodeWatch
from clusterbook.rendezvous.agent import agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import NodeSpec, validate_channel_port

__all__ = ["ElasticProvider", "join_command", "warn_unclean"]


def join_command(head: RendezvousHead, launcher: Launcher | None = None) -> str | None:
    """The command a node joins ``head``'s rendezvous with, once it is served. With the
    cluster's ``launcher``, its agent checks the node for it as the head would
    (``--probe-mpi``): a node with its own sshd is then checked without a login, where it runs
    the cluster's Python (else the head logs in to check it, as without)."""
    if head.join_url is None or head.token_file is None:
        return None
    probe = None if launcher is None else (launcher.flavour.value, launcher.prefix)
    return shlex.join(agent_argv(None, head.join_url, head.token_file, probe_mpi=probe))


def warn_unclean(cluster_id: str, problems: dict[str, Exception]) -> None:
    """Say which nodes kept what ``put()`` made there (``problems``: why, by node)."""
    if problems:
        lines = "".join(f"\n  {n}: {e}" for n, e in problems.items())
        warnings.warn(
            CleanupWarning(
                f"Could not remove what put() created on some nodes of cluster "
                f"{cluster_id!r}:{lines}"
            ),
            stacklevel=4,
        )


class ElasticProvider(Provider):
    """The head side of an elastic cluster: its rendezvous, which watches the nodes, and the
    reach of its nodes on other machines."""

    kind = "elastic"

    def __init__(
        self,
        min_nodes: int,
        max_nodes: int,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        channel_port: int | None = 0,
        last_call: Duration = 1.0,
        join_timeout: Duration = 600.0,
        keep_alive_interval: Duration = 1.0,
        keep_alive_max_attempt: int = 3,
        announce: bool = True,
    ) -> None:
        # Checked now (torch's messages), with the real run id set at start().
        settings = RendezvousSettings(
            run_id="pending",
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeout=RendezvousTimeout(
                join=duration(join_timeout, "join_timeout"),
                last_call=duration(last_call, "last_call"),
            ),
            keep_alive_interval=duration(keep_alive_interval, "keep_alive_interval"),
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        channel_port = validate_channel_port(channel_port, port)
        self.head = RendezvousHead(settings, listen=listen, port=port, channel_port=channel_port)
        self.announce = announce
        self._cluster_id: str | None = None
        self._launcher: Launcher | None = None  # the cluster's, once started
        self._networks: list[str] = []
        self._watch = AgentWatch(self.head, hint=self._hint)
        self.far = FarReach(self.head, lambda: self.nodes)
        self.stop_problems: dict[str, Exception] = {}

    def _hint(self) -> str:
        return f"Start more nodes with: {self.join_command}"

    @property
    def settings(self) -> RendezvousSettings:
        return self.head.settings

    @property
    def token_file(self) -> Path | None:
        return self.head.token_file

    @property
    def bounds(self) -> tuple[int, int]:
        return self.settings.min_nodes, self.settings.max_nodes

    @property
    def join_command(self) -> str | None:
        return join_command(self.head, self._launcher)

    @property
    def watch(self) -> NodeWatch:
        return self._watch

    @property
    def reach(self) -> NodeReach:
        return self.far

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The participants of the last complete round, by rank."""
        return round_nodes(self.head.participants(), socket.gethostname(), self._networks)

    def start(self, ctx: StartContext) -> None:
        self._cluster_id, self._launcher = ctx.cluster_id, ctx.launcher
        try:
            # A node that joins is checked now (its master connection too), not at the next job.
            self.head.start(ctx.cluster_id, self.far.on_change(ctx.changed))
            self.far.start(ctx)
            self._networks = networks_here()
        except BaseException:
            self.stop()
            raise
        if self.announce:
            print(f"Nodes join cluster {ctx.cluster_id!r} with:\n  {self.join_command}", flush=True)

    def stop(self) -> None:
        cluster_id, self._cluster_id = self._cluster_id, None
        if cluster_id is None:
            return
        try:
            self.stop_problems = self.far.stop()  # while the agents (and their sshd) are there
            warn_unclean(cluster_id, self.stop_problems)
        finally:
            self._watch.end()
            self.head.close()
