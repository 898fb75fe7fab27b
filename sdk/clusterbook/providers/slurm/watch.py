"""How a Slurm cluster's nodes are watched: :class:`JobWatch`, the cluster's batch jobs (its
allocations) followed through ``squeue`` beside what the rendezvous head sees of the agents
that joined.

A cluster has one allocation from its start, and one more for each node ``scale()`` added; a
node's name ends with its allocation's job id (``snode1-42``). While an allocation waits in
the queue, each of its nodes still to come shows as a pending row with Slurm's reason
(``Slurm job 42 is PENDING (Resources)``). ``wait_ready`` says the jobs' states when it times
out, and stops at once when every allocation ended: their nodes are gone for good, and only
a new job brings nodes again.

Slurm's warning before a time limit (``--signal``) reaches the batch script, which leaves a
marker file beside the job's output; the watch sees it at its next look, names the nodes of
that allocation in :meth:`JobWatch.warned` (the head forwards the signal to their ranks), and,
if the cluster requeues, requeues the allocation ``requeue_after`` seconds later.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ClusterStateError, ReadyTimeoutError
from clusterbook.providers.slurm.batch import BatchJob, JobState
from clusterbook.providers.slurm.commands import SlurmCommands
from clusterbook.providers.watch import AgentWatch
from clusterbook.scaling import Allocation
from clusterbook.status import NodeStatus

__all__ = ["Followed", "JobWatch"]

_GONE_STATES = ("lost", "left")
_READY_STEP = 0.25  # seconds wait_ready waits for the head between two looks at the jobs


@dataclass
class Followed:
    """One allocation of the cluster: its job id, nodes, output, state as last seen, and when
    (monotonic) Slurm's warning came, if it did and the allocation was not requeued since."""

    job_id: int
    nodes: int
    output: Path
    state: JobState
    first: bool = False
    warned: float | None = None

    @property
    def suffix(self) -> str:
        return f"-{self.job_id}"

    @property
    def marker(self) -> Path:
        """The file the batch script leaves when Slurm's warning reaches it."""
        return self.output.with_name(f"slurm-{self.job_id}.warned")


class JobWatch:
    """The watch of the nodes of the cluster's allocations, the first of ``job`` (submitted
    through ``slurm``): ``agents`` (what the rendezvous head sees of those that joined), and
    each job's state, asked of ``squeue`` every ``poll`` seconds while nodes are missing (four
    times less often once all are there). ``requeue_after``: seconds after Slurm's warning at
    which an allocation is requeued (None: never); ``leaving(job_id)`` is told just before."""

    def __init__(
        self,
        agents: AgentWatch,
        job: BatchJob,
        slurm: SlurmCommands,
        poll: float,
        requeue_after: float | None = None,
        leaving: Callable[[int], dict[str, Exception]] | None = None,
    ) -> None:
        self.agents = agents
        self.job = job
        self._slurm = slurm
        self.poll = poll  # seconds between two squeue while nodes are missing
        self.requeue_after = requeue_after
        self._leaving = leaving  # told before a requeue ends an allocation's nodes
        self.jobs: dict[int, Followed] = {}  # by job id, in the order submitted
        # Allocations scale() cancelled: their rows go, and their nodes get no more work.
        # (Replaced, not changed in place: readers on other threads look at it meanwhile.)
        self.released: frozenset[int] = frozenset()
        self._error: str | None = None
        self._watching = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopping = False

    # -- what it follows ------------------------------------------------------------------

    def _first(self) -> Followed | None:
        return next((f for f in self.jobs.values() if f.first), None)

    @property
    def job_id(self) -> int | None:
        """The cluster's first batch job's id (None before it was submitted, or once stopped)."""
        first = self._first()
        return None if first is None or self.stopping else first.job_id

    @property
    def output(self) -> Path | None:
        first = self._first()
        return None if first is None else first.output

    @property
    def state(self) -> JobState | None:
        first = self._first()
        return None if first is None else first.state

    def allocations(self) -> list[Allocation]:
        """The allocations being followed, oldest first, as :mod:`clusterbook.scaling` sees
        them."""
        return [
            Allocation(str(f.job_id), f.nodes, f.state.state, f.state.reason, f.first)
            for f in list(self.jobs.values())
            if f.state.active
        ]

    # -- following the jobs -----------------------------------------------------------------

    def follow(
        self,
        job_id: int,
        output: Path,
        changed: Callable[[], None],
        *,
        nodes: int | None = None,
    ) -> None:
        """Follow job ``job_id`` (its output at ``output``; ``nodes``: how many it brings,
        the cluster's own job's by default, which makes it the first) from now on, until it
        ends or :meth:`stop`; ``changed()`` is told each change of a job's state."""
        followed = Followed(job_id, nodes or self.job.nodes, output, JobState("PENDING"))
        followed.first = not self.jobs
        self.jobs[job_id] = followed  # first: stop() cancels it, whatever comes next
        with contextlib.suppress(ClusterError):  # its reason, shown from the start
            followed.state = self._slurm.state(job_id)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._follow, args=(changed,), name="clusterbook-slurm", daemon=True
            )
            self._thread.start()

    def release(self, job_id: int) -> None:
        """Follow job ``job_id`` no more: ``scale()`` cancels it (its nodes leave the rows)."""
        self.released |= {job_id}
        self.jobs.pop(job_id, None)

    def cancelled(self, node: str) -> bool:
        """Whether ``node`` is of an allocation :meth:`release` let go: its agent may be in the
        round a while longer (until Slurm's SIGTERM reaches it and it leaves, or its heartbeats
        stop), but no job is placed on it any more."""
        released = self.released
        return bool(released) and node.endswith(tuple(f"-{i}" for i in released))

    def _follow(self, changed: Callable[[], None]) -> None:
        while not self._watching.wait(self.poll if self.missing() else 4 * self.poll):
            active = [f for f in list(self.jobs.values()) if f.state.active]
            if not active:
                continue
            try:
                states = self._slurm.states([f.job_id for f in active])
            except ClusterError as exc:
                self._error = str(exc)
                continue
            self._error = None
            news = [self._look(f, states[f.job_id]) for f in active]
            if any(news):
                changed()

    def _look(self, followed: Followed, state: JobState) -> bool:
        """One allocation as Slurm says now (``state``): see whether its warning came,
        requeue it when it is time; whether anything changed."""
        news, followed.state = state != followed.state, state
        if followed.warned is None and followed.marker.exists():
            followed.warned, news = time.monotonic(), True
        after = self.requeue_after
        warned = followed.warned
        if warned is not None and after is not None and time.monotonic() - warned >= after:
            with contextlib.suppress(OSError):
                followed.marker.unlink()
            followed.warned, news = None, True
            try:
                kept = self._leaving(followed.job_id) if self._leaving is not None else {}
                self._slurm.requeue(followed.job_id)
                if kept:
                    said = "; ".join(f"{n}: {e}" for n, e in kept.items())
                    self._error = f"What put() created stayed on requeued nodes ({said})."
            except ClusterError as exc:
                self._error = str(exc)
        return news

    def stop(self) -> list[int]:
        """Stop following; return the ids of the jobs followed (they are no longer the
        cluster's: no rows, no problem, nothing lost for good from now on); none the second
        time."""
        if self.stopping:
            return []
        self.stopping = True
        self._watching.set()
        return list(self.jobs)

    def ended(self, job_id: int, state: JobState) -> None:
        """Job ``job_id`` is in ``state`` now (as its stop found it)."""
        if (followed := self.jobs.get(job_id)) is not None:
            followed.state = state

    def _mine(self, rows: list[NodeStatus], followed: Followed) -> list[NodeStatus]:
        return [s for s in rows if s.name.endswith(followed.suffix)]

    def joined(self, job_id: int) -> bool:
        """Whether some node of job ``job_id`` joined (its agents end the job by leaving)."""
        followed = self.jobs.get(job_id)
        return followed is not None and bool(self._mine(self.agents.node_statuses(), followed))

    def missing(self) -> int:
        """How many nodes of the active allocations have not joined (or were lost, or
        left)."""
        rows = [s for s in self.agents.node_statuses() if s.state not in _GONE_STATES]
        return sum(
            max(0, f.nodes - len(self._mine(rows, f)))
            for f in list(self.jobs.values())
            if f.state.active
        )

    def warned(self) -> set[str]:
        """The nodes whose allocation Slurm warned of its end (its time limit is near)."""
        warned = [f for f in list(self.jobs.values()) if f.warned is not None]
        rows = self.agents.node_statuses()
        return {s.name for f in warned for s in self._mine(rows, f)}

    def lost_for_good(self) -> str | None:
        """Every allocation ended (scancel, its time limit, a failure): their nodes are gone,
        and only a new job brings nodes again."""
        followed = list(self.jobs.values())
        if self.stopping or not followed or any(f.state.active for f in followed):
            return None
        first = followed[0]
        return (
            f"{first.state.describe(first.job_id)}: its nodes are gone (output: "
            f"{first.output}). Stop the cluster and start a new one."
        )

    # -- the watch ---------------------------------------------------------------------------

    def node_statuses(self) -> list[NodeStatus]:
        """The nodes that joined, and a pending row for each node an allocation still owes,
        with Slurm's state and reason (``Slurm job 42 is PENDING (Resources)``)."""
        rows = [s for s in self.agents.node_statuses() if not self.cancelled(s.name)]
        if self.stopping:
            return rows
        pending = []
        for f in list(self.jobs.values()):
            if not f.state.active:
                continue
            present = sum(s.state not in _GONE_STATES for s in self._mine(rows, f))
            where = "(queued)" if f.state.state == "PENDING" else "(starting)"
            said = f.state.describe(f.job_id)
            if f.state.state != "PENDING":
                said += "; its agent has not joined yet"
            pending += [
                NodeStatus(
                    name=f"slurm-{f.job_id}-{i}",
                    host=where,
                    slots=self.job.slots or 0,
                    state="pending",
                    last_reason=said,
                )
                for i in range(present, f.nodes)
            ]
        return rows + pending

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        return self.agents.unreachable(names, lost_only=lost_only, ended=ended)

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        return self.agents.resource_history(window, nodes=nodes, points=points)

    def _added_missing(self) -> str | None:
        """The allocations added since the start whose nodes are not all in the round yet,
        said with their state; None when there is none."""
        rows = [s for s in self.agents.node_statuses() if s.state == "joined"]
        short = [
            f.state.describe(f.job_id)
            for f in list(self.jobs.values())
            if not f.first and f.state.active and len(self._mine(rows, f)) < f.nodes
        ]
        return f"waiting for the nodes of {', '.join(short)}" if short else None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        head = self.agents.head
        while True:
            left = deadline - time.monotonic()
            try:
                self.agents.wait_ready(max(0.0, min(_READY_STEP, left)))
                seen = head.wait_observed(-1, 0.0)
                reason = self._added_missing()
                if reason is None:
                    return
                # Until the rendezvous changes (their nodes join), or the jobs may have.
                head.wait_observed(seen, max(0.0, min(_READY_STEP, left)))
            except ReadyTimeoutError as exc:
                reason = exc.reason
            state, job_id = self.state, self.job_id
            if gone := self.lost_for_good():
                raise ClusterStateError(f"{gone} Before it ended, {reason}.{self._output_tail()}")
            if left <= 0:
                said = f"{state.describe(job_id)}; " if state and job_id else ""
                raise ReadyTimeoutError(
                    f"The Slurm cluster is not ready after {timeout:g} s: {said}{reason}.",
                    timeout=timeout,
                    reason=f"{said}{reason}",
                )

    def losses(self) -> dict[str, int]:
        return self.agents.losses()

    def problem(self) -> str | None:
        found = self.agents.problem()
        if found or self.stopping:
            return found
        return self._error

    def _output_tail(self, lines: int = 10) -> str:
        if self.output is None:
            return ""
        try:
            text = self.output.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f" Its output would be in {self.output}."
        shown = "".join(f"\n  {line}" for line in text)
        return f" The end of its output ({self.output}):{shown}" if text else ""
