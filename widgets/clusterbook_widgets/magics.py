"""``%cluster`` and ``%%mpirun``: the notebook's cluster, and cells run as MPI programs on it.

Loaded on request (``%load_ext clusterbook``). The magics' arguments are parsed in
:mod:`clusterbook_widgets.arguments`, and a cell runs as a job through
:mod:`clusterbook_widgets.cell_job` (its directory, its output, what is said of its end, its
values); this module keeps the notebook's cluster and tells the user.

Errors are raised, so that "Run All", nbclient and papermill stop at the cell: bad arguments as
IPython's ``UsageError``, everything else as the ``ClusterError`` it is (a failed cell's job as
:class:`~clusterbook.JobFailedError`), shown by its message alone
(:mod:`clusterbook_widgets.raised`). ``%%mpirun --no-raise`` prints a failed cell's error
instead and returns.
"""

from __future__ import annotations

import functools
import sys
from argparse import Namespace
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display as _untyped_display

import clusterbook as cb
from clusterbook.cluster.handle import ClusterHandle
from clusterbook.errors import ClusterError, ClusterStateError, JobFailedError
from clusterbook.wording import speaking
from clusterbook_widgets.arguments import (
    ArgsError,
    HelpRequested,
    MpirunArgs,
    parse_cluster_args,
    parse_mpirun_args,
)
from clusterbook_widgets.cell_job import (
    compiled,
    ending,
    failure,
    follow,
    launch,
    pulled,
    pushed,
)
from clusterbook_widgets.raised import show_as_message

__all__ = ["ClusterMagics"]

P = ParamSpec("P")
R = TypeVar("R")

_NO_CLUSTER = "No cluster is running; start one with %cluster local --workers 2."


def _worded(magic: Callable[P, R]) -> Callable[P, R]:
    """Run ``magic`` with its messages naming the magics' options (``-n 8``, not ``np=8``)."""

    @functools.wraps(magic)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with speaking("magics"):
            return magic(*args, **kwargs)

    return run


def current_cluster(shell: Any = None) -> ClusterHandle | None:
    """The cluster that ``%cluster`` started in ``shell`` (default: the running IPython), the
    one ``%%mpirun`` runs on; None if there is none."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    magics = shell.magics_manager.registry.get("ClusterMagics") if shell is not None else None
    return magics.cluster if magics is not None else None


display: Callable[[object], None] = _untyped_display  # IPython's is not annotated


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _announce_attempt(attempt: int) -> None:
    _err(f"%%mpirun: attempt {attempt}")


def _usage(exc: ArgsError) -> UsageError:
    """The error bad magic arguments raise: what is wrong, then how to call the magic."""
    return UsageError(f"{exc.message}\n{exc.usage.rstrip()}")


@magics_class
class ClusterMagics(Magics):
    """``%cluster local|ssh|slurm|env|profile|attach|status|stop`` and ``%%mpirun``.

    The current cluster is :attr:`cluster` (one per shell); starting a new one stops the old
    one, and the kernel's exit stops it.
    """

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.cluster: ClusterHandle | None = None
        # Why the cluster the last %cluster command asked for did not start, if it did not:
        # %%mpirun then says so rather than run the cell on a local cluster instead.
        self._failed: str | None = None

    # -- %cluster -----------------------------------------------------------------------------

    # Registered by name: ``cluster`` is the attribute that holds the current cluster.
    @line_magic("cluster")  # type: ignore[arg-type]  # IPython types the bare form only
    @_worded
    def cluster_magic(self, line: str) -> None:
        """Start, show or stop the notebook's cluster.

        ``%cluster local [--workers N] [--slots S|gpus]``,
        ``%cluster ssh HOST[:SLOTS] ... [--user U] [--identity F] [--port P]
        [--accept-new-host-keys]``, ``%cluster slurm [--nodes N] [--slots S] [--partition P]
        [--time T] [--account A] [--min-nodes M]`` (nodes from one Slurm batch job: they
        join as Slurm starts it), ``%cluster env [slurm|pbs|mpijob|sagemaker] [--slots N]
        [--via auto|srun|ssh] [--user U] [--identity F] [--port P]`` (the nodes of the
        allocation or training job the kernel runs in:
        :meth:`clusterbook.Cluster.from_environment`), ``%cluster profile NAME`` (the cluster
        of a profile: :meth:`clusterbook.Cluster.from_profile`), ``%cluster attach ID`` (a cluster
        another kernel or process runs: shown with its newest job's output),
        ``%cluster status``, ``%cluster scale N`` (a Slurm cluster: ``Cluster.scale``),
        ``%cluster adapt MIN MAX [--interval D] [--grace D]`` (``Cluster.adapt``),
        ``%cluster stop``. Bad arguments raise IPython's ``UsageError``;
        a cluster that cannot be made, started or reached raises its ``ClusterError``.
        """
        try:
            args = parse_cluster_args(line)
        except HelpRequested as h:
            print(h.text, end="")
            return
        except ArgsError as exc:
            raise _usage(exc) from None
        try:
            self._cluster_command(args)
        except ClusterError as exc:
            show_as_message(exc)
            raise

    def _cluster_command(self, args: Namespace) -> None:
        if args.command == "local":
            self._start(lambda: cb.Cluster.local(args.workers, args.slots))
        elif args.command == "ssh":
            self._start(
                lambda: cb.Cluster.ssh(
                    args.hosts,
                    user=args.user,
                    identity=args.identity,
                    port=args.port,
                    host_keys="accept-new" if args.accept_new_host_keys else None,
                )
            )
        elif args.command == "slurm":
            self._start(
                lambda: cb.Cluster.slurm(
                    args.nodes,
                    args.slots,
                    partition=args.partition,
                    time=args.time,
                    account=args.account,
                    min_nodes=args.min_nodes,
                )
            )
            print("Its nodes join as Slurm starts the job: %cluster status shows them.")
        elif args.command == "env":
            self._start(
                lambda: cb.Cluster.from_environment(
                    args.kind,
                    slots=args.slots,
                    via=args.via,
                    user=args.user,
                    identity=args.identity,
                    port=args.port,
                    # None: the system's own (an MPIJob's pinned keys), else known_hosts
                    host_keys="accept-new" if args.accept_new_host_keys else None,
                )
            )
        elif args.command == "profile":
            self._start(lambda: cb.Cluster.from_profile(args.name))
        elif args.command == "attach":
            self._attach(args.id)
        elif args.command == "status":
            self._status()
        elif args.command == "scale":
            self._scale(args.nodes)
        elif args.command == "adapt":
            self._adapt(args)
        else:
            self._stop()

    def _scale(self, nodes: int) -> None:
        if self.cluster is None:
            raise ClusterStateError("No cluster to scale: start one first (%cluster slurm).")
        self.cluster.scale(nodes)
        print(f"Scaling {self.cluster.name!r} to {nodes} node(s): %cluster status shows them.")

    def _adapt(self, args: Namespace) -> None:
        if self.cluster is None:
            raise ClusterStateError("No cluster to adapt: start one first (%cluster slurm).")
        self.cluster.adapt(args.minimum, args.maximum, interval=args.interval, grace=args.grace)
        print(
            f"{self.cluster.name!r} adapts between {args.minimum} and {args.maximum} node(s): "
            "%cluster status shows them."
        )

    def _attach(self, what: str) -> None:
        cluster = cb.Cluster.attach(what)
        self._stop(quiet=True)
        self.cluster = cluster
        print(f"Attached to {cluster!r}.", flush=True)
        self._status()
        jobs = cluster.jobs
        if jobs:
            try:
                from clusterbook_widgets.log_viewer import LogViewer
            except ImportError:
                display(jobs[-1].logs())
            else:
                display(LogViewer(jobs[-1]))

    def _start(self, make: Callable[[], cb.Cluster]) -> cb.Cluster:
        cluster = make()  # bad input fails here, before the old cluster is stopped
        self._stop(quiet=True)
        try:
            cluster.start()
        except BaseException as exc:  # an error, or an interrupt while nodes come up
            cluster.stop()  # nothing left
            said = str(exc).splitlines()
            self._failed = f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__
            raise
        self.cluster, self._failed = cluster, None
        print(f"Started {cluster!r}.", flush=True)
        return cluster

    def _running(self) -> ClusterHandle | None:
        if self.cluster is not None and self.cluster.state == "running":
            return self.cluster
        return None

    def _default_cluster(self) -> ClusterHandle:
        """A local cluster for a cell run before any ``%cluster``; but not in place of one the
        notebook asked for that has stopped or did not start (the cell would run elsewhere)."""
        fix = (
            "start one with %cluster (local, ssh, slurm, env, profile or attach), or run "
            "%cluster stop to let %%mpirun start a local cluster"
        )
        if self.cluster is not None:
            raise ClusterStateError(
                f"The notebook's cluster {self.cluster.name!r} is {self.cluster.state}, so the "
                f"cell did not run; {fix}."
            )
        if self._failed is not None:
            raise ClusterStateError(
                f"The cluster the last %cluster command asked for did not start "
                f"({self._failed}), so the cell did not run; {fix}."
            )
        return self._start(lambda: cb.Cluster.local())

    def _status(self) -> None:
        cluster = self._running()
        if cluster is None:
            print(_NO_CLUSTER)
            return
        try:  # the live widget, where that module is there
            from clusterbook_widgets.cluster_widget import ClusterWidget
        except ImportError:
            display(cluster.status())
        else:
            display(ClusterWidget(cluster))

    def _stop(self, *, quiet: bool = False) -> None:
        cluster, self.cluster, self._failed = self.cluster, None, None
        if cluster is None or cluster.state == "stopped":
            if not quiet:
                print("No cluster to stop.")
            return
        cluster.stop()
        print(f"Stopped cluster {cluster.name!r}.", flush=True)

    def stop_cluster(self) -> None:
        """Stop the current cluster, if any (what ``%cluster stop`` does, silently)."""
        cluster, self.cluster, self._failed = self.cluster, None, None
        if cluster is not None:
            cluster.stop()

    # -- %%mpirun ----------------------------------------------------------------------------

    @cell_magic
    @_worded
    def mpirun(self, line: str, cell: str) -> None:
        """Run the cell as an MPI program on the current cluster.

        ``%%mpirun [-n N] [--timeout S] [--push a,b] [--pull NAME] [--oversubscribe]
        [--retries N] [--backoff S] [--retry-on WHAT,...] [--deadline S] [--restarts N]
        [--clean {all,running,none}] [--no-raise]``.
        Each rank's output is shown as it comes, prefixed ``[rank]``; a retry is announced as
        it starts. A cell whose job fails raises :class:`~clusterbook.JobFailedError`: its
        ranks that failed and their hosts, each error they raised once with its ranks, the
        last lines of a rank that raised none. ``--no-raise`` prints that and returns, as a
        cell that succeeded does. ``--push`` gives every rank the notebook's values of a, b;
        ``--pull NAME`` sets NAME in the notebook to the ranks' values of NAME, in rank order:
        plain data only, from this cell's own ranks (the kernel runs no code that a node hands
        it; see :mod:`clusterbook_widgets.pulled`). Interrupting the kernel stops every rank.
        """
        try:
            args = parse_mpirun_args(line)
        except HelpRequested as h:
            print(h.text, end="")
            return
        except ArgsError as exc:
            raise _usage(exc) from None
        assert self.shell is not None
        if missing := [name for name in args.push if name not in self.shell.user_ns]:
            raise UsageError(
                f"%%mpirun: --push {', '.join(missing)}: not defined in the notebook; define "
                f"{'it' if len(missing) == 1 else 'them'} first, or leave "
                f"{'it' if len(missing) == 1 else 'them'} out of --push."
            )
        try:
            self._run_cell(args, cell)
        except ClusterError as exc:  # a CellError too
            if not args.no_raise:
                show_as_message(exc)
                raise
            _err(f"%%mpirun: {exc}")

    def _run_cell(self, args: MpirunArgs, cell: str) -> None:
        """Run the cell's job; raise what went wrong (a failed job with ``--no-raise``
        printed instead)."""
        compiled(cell)
        assert self.shell is not None
        values = pushed(self.shell.user_ns, args.push)
        cluster = self._running() or self._default_cluster()
        before = len(cluster.jobs)
        try:
            job, script, pull = launch(cluster, args, cell, values)
            result, tracebacks = follow(job, str(script), _announce_attempt)
        except KeyboardInterrupt:  # wherever it came, the job it started is cancelled
            for started in cluster.jobs[before:]:
                started.cancel()
                _err(f"%%mpirun: interrupted; {started.id} was cancelled and every rank stopped.")
            raise
        if not result.ok and not args.no_raise:
            said = failure(result, tracebacks, args.timeout, pull=args.pull)
            raise JobFailedError(said, result=result)
        for text in ending(result, tracebacks, args.timeout):
            _err(text)
        if args.pull is not None and pull is not None:
            self.shell.user_ns[args.pull] = pulled(cluster, args.pull, result, pull, job.np)
