"""How a Slurm cluster's nodes are watched: :class:`JobWatch`, the batch job followed through
``squeue`` beside what the rendezvous head sees of the agents that joined.

While the job waits in the queue, each node still to come shows as a pending row with Slurm's
reason (``Slurm job 42 is PENDING (Resources)``). ``wait_ready`` says the job's state when it
times out, and stops at once when the job ended: its nodes are gone for good, and only a new
job brings nodes again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ClusterStateError, ReadyTimeoutError
from clusterbook.providers.slurm.batch import BatchJob, JobState
from clusterbook.providers.slurm.commands import SlurmCommands
from clusterbook.providers.watch import AgentWatch
from clusterbook.status import NodeStatus

__all__ = ["JobWatch"]

_GONE_STATES = ("lost", "left")
_READY_STEP = 0.25  # seconds wait_ready waits for the head between two looks at the job


class JobWatch:
    """The watch of the nodes of ``job`` (submitted through ``slurm``): ``agents`` (what the
    rendezvous head sees of those that joined), and the job's state, asked of ``squeue`` every
    ``poll`` seconds while nodes are missing (four times less often once all are there)."""

    def __init__(
        self, agents: AgentWatch, job: BatchJob, slurm: SlurmCommands, poll: float
    ) -> None:
        self.agents = agents
        self.job = job
        self._slurm = slurm
        self.poll = poll  # seconds between two squeue while nodes are missing
        self.job_id: int | None = None
        self.output: Path | None = None
        self.state: JobState | None = None
        self._error: str | None = None
        self._watching = threading.Event()
        self.stopping = False

    # -- following the job -----------------------------------------------------------------

    def follow(self, job_id: int, output: Path, changed: Callable[[], None]) -> None:
        """Follow job ``job_id`` (its output at ``output``) from now on, on a thread of its
        own, until it ends or :meth:`stop`; ``changed()`` is told each change of its state."""
        self.job_id, self.output = job_id, output
        try:  # its reason, shown from the start
            self.state = self._slurm.state(job_id)
        except ClusterError:
            self.state = JobState("PENDING")
        threading.Thread(
            target=self._follow, args=(job_id, changed), name="clusterbook-slurm", daemon=True
        ).start()

    def _follow(self, job_id: int, changed: Callable[[], None]) -> None:
        last = self.state
        while not self._watching.wait(self.poll if self.missing() else 4 * self.poll):
            try:
                state = self._slurm.state(job_id)
            except ClusterError as exc:
                self._error = str(exc)
                continue
            self._error, self.state = None, state
            if state != last:
                last = state
                changed()
            if not state.active:
                return

    def stop(self) -> int | None:
        """Stop following; return the job's id, if one was followed (the job is no longer
        the cluster's: no rows, no problem, nothing lost for good from now on)."""
        self.stopping = True
        self._watching.set()
        job_id, self.job_id = self.job_id, None
        return job_id

    def missing(self) -> int:
        """How many of the job's nodes have not joined (or were lost, or left)."""
        present = [s for s in self.agents.node_statuses() if s.state not in _GONE_STATES]
        return max(0, self.job.nodes - len(present))

    def lost_for_good(self) -> str | None:
        """The batch job ended (scancel, its time limit, a failure): its nodes are gone, and
        only a new job brings nodes again."""
        state, job_id = self.state, self.job_id
        if self.stopping or state is None or job_id is None or state.active:
            return None
        return (
            f"{state.describe(job_id)}: its nodes are gone (output: {self.output}). Stop the "
            "cluster and start a new one."
        )

    # -- the watch ---------------------------------------------------------------------------

    def node_statuses(self) -> list[NodeStatus]:
        """The nodes that joined, and a pending row for each node the job still owes, with
        Slurm's state and reason (``Slurm job 42 is PENDING (Resources)``)."""
        rows = self.agents.node_statuses()
        state, job_id = self.state, self.job_id
        if state is None or job_id is None or not state.active:
            return rows
        present = sum(s.state not in _GONE_STATES for s in rows)
        where = "(queued)" if state.state == "PENDING" else "(starting)"
        said = state.describe(job_id)
        if state.state != "PENDING":
            said += "; its agent has not joined yet"
        rows += [
            NodeStatus(
                name=f"slurm-{job_id}-{i}",
                host=where,
                slots=self.job.slots or 0,
                state="pending",
                last_reason=said,
            )
            for i in range(present, self.job.nodes)
        ]
        return rows

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        return self.agents.unreachable(names, lost_only=lost_only)

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        return self.agents.resource_history(window, nodes=nodes, points=points)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self.agents.wait_ready(max(0.0, min(_READY_STEP, left)))
                return
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
