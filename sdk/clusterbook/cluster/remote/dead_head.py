"""What a cluster's head left when it is gone: stopped here, by whoever stops the cluster.

A head that was killed leaves its record saying the cluster runs, its jobs' processes on this
machine, and its files on it. :func:`clean_after_dead_head` stops those processes, removes the
cluster's own directory under ``~/.clusterbook/clusters`` and marks the record stopped, its jobs
that ran cancelled.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

from clusterbook.fs.safe import locked, remove_tree
from clusterbook.head.record import (
    STOP_FILE,
    JobEntry,
    head_state_of,
    read_record,
    write_record,
)
from clusterbook.launch.guard import kill_tagged
from clusterbook.paths import cluster_dir, clusters_root

__all__ = ["clean_after_dead_head"]


def clean_after_dead_head(run_dir: Path, timeout: float) -> None:
    """Stop what the head of the cluster in ``run_dir``, gone (or that cannot be verified,
    with ``force``), left here: its jobs' processes, its files; mark the record stopped. One
    process does it; another one asking at the same time waits for it (up to ``timeout`` s).
    Nothing is followed or removed outside the cluster's own directories: the lock is never a
    link, the record read is checked (its name and id are never paths, it is where it says)."""
    # The second one waits here, then finds it done.
    with locked(run_dir / ".stop.lock", timeout):
        record = read_record(run_dir)
        if not record.live:
            return
        tokens = [j.token for j in record.jobs if j.token and j.state == "running"]
        if tokens:
            kill_tagged(tokens, 1.0)
        with contextlib.suppress(OSError):  # what cannot be removed stays; stop goes on
            remove_tree(cluster_dir(record.id), clusters_root())
        now = time.time()
        jobs = tuple(
            j if j.state != "running" else _ended(j, now, "cancelled") for j in record.jobs
        )
        head = f"pid {record.head_pid} on {record.head_host}"
        why = "was gone" if head_state_of(record) == "gone" else "could not be verified"
        write_record(
            replace(
                record,
                state="stopped",
                stopped=now,
                stop_reason=f"its head ({head}) {why}; stopped by pid {os.getpid()}",
                jobs=jobs,
                updated=now,
            )
        )
    (run_dir / STOP_FILE).unlink(missing_ok=True)


def _ended(job: JobEntry, now: float, state: str) -> JobEntry:
    return replace(job, state=state, ended=now)
