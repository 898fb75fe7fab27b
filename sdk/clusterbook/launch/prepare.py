"""Preparing a job: from what ``cluster.mpirun`` was given to a running :class:`Job`.

:class:`JobRequest` holds what the user asked, checked; :func:`prepare` adds what the cluster
knows (its nodes, how the launcher reaches them, its interpreter and launcher), makes the job's
directory, builds the launch plan and starts the job."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from clusterbook.durations import Duration
from clusterbook.errors import ClusterError, ConfigError, NodeLostError, RunDirError
from clusterbook.launch.attempt import Attempt
from clusterbook.launch.command import LaunchPlan, placement
from clusterbook.launch.crowding import warn_crowded
from clusterbook.launch.flavour import Launcher
from clusterbook.launch.job import Job
from clusterbook.launch.jobdir import new_job_dir
from clusterbook.launch.keep import check_clean
from clusterbook.launch.logstore import LogBudget, LogStore
from clusterbook.launch.nodes import Placement
from clusterbook.launch.program import check_argv, check_cwd, resolve_program
from clusterbook.launch.rankwrap import HOOK_DIR
from clusterbook.launch.recovery import NO_RECOVERY, Backoff, Recovery
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import JobResult, KeptProcess, ssh_refusals
from clusterbook.launch.srun import launch_command
from clusterbook.nodes.tasks.common import process_tag
from clusterbook.spec import NodeSpec, validate_env, validate_np, validate_timeout

__all__ = [
    "JobArgs",
    "JobHooks",
    "JobRequest",
    "diagnose",
    "prepare",
]

_log = logging.getLogger("clusterbook.job")


class JobArgs(TypedDict, total=False):
    """What ``cluster.mpirun(argv, np, ...)`` takes besides the program and its ranks. Its
    durations (``timeout``, ``backoff``, ``deadline``) are seconds, a ``datetime.timedelta``
    or text like ``"90s"``, ``"30m"``, ``"1h30m"`` (:mod:`clusterbook.durations`).

    env
        Variables for the ranks, passed byte for byte.
    cwd
        Working directory of the ranks (default: the current one).
    timeout
        How long until the job is stopped; Python ranks first dump their stacks.
    oversubscribe
        Allow more ranks than slots.
    launcher_args
        Extra arguments for mpirun/mpiexec, placed before the program; a ``--map-by`` or
        ``--bind-to`` (MPICH: ``-bind-to``) there replaces clusterbook's own.
    abort_on_error
        A Python rank that raises, or calls ``sys.exit`` with a non-zero code, aborts the whole
        MPI job, so that no other rank hangs in a collective (default). Turn it off for programs
        that handle errors themselves (interactive engines).
    retries
        Run the job again after a failure, up to this many times (default 0), each attempt
        with its own logs (``job.logs()``'s ``attempt`` column).
    backoff
        How long before the first retry, doubled after each one up to 60 s (default 1), or a
        ``cb.Backoff(first, factor, limit)``.
    retry_on
        Which endings are retried: ``"failure"`` (a rank failed), ``"node-lost"``,
        ``"timeout"`` (default: ``{"failure", "node-lost"}``).
    deadline
        How long (like ``"2h"``) the job and all its retries may take together; at it the job is
        stopped as at a timeout (Python ranks dump their stacks).
    restarts
        When a node the job runs on is lost, relaunch it at once on the nodes that are left,
        up to this many times (default 0; not counted as retries), on all their slots (or
        ``np``, if fewer); ranks see ``CLUSTERBOOK_RESTART`` and
        ``TORCHELASTIC_RESTART_COUNT``, to resume from their own checkpoint. An elastic
        cluster's job waits for a complete round of at least ``min_nodes`` (up to 60 s).
    restart_on_join
        Also restart (taking one of ``restarts``) when a node joins an elastic cluster and its
        round grows: the job runs again on the larger round (default False).
    clean
        What is left of the job's processes once it has ended (Kubeflow MPIJob's
        ``cleanPodPolicy``). ``"all"`` (default): nothing; every process of the job is gone
        when ``wait()`` returns. ``"running"``: the processes still running when the job
        ended are ended, those that already exited are gone: for MPI ranks, whose logs are
        kept either way, that is what ``"all"`` does (a pod would stay to show its logs; a
        process leaves nothing to look at). ``"none"``: when a rank fails, the job's
        processes stay where they are, stopped (SIGSTOP, state ``T``), so that a debugger
        can attach (``py-spy dump --pid PID``, ``gdb -p PID``): the failing rank stops
        itself (a Python rank after its traceback; any other program when it exits: its
        wrapper stops) before the launcher tears the job down, then the head stops all the
        others, the launcher first. The job still ends: ``wait()`` returns its result,
        whose ``kept`` lists them (the launcher's ``returncode`` is -19, SIGSTOP); the
        failing rank's exit code is the one it reported. ``job.cleanup()`` ends them (and
        ``job.cancel()``, the cluster's ``stop()``, and the kernel's exit). A job that is
        retried ends the processes of each failed attempt before the next; a timeout or a
        cancel ends everything as usual. Only on clusters whose nodes are all this machine
        (a local cluster): elsewhere it is a :class:`~clusterbook.errors.ConfigError`.
    """

    env: Mapping[str, str] | None
    cwd: str | os.PathLike[str] | None
    timeout: Duration | None
    oversubscribe: bool
    launcher_args: Sequence[str]
    abort_on_error: bool
    retries: int
    backoff: Duration | Backoff
    retry_on: Sequence[str] | str | None
    deadline: Duration | None
    restarts: int
    restart_on_join: bool
    clean: str


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What ``cluster.mpirun`` was asked, checked (see its docstring)."""

    argv: tuple[str, ...]
    np: int
    env: Mapping[str, str]
    cwd: str
    timeout: float | None
    oversubscribe: bool
    launcher_args: tuple[str, ...]
    abort_on_error: bool
    recovery: Recovery = NO_RECOVERY
    all_slots: bool = False  # np was not given: every slot, of the nodes left on a restart
    clean: str = "all"

    @classmethod
    def make(
        cls,
        argv: Sequence[str],
        np: int | None = None,
        *,
        slots: int,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: Duration | None = None,
        oversubscribe: bool = False,
        launcher_args: Sequence[str] = (),
        abort_on_error: bool = True,
        retries: int = 0,
        backoff: Duration | Backoff = 1.0,
        retry_on: Sequence[str] | str | None = None,
        deadline: Duration | None = None,
        restarts: int = 0,
        restart_on_join: bool = False,
        clean: str = "all",
    ) -> JobRequest:
        """Check what ``cluster.mpirun`` was given, for a cluster of ``slots`` slots."""
        if not isinstance(oversubscribe, bool) or not isinstance(abort_on_error, bool):
            raise ConfigError(
                "oversubscribe and abort_on_error must be True or False, got "
                f"{oversubscribe!r} and {abort_on_error!r}."
            )
        program = tuple(check_argv(argv))
        count = validate_np(slots if np is None else np, slots, oversubscribe=oversubscribe)
        extra = tuple(check_argv(launcher_args)) if launcher_args else ()
        limit = validate_timeout(timeout)
        return cls(
            argv=program,
            np=count,
            env=validate_env(env),
            cwd=check_cwd(cwd),
            timeout=limit,
            oversubscribe=oversubscribe,
            launcher_args=extra,
            abort_on_error=abort_on_error,
            recovery=Recovery.make(
                retries=retries,
                backoff=backoff,
                retry_on=retry_on,
                deadline=deadline,
                timeout=limit,
                restarts=restarts,
                restart_on_join=restart_on_join,
            ),
            all_slots=np is None,
            clean=check_clean(clean),
        )


@dataclass(frozen=True, slots=True)
class JobHooks:
    """What the job tells the cluster, and asks of it."""

    on_failure: Callable[[str], None]  # stop job ``token`` on every node
    on_done: Callable[[JobResult], None]
    diagnose: Callable[[JobResult | None], list[str]]
    # Where a new attempt may run now, and how; with True, a restart's (nodes left).
    where: Callable[[bool], Placement]
    on_attempt: Callable[[int], None] | None = None
    # Which of these nodes was lost, if one was (asked when ranks ended unreported).
    lost: Callable[[tuple[NodeSpec, ...]], NodeLostError | None] | None = None
    # A port free on a node now (None: not known).
    free_port: Callable[[NodeSpec], int | None] | None = None
    # Keep a failed job's processes stopped on the nodes of other machines (clean="none").
    hold: Callable[[str, Mapping[str, int]], tuple[KeptProcess, ...]] | None = None
    # Told how each attempt ended (plan, result, error), before the job decides what next.
    ended: Callable[[LaunchPlan, JobResult, ClusterError | None], None] | None = None


def diagnose(silent: Mapping[str, str], result: JobResult | None) -> list[str]:
    """Notes on why a job did not succeed: the nodes not heard from (``silent``), a changed
    host key (what the launcher's ssh said)."""
    notes = list(silent.values())
    return notes + (ssh_refusals(result.launcher_tail) if result is not None else [])


def _master_port(
    node: NodeSpec, free_port: Callable[[NodeSpec], int | None] | None, *, local: bool
) -> int:
    """A port for torch.distributed's store on rank 0's ``node``: one free there now, as
    this machine (``local``) or the node (``free_port``) says; else, when the node cannot be
    asked, a random one above the usual services and below Linux's ephemeral ports (where
    connections' own ports come from), 20000-32767 (the job's ``env`` may pin
    ``MASTER_PORT``)."""
    if local:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    try:
        asked = None if free_port is None else free_port(node)
    except Exception as exc:  # a node that does not answer now: the launch will tell
        _log.info("Could not ask %s for a free port: %s", node.name, exc)
        asked = None
    return asked if asked is not None else 20000 + secrets.randbelow(12768)


def _attempt_env(number: int, restarts: int) -> dict[str, str]:
    """What every rank of attempt ``number`` is told (unless the job's ``env`` says it)."""
    return {
        "CLUSTERBOOK_ATTEMPT": str(number),
        "CLUSTERBOOK_RESTART": str(restarts),
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
    }


def prepare(
    request: JobRequest,
    *,
    cluster: str,
    nodes: tuple[NodeSpec, ...],
    remote: RemoteLaunch | None,
    python: str,
    launcher: Launcher,
    env: Mapping[str, str],
    run_dir: Path,
    last_job: int,
    hooks: JobHooks,
    logs: LogBudget | None = None,
    forward_env: tuple[str, ...] = (),
) -> Job:
    """Start ``request`` on ``nodes`` of the cluster of id ``cluster`` (its processes are
    tagged ``ID-...``), in a new job directory under ``run_dir``; return the job. A retry
    runs where ``hooks.where()`` says then. ``logs``: what the log buffers of the cluster's
    jobs may hold together. ``forward_env``: more of this process's variables for the ranks
    (names, or prefixes ending in ``*``)."""
    job_env = {**env, **request.env}
    base_env = dict(os.environ)
    program = resolve_program(
        list(request.argv),
        # Nodes whose environments differ in path run the same per-cluster link on each node.
        python=(remote and remote.python) or python,
        path_env={**base_env, **job_env}.get("PATH"),
        cwd=request.cwd,
        local=remote is None,
    )
    # Told once the job is sure to start: after the checks of what it was given.
    warn_crowded(nodes, request.np, oversubscribe=request.oversubscribe)
    job_id, directory = new_job_dir(run_dir, last_job)
    attempts = _Attempts(
        request,
        job_id,
        cluster,
        tuple(program),
        launcher,
        hooks,
        first=(nodes, remote),
        job_env=job_env,
        base_env=base_env,
        logs=logs,
        forward_env=forward_env,
    )
    return Job(
        job_id,
        directory,
        attempts.start,
        request.recovery,
        argv=list(program),
        timeout=request.timeout,
        on_done=hooks.on_done,
        on_attempt=hooks.on_attempt,
    )


@dataclass(frozen=True)
class _Attempts:
    """How each attempt of job ``job_id`` starts: the first on the nodes ``prepare`` was
    given, a later one where ``hooks.where()`` says then (on fewer nodes, every slot of
    those when ``np`` was not given or no longer fits)."""

    request: JobRequest
    job_id: str
    cluster: str
    program: tuple[str, ...]
    launcher: Launcher
    hooks: JobHooks
    first: tuple[tuple[NodeSpec, ...], RemoteLaunch | None]
    job_env: dict[str, str]
    base_env: dict[str, str]
    logs: LogBudget | None
    forward_env: tuple[str, ...]

    def start(self, number: int, folder: Path, restarts: int, restart: bool) -> Attempt:
        """Attempt ``number`` in ``folder`` (made here for a later one), the job having been
        restarted ``restarts`` times (``restart``: this attempt is a restart)."""
        nodes, remote = self.first if number == 1 else self.hooks.where(restart)
        np = self.request.np
        if number > 1:
            slots = sum(n.slots for n in nodes)
            fewer = restart or slots < sum(n.slots for n in self.first[0])
            np = slots if fewer and (self.request.all_slots or np > slots) else np
            validate_np(np, slots, oversubscribe=self.request.oversubscribe)
            try:
                folder.mkdir(mode=0o700)
            except OSError as exc:
                raise RunDirError.from_os_error(folder, exc) from exc
        plan = self._plan(number, folder, restarts, nodes, remote, np)
        here = socket.gethostname()
        names = remote.hostnames if remote else {}
        hosts = {
            r: names.get(nodes[i].host, nodes[i].host) if remote else here
            for r, i in enumerate(placement(nodes, np))
        }
        return Attempt(
            self.job_id,
            number,
            plan,
            launch_command(plan),
            folder,
            LogStore(folder, hosts, launcher_host=here, attempt=number, budget=self.logs),
            base_env=self.base_env,
            cwd=self.request.cwd,
            timeout=self.request.timeout,
            on_failure=self.hooks.on_failure,
            diagnose=self.hooks.diagnose,
            lost=self.hooks.lost,
            keep=plan.clean == "none",
            hold_far=self.hooks.hold,
            on_end=self.hooks.ended,
        )

    def _plan(
        self,
        number: int,
        folder: Path,
        restarts: int,
        nodes: tuple[NodeSpec, ...],
        remote: RemoteLaunch | None,
        np: int,
    ) -> LaunchPlan:
        """What attempt ``number`` launches: ``np`` ranks on ``nodes``, reached as
        ``remote`` says (None: this machine's), its files in ``folder``."""
        request = self.request
        return LaunchPlan(
            launcher=(remote and remote.launcher) or self.launcher,
            nodes=nodes,
            np=np,
            argv=self.program,
            env={**_attempt_env(number, restarts), **self.job_env},
            hostfile=str(folder / "hostfile"),
            output_dir=str(folder / "raw"),
            as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
            oversubscribe=request.oversubscribe,
            remote=remote,
            inherited_env=self.base_env,
            launcher_args=request.launcher_args,
            job_token=process_tag(self.cluster, secrets.token_hex(6)),
            hook_dir=(remote and remote.hook_dir) or HOOK_DIR,
            abort_on_error=request.abort_on_error,
            master_port=_master_port(
                nodes[placement(nodes, np)[0]], self.hooks.free_port, local=remote is None
            ),
            clean=request.clean,
            forward_env=self.forward_env,
        )
