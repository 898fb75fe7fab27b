"""A cluster's record: ``cluster.json`` in its directory, what other processes know of it.

The head rewrites it on every change (a temporary file, then an atomic rename: a reader sees
the old record or the new one, never half of one). It holds no secret. Reading a record
checks it: a file that is not a cluster's record is refused with its path.

``state`` is the head's word: created, starting, running, stopping, stopped. A record whose
head process is gone while it says starting, running or stopping is *stale* (the head was
killed, or its pid is another process's now): :func:`is_stale` tells, from the pid, start time,
program and host the record names.

A record is read in a directory that others may be able to write: every value a decision is
taken on is checked (an id or a name is never a path), and a record that says it is in another
directory, or that its jobs are outside its ``jobs/``, is refused.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, cast

from clusterbook.errors import RecordError
from clusterbook.head.liveness import HeadState, head_state
from clusterbook.lifetime import Lifetime
from clusterbook.names import (
    ID_RULE,
    JOB_ID_RULE,
    NAME_RULE,
    TAG_RULE,
    is_cluster_id,
    is_job_id,
    is_name,
    is_tag,
)
from clusterbook.nodes.tasks.common import write_atomic as tasks_write_atomic
from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus

__all__ = [
    "FILE",
    "STOP_FILE",
    "ClusterRecord",
    "JobEntry",
    "head_state_of",
    "is_stale",
    "job_json",
    "read_record",
    "snapshot_from",
    "write_atomic",
    "write_record",
]

FILE = "cluster.json"
STOP_FILE = "stop"
FORMAT = 1
LIVE_STATES = ("starting", "running", "stopping")
STATES = ("created", *LIVE_STATES, "stopped")


@dataclass(frozen=True, slots=True)
class JobEntry:
    """A job as the record lists it: its id, state, directory, and what it ran."""

    id: str
    state: str
    directory: str
    np: int
    argv: tuple[str, ...]
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    failed_ranks: tuple[int, ...] = ()
    token: str | None = None  # the tag of its processes, to stop what a dead head left
    attempt: int = 1
    last_reason: str | None = None
    restarts: int = 0
    label: str | None = None  # the name it is shown under ("ipyparallel engines")


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """What ``cluster.json`` holds (times are epoch seconds; durations seconds)."""

    id: str
    name: str
    kind: str
    state: str
    directory: str
    created: float
    started: float | None = None
    stopped: float | None = None
    stop_reason: str | None = None
    life_span: float | None = None
    idle_timeout: float | None = None
    retention: float | None = None
    idle_since: float | None = None
    detached: bool = False
    head_pid: int = 0
    head_host: str = ""
    head_started: int | None = None  # the head's start, ticks since boot (its pid may be reused)
    head_program: str | None = None  # what the head runs (/proc/PID/exe)
    address: str | None = None  # where the head takes requests from attached handles
    python: str = ""
    launcher: str | None = None
    nodes: tuple[NodeStatus, ...] = ()
    jobs: tuple[JobEntry, ...] = ()
    problem: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    updated: float = 0.0
    format: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Whether the record says the cluster runs (its head may still be gone)."""
        return self.state in LIVE_STATES

    def to_json(self, job_json: Callable[[JobEntry], str] | None = None) -> str:
        """The record as JSON; ``job_json``: each job's entry as :func:`job_json` writes it
        (a cache of the entries that no longer change, say: the head rewrites the record at
        each job's start and end, and a session's record lists every job it ran)."""
        # As json.dumps(asdict(self)) writes it, without asdict's deep copy of every value, and
        # on one line: with an indent, json encodes in Python instead of C, and the keeper
        # rewrites the record at every heartbeat of every node (up to five times a second).
        if job_json is None or not self.jobs:
            return json.dumps(self, default=_fields, sort_keys=True)
        text = json.dumps(
            replace(self, jobs=cast(Any, _JOBS_SLOT)), default=_fields, sort_keys=True
        )
        jobs = ", ".join(map(job_json, self.jobs))
        return text.replace(f'"{_JOBS_SLOT}"', f"[{jobs}]", 1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterRecord:
        """The record ``data`` holds, its values checked: ``ValueError`` (or ``TypeError``)
        saying which one is not what clusterbook writes. A name or an id read here names
        directories that get removed: never a path."""
        known = {f.name for f in fields(cls)}
        args = {k: v for k, v in data.items() if k in known}
        args["nodes"] = tuple(_node(n) for n in data.get("nodes", ()))
        args["jobs"] = tuple(_job(j) for j in data.get("jobs", ()))
        for key in ("id", "name", "kind", "state", "directory"):
            if not isinstance(args.get(key), str) or not args[key]:
                raise ValueError(f"no {key}")
        if not isinstance(args.get("created"), (int, float)):
            raise ValueError("no created time")
        if not is_cluster_id(args["id"]):
            raise ValueError(f"its id {args['id']!r} is not a cluster id: {ID_RULE}")
        if not is_name(args["name"]):
            raise ValueError(f"its name {args['name']!r} is not a cluster's name: {NAME_RULE}")
        if args["state"] not in STATES:
            raise ValueError(f"its state {args['state']!r} is none of {', '.join(STATES)}")
        for key, kinds in _SCALARS.items():
            value = args.get(key)
            if key in args and (isinstance(value, bool) is not (bool in kinds)
                                or not isinstance(value, kinds)):  # fmt: skip
                want = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise ValueError(f"its {key} {value!r} is not {want}")
        return cls(**args)


# Where to_json puts the jobs' entries: no value of a record holds it (a random part).
_JOBS_SLOT = f"jobs-{secrets.token_hex(16)}"


def job_json(entry: JobEntry) -> str:
    """``entry`` as :meth:`ClusterRecord.to_json` writes it among the record's jobs."""
    return json.dumps(entry, default=_fields, sort_keys=True)


def _fields(obj: object) -> dict[str, Any]:
    """A dataclass's fields by name, for json.dumps (which then goes into the values)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {name: getattr(obj, name) for name in obj.__dataclass_fields__}
    raise TypeError(f"{type(obj).__name__} is not a record's value")


def _node(data: dict[str, Any]) -> NodeStatus:
    known = {f.name for f in fields(NodeStatus)}
    args = {k: v for k, v in data.items() if k in known}
    args["ranks"] = tuple(args.get("ranks", ()))
    return NodeStatus(**args)


def _job(data: dict[str, Any]) -> JobEntry:
    known = {f.name for f in fields(JobEntry)}
    args = {k: v for k, v in data.items() if k in known}
    args["argv"] = tuple(args.get("argv", ()))
    args["failed_ranks"] = tuple(args.get("failed_ranks", ()))
    if not is_job_id(args.get("id")):
        raise ValueError(f"a job's id {args.get('id')!r} is not {JOB_ID_RULE}")
    if not isinstance(args.get("directory"), str):
        raise ValueError(f"job {args['id']} has no directory")
    token = args.get("token")
    if token is not None and not is_tag(token):
        raise ValueError(f"the token of job {args['id']}, {token!r}, is not {TAG_RULE}")
    if not isinstance(args.get("label"), (str, type(None))):
        raise ValueError(f"the label of job {args['id']}, {args['label']!r}, is not text")
    return JobEntry(**args)


# Values a decision is taken on (whether the head lives, what to remove when): their types.
_SCALARS: dict[str, tuple[type, ...]] = {
    "head_pid": (int,),
    "head_host": (str,),
    "head_started": (int, type(None)),
    "head_program": (str, type(None)),
    "detached": (bool,),
    "address": (str, type(None)),
    "created": (float, int),
    "started": (float, int, type(None)),
    "stopped": (float, int, type(None)),
    "updated": (float, int),
    "retention": (float, int, type(None)),
    "life_span": (float, int, type(None)),
    "idle_timeout": (float, int, type(None)),
    "idle_since": (float, int, type(None)),
}


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` in one step (a reader never sees half of it)."""
    tasks_write_atomic(str(path), text.encode(), mode)


def write_record(record: ClusterRecord, text: str | None = None) -> None:
    """Write ``record`` (``text``: its JSON, made already) to ``cluster.json`` in its
    directory."""
    write_atomic(Path(record.directory) / FILE, text or record.to_json(), 0o644)


def read_record(directory: str | os.PathLike[str]) -> ClusterRecord:
    """The record in ``directory``; :class:`RecordError` naming the file when there is none,
    or when it is not a cluster's record (half-written, corrupt, another program's)."""
    path = Path(directory) / FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RecordError(
            f"{path.parent} is not a cluster's directory: it has no {FILE}.", path=path
        ) from exc
    except OSError as exc:
        raise RecordError(f"Cannot read {path}: {exc.strerror or exc}.", path=path) from exc
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        record = ClusterRecord.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise RecordError(
            f"{path} is not a cluster record ({exc}); it may be half-written or damaged. "
            "Remove its directory if the cluster is gone.",
            path=path,
        ) from exc
    _check_where(record, Path(directory), path)
    return record


def _check_where(record: ClusterRecord, directory: Path, path: Path) -> None:
    """Refuse a record that says it is elsewhere, or whose jobs are not in its ``jobs/``:
    it is written again and its jobs' directories removed where it says."""
    here = os.path.realpath(directory)
    if os.path.realpath(record.directory) != here:
        raise RecordError(
            f"{path} says its cluster's directory is {record.directory}, but it is in {here}: "
            "a record is only read where its cluster wrote it. It was changed or copied; "
            "cb.Job.load(JOB_DIRECTORY) still reads a job's files.",
            path=path,
        )
    if not record.jobs:
        return
    # Where the record says its jobs are, as written (the directory resolves here, checked):
    # resolving every job's path costs a system call per component, per job, per read.
    named = os.path.join(os.path.normpath(record.directory), "jobs")
    jobs = os.path.join(here, "jobs")
    linked = os.path.realpath(named) != jobs
    for job in record.jobs:
        where = os.path.normpath(job.directory)
        if linked or where != os.path.join(named, job.id) or os.path.islink(where):
            raise RecordError(
                f"{path} says job {job.id} is in {job.directory}, not in {jobs}/{job.id} where "
                "its cluster makes it: the record was changed, and is not read.",
                path=path,
            )


def head_state_of(record: ClusterRecord, *, host: str | None = None) -> HeadState:
    """Whether the head process the record names runs (``alive``), does not (``gone``), or
    this machine cannot tell (``unknown``: the head ran on another machine, or the record,
    written by an older clusterbook, names no start time): see :mod:`clusterbook.head.liveness`."""
    return head_state(
        record.head_pid, record.head_host, record.head_started, record.head_program, here=host
    )


def head_ended(record: ClusterRecord, until: float, *, poll: float = 0.05) -> bool:
    """Wait until the head process the record names has ended (or this machine cannot tell:
    it ran on another), at most until ``until`` (:func:`time.monotonic`); whether it did."""
    while head_state_of(record) == "alive":
        if time.monotonic() >= until:
            return False
        time.sleep(poll)
    return True


def is_stale(record: ClusterRecord, *, host: str | None = None) -> bool:
    """Whether the record says the cluster runs while its head process is gone: its pid has
    ended, or is another process's now (another start time or program). Only the machine
    the head ran on can tell; elsewhere a live record is taken at its word."""
    return record.live and head_state_of(record, host=host) == "gone"


def snapshot_from(record: ClusterRecord, *, now: float, stale: bool) -> ClusterSnapshot:
    """The snapshot an attached handle shows: the record's nodes and jobs, as of its
    last update (a stale record says its head is gone)."""
    state = "stale" if stale else record.state
    problem, left = record.problem, None
    if record.live and not stale and record.started is not None:
        end = Lifetime(record.life_span, record.idle_timeout).deadline(
            record.started, record.idle_since
        )
        left = None if end is None else (max(0.0, end[0] - now), end[1])
    if stale:
        problem = (
            f"its head (pid {record.head_pid} on {record.head_host}) is gone; stop() cleans "
            "what is left"
        )
    return ClusterSnapshot(
        name=record.name,
        kind=record.kind,
        state=state,
        nodes=record.nodes,
        jobs=tuple(
            JobStatus(
                id=j.id,
                np=j.np,
                argv=j.argv,
                state=j.state,
                returncode=j.returncode,
                duration=None if j.started is None or j.ended is None else j.ended - j.started,
                failed_ranks=j.failed_ranks,
                attempt=j.attempt,
                last_reason=j.last_reason,
                restarts=j.restarts,
                label=j.label,
            )
            for j in record.jobs
        ),
        launcher=record.launcher,
        run_dir=record.directory,
        uptime=None if record.started is None else (record.stopped or now) - record.started,
        problem=problem,
        min_nodes=record.min_nodes,
        max_nodes=record.max_nodes,
        time_left=left,
    )
