"""Nodes that join by themselves: the head serves the rendezvous store, agents join it.

``Cluster.elastic(min_nodes, max_nodes)`` serves the rendezvous (:class:`RendezvousHead`),
prints the command nodes join with, and is ready once a round completes (``min_nodes`` plus the
last call, or ``max_nodes``); the MPI hostfile is built from that round. Nodes on other
machines run MPI ranks through the sshd their agent started (see
:mod:`clusterbook.providers.elastic.reach`), with a key both sides derive from the token.
"""

from __future__ import annotations

import getpass
import shlex
import shutil
import socket
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import psutil

from clusterbook.errors import CleanupWarning, ClusterError
from clusterbook.launch.keep import end_far, hold_far
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.call import Call
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.transfer import Outgoing, fetch_all, send_all, uncounted
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.elastic.reach import Reach, far_nodes, pick_address
from clusterbook.rendezvous.agent import agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import HERE, NodeSpec
from clusterbook.status import NodeStatus

__all__ = ["ElasticProvider"]


class ElasticProvider(Provider):
    """The head side of an elastic cluster: its rendezvous, and the ssh path to its nodes
    on other machines."""

    kind = "elastic"

    def __init__(
        self,
        min_nodes: int,
        max_nodes: int,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        last_call: float = 1.0,
        join_timeout: float = 600.0,
        keep_alive_interval: float = 1.0,
        keep_alive_max_attempt: int = 3,
        announce: bool = True,
    ) -> None:
        # Checked now (torch's messages), with the real run id set at start().
        settings = RendezvousSettings(
            run_id="pending",
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeout=RendezvousTimeout(join=join_timeout, last_call=last_call),
            keep_alive_interval=keep_alive_interval,
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        self.head = RendezvousHead(settings, listen=listen, port=port)
        self.announce = announce
        self._ctx: StartContext | None = None
        self._reach: Reach | None = None
        self._held: set[str] = set()  # jobs kept stopped on far nodes (clean="none")
        self._networks: list[str] = []
        self.stop_problems: dict[str, Exception] = {}

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
        if self.head.join_url is None or self.head.token_file is None:
            return None
        return shlex.join(agent_argv(None, self.head.join_url, self.head.token_file))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, ctx: StartContext) -> None:
        self._ctx = ctx
        self.head.start(ctx.cluster_id, ctx.changed)
        assert self.head.secret is not None
        from clusterbook.ssh.keys import derive_keypair  # cryptography: only when started

        keys = cluster_dir(ctx.cluster_id) / "keys"
        shutil.rmtree(keys, ignore_errors=True)
        pair = derive_keypair(keys, ctx.cluster_id, self.head.secret)
        self._reach = Reach(cluster_dir(ctx.cluster_id), pair.private_path)
        self._networks = _networks_here()
        if self.announce:
            print(f"Nodes join cluster {ctx.cluster_id!r} with:\n  {self.join_command}", flush=True)

    def stop(self) -> None:
        ctx, reach = self._ctx, self._reach
        self._ctx = self._reach = None
        if ctx is None:
            return
        try:
            if reach is not None:
                # While the agents (and their sshd) are still there.
                try:
                    self.stop_problems = reach.release(ctx.cluster_id)
                except Exception as exc:  # clean-up goes on: close, so the agents leave
                    self.stop_problems = {"(all nodes)": exc}
                if self.stop_problems:
                    lines = "".join(f"\n  {n}: {e}" for n, e in self.stop_problems.items())
                    warnings.warn(
                        CleanupWarning(
                            f"Could not remove what put() created on some nodes of cluster "
                            f"{ctx.cluster_id!r}:{lines}"
                        ),
                        stacklevel=3,
                    )
        finally:
            self.head.close()
            directory = cluster_dir(ctx.cluster_id)
            shutil.rmtree(directory / "keys", ignore_errors=True)
            for name in ("known_hosts", "ssh_config", "ssh"):
                (directory / name).unlink(missing_ok=True)

    def wait_ready(self, timeout: float) -> None:
        self.head.wait_ready(timeout, f"Start more nodes with: {self.join_command}")

    # -- the nodes ----------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The participants of the last complete round, by rank."""
        here = socket.gethostname()
        out = []
        for node, report in self.head.participants():
            addresses = list(report.addresses) or ["?"]
            local = report.hostname == here
            host = HERE if local else pick_address(addresses, self._networks)
            out.append(NodeSpec(node, host, report.slots, cores=report.cores, gpus=report.gpus))
        return tuple(out)

    def node_statuses(self) -> list[NodeStatus]:
        return self.head.node_statuses()

    def problem(self) -> str | None:
        return self.head.problem()

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        return self.head.unreachable(names, lost_only=lost_only)

    def stop_job(self, token: str) -> None:
        """Ask every agent to stop the processes of job ``token`` on its node; those of a
        job kept for inspection, through the nodes' sshd, before returning."""
        if token in self._held:  # first: the agents' own clean-up gives a grace
            self._held.discard(token)
            end_far(self._callers()[0] if self._reach is not None else {}, token)
        self.head.stop_job(token)

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        """Asked of each node on another machine through its sshd (this machine's are the
        job's own)."""
        if self._reach is None:
            return ()
        self._held.add(token)
        return hold_far(self._callers()[0], token, failing)

    def remote(self) -> RemoteLaunch | None:
        """None when every node is on this machine; else the checked ssh path to them."""
        nodes = self.nodes
        if all(n.here for n in nodes):
            return None
        ctx, reach = self._started()
        return reach.launch(ctx, nodes, self.head.reports())

    def _started(self) -> tuple[StartContext, Reach]:
        if self._reach is None or self._ctx is None:
            raise ClusterError("The elastic cluster is not started; call start() first.")
        return self._ctx, self._reach

    # -- files for nodes on other machines ----------------------------------------------

    def put(
        self, sent: Outgoing, sending: Callable[[int], None] = uncounted
    ) -> dict[str, Exception]:
        """Send ``sent`` to every node on another machine; return the nodes it failed on."""
        callers, unreachable = self._callers()
        return {**unreachable, **send_all(callers, self.settings.run_id, sent, sending)}

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` on nodes on other machines here."""
        callers, unreachable = self._callers()
        stored, failed = fetch_all(callers, directory, skip, receiving)
        return stored, {**unreachable, **failed}

    def run_on_nodes(self, argv: Sequence[str], timeout: float) -> list[NodeRun]:
        """Run ``argv`` on every node of the round: over the sshd of those on other machines
        (a node without one says why in its stderr), here for those on this machine."""
        callers, unreachable = self._callers()
        return run_everywhere(self.nodes, callers, argv, timeout, unreachable)

    def free_port(self, node: NodeSpec) -> int | None:
        """Asked of a node on another machine through its sshd (None for this machine's)."""
        call = self._callers()[0].get(node.name)
        return None if call is None else int(call("free_port", {}, 10.0)["port"])

    def _callers(self) -> tuple[dict[str, Call], dict[str, Exception]]:
        """Node tasks on each node of the round on another machine; those the head cannot
        reach, with why."""
        ctx, reach = self._started()
        far, found = far_nodes(self.nodes, self.head.reports(), getpass.getuser())
        callers = {n.name: reach.caller(ctx.python, n) for n in far}
        return callers, {name: ClusterError(" ".join(why)) for name, why in found.items()}


def _networks_here() -> list[str]:
    """This machine's IPv4 networks (``addr/netmask``), to pick the node address to use."""
    return [
        f"{a.address}/{a.netmask}"
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and a.netmask and not a.address.startswith("127.")
    ]
