"""What the REST API answers, as JSON-ready values (pure): a cluster as ``clusterbook ls``
lists it, its jobs as its record lists them, a page of a job's log lines.

Only values named here reach the browser: a record also holds what must not (a job's process
tag, the head's address, an elastic cluster's join command with its secret), so nothing is
copied from a record as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clusterbook.head.catalog import Found, row, time_left
from clusterbook.head.record import ClusterRecord, JobEntry
from clusterbook.launch.logs import LogRecord

__all__ = ["READY", "cluster_json", "job_json", "jobs_json", "lines_json"]

#: The node states counted as ready, as the cluster widget counts them (views.html).
READY = frozenset({"ready", "joined", "running"})


def cluster_json(found: Found, now: float) -> dict[str, Any]:
    """A cluster as ``clusterbook ls`` lists it (:func:`clusterbook.head.catalog.row`), with
    its ready nodes and its time left as a person reads it; ``running``: whether it takes
    requests (live, its head there)."""
    values = row(found, now)
    record = found.record
    values["nodes_ready"] = 0 if record is None else sum(n.state in READY for n in record.nodes)
    values["started"] = None if record is None else record.started
    values["time_left_text"] = None if record is None else time_left(record, now)
    values["running"] = record is not None and record.live and not found.stale
    return values


def job_json(entry: JobEntry) -> dict[str, Any]:
    """A job as its cluster's record lists it, without its process tag."""
    return {
        "id": entry.id,
        "state": entry.state,
        "np": entry.np,
        "argv": list(entry.argv),
        "label": entry.label,
        "started": entry.started,
        "ended": entry.ended,
        "returncode": entry.returncode,
        "failed_ranks": list(entry.failed_ranks),
        "attempt": entry.attempt,
        "restarts": entry.restarts,
        "last_reason": entry.last_reason,
    }


def jobs_json(record: ClusterRecord) -> list[dict[str, Any]]:
    """The cluster's jobs, newest first."""
    return [job_json(entry) for entry in reversed(record.jobs)]


def lines_json(records: Sequence[LogRecord], first: int) -> list[dict[str, Any]]:
    """Log records as lines, each with its position (``first`` is the first one's)."""
    return [
        {
            "position": first + i,
            "time": r.time,
            "rank": r.rank,
            "host": r.host,
            "stream": r.stream,
            "text": r.line,
            "partial": r.partial,
            "attempt": r.attempt,
        }
        for i, r in enumerate(records)
    ]
