"""Nodes on this machine, each run by a local worker agent.

A local cluster's nodes are agents the head starts itself, one per node, which join its
rendezvous (:class:`RendezvousHead`) and heartbeat: the same status, loss detection and job
stopping as nodes that join from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import replace

from clusterbook.errors import ClusterError
from clusterbook.gpus import GPUS, GPUInfo, Slots, probe_gpus, slots_from_gpus
from clusterbook.launch.guard import guard, kill_tagged
from clusterbook.providers.base import Provider, StartContext
from clusterbook.rendezvous.agent import HEAD_LEASE, agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import HERE, NodeSpec, validate_positive_int, validate_slots
from clusterbook.status import NodeStatus
from clusterbook.wording import spell_or

__all__ = ["LocalAgentsProvider", "local_nodes"]

#: How long ``start()`` waits for the local agents to join.
START_TIMEOUT = 60.0


def local_nodes(
    workers: int, slots: Slots | None, gpus: GPUInfo | None = None
) -> tuple[NodeSpec, ...]:
    """``workers`` nodes on this machine with ``slots`` slots each (default: one per core;
    ``"gpus"``: one per GPU of the node). The machine's GPUs (``gpus``, else probed now) are
    shared out among the nodes in order, so that no two nodes count the same GPU."""
    validate_positive_int(workers, "workers")
    asked = None if slots is None else validate_slots(slots)
    cores = os.cpu_count() or 1
    if gpus is None:
        gpus = probe_gpus()
    nodes = []
    for i in range(workers):
        name, share = f"local-{i}", gpus.share(i, workers)
        if asked == GPUS:
            count = slots_from_gpus(
                share, node=f"{name} (this machine)", asked=_spelled(GPUS), fix=_fix(gpus, cores)
            )
        else:
            count = cores if asked is None else asked
        nodes.append(NodeSpec(name, HERE, count, cores=cores, gpus=share))
    return tuple(nodes)


def _spelled(slots: Slots) -> str:
    return spell_or("slots", slots, f"slots {slots!r}")


def _fix(gpus: GPUInfo, cores: int) -> str:
    """What to do when a local node has no GPU for ``slots="gpus"``."""
    number = f"give slots as a number ({_spelled(cores)})"
    if gpus.count:
        fewer = spell_or("workers", gpus.count, f"{gpus.count} workers")
        return f"ask for at most {gpus.count} workers ({fewer}), or {number}"
    return f"{number}, or run on a machine with GPUs"


class LocalAgentsProvider(Provider):
    """Starts one agent process per node on this machine and waits until they joined."""

    kind = "local"

    def __init__(self, nodes: tuple[NodeSpec, ...]) -> None:
        # Nothing to wait for beyond all of them: min = max, so the round completes at once.
        settings = RendezvousSettings(
            run_id="pending",
            min_nodes=len(nodes),
            max_nodes=len(nodes),
            timeout=RendezvousTimeout(last_call=0.1),
        )
        self.head = RendezvousHead(settings)
        self._spec = nodes
        self._agents: list[subprocess.Popen[bytes]] = []
        self._token = ""

    @classmethod
    def from_spec(cls, workers: int = 1, slots: Slots | None = None) -> LocalAgentsProvider:
        """``workers`` nodes on this machine, ``slots`` ranks each (default: its cores;
        ``"gpus"``: one per GPU, the machine's GPUs shared out among the nodes)."""
        return cls(local_nodes(workers, slots))

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes, once their agents joined (none before)."""
        joined = dict(self.head.participants())
        return tuple(
            replace(n, cores=joined[n.name].cores or n.cores)
            for n in self._spec
            if n.name in joined
        )

    @property
    def planned(self) -> tuple[NodeSpec, ...]:
        return self._spec

    def start(self, ctx: StartContext) -> None:
        self.head.start(ctx.cluster_id, ctx.changed)
        assert self.head.join_url is not None
        assert self.head.token_file is not None
        # Tagged like a job's processes, so they die with us even if we are SIGKILLed.
        self._token = f"{ctx.cluster_id}-agents"
        guard.watch(self._token)
        env = {**os.environ, "CLUSTERBOOK_JOB": self._token}
        for node in self._spec:
            argv = agent_argv(
                sys.executable,
                self.head.join_url,
                self.head.token_file,
                node_id=node.name,
                slots=node.slots,
                lease=HEAD_LEASE,
            )
            self._agents.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
        try:
            self.head.wait_ready(START_TIMEOUT)
        except ClusterError:
            failed = [p for p in self._agents if p.poll() is not None]
            self.stop()
            if failed:
                err = failed[0].stderr.read().decode(errors="replace") if failed[0].stderr else ""
                raise ClusterError(
                    f"A local worker agent exited with code {failed[0].returncode}: "
                    + (" / ".join(err.strip().splitlines()[-3:]) or "no output")
                ) from None
            raise

    def stop(self) -> None:
        self.head.close()  # closes the rendezvous: agents leave and exit
        deadline = time.monotonic() + 5.0
        for proc in self._agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if self._token:
            kill_tagged([self._token], 1.0)  # any that did not go by themselves
            guard.release(self._token)
        for proc in self._agents:
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self._agents = []

    def stop_job(self, token: str) -> None:
        self.head.stop_job(token)

    def node_statuses(self) -> list[NodeStatus]:
        # Each agent reports all of this machine's GPUs; a node has its share of them.
        seen = {s.name: s for s in self.head.node_statuses()}
        return [
            replace(
                seen.get(n.name) or NodeStatus(n.name, n.host, n.slots, "pending"),
                gpus=n.gpus.count,
                gpu_model=n.gpus.model,
            )
            for n in self._spec
        ]

    def problem(self) -> str | None:
        return self.head.problem()

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        return self.head.unreachable(names, lost_only=lost_only)
