"""Nodes on this machine, each run by a local worker agent.

A local cluster is an elastic cluster whose agents the head starts itself, one per node, and
waits for: the same rendezvous, heartbeats and status as nodes that join from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from clusterbook.errors import ClusterError
from clusterbook.launch.guard import guard, kill_tagged
from clusterbook.providers.base import StartContext
from clusterbook.providers.elastic import ElasticProvider
from clusterbook.rendezvous.agent import HEAD_LEASE
from clusterbook.spec import NodeSpec, validate_positive_int
from clusterbook.status import NodeStatus

__all__ = ["LocalAgentsProvider", "local_nodes"]

#: How long ``start()`` waits for the local agents to join.
START_TIMEOUT = 60.0


def local_nodes(workers: int, slots: int | None) -> tuple[NodeSpec, ...]:
    """``workers`` nodes on this machine with ``slots`` slots each (default: one per core)."""
    validate_positive_int(workers, "workers")
    cores = os.cpu_count() or 1
    slots = cores if slots is None else validate_positive_int(slots, "slots")
    return tuple(NodeSpec(f"local-{i}", "localhost", slots, cores=cores) for i in range(workers))


class LocalAgentsProvider(ElasticProvider):
    """Starts one agent process per node on this machine and waits until they joined."""

    kind = "local"

    def __init__(self, nodes: tuple[NodeSpec, ...]) -> None:
        # Nothing to wait for beyond all of them: min = max, so the round completes at once.
        super().__init__(len(nodes), len(nodes), listen="127.0.0.1", last_call=0.1)
        self.announce = False
        self._spec = nodes
        self._agents: list[subprocess.Popen[bytes]] = []
        self._token = ""

    def start(self, ctx: StartContext) -> None:
        super().start(ctx)
        assert self.join_url is not None
        assert self.token_file is not None
        argv = ["worker", "join", self.join_url, "--token-file", str(self.token_file)]
        # Tagged like a job's processes, so they die with us even if we are SIGKILLed.
        self._token = f"{ctx.cluster_id}-agents"
        guard.watch(self._token)
        env = {**os.environ, "CLUSTERBOOK_JOB": self._token}
        for node in self._spec:
            self._agents.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "clusterbook.cli",
                        *argv,
                        "--node-id",
                        node.name,
                        "--slots",
                        str(node.slots),
                        "--lease",
                        str(HEAD_LEASE),
                    ],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
        try:
            self.wait_ready(START_TIMEOUT)
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
        super().stop()  # closes the rendezvous: agents leave and exit
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

    def node_statuses(self) -> list[NodeStatus]:
        seen = {s.name: s for s in super().node_statuses()}
        return [
            seen.get(n.name) or NodeStatus(n.name, n.host, n.slots, "pending") for n in self._spec
        ]
