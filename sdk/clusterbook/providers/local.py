"""Nodes on this machine, each run by a local worker agent.

A local cluster's nodes are agents the head starts itself, one per node, which join its
rendezvous (:class:`RendezvousHead`) and heartbeat: the same status, loss detection and job
stopping as nodes that join from elsewhere.

The agents are the head's own processes, so it keeps them: an agent that ends while the
cluster runs (it lost the head for its lease while the head was paused, or it was killed) is
reaped and started again, and its node joins the next round. One that keeps ending
(:func:`restart_allowed`) is not started again: the cluster says so (:meth:`lost_for_good`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from clusterbook.errors import ClusterError
from clusterbook.gpus import GPUS, GPUInfo, Slots, probe_gpus, slots_from_gpus
from clusterbook.launch.guard import guard, kill_tagged
from clusterbook.nodes.tasks.common import AGENTS, process_tag
from clusterbook.nodes.tasks.cpus import place_here, usable_cores_here
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.reach import LocalReach, NodeReach
from clusterbook.providers.watch import AgentWatch, NodeWatch
from clusterbook.rendezvous.agent import HEAD_LEASE, agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import HERE, NodeSpec, validate_positive_int, validate_slots
from clusterbook.wording import spell_or

__all__ = ["LocalAgentsProvider", "local_nodes", "restart_allowed", "share_cores"]

_log = logging.getLogger("clusterbook.local")

#: How long ``start()`` waits for the local agents to join.
START_TIMEOUT = 60.0
#: An agent that ended this many times within ``RESTART_WINDOW`` seconds is not started again.
MAX_ENDS = 5
RESTART_WINDOW = 60.0
_KEEP_EVERY = 0.2  # seconds between two looks at the agents


def restart_allowed(ends: Sequence[float], now: float) -> bool:
    """Whether an agent that ended at the (monotonic) times ``ends`` is started again at
    ``now``: unless it ended ``MAX_ENDS`` times within the last ``RESTART_WINDOW`` seconds
    (it cannot run here, and starting it again would only repeat that)."""
    return sum(now - end < RESTART_WINDOW for end in ends) < MAX_ENDS


def share_cores(cores: int, workers: int) -> list[int]:
    """The slots of each of ``workers`` nodes that share ``cores`` cores: as many each, the
    remainder to the first ones; at least one each (more workers than cores then have more
    slots in all than cores, which a job that uses them is warned of)."""
    return [max(1, cores // workers + (i < cores % workers)) for i in range(workers)]


def local_nodes(
    workers: int,
    slots: Slots | None,
    gpus: GPUInfo | None = None,
    cores: Callable[[], int] = usable_cores_here,
) -> tuple[NodeSpec, ...]:
    """``workers`` nodes on this machine with ``slots`` slots each (default: the cores this
    process may use, ``cores()``, shared out among them by :func:`share_cores`; ``"gpus"``:
    one per GPU of the node). The machine's GPUs (``gpus``, else probed now) are shared out
    among the nodes in order, so that no two nodes count the same GPU."""
    validate_positive_int(workers, "workers")
    asked = None if slots is None else validate_slots(slots)
    usable, place = cores(), place_here()
    shares = share_cores(usable, workers)
    if gpus is None:
        gpus = probe_gpus()
    nodes = []
    for i in range(workers):
        name, share = f"local-{i}", gpus.share(i, workers)
        if asked == GPUS:
            count = slots_from_gpus(
                share, node=f"{name} (this machine)", asked=_spelled(GPUS), fix=_fix(gpus, usable)
            )
        else:
            count = shares[i] if asked is None else asked
        nodes.append(NodeSpec(name, HERE, count, cores=usable, gpus=share, place=place))
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
    """Starts one agent process per node on this machine and waits until they joined; the
    agents run ``python`` (default: this interpreter, which has clusterbook)."""

    kind = "local"

    def __init__(self, nodes: tuple[NodeSpec, ...], *, python: str | None = None) -> None:
        # Nothing to wait for beyond all of them: min = max, so the round completes at once.
        settings = RendezvousSettings(
            run_id="pending",
            min_nodes=len(nodes),
            max_nodes=len(nodes),
            timeout=RendezvousTimeout(last_call=0.1),
        )
        self.head = RendezvousHead(settings)
        self._spec = nodes
        self._python = python or sys.executable  # the agents': this one has clusterbook
        # Every node is one the head started: a row each from the start, with its share of
        # this machine's GPUs (each agent reports all of them); an agent that keeps ending
        # is given up on at once.
        self._watch = AgentWatch(self.head, planned=lambda: self._spec, give_up=self.lost_for_good)
        # The nodes are this machine; the agents stop a job's processes too.
        self._reach = LocalReach(lambda: self.nodes, stop_job=self.head.stop_job)
        self._agents: dict[str, subprocess.Popen[bytes]] = {}  # by node name
        self._ends: dict[str, list[float]] = {}  # when each node's agents ended
        self._gave_up: dict[str, str] = {}  # nodes not started again, with why
        self._keeping = threading.Event()  # set: the keeper thread is to stop
        self._keeper: threading.Thread | None = None
        self._changed: Callable[[], None] = lambda: None
        self._token = ""
        # Where each agent's stderr goes: a file, not a pipe nobody reads while it runs (an
        # agent that says a line at each rejoin would block on a full pipe after ~600).
        self._logs: Path | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def from_spec(cls, workers: int = 1, slots: Slots | None = None) -> LocalAgentsProvider:
        """``workers`` nodes on this machine, ``slots`` ranks each (default: the cores this
        process may use, shared out among them; ``"gpus"``: one per GPU, the machine's GPUs
        shared out among the nodes)."""
        return cls(local_nodes(workers, slots))

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes, once their agents joined (none before)."""
        joined = dict(self.head.participants())
        return tuple(
            replace(n, cores=joined[n.name].cores or n.cores, place=joined[n.name].place or n.place)
            for n in self._spec
            if n.name in joined
        )

    @property
    def planned(self) -> tuple[NodeSpec, ...]:
        return self._spec

    @property
    def watch(self) -> NodeWatch:
        return self._watch

    @property
    def reach(self) -> NodeReach:
        return self._reach

    def start(self, ctx: StartContext) -> None:
        self.head.start(ctx.cluster_id, ctx.changed)
        self._changed = ctx.changed
        # Tagged like a job's processes, so they die with us even if we are SIGKILLed.
        self._token = process_tag(ctx.cluster_id, AGENTS)
        guard.watch(self._token)
        if ctx.run_dir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="clusterbook-agents-")
            self._logs = Path(self._scratch.name)
        else:
            self._logs = ctx.run_dir / "agents"
            self._logs.mkdir(mode=0o700, exist_ok=True)
        for node in self._spec:
            self._agents[node.name] = self._spawn(node)
        try:
            # An agent that ended cannot join: no use waiting for it (none is started again
            # before the start is over).
            self.head.wait_ready(START_TIMEOUT, give_up=self._ended_at_start)
        except ClusterError:
            failed = [(n, p) for n, p in self._agents.items() if p.poll() is not None]
            said = failed and (
                f"code {failed[0][1].returncode}: {_last_words(self._log_of(failed[0][0]))}"
            )
            self.stop()
            if said:
                raise ClusterError(f"A local worker agent exited with {said}") from None
            raise
        self._keeper = threading.Thread(
            target=self._keep, name="clusterbook-local-agents", daemon=True
        )
        self._keeper.start()

    def _ended_at_start(self) -> str | None:
        ended = [name for name, proc in self._agents.items() if proc.poll() is not None]
        return f"The local worker agent of {', '.join(ended)} ended." if ended else None

    def _spawn(self, node: NodeSpec) -> subprocess.Popen[bytes]:
        """Start the agent of ``node``."""
        assert self.head.join_url is not None
        assert self.head.token_file is not None
        argv = agent_argv(
            self._python,
            self.head.join_url,
            self.head.token_file,
            node_id=node.name,
            slots=node.slots,
            lease=HEAD_LEASE,
        )
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        log = os.open(self._log_of(node.name), flags, 0o600)  # its last life was read
        try:
            return subprocess.Popen(
                argv,
                env={**os.environ, "CLUSTERBOOK_JOB": self._token},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(log)

    def _log_of(self, node: str) -> Path:
        assert self._logs is not None
        return self._logs / f"{node}.log"

    def _keep(self) -> None:
        """Reap every agent that ends while the cluster runs, and start it again (see the
        module docstring)."""
        while not self._keeping.wait(_KEEP_EVERY):
            for node in self._spec:
                proc = self._agents.get(node.name)
                if proc is None or proc.poll() is None:  # poll() reaps one that ended
                    continue
                said = f"code {proc.returncode}: {_last_words(self._log_of(node.name))}"
                now = time.monotonic()
                ends = [t for t in self._ends.get(node.name, []) if now - t < RESTART_WINDOW]
                ends.append(now)
                self._ends[node.name] = ends
                if self._keeping.is_set():
                    return  # stop() is under way: the agents end because of it
                if not restart_allowed(ends, now):
                    del self._agents[node.name]
                    self._gave_up[node.name] = said
                    _log.error("The local agent of node %s keeps ending (%s).", node.name, said)
                    self._changed()
                    continue
                _log.warning(
                    "The local agent of node %s ended (%s); starting it again.", node.name, said
                )
                self._agents[node.name] = self._spawn(node)

    def stop(self) -> None:
        self._keeping.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join()
        self._watch.end()
        self.head.close()  # closes the rendezvous: agents leave and exit
        agents = list(self._agents.values())
        deadline = time.monotonic() + 5.0
        for proc in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if self._token:
            kill_tagged([self._token], 1.0)  # any that did not go by themselves
            guard.release(self._token)
        for proc in agents:
            proc.wait()
        self._agents = {}
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def lost_for_good(self) -> str | None:
        gave_up = dict(self._gave_up)
        if not gave_up:
            return None
        said = "; ".join(f"node {name}: {why}" for name, why in gave_up.items())
        return (
            f"The local worker agent of {len(gave_up)} node(s) ended {MAX_ENDS} times within "
            f"{RESTART_WINDOW:g} s and is not started again ({said}). Stop the cluster and "
            "start a new one."
        )


def _last_words(log: Path) -> str:
    """The last lines an agent that ended wrote to its stderr, the file ``log``."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - (1 << 16)))
            text = f.read().decode(errors="replace")
    except OSError:
        return "no output"
    return " / ".join(text.strip().splitlines()[-3:]) or "no output"
