"""Test doubles shipped with clusterbook, for code that uses it (as httpx ships
``MockTransport``).

:func:`fake_nvidia_smi` writes a stand-in ``nvidia-smi`` that lists made-up GPUs (or fails,
or hangs): put its directory first on ``PATH`` and clusterbook sees those GPUs (its probe runs
``nvidia-smi -L`` and nothing else), on a machine that has none.

:class:`FakeProvider` is a provider whose nodes exist in memory: starting and stopping them is
instant, their status is whatever the test says (:meth:`FakeProvider.lose`), and jobs run on
this machine, with the cluster's launcher. It is its own watch and reach (``fake.watch`` and
``fake.reach`` are ``fake``), so a test calls their members on it. Inject it::

    cluster = cb.Cluster(FakeProvider(nodes=2, slots=2))

:class:`FakeSlurm` answers ``sbatch``, ``squeue``, ``scancel`` and ``scontrol`` as a Slurm
whose jobs stay where the test puts them: inject it as a Slurm cluster's runner::

    slurm = FakeSlurm(reason="Resources")
    cluster = cb.Cluster.slurm(nodes=2, runner=slurm)

:func:`stand_in_hosts` starts machines to reach with ssh on this one (user-level sshds on
``127.0.0.2``, ...) whose logins get a throwaway home: an SSH cluster of them writes nothing
in the user's own ``~/.ssh`` (see :mod:`clusterbook.ssh.standin`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ReadyTimeoutError
from clusterbook.gpu_fakes import fake_nvidia_smi
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.transfer import uncounted
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.reach import NodeReach, here_for
from clusterbook.providers.watch import NodeWatch
from clusterbook.resources import ResourceHistory
from clusterbook.spec import NodeSpec, validate_positive_int
from clusterbook.ssh.standin import StandInHosts, stand_in_hosts
from clusterbook.status import NodeStatus

__all__ = ["FakeProvider", "FakeSlurm", "StandInHosts", "fake_nvidia_smi", "stand_in_hosts"]

_USAGE = ("cpu", "memory_used_gib", "memory_gib", "gpu")


@dataclass
class _Calls:
    """What was asked of a :class:`FakeProvider`, in order."""

    started: list[StartContext] = field(default_factory=list)
    stopped: int = 0
    stopped_jobs: list[str] = field(default_factory=list)
    put: list[Outgoing] = field(default_factory=list)
    gathered: list[Path] = field(default_factory=list)


class FakeProvider(Provider):
    """Nodes in memory, jobs on this machine; its own watch and reach.

    Parameters
    ----------
    nodes
        How many nodes (named ``fake-0``, ``fake-1``, ...), or the nodes themselves.
    slots
        Slots of each node, when ``nodes`` is a number.
    fail_start
        An error :meth:`start` raises instead of starting (a bootstrap that fails).
    ready
        Whether the nodes are ready once started; if not, ``wait_ready`` times out until
        :meth:`make_ready` (as it does before the start).
    bounds
        ``(min_nodes, max_nodes)`` to report, as an elastic provider does.
    gather_files
        ``{name: bytes}``: what the nodes hand over to ``gather()`` (then they have no more).
    report_interval, clock
        Seconds between a node's reports, and the wall clock of :meth:`report_usage`.
    """

    kind = "fake"

    def __init__(
        self,
        nodes: int | Sequence[NodeSpec] = 2,
        slots: int = 1,
        *,
        fail_start: ClusterError | None = None,
        ready: bool = True,
        bounds: tuple[int, int] | None = None,
        gather_files: dict[str, bytes] | None = None,
        report_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(nodes, int):
            count = validate_positive_int(nodes, "nodes")
            nodes = [NodeSpec(f"fake-{i}", "localhost", slots) for i in range(count)]
        self._nodes = tuple(nodes)
        self._fail_start = fail_start
        self._ready = ready
        self._bounds = bounds
        self._gather = dict(gather_files or {})
        self._lost: dict[str, str] = {}
        self._losses: dict[str, int] = {}  # name -> times lose() lost it
        self._for_good: str | None = None
        self._ctx: StartContext | None = None
        self.problem_text: str | None = None
        self.calls = _Calls()
        self._clock, self._names = clock, {n.name for n in self._nodes}
        self._memory: dict[str, tuple[float, int]] = {}  # node -> percent in use, bytes
        self.history = ResourceHistory(report_interval, clock=clock)

    # -- what a test does ---------------------------------------------------------------

    def lose(self, name: str) -> None:
        """Node ``name`` is lost (it stopped heartbeating): the cluster is told."""
        if name not in {n.name for n in self._nodes}:
            raise KeyError(name)
        self._mark_lost(name, f"Node {name} (localhost) was lost: it stopped heartbeating")
        self._tell()

    def lose_all_for_good(self, why: str) -> None:
        """Every node is lost and cannot come back, for ``why``: what :meth:`lost_for_good`
        says from now on. The cluster is told."""
        for node in self._nodes:
            self._mark_lost(node.name, f"Node {node.name} (localhost) was lost")
        self._for_good = why
        self._tell()

    def _mark_lost(self, name: str, why: str) -> None:
        """Node ``name`` is lost for ``why``; a loss counts once, until it is back."""
        self._losses[name] = self._losses.get(name, 0) + (name not in self._lost)
        self._lost[name] = why

    def make_ready(self) -> None:
        """The nodes are ready now (after ``ready=False``)."""
        self._ready = True
        self._tell()

    def report_problem(self, text: str | None) -> None:
        """What :meth:`problem` says from now on."""
        self.problem_text = text
        self._tell()

    def report_usage(
        self, usage: Mapping[str, Mapping[str, float | None]], t: float | None = None
    ) -> None:
        """Nodes reported their use at ``t`` (now, by the clock, if None), as agents do with
        each heartbeat: ``{node: {"cpu": %, "memory_used_gib": GiB, "memory_gib": GiB,
        "gpu": %}}`` (a key left out: not known); their status rows show the memory. The
        cluster is told once."""
        when = self._clock() if t is None else t
        for node, values in usage.items():
            if node not in self._names:
                raise KeyError(node)
            self.history.add(node, when, **{k: values.get(k) for k in _USAGE})
            used, total = values.get("memory_used_gib"), values.get("memory_gib")
            if used is not None and total:
                self._memory[node] = (used / total * 100, int(total * 2**30))
        self._tell()

    def _tell(self) -> None:
        if self._ctx is not None:
            self._ctx.changed()

    # -- the contract -------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._nodes if self.started and self._ready else ()

    def start(self, ctx: StartContext) -> None:
        self.calls.started.append(ctx)
        ctx.progress(f"starting {len(self._nodes)} fake nodes")
        if self._fail_start is not None:
            raise self._fail_start
        self._ctx = ctx
        self.started = True

    def stop(self) -> None:
        self.calls.stopped += 1
        self.started = False
        self._ctx = None

    def lost_for_good(self) -> str | None:
        return self._for_good

    @property
    def bounds(self) -> tuple[int, int] | None:
        return self._bounds

    @property
    def watch(self) -> NodeWatch:
        return self

    @property
    def reach(self) -> NodeReach:
        return self

    # -- the watch ----------------------------------------------------------------------

    def wait_ready(self, timeout: float) -> None:
        if not (self.started and self._ready):
            names = ", ".join(n.name for n in self._nodes)
            raise ReadyTimeoutError(
                f"The fake nodes are not ready after {timeout:g} s: waiting for {names}.",
                timeout=timeout,
                reason=f"waiting for {names}",
            )

    def node_statuses(self) -> list[NodeStatus]:
        state = "ready" if self.started and self._ready else "pending"
        return [
            NodeStatus(
                n.name,
                n.host,
                n.slots,
                "lost" if n.name in self._lost else state,
                memory_used=self._memory.get(n.name, (None, None))[0],
                memory=self._memory.get(n.name, (None, None))[1],
                gpus=n.gpus.count,
                gpu_model=n.gpus.model,
            )
            for n in self._nodes
        ]

    def losses(self) -> dict[str, int]:
        return dict(self._losses)

    def problem(self) -> str | None:
        return self.problem_text

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        return {n: why for n, why in self._lost.items() if n in names}

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        return self.history.answer(window, nodes=nodes, points=points)

    # -- the reach ----------------------------------------------------------------------

    def remote(self) -> RemoteLaunch | None:
        return None

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        return run_everywhere(self.nodes, {}, argv, timeout, only=nodes)

    def free_port(self, node: NodeSpec) -> int | None:
        return None

    def stop_job(self, token: str) -> None:
        self.calls.stopped_jobs.append(token)

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        return ()

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        self.calls.put.append(sent)
        if sent.relocated:  # its nodes share this machine's files
            return here_for(sent, sending, [n.name for n in self.nodes], nodes)
        sending(sum(f.size for f in sent.files))
        return {}

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        self.calls.gathered.append(directory)
        stored = []
        for name, data in sorted(self._gather.items()):
            if name in skip:
                continue
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(data)
            receiving(len(data))
            stored.append(directory / name)
        self._gather = {n: d for n, d in self._gather.items() if n in skip}
        return stored, {}


class FakeSlurm:
    """Slurm's commands answered in memory: a runner for ``Cluster.slurm(runner=...)``.

    Every job ``sbatch`` submits gets the next id and stays in ``state`` (with ``reason``)
    until the test moves it (:meth:`set_state`) or ``scancel`` cancels it. ``refuse`` is what
    sbatch says on stderr, exiting 1, instead of submitting. ``srun``'s start check (see
    :func:`clusterbook.providers.slurm.srun.check_world`) finds an MPI world of ``world`` ranks
    (default: one per node; 1 is a PMI plugin that does not fit). ``calls`` holds every argv,
    and ``scripts`` each submitted script's text.
    """

    def __init__(
        self,
        *,
        state: str = "PENDING",
        reason: str | None = "Resources",
        refuse: str | None = None,
        controller: str = "127.0.0.1",
        world: int | None = None,
    ) -> None:
        self.state, self.reason, self.refuse = state, reason, refuse
        self.controller = controller
        self.world = world
        self.calls: list[list[str]] = []
        self.scripts: list[str] = []
        self.jobs: dict[int, tuple[str, str | None]] = {}
        self._lock = threading.Lock()

    def set_state(self, job_id: int, state: str, reason: str | None = None) -> None:
        """Job ``job_id`` is in ``state`` now (``RUNNING``, ``COMPLETED``...)."""
        with self._lock:
            self.jobs[job_id] = (state, reason)

    def commands(self, name: str) -> list[list[str]]:
        """The calls of command ``name`` (``"scancel"``), in order."""
        return [c for c in self.calls if c[0] == name]

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        with self._lock:
            self.calls.append(argv)
            return self._answer(argv)

    def _answer(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        def done(code: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.CompletedProcess(argv, code, out, err)

        invalid = "slurm_load_jobs error: Invalid job id specified"
        command = argv[0]
        if command == "sbatch":
            if self.refuse is not None:
                return done(1, err=self.refuse + "\n")
            self.scripts.append(Path(argv[-1]).read_text())
            job_id = len(self.jobs) + 1
            self.jobs[job_id] = (self.state, self.reason)
            return done(0, f"{job_id}\n")
        if command == "squeue" and argv[argv.index("-o") + 1].startswith("%i"):
            ids = [int(i) for i in argv[argv.index("-j") + 1].split(",")]
            known = [(i, self.jobs[i]) for i in ids if i in self.jobs]
            if not known:
                return done(1, err=invalid)
            return done(0, "".join(f"{i} {s} {r or 'None'}\n" for i, (s, r) in known))
        if command == "squeue":
            job = self.jobs.get(int(argv[argv.index("-j") + 1]))
            if job is None:
                return done(1, err=invalid)
            return done(0, f"{job[0]} {job[1] or 'None'}\n")
        if command == "scancel":
            job_id = int(argv[1])
            if job_id not in self.jobs:
                return done(1, err=f"scancel: error: Kill job error on job id {job_id}: {invalid}")
            if self.jobs[job_id][0] in ("PENDING", "RUNNING", "CONFIGURING"):
                self.jobs[job_id] = ("CANCELLED", None)
            return done(0)
        if argv[:2] == ["scontrol", "requeue"]:  # queued again, same id, after a while
            self.jobs[int(argv[2])] = ("PENDING", "BeginTime")
            return done(0)
        if argv[:3] == ["scontrol", "show", "config"]:
            return done(0, f"SlurmctldHost[0]        = fake({self.controller})\n")
        if Path(command).name == "srun" and any(a.startswith("--mpi=") for a in argv):
            # The start check of srun launches: each task reports its node and MPI world.
            hosts = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
            size = self.world or len(hosts)
            out = "".join(
                f"{i}: " + json.dumps({"host": h, "cores": 2, "rank": i, "size": size}) + "\n"
                for i, h in enumerate(hosts)
            )
            return done(0, out)
        return done(1, err=f"FakeSlurm does not know {shlex.join(argv)!r}")
