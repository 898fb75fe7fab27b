"""A handle on a cluster another process runs: ``cb.Cluster.attach(id_or_dir)``, or
``cb.Cluster.attach("ssh://me@login1/ID")`` for one whose head runs on another machine.

Everything it knows comes from the cluster's directory, which must be this user's alone
(:mod:`clusterbook.fs.private`): the record (``cluster.json``) for status, the job directories for
logs and results. It reads the directory through a
:class:`~clusterbook.cluster.remote.rundir.ClusterDir`: on this machine, or on the head's over ssh
(:mod:`clusterbook.cluster.remote.sshdir`), the same way. What it asks of the cluster (run a job,
cancel one, copy files, stop) goes to the head's control server (:mod:`clusterbook.head.control`)
through the directory's control socket, proving the secret in its 0600 ``token`` file (and asking
the head to prove it too). Stopping also works without it, the way anyone who can write the
directory can: with the stop file, which the head acts on within a second. When the head is gone
(the record is *stale*), ``stop()`` stops what it left here
(:mod:`clusterbook.cluster.remote.dead_head`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from clusterbook.cluster import display
from clusterbook.cluster.handle import job_by_id
from clusterbook.cluster.remote.dead_head import clean_after_dead_head
from clusterbook.cluster.remote.held import Held
from clusterbook.cluster.remote.node_calls import AttachedNodeCalls
from clusterbook.cluster.remote.rundir import ClusterDir, LocalDir, open_dir
from clusterbook.durations import Duration, duration, optional_duration
from clusterbook.errors import ClusterError, ClusterStateError, RecordError
from clusterbook.events import Subscribers
from clusterbook.functions.methods import FunctionMethods
from clusterbook.functions.place import CallPlace
from clusterbook.head import record as records
from clusterbook.head.catalog import Found
from clusterbook.head.record import STOP_FILE, ClusterRecord, head_state_of, snapshot_from
from clusterbook.launch.saved import SavedJob
from clusterbook.resources import ResourceFrames, empty_answer
from clusterbook.spec import NodeSpec, validate_timeout
from clusterbook.status import ClusterSnapshot, nodes_frame
from clusterbook.wording import spell

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Unpack

    from clusterbook.launch.prepare import JobArgs

__all__ = ["AttachedCluster"]

_POLL = 0.1
_HEAD_EXIT = 5.0  # s a stopped supervisor's process gets to end

_log = logging.getLogger("clusterbook.cluster.remote.attached")


class AttachedCluster(AttachedNodeCalls, FunctionMethods, ResourceFrames):
    """A cluster run by another process, seen and stopped through its directory."""

    def __init__(self, found: Found, where: ClusterDir | None = None) -> None:
        assert found.record is not None
        self.run_dir = found.path
        self._held = Held(where or LocalDir(found.path))
        self._dir = self._held.dir
        self._record = found.record
        self._stale = found.stale
        self._subscribers: Subscribers[ClusterSnapshot] = Subscribers()
        self._jobs: dict[str, SavedJob] = {}
        # A handle dropped without close() lets go of what it holds all the same, when it is
        # collected: its socket is not left to the garbage collector (which warns).
        self._finalizer = weakref.finalize(self, self._held.close)

    @classmethod
    def attach(
        cls,
        what: str | os.PathLike[str],
        *,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        python: str | None = None,
        connect_timeout: Duration = 10.0,
    ) -> AttachedCluster:
        """A handle on cluster ``what`` (see ``Cluster.attach``); the keyword arguments say
        how an ``ssh://`` address is reached."""
        found, where = open_dir(
            what,
            identity=identity,
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            python=python,
            connect_timeout=connect_timeout,
        )
        return cls(found, where)

    def start(self, *, progress: bool | None = None) -> AttachedCluster:
        """Itself: the cluster runs already (a cluster that stopped cannot start again: a
        :class:`ClusterStateError` says so)."""
        record = self.refresh()
        if not record.live or self._stale:
            raise ClusterStateError(
                f"Cluster {self.id} was stopped; make a new cluster to run again."
            )
        return self

    # -- what the record says --------------------------------------------------------------

    def refresh(self) -> ClusterRecord:
        """Read the record again (the head rewrites it on every change)."""
        with contextlib.suppress(RecordError):  # a record being replaced: keep the last one
            self._record, self._stale = self._dir.read()
        return self._record

    @property
    def record(self) -> ClusterRecord:
        return self.refresh()

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def name(self) -> str:
        return self._record.name

    @property
    def kind(self) -> str:
        return self._record.kind

    @property
    def state(self) -> str:
        """The head's word (starting, running, stopping, stopped), or ``stale``: the record
        says it runs, but its head process is gone."""
        record = self.refresh()
        return "stale" if self._stale else record.state

    @property
    def time_left(self) -> float | None:
        """Seconds until the cluster stops by itself, if it will."""
        left = self.snapshot().time_left
        return None if left is None else left[0]

    def snapshot(self) -> ClusterSnapshot:
        return snapshot_from(self.refresh(), now=time.time(), stale=self._stale)

    def status(self) -> pd.DataFrame:
        """One row per node, as the head last wrote it (columns as ``Cluster.status()``)."""
        return nodes_frame(self.snapshot())

    def resource_history(
        self,
        window: Duration | None = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """Each node's use as its head keeps it (``Cluster.resource_history``), asked of the
        head; none once the cluster stopped (the history went with its head)."""
        seconds = optional_duration(window, "window")  # refused here, as it was written
        record = self.refresh()
        if not record.live or self._stale:
            return empty_answer(1.0)
        names = None if nodes is None else list(nodes)
        return self._call("resource_history", window=seconds, nodes=names, points=points)

    @property
    def jobs(self) -> list[SavedJob]:
        """The cluster's jobs, oldest first, read from their directories."""
        out = []
        for entry in self.refresh().jobs:
            with contextlib.suppress(Exception):  # a job whose files are gone
                out.append(self._saved(entry.id, entry.directory))
        return out

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes as the head last wrote them."""
        return tuple(NodeSpec(n.name, n.host, n.slots) for n in self.refresh().nodes)

    @property
    def join_command(self) -> str | None:
        command = self.refresh().extra.get("join_command")
        return command if isinstance(command, str) else None

    # -- asking the head ---------------------------------------------------------------------

    def _call(self, op: str, *, reply_within: float | None = None, **args: Any) -> dict[str, Any]:
        record = self.refresh()
        if not record.live or self._stale:
            state = "stale: its head is gone" if self._stale else record.state
            raise ClusterStateError(f"Cluster {self.id} is {state}; it cannot {op}.")
        client = self._held.client
        if client is None:
            if record.address is None:
                raise ClusterStateError(
                    f"Cluster {self.id} is {record.state}; its head takes no requests now."
                )
            here = self._dir.machine()
            if record.head_host and record.head_host != here:
                raise ClusterStateError(
                    f"Cluster {self.id}'s head runs on {record.head_host}; it takes requests "
                    f"from that machine only (this is {here}): attach to it there, like "
                    f"ssh://{record.head_host}/{self.id}."
                )
            client = self._held.client = self._dir.control()
        return client.call(op, reply_within=reply_within, **args)

    def mpirun(
        self, argv: Sequence[str], np: int | None = None, **job: Unpack[JobArgs]
    ) -> SavedJob:
        """Start a job on the cluster, as ``Cluster.mpirun`` does; its head runs it (it goes
        on when this process ends). Returns the job, read from its directory."""
        if isinstance(argv, str):
            argv = [argv]  # the head refuses it with the message Cluster.mpirun gives
        args: dict[str, Any] = {}
        for key, value in job.items():
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif isinstance(value, (tuple, list)):
                value = list(value)
            args[key] = value
        answer = self._call("mpirun", argv=list(argv), np=np, job=args)
        return self._saved(answer["id"], answer["directory"])

    def scale(self, nodes: int) -> None:
        """Grow or shrink the cluster to ``nodes``, as ``Cluster.scale`` does; its head acts
        (a kind whose nodes cannot change, or a bad value, is refused there)."""
        self._call("scale", nodes=nodes)

    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None:
        """Have the head grow and shrink the cluster, as ``Cluster.adapt`` does; it adapts
        until a ``scale()``, another ``adapt()`` or the cluster's stop."""
        # In seconds: a timedelta does not travel as JSON (and a bad one is named here).
        looks, grace_s = duration(interval, "interval"), duration(grace, "grace")
        self._call("adapt", minimum=minimum, maximum=maximum, interval=looks, grace=grace_s)

    def call_place(self) -> CallPlace:
        """Where function jobs keep their calls: the head's run directory, here or through
        the ssh connection (:mod:`clusterbook.functions.place`)."""
        return self._dir.call_place()

    def wait_ready(self, timeout: Duration = 60, *, progress: bool | None = None) -> None:
        """Return when the head says every node is ready (see ``Cluster.wait_ready``)."""
        limit = validate_timeout(timeout)  # named here, as the head would name it
        if limit is not None:
            self._call("wait_ready", timeout=limit)

    def reinstate(self, node: str) -> None:
        """Bring ``node``, set aside for failing, back into jobs (see ``Cluster.reinstate``)."""
        self._call("reinstate", node=node)

    def job_script(self) -> str:
        """The batch script a Slurm cluster submitted, as its head shows it (see
        ``Cluster.job_script``); other kinds submit none: a :class:`ConfigError` says so."""
        return str(self._call("job_script")["script"])

    def engines(self, n: int | None = None, **how: Any) -> NoReturn:
        """Refused with a :class:`ClusterStateError` that says why and what to use instead:
        engines need their controller in the process that runs the cluster."""
        raise ClusterStateError(
            f"Cluster {self.id} runs in another process, and ipyparallel engines need their "
            "controller in the process that runs the cluster for as long as they run, so "
            "run MPI work on it with mpirun() or %%mpirun instead, or call engines() on a "
            "cluster that is not detached."
        )

    def _saved(self, job_id: str, directory: str) -> SavedJob:
        job = self._jobs.get(job_id)
        if job is None:
            job = SavedJob(directory, cancel=self._cancel, files=self._dir.files)
            self._jobs[job_id] = job
        return job

    def _cancel(self, job_id: str) -> None:
        self._call("cancel", job=job_id)

    def job(self, job_id: str | None = None) -> SavedJob:
        """A job by id (``job-0001``), or the newest one."""
        return job_by_id(self.jobs, self.id, job_id)

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` whenever the head rewrites the record (polled)."""
        unsubscribe = self._subscribers.subscribe(callback)
        self._held.follow(self._follow, weakref.ref(self), self._record.updated)
        return unsubscribe

    @staticmethod
    def _follow(ref: weakref.ref[AttachedCluster], seen: float, stop: threading.Event) -> None:
        """Poll the record of the handle ``ref`` names (updated at ``seen`` when last read),
        never holding the handle between two looks (one dropped is collected), until the
        cluster stops, or ``stop`` is set."""
        last: float | None = seen
        while last is not None and not stop.wait(_POLL * 5):
            self = ref()  # the handle, for this look only
            last = None if self is None else self._look(last)
            del self

    def _look(self, seen: float) -> float | None:
        """Read the record; tell subscribers if it changed since ``seen``. When it was last
        updated, or None once the cluster stopped (or its head is gone)."""
        try:
            record = self.refresh()
        except ClusterError:  # the head's machine is out of reach: the next look retries
            return seen
        if record.updated != seen or self._stale:
            seen = record.updated
            if len(self._subscribers):
                self._subscribers.publish(self.snapshot())
        return seen if record.live and not self._stale else None

    # -- stopping ----------------------------------------------------------------------------

    def stop(
        self, timeout: Duration = 30.0, *, reason: str | None = None, force: bool = False
    ) -> None:
        """Stop the cluster: its head is asked to (or, when it takes no requests, finds the
        stop file within a second); a head that is gone leaves this process to stop what is
        left. Returns once it is stopped (and a detached one's supervisor ended);
        :class:`ClusterStateError` if the head has not stopped it in ``timeout`` s.

        ``force``: also when this machine cannot verify that the head runs (it ran on
        another machine; an older clusterbook wrote a record whose pid may be another
        process's now), stop what it left here and mark the record stopped."""
        timeout = duration(timeout, "timeout")
        asked = reason or f"stopped by an attached handle (pid {os.getpid()})"
        if self._dir.stop_there(timeout, asked, force):  # on the head's machine, by its own
            self._held.close_client()
            self.refresh()
            return
        record = self.refresh()
        if record.live and force and head_state_of(record) != "alive":
            clean_after_dead_head(self.run_dir, timeout)
            self.refresh()
            return
        if record.live and not self._stale:
            self._ask_to_stop(asked)
        self._held.close_client()  # the head is going: its connection with it
        deadline = time.monotonic() + timeout
        while record.live:
            if self._stale:
                clean_after_dead_head(self.run_dir, max(0.0, deadline - time.monotonic()))
                self.refresh()
                return
            if time.monotonic() >= deadline:
                raise ClusterStateError(
                    f"Cluster {self.id} is still {record.state} {timeout:g} s after it was "
                    f"asked to stop; its head (pid {record.head_pid} on {record.head_host}) "
                    "did not act on it. If that process is not the cluster's head (it may "
                    "be gone, its pid another process's), stopping it with "
                    f"{spell('force', True)} cleans what it left here."
                )
            time.sleep(_POLL)
            record = self.refresh()
        # A supervisor writes "stopped" as its last act (a kernel's head lives on after).
        if record.detached and not records.head_ended(record, time.monotonic() + _HEAD_EXIT):
            _log.warning("Cluster %s stopped; its head, pid %s, runs on", self.id, record.head_pid)

    def _ask_to_stop(self, asked: str) -> None:
        """Ask the head to stop, or, when it cannot be asked, put the stop file, saying so."""
        try:
            self._call("stop", reason=asked)
        except ClusterStateError as exc:  # the head takes no requests: it reads the stop file
            _log.warning("%s Asking it through its stop file, %s.", exc, self.run_dir / STOP_FILE)
            self._dir.touch_stop()

    def close(self) -> None:
        """Let go of the cluster (it runs on): close the connection to its head and, attached
        over ssh, the connection to its machine, leaving nothing running there."""
        self._finalizer()

    def __enter__(self) -> AttachedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- display -----------------------------------------------------------------------------

    def __repr__(self) -> str:
        record = self.refresh()
        state = "stale" if self._stale else record.state
        slots = sum(n.slots for n in record.nodes)
        how = f"attached over ssh to {self._dir.where}" if self._dir.where else "attached"
        return (
            f"<Cluster {record.name!r} {record.kind} {state} ({how}, {record.id}): "
            f"{len(record.nodes)} nodes, {slots} slots>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return display.mimebundle(self, **kwargs)
