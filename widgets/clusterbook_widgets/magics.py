"""``%cluster`` and ``%%mpirun``: the notebook's cluster, and cells run as MPI programs on it.

Loaded on request (``%load_ext clusterbook``). The parsing, the rank script and the grouping of
errors are pure functions in :mod:`clusterbook_widgets.arguments`,
:mod:`clusterbook_widgets.mpirun_cell` and :mod:`clusterbook.launch.fold`; this module does the
I/O.
"""

from __future__ import annotations

import functools
import os
import secrets
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display as _untyped_display

import clusterbook as cb
from clusterbook.cluster.remote.attached import AttachedCluster
from clusterbook.errors import ClusterError
from clusterbook.launch.fold import failure_report, fold_live
from clusterbook.launch.logs import LiveText, LogRecord
from clusterbook.launch.saved import SavedJob
from clusterbook.wording import speaking
from clusterbook_widgets.arguments import (
    ArgsError,
    HelpRequested,
    MpirunArgs,
    parse_cluster_args,
    parse_mpirun_args,
)
from clusterbook_widgets.mpirun_cell import build_script
from clusterbook_widgets.pulled import check_private_dirs, read_pulled

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


class _CellError(Exception):
    """A problem with the cell's inputs, told to the user as a message."""


def current_cluster(shell: Any = None) -> cb.Cluster | None:
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


@magics_class
class ClusterMagics(Magics):
    """``%cluster local|ssh|slurm|env|attach|status|stop`` and ``%%mpirun``.

    The current cluster is :attr:`cluster` (one per shell); starting a new one stops the old
    one, and the kernel's exit stops it.
    """

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.cluster: cb.Cluster | AttachedCluster | None = None

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
        :meth:`clusterbook.Cluster.from_environment`), ``%cluster attach ID`` (a cluster
        another kernel or process runs: shown with its newest job's output),
        ``%cluster status``, ``%cluster stop``.
        """
        try:
            args = parse_cluster_args(line)
        except HelpRequested as h:
            print(h.text, end="")
            return
        except ArgsError as exc:
            _err(f"{exc.usage}{exc.message}")
            return
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
            started = self._start(
                lambda: cb.Cluster.slurm(
                    args.nodes,
                    args.slots,
                    partition=args.partition,
                    time=args.time,
                    account=args.account,
                    min_nodes=args.min_nodes,
                )
            )
            if started is not None:
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
        elif args.command == "attach":
            self._attach(args.id)
        elif args.command == "status":
            self._status()
        else:
            self._stop()

    def _attach(self, what: str) -> None:
        try:
            cluster = cb.Cluster.attach(what)
        except ClusterError as exc:
            _err(f"%cluster: {exc}")
            return
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

    def _start(self, make: Callable[[], cb.Cluster]) -> cb.Cluster | None:
        try:
            cluster = make()  # bad input fails here, before the old cluster is stopped
        except ClusterError as exc:
            _err(f"%cluster: {exc}")
            return None
        self._stop(quiet=True)
        try:
            cluster.start()
        except ClusterError as exc:
            cluster.stop()
            _err(f"%cluster: {exc}")
            return None
        except BaseException:  # an interrupt while nodes come up: leave nothing behind
            cluster.stop()
            raise
        self.cluster = cluster
        print(f"Started {cluster!r}.", flush=True)
        return cluster

    def _running(self) -> cb.Cluster | AttachedCluster | None:
        if self.cluster is not None and self.cluster.state == "running":
            return self.cluster
        return None

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
        cluster, self.cluster = self.cluster, None
        if cluster is None or cluster.state == "stopped":
            if not quiet:
                print("No cluster to stop.")
            return
        cluster.stop()
        print(f"Stopped cluster {cluster.name!r}.", flush=True)

    def stop_cluster(self) -> None:
        """Stop the current cluster, if any (what ``%cluster stop`` does, silently)."""
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()

    # -- %%mpirun ----------------------------------------------------------------------------

    @cell_magic
    @_worded
    def mpirun(self, line: str, cell: str) -> None:
        """Run the cell as an MPI program on the current cluster.

        ``%%mpirun [-n N] [--timeout S] [--push a,b] [--pull NAME] [--oversubscribe]
        [--retries N] [--backoff S] [--retry-on WHAT,...] [--deadline S] [--restarts N]
        [--clean {all,running,none}]``.
        Each rank's output is shown as it comes, prefixed ``[rank]``; an error raised on
        several ranks is shown once, with its ranks; a retry is announced as it starts.
        ``--push`` gives every rank the notebook's values of a, b; ``--pull NAME`` sets NAME
        in the notebook to the ranks' values of NAME, in rank order: plain data only, from
        this cell's own ranks (the kernel runs no code that a node hands it; see
        :mod:`clusterbook_widgets.pulled`). Interrupting the kernel stops every rank.
        """
        try:
            args = parse_mpirun_args(line)
        except HelpRequested as h:
            print(h.text, end="")
            return
        except ArgsError as exc:
            _err(f"{exc.usage}{exc.message}")
            return
        try:
            compile(cell, "<mpirun cell>", "exec")
        except SyntaxError as exc:  # the same on every rank: say it once, start nothing
            _err("".join(traceback.format_exception_only(type(exc), exc)).rstrip())
            return
        try:
            values = self._push_values(args)
            cluster = self._running() or self._start(lambda: cb.Cluster.local())
        except (ClusterError, _CellError) as exc:
            _err(f"%%mpirun: {exc}")
            return
        if cluster is None:
            return
        before = len(cluster.jobs)
        try:
            try:
                job, script, pull = self._launch(cluster, args, cell, values)
            except (ClusterError, _CellError) as exc:
                _err(f"%%mpirun: {exc}")
                return
            result, tracebacks = self._follow(job, str(script))
        except KeyboardInterrupt:  # wherever it came, the job it started is cancelled
            for started in cluster.jobs[before:]:
                started.cancel()
                _err(f"%%mpirun: interrupted; {started.id} was cancelled and every rank stopped.")
            raise
        for text in failure_report(tracebacks, result.failed):
            _err(text)
        if result.deadline_exceeded:
            _err(
                f"%%mpirun: the deadline passed after {result.duration:.1f} s; the job was "
                "stopped. Where each rank was is in its stack above (most recent call first)."
            )
        elif result.timed_out:
            _err(
                f"%%mpirun: timed out after {args.timeout:g} s; the job was stopped. Where each "
                "rank was is in its stack above (most recent call first)."
            )
        elif not result.ok and not result.failed and not tracebacks:
            _err(result.summary())
        if result.kept:
            ranks = ", ".join(
                f"rank {k.rank} pid {k.pid}" for k in result.kept if k.rank is not None
            )
            _err(
                f"%%mpirun: kept stopped for inspection (--clean none): {ranks or 'no rank'}, "
                f"with {len(result.kept)} process(es) in all; %cluster stop ends them (or "
                "cluster.jobs[-1].cleanup())."
            )
        if args.pull is not None and pull is not None:
            self._pull(cluster, args.pull, result, pull, job.np)

    def _push_values(self, args: MpirunArgs) -> bytes | None:
        """The pushed values, pickled: before anything starts, a missing or unpicklable one
        is named."""
        assert self.shell is not None
        ns = self.shell.user_ns
        missing = [name for name in args.push if name not in ns]
        if missing:
            raise _CellError(f"--push: {', '.join(missing)} not defined in the notebook.")
        return pickled({name: ns[name] for name in args.push}) if args.push else None

    def _launch(
        self,
        cluster: cb.Cluster | AttachedCluster,
        args: MpirunArgs,
        cell: str,
        values: bytes | None,
    ) -> tuple[cb.Job | SavedJob, Path, tuple[Path, bytes] | None]:
        """Start the cell's job; return it, its script, and where its values are pulled
        from with the key they are signed with."""
        cells = cluster.run_dir / "cells"
        cells.mkdir(mode=0o700, exist_ok=True)
        # The cell's program, values and results go there: nobody else may change them.
        check_private_dirs(cells)
        number = len(list(cells.iterdir())) + 1
        while True:
            directory = cells / f"cell-{number:04d}"
            try:
                directory.mkdir(mode=0o700)
                break
            except FileExistsError:
                number += 1
        push_file = None
        if values is not None:
            push_file = directory / "push.pkl"
            _write_private(push_file, values)
        pull_dir = key = None
        if args.pull is not None:
            pull_dir = directory / "pull"
            pull_dir.mkdir(mode=0o700)
            key = secrets.token_bytes(32)  # the ranks sign their values with it
        script = directory / "cell.py"
        text = build_script(
            cell,
            filename=f"<mpirun cell {number}>",
            push_file=None if push_file is None else str(push_file),
            pull=args.pull,
            pull_dir=None if pull_dir is None else str(pull_dir),
            pull_key=key,
        )
        # UTF-8: what Python reads source as, whatever the locale. Private: it holds the key.
        _write_private(script, text.encode("utf-8"))
        cluster.put(directory)  # nodes that do not share this filesystem get it too
        job = cluster.mpirun(
            ["python", str(script)],
            np=args.np,
            env={"PYTHONUNBUFFERED": "1"},  # output as it is printed, not when a buffer fills
            timeout=args.timeout,
            oversubscribe=args.oversubscribe,
            retries=args.retries,
            backoff=1.0 if args.backoff is None else args.backoff,
            retry_on=args.retry_on,
            deadline=args.deadline,
            restarts=args.restarts,
            clean=args.clean,
        )
        return job, script, None if pull_dir is None or key is None else (pull_dir, key)

    def _follow(
        self, job: cb.Job | SavedJob, script: str
    ) -> tuple[cb.JobResult, dict[int, list[tuple[str, ...]]]]:
        """Print the job's output as it comes; its result once it has ended (an interrupt
        is the caller's to handle: it cancels the job)."""
        launcher = Path(job.plan.launcher.path if isinstance(job, cb.Job) else job.launcher).name
        live = LiveText()

        def emit(rank: int, stream: str, text: str, partial: bool) -> None:
            prefix = f"[{launcher}]" if rank < 0 else f"[{rank}]"
            out = sys.stderr if stream == "stderr" else sys.stdout
            record = LogRecord(0.0, rank, "", stream, text, partial)
            print(live.render(record, prefix), file=out, end="", flush=True)

        def announce(attempt: int) -> None:
            _err(f"%%mpirun: attempt {attempt}")

        tracebacks = fold_live(
            job.stream(), emit, continues=live.continues, runner=script, on_attempt=announce
        )
        return job.wait(), tracebacks

    def _pull(
        self,
        cluster: cb.Cluster | AttachedCluster,
        name: str,
        result: cb.JobResult,
        pull: tuple[Path, bytes],
        np: int,
    ) -> None:
        """Set ``name`` to the ranks' values: plain data only, each signed by its rank of
        this cell, from the cell's own directory (:mod:`clusterbook_widgets.pulled`)."""
        if not result.ok:
            _err(f"%%mpirun: --pull {name}: not set, the job did not succeed.")
            return
        pull_dir, key = pull
        try:
            cluster.gather(pull_dir)  # from nodes that do not share this filesystem
            values = read_pulled(pull_dir, np, key)
        except ClusterError as exc:
            _err(f"%%mpirun: --pull {name}: {exc}; {name} not set.")
            return
        assert self.shell is not None
        self.shell.user_ns[name] = values


def pickled(values: dict[str, Any]) -> bytes:
    """The notebook's ``values`` for the ranks, by value where plain pickle goes by name
    (cloudpickle): a function, lambda or class defined in the notebook works on every rank.
    A value that cannot be pickled is named."""
    import cloudpickle  # type: ignore[import-untyped]  # (no type information)

    for name, value in values.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise _CellError(
                f"--push {name}: {type(value).__name__} objects cannot be sent to the ranks "
                f"({type(exc).__name__}: {exc}); push what it holds instead, or make it on "
                "every rank in the cell."
            ) from None
    data: bytes = cloudpickle.dumps(values)
    return data


def _write_private(path: Path, data: bytes) -> None:
    # Notebook values may be secret: 0600 from the start, never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
