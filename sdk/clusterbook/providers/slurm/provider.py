"""Nodes from Slurm: one batch job whose step runs an elastic agent on every allocated node.

``Cluster.slurm(nodes=2, ...)`` serves an elastic rendezvous (see
:mod:`clusterbook.providers.elastic.provider`) and submits one batch job (``sbatch``; the script
goes to the cluster's run directory, Slurm's output beside it as ``slurm-JOBID.out``). Its one step
(``srun``, a task per node) runs ``clusterbook worker join URL --token-file F --start-sshd 0`` on
each node, so the nodes join as elastic nodes do, each with a user-level sshd for MPI. The nodes
must share the head's files where the token file is (the home directory, as Slurm clusters do) and
have its Python environment at the same path.

While the job waits in the queue, :meth:`SlurmProvider.node_statuses` shows a pending row for
each node still to come, with Slurm's reason (``squeue``). The job's time limit is the
cluster's life span. :meth:`SlurmProvider.stop` closes the rendezvous (the agents stop their
sshd and ranks and remove their files), then cancels the job if it is still there and waits
until Slurm says it has ended.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from clusterbook.errors import (
    CleanupWarning,
    ClusterError,
    ClusterStateError,
    ConfigError,
    ReadyTimeoutError,
)
from clusterbook.launch.remote import RemoteLaunch, SrunStep
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import StartContext
from clusterbook.providers.elastic.provider import ElasticProvider
from clusterbook.providers.elastic.reach import head_address_towards
from clusterbook.providers.slurm.batch import BatchJob, JobState, render_script, sbatch_argv
from clusterbook.providers.slurm.commands import SlurmCommands, SlurmRunner, write_script
from clusterbook.providers.slurm.srun import check_world
from clusterbook.rendezvous.agent import agent_argv
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.status import NodeStatus
from clusterbook.wording import spell_or

__all__ = ["SlurmProvider"]

_log = logging.getLogger(__name__)

_GONE_STATES = ("lost", "left")
_END_WAIT = 30.0  # seconds Slurm gets to end the job once cancelled (KillWait is 30 by default)
_LEAVE_WAIT = 5.0  # seconds the job gets to end by itself once its agents were told to leave


class SlurmProvider(ElasticProvider):
    """An elastic cluster whose nodes come from one Slurm batch job (see the module)."""

    kind = "slurm"

    def __init__(
        self,
        nodes: int = 2,
        slots: int | None = None,
        partition: str | None = None,
        time: str | float | None = "1:00:00",
        account: str | None = None,
        sbatch_args: Sequence[str] = (),
        min_nodes: int | None = None,
        *,
        listen: str | None = None,
        port: int = 0,
        last_call: float = 1.0,
        join_timeout: float = 600.0,
        keep_alive_interval: float = 1.0,
        keep_alive_max_attempt: int = 3,
        runner: SlurmRunner | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        self.job = BatchJob.make(
            nodes,
            min_nodes=min_nodes,
            slots=slots,
            partition=partition,
            time=time,
            account=account,
            sbatch_args=sbatch_args,
        )
        super().__init__(
            self.job.min_nodes or self.job.nodes,
            self.job.nodes,
            listen=listen or "127.0.0.1",
            port=port,
            last_call=last_call,
            join_timeout=join_timeout,
            keep_alive_interval=keep_alive_interval,
            keep_alive_max_attempt=keep_alive_max_attempt,
            announce=False,
        )
        self._listen, self._port = listen, port
        self.slurm = SlurmCommands(runner)
        self._poll = poll_interval
        self.job_id: int | None = None
        self.script: Path | None = None
        self.output: Path | None = None
        self._job_state: JobState | None = None
        self._watch_error: str | None = None
        self._watching = threading.Event()
        self._stopping = False
        self._srun_lock = threading.Lock()
        self._srun_checked: str | None = None  # srun, once the start check passed
        self._srun_failed: str | None = None  # why jobs start over ssh instead

    @property
    def life_span(self) -> float | None:
        return self.job.seconds

    @property
    def job_state(self) -> JobState | None:
        """The batch job's state as last seen (None before it was submitted)."""
        return self._job_state

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, ctx: StartContext) -> None:
        listen = self._listen or self._address_for_nodes()
        # The head listens where the nodes reach it (only known now: Slurm is asked).
        self.head = RendezvousHead(self.settings, listen=listen, port=self._port)
        super().start(ctx)
        try:
            self._submit(ctx)
        except BaseException:
            self.stop()  # the job too, if sbatch took it (an interrupt while asking squeue)
            with contextlib.suppress(OSError):  # its token and keys are gone: it is empty
                cluster_dir(ctx.cluster_id).rmdir()
            raise
        threading.Thread(
            target=self._watch, args=(ctx,), name="clusterbook-slurm", daemon=True
        ).start()

    def _submit(self, ctx: StartContext) -> None:
        assert self.head.join_url is not None
        assert self.head.token_file is not None
        directory = ctx.run_dir or cluster_dir(ctx.cluster_id)
        self.script = directory / "slurm-job.sh"
        agent = agent_argv(ctx.python, self.head.join_url, self.head.token_file, start_sshd=0)
        write_script(
            self.script, render_script(agent, cluster=ctx.cluster_id, slots=self.job.slots)
        )
        output = directory / "slurm-%j.out"
        argv = sbatch_argv(self.job, name=ctx.cluster_id, script=self.script, output=output)
        ctx.progress("submitting the Slurm job")
        self.job_id = self.slurm.submit(argv)
        self.output = directory / f"slurm-{self.job_id}.out"
        try:  # its reason, shown from the start
            self._job_state = self.slurm.state(self.job_id)
        except ClusterError:
            self._job_state = JobState("PENDING")
        ctx.changed()

    def _address_for_nodes(self) -> str:
        """This machine's address on the way to slurmctld: where the nodes reach it too."""
        controller = self.slurm.controller()
        try:
            if controller is None:
                raise OSError("scontrol show config names no SlurmctldHost")
            return head_address_towards(socket.gethostbyname(controller))
        except OSError as exc:
            given = spell_or("listen", "ADDRESS", "the listen option in Python")
            raise ConfigError(
                f"Cannot tell the address the Slurm nodes reach this machine at ({exc}); give "
                f"it with {given}."
            ) from None

    def _watch(self, ctx: StartContext) -> None:
        """Follow the job's state (squeue) until it ends or the cluster stops."""
        job_id, last = self.job_id, self._job_state
        assert job_id is not None
        while not self._watching.wait(self._poll if self._missing() else 4 * self._poll):
            try:
                state = self.slurm.state(job_id)
            except ClusterError as exc:
                self._watch_error = str(exc)
                continue
            self._watch_error, self._job_state = None, state
            if state != last:
                last = state
                ctx.changed()
            if not state.active:
                return

    def stop(self) -> None:
        self._stopping = True
        self._watching.set()
        joined = job_id = None
        if self.job_id is not None:
            joined = self._missing() < self.job.nodes
            job_id, self.job_id = self.job_id, None
        try:
            super().stop()  # the agents leave: the step, then the job, end by themselves
        finally:
            if job_id is not None:
                self._end_job(job_id, bool(joined))

    def _end_job(self, job_id: int, joined: bool) -> None:
        """Cancel the job unless its agents (``joined``: some did) ended it by leaving; wait
        until Slurm says it ended."""
        try:
            state = self.slurm.state(job_id)
            if state.active and joined:
                state = self.slurm.wait_ended(job_id, _LEAVE_WAIT)
            if state.active:
                self.slurm.cancel(job_id)
                state = self.slurm.wait_ended(job_id, _END_WAIT)
            self._job_state = state
            if state.active:
                raise ClusterError(f"{state.describe(job_id)} {_END_WAIT:g} s after scancel")
        except ClusterError as exc:
            warnings.warn(
                CleanupWarning(
                    f"Could not end Slurm job {job_id} of the cluster: {exc}. Cancel it with: "
                    f"scancel {job_id}"
                ),
                stacklevel=3,
            )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self.head.wait_ready(max(0.0, min(0.25, left)))
                return
            except ReadyTimeoutError as exc:
                reason = exc.reason
            state, job_id = self._job_state, self.job_id
            if gone := self.lost_for_good():
                raise ClusterStateError(f"{gone} Before it ended, {reason}.{self._output_tail()}")
            if left <= 0:
                said = f"{state.describe(job_id)}; " if state and job_id else ""
                raise ReadyTimeoutError(
                    f"The Slurm cluster is not ready after {timeout:g} s: {said}{reason}.",
                    timeout=timeout,
                    reason=f"{said}{reason}",
                )

    def _output_tail(self, lines: int = 10) -> str:
        if self.output is None:
            return ""
        try:
            text = self.output.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f" Its output would be in {self.output}."
        shown = "".join(f"\n  {line}" for line in text)
        return f" The end of its output ({self.output}):{shown}" if text else ""

    # -- how jobs start ---------------------------------------------------------------------

    def remote(self) -> RemoteLaunch | None:
        """Jobs start as steps of the batch job (``srun``, the MPI's PMI plugin: see
        :mod:`clusterbook.launch.srun`) while every node is one of the job's, once a start
        check found that MPI gets its world through the plugin; else with mpirun over the
        agents' sshd."""
        base = super().remote()
        step = self._srun_step()
        return base if base is None or step is None else replace(base, srun=step)

    def _srun_step(self) -> SrunStep | None:
        job_id, ctx = self.job_id, self._ctx
        if job_id is None or ctx is None or self._srun_failed is not None:
            return None
        suffix = f"-{job_id}"  # a node of the job is named after its Slurm node and the job
        nodes = self.nodes
        if not nodes or not all(n.name.endswith(suffix) for n in nodes):
            return None
        names = {n.host: n.name.removesuffix(suffix) for n in nodes}
        with self._srun_lock:
            if self._srun_checked is None:
                srun = shutil.which("srun")
                try:
                    if srun is None:
                        raise ConfigError("srun is not on PATH here")
                    check_world(self.slurm.run, srun, str(job_id), sorted(set(names.values())), ctx)
                except ClusterError as exc:
                    self._srun_failed = f"Jobs start with mpirun over ssh, not srun: {exc}"
                    _log.warning("%s", self._srun_failed)
                    return None
                self._srun_checked = srun
        return SrunStep(self._srun_checked, str(job_id), names)

    # -- status ---------------------------------------------------------------------------

    def _missing(self) -> int:
        present = [s for s in super().node_statuses() if s.state not in _GONE_STATES]
        return max(0, self.job.nodes - len(present))

    def node_statuses(self) -> list[NodeStatus]:
        """The nodes that joined, and a pending row for each node the job still owes, with
        Slurm's state and reason (``Slurm job 42 is PENDING (Resources)``)."""
        rows = super().node_statuses()
        state, job_id = self._job_state, self.job_id
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

    def problem(self) -> str | None:
        found = super().problem()
        if found or self._stopping:
            return found
        return self._watch_error

    def lost_for_good(self) -> str | None:
        """The batch job ended (scancel, its time limit, a failure): its nodes are gone, and
        only a new job brings nodes again."""
        state, job_id = self._job_state, self.job_id
        if self._stopping or state is None or job_id is None or state.active:
            return None
        return (
            f"{state.describe(job_id)}: its nodes are gone (output: {self.output}). Stop the "
            "cluster and start a new one."
        )
