"""Hosts that join or leave a running SSH cluster (host discovery): :class:`Growth`.

A host that joins goes through the start's own steps (:class:`~clusterbook.providers.ssh.start.
Bootstrap`): its connection and host key checked by the same policy, the same probe and
checks against the head, the cluster's key pair and files, and an agent that joins the
rendezvous; the head and the nodes get the known_hosts that now names it, for the launcher's
ssh. A host that leaves is cleaned as the stop cleans every node (its processes, key line and
files), and its session and master connection are closed. Hosts join one at a time, each in
one bootstrap: what one host's failure stops is that host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from clusterbook.errors import ReadyTimeoutError
from clusterbook.gpus import Slots
from clusterbook.nodes.fanout import parallel
from clusterbook.providers.base import StartContext
from clusterbook.providers.ssh.hosts import HEAD, host_node
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.providers.ssh.start import Bootstrap
from clusterbook.providers.watch import NodeWatch
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.ssh.keys import key_tag
from clusterbook.ssh.node_session import NodeSession
from clusterbook.ssh.target import Target
from clusterbook.status import NodeStatus

__all__ = ["Growth", "LeftWatch", "wait_joined"]

#: Seconds a node task of a host that leaves may take (its clean-up).
_CLEAN_TIMEOUT = 15.0


class Growth:
    """Adds hosts to and removes hosts from the cluster that ``boot`` started (its context,
    sessions, key pair, head facts and files, in ``head_dir``), whose agents join ``head``;
    ``targets(hosts)`` says where hosts are, as for the hosts given at first."""

    def __init__(
        self,
        ctx: StartContext,
        sessions: Sessions,
        head: RendezvousHead,
        boot: Bootstrap,
        head_dir: Path,
        targets: Callable[[list[str]], Mapping[str, Target]],
    ) -> None:
        self._ctx = ctx
        self._sessions = sessions
        self._head = head
        self._boot = boot
        self._head_dir = head_dir
        self._targets = targets

    def add(self, host: str, slots: Slots, asked_python: Mapping[str, str]) -> Bootstrap:
        """Bootstrap ``host`` into the cluster; return its start (its node in ``nodes``, the
        launcher's way to every node in ``remote``). Raises what a start raises for it, having
        closed what it opened."""
        sessions, boot = self._sessions, self._boot
        sessions.targets.update(self._targets([host]))
        more = Bootstrap(
            self._ctx, sessions, (host_node(host, slots),), {host: slots}, asked_python, {}
        )
        more.warm = boot.warm  # its agent serves MPI's daemons as the others' do
        probing: dict[str, NodeSession] = {}
        try:
            more.connect_and_probe(probing, time.monotonic(), sessions.dial)
            more.facts = {**boot.facts, **more.facts}  # every host's names in known_hosts
            assert self._head.token_file is not None
            token = self._head.token_file.read_bytes()
            others = [h for h in sessions.conns if h != host]
            installs, ready = more.install(
                self._head_dir, token, [HEAD, host, *others], keys=boot.keys
            )
            # The nodes there were learn the new host's key (for the launcher's ssh between
            # nodes); the head's own copy is rewritten with the new host's files.
            failed = parallel(
                others, lambda h: sessions.task(h, "install", installs[h], _CLEAN_TIMEOUT)
            )[1]
            Bootstrap.check(failed)
            more.start_agents(
                self._head,
                probing,
                {k: installs[k] for k in probing},
                ready,
                joined=lambda timeout: wait_joined(self._head, [host], timeout),
            )
        except BaseException:
            parallel(list(probing), lambda key: probing[key].close())
            self._forget(host)
            raise
        head = probing.pop(HEAD, None)
        if head is not None:
            head.close()
        sessions.keep(probing)
        boot.facts = more.facts
        return more

    def remove(self, host: str, *, put_used: bool) -> None:
        """Clean ``host`` as the stop does (its processes, the cluster's key line and files,
        what ``put()`` made), then close its session; raises what the clean-up raised."""
        cluster_id = self._ctx.cluster_id
        done = {"cluster": cluster_id, "state": "done", "time": time.time()}
        args = {"cluster_id": cluster_id, "tag": key_tag(cluster_id), "grace": 2.0}
        try:
            if put_used:
                self._sessions.task(host, "put_cleanup", {"cluster_id": cluster_id}, _CLEAN_TIMEOUT)
            self._sessions.task(host, "cleanup", {**args, "status": done}, _CLEAN_TIMEOUT)
        finally:
            self._forget(host)

    def _forget(self, host: str) -> None:
        """Close ``host``'s session and connection and drop it from the sessions."""
        sessions = self._sessions
        if host in sessions.conns:
            try:
                sessions.close(host)
            finally:
                sessions.conns.pop(host, None)
        sessions.targets.pop(host, None)
        self._boot.facts.pop(host, None)


def wait_joined(head: RendezvousHead, hosts: Collection[str], timeout: float) -> None:
    """Return once every one of ``hosts`` is in a complete round of ``head``'s rendezvous."""
    deadline = time.monotonic() + timeout
    while missing := set(hosts) - {name for name, _ in head.participants()}:
        if time.monotonic() > deadline:
            raise ReadyTimeoutError(
                f"The agents of {', '.join(sorted(missing))} did not join within {timeout:g} s.",
                timeout=timeout,
                reason="agents did not join",
            )
        time.sleep(0.05)


class LeftWatch:
    """``watch`` (the agents' watch of an SSH cluster) with the hosts that left it
    (``left()``: host, and a sentence saying so) counted as lost: the jobs with ranks there
    are stopped as on a lost node, and those with ``restarts=`` relaunch without them;
    ``problem()`` adds ``also()`` (the discovery's error, if any)."""

    def __init__(
        self,
        watch: NodeWatch,
        left: Callable[[], Mapping[str, str]],
        also: Callable[[], str | None],
    ) -> None:
        self._watch = watch
        self._left = left
        self._also = also

    def node_statuses(self) -> list[NodeStatus]:
        return self._watch.node_statuses()

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        found = self._watch.unreachable(names, lost_only=lost_only, ended=ended)
        left = self._left()
        return {**{n: left[n] for n in names if n in left}, **found}

    def wait_ready(self, timeout: float) -> None:
        self._watch.wait_ready(timeout)

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        return self._watch.resource_history(window, nodes=nodes, points=points)

    def losses(self) -> dict[str, int]:
        return self._watch.losses()

    def problem(self) -> str | None:
        said = [p for p in (self._watch.problem(), self._also()) if p]
        return " ".join(said) or None
