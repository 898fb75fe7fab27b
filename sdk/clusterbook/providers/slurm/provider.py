"""Nodes from Slurm: one batch job whose step runs an elastic agent on every allocated node.

``Cluster.slurm(nodes=2, ...)`` serves a rendezvous as an elastic cluster does (see
:mod:`clusterbook.providers.elastic.provider`: the same head, and the same reach of the nodes,
:class:`~clusterbook.providers.elastic.reach.FarReach`, composed rather than inherited) and
submits one batch job (``sbatch``; the script
goes to the cluster's run directory, Slurm's output beside it as ``slurm-JOBID.out``). Its one step
(``srun``, a task per node) runs ``clusterbook worker join URL --token-file F --start-sshd 0`` on
each node, so the nodes join as elastic nodes do, each with a user-level sshd for MPI. The nodes
must share the head's files where the token file is (the home directory, as Slurm clusters do) and
have its Python environment at the same path.

While the job waits in the queue, its watch (:class:`~clusterbook.providers.slurm.watch.JobWatch`)
shows a pending row for each node still to come, with Slurm's reason (``squeue``); jobs start
as steps of the batch job where they can (:mod:`clusterbook.providers.slurm.steps`). The job's
time limit is the cluster's life span. :meth:`SlurmProvider.stop` closes the rendezvous (the
agents stop their sshd and ranks and remove their files), then cancels the job if it is still
there and waits until Slurm says it has ended.
"""

from __future__ import annotations

import contextlib
import socket
import warnings
from collections.abc import Sequence
from pathlib import Path

from clusterbook.durations import Duration, duration
from clusterbook.errors import CleanupWarning, ClusterError, ClusterStateError, ConfigError
from clusterbook.launch.flavour import Launcher
from clusterbook.launch.nodes import RESTART_WAIT
from clusterbook.launch.remote import SrunStep
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import Provider, Scaler, StartContext
from clusterbook.providers.elastic.far import head_address_towards, networks_here, round_nodes
from clusterbook.providers.elastic.provider import join_command, warn_unclean
from clusterbook.providers.elastic.reach import FarReach
from clusterbook.providers.reach import NodeReach
from clusterbook.providers.slurm.batch import (
    BatchJob,
    JobState,
    render_script,
    sbatch_argv,
    with_directives,
)
from clusterbook.providers.slurm.commands import SlurmCommands, SlurmRunner, write_script
from clusterbook.providers.slurm.steps import StepCheck
from clusterbook.providers.slurm.watch import JobWatch
from clusterbook.providers.watch import AgentWatch, NodeWatch
from clusterbook.rendezvous.agent import agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.scaling import Allocation
from clusterbook.spec import NodeSpec, validate_channel_port, validate_positive_int
from clusterbook.wording import spell_or

__all__ = ["SlurmProvider"]

_END_WAIT = 30.0  # seconds Slurm gets to end the job once cancelled (KillWait is 30 by default)
_LEAVE_WAIT = 5.0  # seconds the job gets to end by itself once its agents were told to leave


class SlurmProvider(Provider):
    """A cluster whose nodes come from one Slurm batch job (see the module)."""

    kind = "slurm"

    def __init__(
        self,
        nodes: int = 2,
        slots: int | None = None,
        partition: str | None = None,
        time: Duration | None = "1:00:00",
        account: str | None = None,
        sbatch_args: Sequence[str] = (),
        min_nodes: int | None = None,
        *,
        max_nodes: int | None = None,
        signal_before: Duration | None = None,
        requeue: bool = False,
        listen: str | None = None,
        port: int = 0,
        channel_port: int | None = 0,
        last_call: Duration = 1.0,
        join_timeout: Duration = 600.0,
        keep_alive_interval: Duration = 1.0,
        keep_alive_max_attempt: int = 3,
        runner: SlurmRunner | None = None,
        poll_interval: Duration = 0.5,
    ) -> None:
        self.job = BatchJob.make(
            nodes,
            min_nodes=min_nodes,
            slots=slots,
            partition=partition,
            time=time,
            account=account,
            sbatch_args=sbatch_args,
            signal_before=signal_before,
            requeue=requeue,
        )
        most = self.job.nodes
        if max_nodes is not None:
            most = validate_positive_int(max_nodes, "max_nodes")
        if most < self.job.nodes:
            raise ConfigError(
                f"max_nodes ({most}) must be at least nodes ({self.job.nodes}): scale() and "
                "adapt() grow the cluster up to max_nodes."
            )
        # Checked now (torch's messages), with the real run id set at start().
        settings = RendezvousSettings(
            run_id="pending",
            min_nodes=self.job.min_nodes or self.job.nodes,
            max_nodes=most,
            timeout=RendezvousTimeout(
                join=duration(join_timeout, "join_timeout"),
                last_call=duration(last_call, "last_call"),
            ),
            keep_alive_interval=duration(keep_alive_interval, "keep_alive_interval"),
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        # It listens where the nodes reach it: only known at start (Slurm is asked).
        channel_port = validate_channel_port(channel_port, port)
        self.head = RendezvousHead(settings, port=port, channel_port=channel_port)
        self._listen = listen
        self.slurm = SlurmCommands(runner)
        poll = duration(poll_interval, "poll_interval")
        # Ranks get half of the warning's lead to checkpoint before the requeue ends them.
        after = self.job.signal / 2 if self.job.requeue and self.job.signal else None
        self.follow = JobWatch(
            AgentWatch(self.head), self.job, self.slurm, poll, after, leaving=self._leave
        )
        self.steps = StepCheck(self.slurm.run)
        self.far = FarReach(self.head, lambda: self.nodes, self._step)
        self._ctx: StartContext | None = None
        self._networks: list[str] = []
        self.script: Path | None = None
        self.stop_problems: dict[str, Exception] = {}

    @property
    def job_id(self) -> int | None:
        """The batch job's id, once submitted (None again once the cluster stopped)."""
        return self.follow.job_id

    @property
    def job_state(self) -> JobState | None:
        """The batch job's state as last seen (None before it was submitted)."""
        return self.follow.state

    @property
    def output(self) -> Path | None:
        """Where Slurm writes the job's output, once submitted."""
        return self.follow.output

    @property
    def settings(self) -> RendezvousSettings:
        return self.head.settings

    @property
    def bounds(self) -> tuple[int, int]:
        return self.settings.min_nodes, self.settings.max_nodes

    @property
    def life_span(self) -> float | None:
        # A job that is requeued comes back after its time limit: the cluster waits for it.
        return None if self.job.requeue else self.job.seconds

    @property
    def join_command(self) -> str | None:
        return join_command(self.head, None if self._ctx is None else self._ctx.launcher)

    @property
    def watch(self) -> NodeWatch:
        return self.follow

    @property
    def reach(self) -> NodeReach:
        return self.far

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The participants of the last complete round, by rank, but those of allocations
        ``scale()`` cancelled (their agents may not have left yet)."""
        held = [(n, r) for n, r in self.head.participants() if not self.follow.cancelled(n)]
        return round_nodes(held, socket.gethostname(), self._networks)

    def _leave(self, job_id: int) -> dict[str, Exception]:
        """The nodes of batch job ``job_id`` are to leave (cancelled, requeued): remove what
        ``put`` left there while their sshd runs; the nodes where that failed, with why."""
        rows = self.follow.agents.node_statuses()
        return self.far.leave([s.name for s in rows if s.name.endswith(f"-{job_id}")])

    def lost_for_good(self) -> str | None:
        return self.follow.lost_for_good()

    def preempting(self) -> set[str]:
        return self.follow.warned()

    @property
    def restart_wait(self) -> float:
        # A requeued job comes back after Slurm's cred_expire (120 s by default) and the
        # queue: its jobs' restarts wait as long as nodes are given to join.
        return self.settings.timeout.join if self.job.requeue else RESTART_WAIT

    @property
    def scaler(self) -> Scaler:
        return self

    # -- scaling (clusterbook.cluster.resize decides, through the Scaler protocol) -----------

    def allocations(self) -> list[Allocation]:
        return self.follow.allocations()

    def grow(self, count: int) -> None:
        """Submit ``count`` more allocations of one node each: the same script and options as
        the cluster's own job. sbatch's refusal is a ConfigError quoting it; the allocations
        submitted before it stay."""
        ctx, script = self._ctx, self.script
        if ctx is None or script is None:
            raise ClusterStateError("The Slurm cluster is not running: it has nothing to grow.")
        directory = script.parent
        output = directory / "slurm-%j.out"
        for _ in range(count):
            argv = sbatch_argv(self.job.more(), name=ctx.cluster_id, script=script, output=output)
            try:
                job_id = self.slurm.submit(argv)
            except ConfigError as exc:
                nodes = sum(a.nodes for a in self.allocations())
                raise ConfigError(
                    f"{exc}. The cluster keeps the {nodes} node(s) it has or waits for."
                ) from None
            self.follow.follow(job_id, directory / f"slurm-{job_id}.out", ctx.changed, nodes=1)
        ctx.changed()

    def release(self, ids: Sequence[str]) -> None:
        """Cancel the allocations ``ids``: what ``put`` left on their nodes goes first, while
        their sshd runs; then their agents leave, and their rows go."""
        for job_id in ids:
            if self._ctx is not None:
                warn_unclean(self._ctx.cluster_id, self._leave(int(job_id)))
            self.follow.release(int(job_id))
            self.slurm.cancel(int(job_id))
        if self._ctx is not None:
            self._ctx.changed()

    def _step(self, nodes: tuple[NodeSpec, ...]) -> SrunStep | None:
        return self.steps.step(self.job_id, self._ctx, nodes)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, ctx: StartContext) -> None:
        listen = self._listen or self._address_for_nodes()
        self._ctx = ctx
        try:
            # A node that joins is checked now (its master connection too), not at the next job.
            self.head.start(ctx.cluster_id, self.far.on_change(ctx.changed), listen=listen)
            self.far.start(ctx)
            self._networks = networks_here()
            self._submit(ctx)
        except BaseException:
            self.stop()  # the job too, if sbatch took it (an interrupt while asking squeue)
            with contextlib.suppress(OSError):  # its token and keys are gone: it is empty
                cluster_dir(ctx.cluster_id).rmdir()
            raise

    def _submit(self, ctx: StartContext) -> None:
        assert self.head.join_url is not None
        directory = ctx.run_dir or cluster_dir(ctx.cluster_id)
        self.script = directory / "slurm-job.sh"
        text, argv = self._render(ctx.python, ctx.cluster_id, directory, ctx.launcher)
        write_script(self.script, text)
        ctx.progress("submitting the Slurm job")
        job_id = self.slurm.submit(argv)
        self.follow.follow(job_id, directory / f"slurm-{job_id}.out", ctx.changed)
        ctx.changed()

    def _render(
        self, python: str, cluster_id: str, directory: Path, launcher: Launcher
    ) -> tuple[str, list[str]]:
        """The batch script and the sbatch command that submits it from ``directory``; before
        :meth:`start`, with placeholders for the rendezvous's URL and token file. Its agents
        check their node for ``launcher`` themselves: a node that joins needs no login."""
        url = self.head.join_url or "<URL: start() makes it>"
        token = self.head.token_file or "<TOKEN_FILE: start() makes it>"
        probe = (launcher.flavour.value, launcher.prefix)
        agent = agent_argv(python, url, token, start_sshd=0, probe_mpi=probe)
        warned = directory if self.job.signal is not None else None
        text = render_script(agent, cluster=cluster_id, slots=self.job.slots, warned=warned)
        output = directory / "slurm-%j.out"
        script = directory / "slurm-job.sh"
        return text, sbatch_argv(self.job, name=cluster_id, script=script, output=output)

    def job_script(
        self, python: str, cluster_id: str, run_dir: Path | None, launcher: Launcher
    ) -> str:
        directory = run_dir or cluster_dir(cluster_id)
        text, argv = self._render(python, cluster_id, directory, launcher)
        return with_directives(text, argv)

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

    def stop(self) -> None:
        joined = {i: self.follow.joined(i) for i in list(self.follow.jobs)}
        job_ids = self.follow.stop()
        ctx, self._ctx = self._ctx, None
        try:
            if ctx is not None:  # the agents leave: the step, then the job, end by themselves
                try:
                    self.stop_problems = self.far.stop()
                    warn_unclean(ctx.cluster_id, self.stop_problems)
                finally:
                    self.follow.agents.end()
                    self.head.close()
        finally:
            for job_id in job_ids:
                self._end_job(job_id, joined.get(job_id, False))

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
            self.follow.ended(job_id, state)
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
