"""The clusters this user has: found by their records under the run root, listed, pruned.

Every cluster's directory is under :func:`~clusterbook.paths.default_run_root`, or linked
there by its id when the cluster was given a ``run_dir`` elsewhere. :func:`clusters_frame`
lists them (running first, a cluster whose head died marked ``stale``), :func:`find` turns
an id, a name or a directory into a record, and :func:`prune` removes what finished long
enough ago. A damaged record never stops a listing: it shows as ``damaged``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.errors import (
    ClusterError,
    ClusterStateError,
    RecordError,
    RunDirError,
    UnknownClusterError,
)
from clusterbook.fs.private import check_run_dir
from clusterbook.fs.safe import inside, remove_tree
from clusterbook.head.record import FILE, ClusterRecord, is_stale, read_record, snapshot_from
from clusterbook.launch.jobdir import make_run_dir
from clusterbook.lifetime import format_duration
from clusterbook.paths import default_run_root

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CLUSTER_DTYPES",
    "Found",
    "Removal",
    "claim",
    "clusters_frame",
    "find",
    "link",
    "ordered",
    "prunable",
    "prune",
    "prune_quietly",
    "row",
    "scan",
    "time_left",
    "unlink",
]

_log = logging.getLogger("clusterbook.head.catalog")


@dataclass(frozen=True, slots=True)
class Found:
    """A directory that holds (or held) a cluster: its record, or why it could not be read."""

    path: Path
    record: ClusterRecord | None
    error: RecordError | None = None
    stale: bool = False

    @property
    def id(self) -> str:
        return self.record.id if self.record else self.path.name

    @property
    def state(self) -> str:
        if self.record is None:
            return "damaged"
        return "stale" if self.stale else self.record.state


def link(directory: Path, cluster_id: str, root: Path | None = None) -> None:
    """Make a cluster whose directory is not under the run root findable there by its id."""
    root = root or default_run_root()
    if directory.resolve().parent == root.resolve():
        return
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = root / cluster_id
    with contextlib.suppress(FileNotFoundError):
        if entry.is_symlink():
            entry.unlink()
    with contextlib.suppress(FileExistsError):
        entry.symlink_to(directory.resolve(), target_is_directory=True)


def unlink(cluster_id: str, root: Path | None = None) -> None:
    """Forget the link to a cluster's directory (the directory stays)."""
    entry = (root or default_run_root()) / cluster_id
    if entry.is_symlink():
        entry.unlink(missing_ok=True)


def scan(root: Path | None = None) -> Iterator[Found]:
    """Every cluster directory under ``root`` (default: the run root), linked ones too."""
    root = root or default_run_root()
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if not (entry / FILE).exists():
            continue  # a directory of something else, or a link whose cluster was removed
        try:
            record = read_record(entry)
        except RecordError as exc:
            yield Found(entry, None, exc)
            continue
        if entry.is_symlink() and entry.name != record.id:
            continue  # a link to a directory another cluster has taken over since
        yield Found(entry, record, stale=is_stale(record))


def find(what: str | os.PathLike[str], root: Path | None = None) -> Found:
    """The cluster ``what`` names: a directory holding a record, or an id (its directory's
    name) or a name (the newest cluster of that name) under the run root.

    Raises :class:`RecordError` for a directory that is not a cluster's (or a damaged
    record), :class:`UnknownClusterError` listing the clusters there are otherwise.
    """
    text = os.fspath(what)
    path = Path(text).expanduser()
    if os.sep in text or (path.is_dir() and (path / FILE).exists()):
        record = read_record(path)
        return Found(path, record, stale=is_stale(record))
    found = list(scan(root))
    by_id = [f for f in found if f.id == text or f.path.name == text]
    if by_id:
        if by_id[0].error is not None:
            raise by_id[0].error
        return by_id[0]
    named = [f for f in found if f.record is not None and f.record.name == text]
    if named:
        return max(named, key=lambda f: f.record.created if f.record else 0.0)
    known = tuple(f.id for f in ordered(found))
    listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    where = root or default_run_root()
    raise UnknownClusterError(
        f"No cluster {text!r} under {where}; "
        + (f"there are: {listed} (clusterbook ls lists them)." if known else "there is none.")
        + " Give an id, a name, or the cluster's directory.",
        known=known,
    )


def ordered(found: list[Found]) -> list[Found]:
    """Running clusters first, then the rest; newest first within each."""

    def key(f: Found) -> tuple[int, float]:
        rank = 0 if f.record is not None and f.record.live and not f.stale else 1
        return rank, -(f.record.created if f.record else 0.0)

    return sorted(found, key=key)


#: The dtype of every column of :func:`clusters_frame`, whatever the rows (none too).
CLUSTER_DTYPES = {
    "id": "string",
    "name": "string",
    "kind": "string",
    "state": "string",
    "nodes": "Int64",
    "slots": "Int64",
    "jobs": "Int64",
    "running_jobs": "Int64",
    "created": "datetime64[us, UTC]",
    "stopped": "datetime64[us, UTC]",
    "time_left": "timedelta64[ns]",  # NaT: it will not stop by itself
    "stops_by": "string",  # what stops it then: life_span or idle_timeout
    "detached": "boolean",
    "directory": "string",
    "problem": "string",
}


def clusters_frame(root: Path | None = None, *, now: float | None = None) -> pd.DataFrame:
    """One row per cluster of this user: running ones first, newest first; dtypes
    :data:`CLUSTER_DTYPES`. ``state`` is the record's, ``stale`` when its head is gone, or
    ``damaged`` when its record cannot be read (``problem`` says why)."""
    import pandas as pd

    now = time.time() if now is None else now
    rows = [row(f, now) for f in ordered(list(scan(root)))]
    frame = pd.DataFrame(rows, columns=list(CLUSTER_DTYPES))
    for column in ("created", "stopped"):
        seconds = frame[column].astype("float64")
        frame[column] = pd.to_datetime(seconds, unit="s", utc=True).astype("datetime64[us, UTC]")
    frame["time_left"] = pd.to_timedelta(frame["time_left"].astype("float64"), unit="s")
    others = {k: v for k, v in CLUSTER_DTYPES.items() if k not in ("created", "stopped")}
    typed: pd.DataFrame = frame.astype(others)
    return typed


def row(found: Found, now: float) -> dict[str, object]:
    """A cluster as :func:`clusters_frame` lists it: a value for each column of
    :data:`CLUSTER_DTYPES` (times in epoch seconds, ``time_left`` in whole seconds)."""
    r = found.record
    if r is None:
        problem = str(found.error) if found.error else None
        values: dict[str, object] = dict.fromkeys(CLUSTER_DTYPES)
        values.update(id=found.id, state="damaged", directory=str(found.path), problem=problem)
        return values
    running = sum(j.state == "running" for j in r.jobs)
    left = snapshot_from(r, now=now, stale=False).time_left
    problem = "its head is gone; clusterbook stop cleans what is left" if found.stale else r.problem
    return {
        "id": r.id,
        "name": r.name,
        "kind": r.kind,
        "state": found.state,
        "nodes": len(r.nodes),
        "slots": sum(n.slots for n in r.nodes),
        "jobs": len(r.jobs),
        "running_jobs": running,
        "created": r.created,
        "stopped": r.stopped,
        "time_left": None if left is None else round(left[0]),
        "stops_by": None if left is None else left[1],
        "detached": r.detached,
        "directory": str(found.path),
        "problem": problem,
    }


def time_left(record: ClusterRecord, now: float) -> str | None:
    """How long until the cluster stops by itself, and why, as a person reads it."""
    left = snapshot_from(record, now=now, stale=False).time_left
    return None if left is None else f"{format_duration(left[0])} ({left[1]})"


# -- pruning -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Removal:
    """A directory that pruning removes (or would, on a dry run), and why. ``within``: the
    directory it must be in (a job's, its cluster's ``jobs/``); None for a cluster's own
    directory, whose record is read again before it goes."""

    path: Path
    why: str
    within: Path | None = field(default=None, repr=False, compare=False)


def prunable(found: list[Found], *, now: float, older_than: float | None) -> list[Removal]:
    """What pruning removes: the directories of clusters stopped over ``older_than`` seconds
    ago (default: each cluster's own ``retention``; none without one), and of finished jobs of
    live clusters whose own retention has passed. Never a live cluster's or a running job's,
    nor a job's outside its cluster's ``jobs/``."""
    out: list[Removal] = []
    for f in found:
        r = f.record
        if r is None:
            continue
        keep = older_than if older_than is not None else r.retention
        if keep is None:
            continue
        if not r.live or f.stale:
            ended = r.stopped or r.updated or r.created
            if now - ended >= keep:
                age = format_duration(now - ended)
                out.append(Removal(f.path, f"cluster {r.id} {f.state} {age} ago"))
            continue
        jobs = f.path / "jobs"
        for job in r.jobs:
            if job.state == "running" or job.ended is None or now - job.ended < keep:
                continue
            if not inside(job.directory, jobs):
                continue  # not where its cluster makes its jobs: never removed
            age = format_duration(now - job.ended)
            why = f"job {job.id} of {r.id} ended {age} ago"
            out.append(Removal(Path(job.directory), why, within=jobs))
    return out


def prune(
    *, older_than: float | None = None, dry_run: bool = False, root: Path | None = None
) -> list[Removal]:
    """Remove (unless ``dry_run``) what :func:`prunable` names; return it."""
    root = root or default_run_root()
    found = list(scan(root))
    removals = prunable(found, now=time.time(), older_than=older_than)
    if not dry_run:
        for removal in removals:
            _remove(removal, root)
        for entry in _dangling_links(root):
            entry.unlink(missing_ok=True)
    return removals


def _remove(removal: Removal, root: Path) -> None:
    """Remove what ``removal`` names, only where it must be: a job's directory inside its
    cluster's ``jobs/``, a cluster's directory that still holds its record (which is where it
    says), inside the run root or linked there."""
    path = removal.path
    try:
        if removal.within is not None:
            remove_tree(path, removal.within)
            return
        read_record(path)  # still a cluster's directory, where its record says
        if path.is_symlink():  # a cluster linked into the run root: its directory, the link
            remove_tree(path.resolve(), path.resolve(), itself=True)
            path.unlink()
        else:
            remove_tree(path, root)
    except (OSError, ClusterError) as exc:
        _log.warning("Could not remove %s: %s", path, exc)


def _dangling_links(root: Path) -> Iterator[Path]:
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.is_symlink() and not entry.exists():
                yield entry


def prune_quietly() -> None:
    """:func:`prune` by each cluster's own retention, logging (not raising) what fails: any
    cluster's start does it, so that a retention is kept without a daemon."""
    try:
        prune()
    except Exception:
        _log.exception("Pruning old run directories failed.")


# -- a new cluster's directory --------------------------------------------------------------


def claim(cluster_id: str, run_dir: Path, own_run_dir: bool) -> tuple[str, Path]:
    """Make the run directory ``run_dir`` of cluster ``cluster_id``, unless another live
    cluster has it, and make it findable; return the id and directory it got. A directory the
    cluster makes itself (``own_run_dir``) is new: its id and name are numbered (``-2``,
    ``-3``...) past any taken. A directory (or run root) another user could change is refused
    with :class:`~clusterbook.errors.UnsafePathError` (:mod:`clusterbook.fs.private`)."""
    got, path, n = cluster_id, run_dir, 1
    while own_run_dir:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            n += 1
            got = f"{cluster_id}-{n}"
            path = path.with_name(got)
        except OSError as exc:
            raise RunDirError.from_os_error(path, exc) from exc
    root = default_run_root()
    if not own_run_dir and path.exists():
        check_run_dir(path, root)  # one given: refused before anything is put in it
    make_run_dir(path)
    check_run_dir(path, root)
    with contextlib.suppress(ClusterError):
        other = read_record(path)
        if other.live and not is_stale(other) and other.head_pid != os.getpid():
            raise ClusterStateError(
                f"run_dir {str(path)!r} belongs to cluster {other.name!r}, which is "
                "running; give this cluster another run_dir (or none: a new one is made)."
            )
    link(path, got)
    return got, path
