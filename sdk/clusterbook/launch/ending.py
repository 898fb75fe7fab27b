"""How an attempt ended, told from what its ranks reported (pure): its
:class:`~clusterbook.launch.result.JobResult`, and the processes it kept (``clean="none"``)
named as its ranks reported them.

What the ranks reported (their host, pid, start, exit code and order, last lines) is what the
rank wrapper's markers told the attempt's :class:`~clusterbook.launch.logstore.LogStore`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from clusterbook.errors import ClusterError
from clusterbook.launch.logs import LAUNCHER_RANK
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.result import (
    AttemptInfo,
    JobResult,
    KeptProcess,
    RankFailure,
    failed_ranks,
)
from clusterbook.spec import NodeSpec

__all__ = ["attempt_result", "final_result", "name_kept", "ranks_first"]


def attempt_result(
    store: LogStore,
    job_id: str,
    number: int,
    np: int,
    returncode: int,
    duration: float,
    *,
    stop_reason: str | None,
    stopped_at: int | None,
    error: ClusterError | None,
    kept: tuple[KeptProcess, ...] = (),
) -> JobResult:
    """The result of attempt ``number`` of job ``job_id`` (``np`` ranks) from what its ranks
    reported to ``store``, its launcher's ``returncode`` and how long it ran.

    ``stop_reason`` says why clusterbook stopped it, if it did (``"timeout"``, ``"cancel"``,
    ``"failure"``, ``"error"``), when ``stopped_at`` ranks had exited: the ranks that exited
    after a stop that was not for a failure were stopped, not failed. ``error``: why
    clusterbook stopped it itself; ``kept``: the processes it kept stopped.
    """
    order = list(store.exit_order)
    stopped = (
        set(order[stopped_at:]) if stopped_at is not None and stop_reason != "failure" else set()
    )
    failed = failed_ranks(order, store.exit_codes, stopped_by_us=stopped)
    return JobResult(
        job_id=job_id,
        returncode=returncode,
        rank_exit_codes={r: store.exit_codes.get(r) for r in range(np)},
        failed=tuple(
            RankFailure(r, store.hosts.get(r, "?"), store.exit_codes[r], tuple(store.tail(r)))
            for r in failed
        ),
        duration=duration,
        timed_out=stop_reason == "timeout",
        cancelled=stop_reason == "cancel",
        launcher_tail=tuple(store.tail(LAUNCHER_RANK)),
        error=None if error is None else str(error),
        rank_hosts={r: store.hosts.get(r, "?") for r in range(np)},
        rank_times={
            r: (store.started.get(r), store.ended.get(r))
            for r in range(np)
            if r in store.started or r in store.ended
        },
        attempt=number,
        kept=kept,
    )


def name_kept(
    kept: tuple[KeptProcess, ...], node_of: Mapping[int, NodeSpec], store: LogStore
) -> tuple[KeptProcess, ...]:
    """``kept`` (``host``: a node's name; ``node_of``: each rank's node) with the host name
    its ranks reported to ``store``, and the rank of each rank's program."""
    hosts = store.hosts
    shown = {node_of[r].name: hosts[r] for r in node_of if r in hosts}
    ranks = {(node_of[r].name, p): r for r, p in store.pids.items() if r in node_of}
    return tuple(
        replace(k, host=shown.get(k.host, k.host), rank=ranks.get((k.host, k.pid))) for k in kept
    )


def ranks_first(kept: tuple[KeptProcess, ...]) -> tuple[KeptProcess, ...]:
    """``kept`` in the order a result shows them: ranks in rank order, then the others."""
    return tuple(sorted(kept, key=lambda k: (k.rank is None, k.rank or 0, k.host, k.pid)))


def final_result(
    last: JobResult,
    *,
    job_id: str,
    duration: float,
    why: str | None,
    attempt: int,
    attempts: tuple[AttemptInfo, ...],
    restarts: int,
    cancelled: bool,
    deadline: bool,
) -> JobResult:
    """The job's result, from its last attempt's (number ``attempt``): the whole job's
    duration, its attempts and restarts, why it stopped (a note), and cancelled or past its
    deadline only if it did not succeed anyway."""
    return replace(
        last,
        job_id=job_id,
        duration=duration,
        notes=(*last.notes, why) if why else last.notes,
        attempt=attempt,
        attempts=attempts,
        restarts=restarts,
        cancelled=last.cancelled or (cancelled and not last.ok),
        deadline_exceeded=deadline and not last.ok,
    )
